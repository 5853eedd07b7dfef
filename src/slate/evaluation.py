"""How a run scores its test rows: as one pool, or federated through summed histograms.

The choice follows the data source (:mod:`slate.data.sources`) and is made once, in
:func:`evaluation_for`:

* :class:`PooledEvaluation`: every process holds the whole test set (the paper's experiments).
  The main process computes AP and AUROC exactly (:mod:`slate.metrics`, equal to scikit-learn).
* :class:`FederatedEvaluation`: each party holds only its own test rows. It counts them per
  score bin and class, the counts are summed over all parties (one all-reduce), and every party
  computes the AP and AUROC of the union of all test sets, with error bounds
  (:mod:`slate.histogram_metrics`). No score leaves a party. Each party also scores its own test
  rows exactly (``party_test_ap``).

  Logits beyond :data:`~slate.histogram_metrics.LOGIT_RANGE` share the two end bins, where their
  order is lost; when more than :data:`END_BIN_SHARE` of the test scores lie there, the scores
  carry a warning (:func:`end_bin_warning`), printed by the run and kept in ``summary.json``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from slate import metrics
from slate.histogram_metrics import (
    DEFAULT_BINS,
    LOGIT_RANGE,
    BinnedMetrics,
    binned_counts,
    metrics_from_counts,
)

__all__ = [
    "END_BIN_SHARE",
    "Evaluation",
    "FederatedEvaluation",
    "PooledEvaluation",
    "TestScores",
    "bin_edges",
    "end_bin_warning",
    "evaluation_for",
]

END_BIN_SHARE = 0.01  # warn when more of the test scores than this fall in an end bin


@dataclass
class TestScores:
    r"""The test metrics of one model, and how to draw its precision-recall curve.

    ``thresholds`` are the logit thresholds of the curve's points: point ``k`` is the precision
    and recall of the decision "positive when logit >= thresholds[k]". The last point,
    :math:`(P, R) = (1, 0)`, flags nothing: its threshold is :math:`+\infty`.
    """

    values: dict[str, float]
    curve: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    thresholds: np.ndarray | None = field(default=None, repr=False)
    warning: str | None = None  # a line for the user: the metrics may mislead (end bins)

    def pr_curve(self) -> tuple[np.ndarray, np.ndarray]:
        if self.curve is None:
            raise RuntimeError("this process holds no precision-recall curve")
        return self.curve


class Evaluation(ABC):
    """Scores the logits of this process's test rows (a collective: every process calls it)."""

    name: str

    @abstractmethod
    def score(self, logits: Tensor, labels: Tensor, total, is_main: bool) -> TestScores:
        """Metrics of the whole test set; ``total`` sums a tensor over all processes."""

    def party_test_aps(self, logits: Tensor, labels: Tensor) -> list[float | None]:
        """Each local party's AP on its own test rows; empty when the test set is one pool."""
        del logits, labels
        return []

    def describe(self) -> dict[str, object]:
        return {"evaluation": self.name}


class PooledEvaluation(Evaluation):
    """Exact metrics of the whole test set, on the main process (NaN elsewhere)."""

    name = "pooled"

    def score(self, logits: Tensor, labels: Tensor, total, is_main: bool) -> TestScores:
        del total
        if not is_main:
            return TestScores({"test_ap": math.nan, "test_auroc": math.nan})
        precision, recall, thresholds = metrics.precision_recall_curve(logits, labels)
        values = {
            "test_ap": metrics.average_precision(logits, labels),
            "test_auroc": metrics.auroc(logits, labels),
        }
        edges = np.append(thresholds.astype(np.float64), np.inf)
        return TestScores(values, (precision, recall), edges)


class FederatedEvaluation(Evaluation):
    """Metrics of the union of the parties' test sets from summed per-bin class counts."""

    name = "federated"

    def __init__(self, test_parts: list[np.ndarray], bins: int = DEFAULT_BINS) -> None:
        self.test_parts = test_parts
        self.bins = bins

    def score(self, logits: Tensor, labels: Tensor, total, is_main: bool) -> TestScores:
        del is_main
        counts = total(binned_counts(logits, labels, self.bins))
        binned = BinnedMetrics(counts)
        precision, recall, bins = binned.precision_recall_curve()
        edges = np.append(bin_edges(bins, self.bins), np.inf)
        values = metrics_from_counts(counts)
        warning = end_bin_warning(counts, values["test_ap"], values["test_ap_error_bound"])
        return TestScores(values, (precision, recall), edges, warning)

    def party_test_aps(self, logits: Tensor, labels: Tensor) -> list[float | None]:
        aps: list[float | None] = []
        for rows in self.test_parts:
            own = labels[rows]
            aps.append(metrics.average_precision(logits[rows], own) if bool(own.any()) else None)
        return aps

    def describe(self) -> dict[str, object]:
        return {"evaluation": self.name, "evaluation_bins": self.bins}


def bin_edges(bins: np.ndarray, n_bins: int, limit: float = LOGIT_RANGE) -> np.ndarray:
    r"""The logit threshold of each bin: its lower edge :math:`-L + 2 L k / B`, and
    :math:`-\infty` for bin 0, which also holds every logit below :math:`-L`.

    A logit :math:`s` falls in a bin :math:`\ge k` when :math:`s \ge` the edge of :math:`k`
    (:func:`slate.histogram_metrics.bin_index`; up to float64 rounding of a logit on the edge
    itself), so "positive when logit >= edge" flags the rows counted in bins :math:`k` and
    above: the precision and recall of bin :math:`k`'s point on the binned curve.
    """
    k = np.asarray(bins, dtype=np.float64)
    edges = -limit + k * (2 * limit / n_bins)
    return np.where(k == 0, -np.inf, edges)


def end_bin_warning(
    counts: Tensor, ap: float, bound: float, limit: float = LOGIT_RANGE
) -> str | None:
    """A one-line warning when more than :data:`END_BIN_SHARE` of the rows counted in the
    summed ``(2, bins)`` table lie in its end bins (logits beyond ``-limit`` or ``limit``).

    Scores there are ties to the histogram: with every logit beyond the range, all rows share
    one bin and the binned AP is the positive rate, whatever the model's ranking. The exact AP
    needs the scores in one place: the pooled evaluation of a run with one ``--test`` file, or
    ``slate evaluate`` on a test file.
    """
    table = counts.detach().to(torch.float64).cpu()
    rows = float(table.sum())
    if rows == 0:
        return None
    low, high = float(table[:, 0].sum()), float(table[:, -1].sum())
    share = (low + high) / rows
    if share <= END_BIN_SHARE:
        return None
    return (
        f"warning: {share:.1%} of the test scores lie beyond the federated histogram's logit "
        f"range +-{limit:g} ({low:.0f} below, {high:.0f} above), in its end bins, where their "
        f"order is lost: the test AP {ap:.4f} (+-{bound:.1e}) may be far from the AP of the raw "
        "scores. Lower --lr or standardise the features (--standardize) to keep the logits in "
        "range, or get the exact AP from pooled scores: one --test file instead of per-party "
        "test files, or slate evaluate --run RUN --data TEST_FILE."
    )


def evaluation_for(test_parts: list[np.ndarray] | None) -> Evaluation:
    """Federated when each party holds its own test rows, pooled otherwise."""
    return PooledEvaluation() if test_parts is None else FederatedEvaluation(test_parts)
