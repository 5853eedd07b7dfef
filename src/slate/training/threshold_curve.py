"""Which rows a site's deployed threshold comes from: its own test rows, or the pooled sums.

``slate predict --at-recall R`` / ``--at-precision P`` chooses its threshold on a curve of the
run folder (:mod:`slate.inference.predict`). With per-site files the run has two curves of the
saved model:

* **own**: the saved model scored exactly on this site's own test rows, with no exchange. No
  other site can touch them, so no liar can shape the threshold this site deploys. This is the
  default: ``pr_curve.csv`` (and the summary's ``operating_points``).
* **pooled**: the curve of the summed per-bin class counts of every site's test rows
  (:class:`slate.training.evaluation.FederatedEvaluation`). A site that lies in its counts (rows
  moved between bins with the totals exact, or positive rows declared and planted) shapes it.
  It stays available, labelled: ``pr_curve_pooled.csv`` (``summary.json``'s
  ``operating_points_pooled``; ``slate predict --curve pooled``).

With one test set for every site (the simulator, or a distributed run with one ``--test`` file)
the site's own rows are the pooled rows: there is one curve, ``pr_curve.csv``, and the record
says so. A site without both classes among its own test rows has no own curve: its default is the
pooled curve, and the record says why. A site that refused the final average
(:mod:`slate.training.final_check`) saved its own model scored on its own rows: its curve is own.

The source is recorded as ``threshold_curve`` in ``summary.json`` and ``model.json``
(:meth:`Curves.describe`). The same holds for the validation rows of ``--validation-fraction``
(:data:`POOLED_VALIDATION_CURVE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from slate.training.evaluation import PooledEvaluation, TestScores

__all__ = [
    "CURVE",
    "POOLED_CURVE",
    "POOLED_VALIDATION_CURVE",
    "Curves",
    "curves_of",
    "own_scores",
]

CURVE = "pr_curve.csv"  # the default threshold's curve
POOLED_CURVE = "pr_curve_pooled.csv"  # with per-site files: the summed histograms' curve
POOLED_VALIDATION_CURVE = "validation_pr_curve_pooled.csv"

_ONE_SET = "one set of rows for every site: its own rows are the pooled rows (one curve)"
_NO_OWN = ("this site's own test rows do not hold both classes, so it has no own curve: the "
           "default threshold comes from the pooled curve")  # fmt: skip
_REFUSED = "this site refused the final average: the saved model is its own, on its own rows"


def own_scores(logits: Tensor, labels: Tensor) -> TestScores | None:
    """The exact metrics and curve of ``logits`` on this site's rows; None without both
    classes (no curve, no AP)."""
    if not len(labels) or not bool(labels.any()) or bool(labels.all()):
        return None
    return PooledEvaluation().metrics((logits, labels), True)


@dataclass
class Curves:
    """The curve the default threshold comes from (``source``: ``"own"`` or ``"pooled"``), with
    its rows and positives, and with per-site files the pooled curve beside it."""

    default: TestScores
    source: str
    rows: int
    positives: int
    pooled: TestScores | None = None
    pooled_positives: int | None = None
    note: str | None = None

    def describe(self, file: str = CURVE, pooled_file: str = POOLED_CURVE) -> dict[str, Any]:
        """``threshold_curve`` (``summary.json``, ``model.json``)."""
        return {
            "source": self.source,
            "file": file,
            "rows": self.rows,
            "positives": self.positives,
            "ap": self.default.values.get("test_ap"),
            "pooled_file": pooled_file if self.pooled is not None else None,
            "pooled_positives": self.pooled_positives,
            "note": self.note,
        }


def curves_of(
    federated: bool, logits: Tensor, labels: Tensor, scores: TestScores, pooled_positives: int,
    refused: bool = False,
) -> Curves:  # fmt: skip
    """The curves of a scored model: ``federated``, whether each site holds its own rows
    (``scores`` then are the summed histograms', of ``pooled_positives`` positives);
    ``refused``: ``scores`` already are the site's own model's on its own rows."""
    rows, positives = len(labels), int(labels.sum()) if len(labels) else 0
    if refused:
        return Curves(scores, "own", rows, positives, note=_REFUSED)
    if not federated:
        return Curves(scores, "pooled", rows, pooled_positives, note=_ONE_SET)
    own = own_scores(logits, labels)
    if own is None:
        return Curves(scores, "pooled", rows, pooled_positives, scores, pooled_positives, _NO_OWN)
    return Curves(own, "own", rows, positives, scores, pooled_positives)
