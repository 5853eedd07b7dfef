r"""Operating points: the decision threshold that gives a required recall or precision.

A scored set with labels gives a precision-recall curve with one point per distinct score
threshold :math:`t_k` (:func:`slate.metrics.precision_recall_curve`): flagging every row whose
logit is :math:`\ge t_k` has precision :math:`P_k = \mathrm{TP}_k / (\mathrm{TP}_k +
\mathrm{FP}_k)` and recall :math:`R_k = \mathrm{TP}_k / n_+`. Lowering the threshold flags more
rows, so recall never decreases while precision may go either way. Two questions pick a point:

* **precision at recall** :math:`\ge R` (a fraud team's "90% recall, at the best precision"):
  among the thresholds with :math:`R_k \ge R`, the one with the highest :math:`P_k`; ties go to
  the higher recall, then to the higher threshold. Always reachable for :math:`R \le 1`: the
  lowest threshold flags every row (recall 1).
* **recall at precision** :math:`\ge P` (a screening program's "precision at least 0.5"):
  among the thresholds with :math:`P_k \ge P`, the one with the highest :math:`R_k`; ties go
  to the higher precision, then the higher threshold. Unreachable when no threshold has
  :math:`P_k \ge P`.

The curve's extra point :math:`(P, R) = (1, 0)` flags nothing and is never chosen.

**A threshold chosen elsewhere.** :func:`at_threshold` reads off a curve the precision and recall
of a given decision "logit >= t" (chosen on other rows, e.g. validation rows): those of the
curve's point with the smallest threshold :math:`t_k \ge t`, which flags exactly the same rows
when the curve holds every distinct score (a histogram's curve, whose thresholds are bin edges,
flags the rows of the bins from that edge up: those with logit :math:`\ge t` less the ones
between :math:`t` and the edge).

**Uncertainty.** Given the number of positives :math:`n_+` of the scored set, each point also
carries its counts (:math:`\mathrm{TP}` and the rows flagged) and 95% Wilson score intervals
for its precision (:math:`\mathrm{TP}` of the flagged rows) and recall (:math:`\mathrm{TP}` of
:math:`n_+`): with a handful of positives a threshold chosen on them says little about new data.
Below :data:`FEW_POSITIVES` positives, :func:`few_positives_warning` says so in one line.

A point's ``logit`` is the threshold on the model's logit (exact: a decision "logit >= t" on
the same rows gives exactly that precision and recall); its ``threshold`` is the same point on
the probability scale, :math:`\sigma(t)` rounded to float32 like the ``score`` column of
``slate predict``, so that "score >= threshold" takes the same decisions except between rows
whose probabilities float32 cannot tell apart: every logit above about +16.6 has probability
exactly 1 (negative logits stay apart much longer: :math:`\sigma(-17) = 4.1 \cdot 10^{-8}`, and
torch's float32 sigmoid reaches 0 only below about -88.7).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "PRECISION_TARGETS",
    "RECALL_TARGETS",
    "OperatingPoint",
    "at_precision",
    "at_recall",
    "at_threshold",
    "few_positives_warning",
    "mark_label",
    "marks",
    "operating_points",
    "probability",
    "unreached_marks",
    "wilson_interval",
]

RECALL_TARGETS = (0.5, 0.8, 0.9, 0.95)
PRECISION_TARGETS = (0.5, 0.8, 0.9)
FEW_POSITIVES = 30  # fewer positives than this: thresholds chosen on them are noted as uncertain
_Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_interval(successes: int, trials: int, z: float = _Z95) -> tuple[float, float]:
    r"""The Wilson score interval of a binomial proportion (95% for the default ``z``):
    :math:`\frac{\hat p + z^2/2n \pm z\sqrt{\hat p(1-\hat p)/n + z^2/4n^2}}{1 + z^2/n}`."""
    if trials <= 0:
        return (0.0, 1.0)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def few_positives_warning(positives: int, what: str = "the test set") -> str | None:
    """A one-line warning when ``positives`` is below :data:`FEW_POSITIVES`, else None."""
    if positives >= FEW_POSITIVES:
        return None
    return (
        f"warning: {what} holds only {positives} positive{'s' if positives != 1 else ''}; "
        "thresholds and operating points chosen on so few are uncertain (see their 95% "
        "intervals), and AP varies widely from one such set to another."
    )


@dataclass(frozen=True)
class OperatingPoint:
    """One row of the table: the target, and the chosen threshold's precision and recall.

    ``precision``, ``recall``, ``logit`` and ``threshold`` are ``None`` when no threshold
    reaches the target.
    """

    kind: str  # "precision_at_recall" or "recall_at_precision"
    target: float
    precision: float | None
    recall: float | None
    logit: float | None
    threshold: float | None
    positives: int | None = None  # n_+ of the scored set
    true_positives: int | None = None
    flagged: int | None = None  # rows at or above the threshold

    @property
    def precision_interval(self) -> tuple[float, float] | None:
        """95% Wilson interval of the precision, from the counts."""
        if self.flagged is None or self.true_positives is None:
            return None
        return wilson_interval(self.true_positives, self.flagged)

    @property
    def recall_interval(self) -> tuple[float, float] | None:
        """95% Wilson interval of the recall, from the counts."""
        if self.positives is None or self.true_positives is None:
            return None
        return wilson_interval(self.true_positives, self.positives)

    def with_counts(self, positives: int) -> OperatingPoint:
        """The point with its counts, given the scored set's number of positives."""
        if not self.reachable:
            return OperatingPoint(self.kind, self.target, None, None, None, None, positives)
        true_positives = round(self.recall * positives)
        flagged = round(true_positives / self.precision) if self.precision else 0
        return OperatingPoint(
            self.kind, self.target, self.precision, self.recall, self.logit, self.threshold,
            positives, true_positives, flagged,
        )  # fmt: skip

    @property
    def reachable(self) -> bool:
        return self.logit is not None

    def describe(self) -> str:
        """``recall >= 0.90`` or ``precision >= 0.50``."""
        what = "recall" if self.kind == "precision_at_recall" else "precision"
        return f"{what} >= {self.target:.2f}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "precision": self.precision,
            "recall": self.recall,
            "threshold": self.threshold,
            "logit": self.logit,
            "positives": self.positives,
            "true_positives": self.true_positives,
            "flagged": self.flagged,
            "precision_interval": _listed(self.precision_interval),
            "recall_interval": _listed(self.recall_interval),
        }

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> OperatingPoint:
        return cls(
            saved["kind"], float(saved["target"]), saved["precision"], saved["recall"],
            saved["logit"], saved["threshold"], saved.get("positives"),
            saved.get("true_positives"), saved.get("flagged"),
        )  # fmt: skip


def _listed(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [interval[0], interval[1]]


def probability(logit: float) -> float:
    """:math:`\\sigma(t)` in float32, as a Python float (the ``score`` column's rounding)."""
    return float(torch.sigmoid(torch.tensor(logit, dtype=torch.float32)))


def _curve(precision, recall, logits) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The curve's real thresholds (the ``+inf`` point that flags nothing left out)."""
    p = np.asarray(precision, dtype=np.float64).ravel()
    r = np.asarray(recall, dtype=np.float64).ravel()
    t = np.asarray(logits, dtype=np.float64).ravel()
    if not (p.shape == r.shape == t.shape):
        raise ValueError(
            f"precision, recall and thresholds differ in length ({p.size}, {r.size}, {t.size})"
        )
    real = t < np.inf
    return p[real], r[real], t[real]


def _point(
    kind: str, target: float, p, r, t, candidates: np.ndarray, primary, secondary
) -> OperatingPoint:
    if not candidates.any():
        return OperatingPoint(kind, float(target), None, None, None, None)
    rows = np.flatnonzero(candidates)
    # The largest (primary, secondary, threshold); np.lexsort sorts by its last key first.
    best = rows[np.lexsort([t[rows], secondary[rows], primary[rows]])[-1]]
    logit = float(t[best])
    return OperatingPoint(
        kind, float(target), float(p[best]), float(r[best]), logit, probability(logit)
    )


def at_recall(precision, recall, logits, target: float) -> OperatingPoint:
    """The highest-precision threshold with recall :math:`\\ge` ``target`` (module doc)."""
    p, r, t = _curve(precision, recall, logits)
    return _point("precision_at_recall", target, p, r, t, r >= target, primary=p, secondary=r)


def at_precision(precision, recall, logits, target: float) -> OperatingPoint:
    """The highest-recall threshold with precision :math:`\\ge` ``target`` (module doc)."""
    p, r, t = _curve(precision, recall, logits)
    return _point("recall_at_precision", target, p, r, t, p >= target, primary=r, secondary=p)


def at_threshold(
    precision, recall, logits, logit: float, kind: str, target: float
) -> OperatingPoint:
    """The precision and recall of the decision "logit >= ``logit``" on a curve's rows (module
    doc), as a point of ``kind`` for ``target``; its ``logit`` is the curve threshold used.
    ``precision`` and ``logit`` are None when the threshold lies above every score (no row
    flagged: recall 0)."""
    p, r, t = _curve(precision, recall, logits)
    above = np.flatnonzero(t >= logit)
    if not above.size:
        return OperatingPoint(kind, float(target), None, 0.0, None, None)
    k = above[np.argmin(t[above])]
    edge = float(t[k])
    return OperatingPoint(kind, float(target), float(p[k]), float(r[k]), edge, probability(edge))


def operating_points(
    precision,
    recall,
    logits,
    recalls: tuple[float, ...] = RECALL_TARGETS,
    precisions: tuple[float, ...] = PRECISION_TARGETS,
    positives: int | None = None,
) -> list[OperatingPoint]:
    """The table: precision at each recall target, then recall at each precision target.

    ``precision``, ``recall`` and ``logits`` are aligned arrays of a curve's points (a point
    whose logit is ``+inf`` is ignored), e.g. the first two outputs of
    :func:`slate.metrics.precision_recall_curve` and its thresholds. With ``positives`` (the
    set's :math:`n_+`) every point carries its counts and 95% intervals.
    """
    table = [at_recall(precision, recall, logits, target) for target in recalls]
    table += [at_precision(precision, recall, logits, target) for target in precisions]
    if positives is not None:
        table = [point.with_counts(positives) for point in table]
    return table


def mark_label(point: OperatingPoint) -> str:
    """The point's short label on a PR plot: ``R≥0.90`` (recall target), ``P≥0.50``."""
    short = {"precision_at_recall": "R", "recall_at_precision": "P"}
    return f"{short[point.kind]}≥{point.target:.2f}"


def marks(table: list[OperatingPoint]) -> list[tuple[float, float, str]]:
    """The reachable points as ``(recall, precision, label)`` for a PR plot (``R≥0.90``)."""
    reached = [point for point in table if point.reachable]
    return [(point.recall, point.precision, mark_label(point)) for point in reached]


def unreached_marks(table: list[OperatingPoint]) -> list[str]:
    """The labels of the points no threshold reaches (``P≥0.90``), for the plot's note."""
    return [mark_label(point) for point in table if not point.reachable]
