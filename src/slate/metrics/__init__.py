"""Measuring a classifier and a run: ranking metrics on tensors (:mod:`~slate.metrics.ranking`),
the same from summed histograms (:mod:`~slate.metrics.histograms`), operating points, the
parties' divergence, and the figures of a report (:mod:`~slate.metrics.plots`).

The ranking functions are importable from here, as torchmetrics' functional API is:
``slate.metrics.average_precision(scores, labels)``.
"""

from slate.metrics.ranking import (
    auroc,
    average_precision,
    consensus_distance,
    precision_recall_curve,
)

__all__ = ["auroc", "average_precision", "consensus_distance", "precision_recall_curve"]
