r"""AP, AUROC and the PR curve of the union of all parties' test sets, from summed histograms.

No party shows another its scores. Each party sorts the scores of its own test rows into the same
fixed bins and counts, per bin, its negatives and positives: a ``(2, B)`` table. The tables are
summed over the parties (one all-reduce), and every party computes the metrics of the union from
the sum. This is the building block torchmetrics uses for fixed thresholds, applied here to AP.

**Bins.** ``B`` equal bins of the logit on ``[-LOGIT_RANGE, LOGIT_RANGE]``; logits beyond fall
into the end bins. A bin is a threshold: the metrics from the counts are *exactly* those of
scikit-learn on the scores rounded to their bins (the bin index), ties within a bin included.

**Error bounds.** Let bin :math:`k` (bins in decreasing score order) hold :math:`p_k`
positives and :math:`q_k` negatives, with :math:`T` positives and :math:`C` rows in the
bins above it. Whatever the order of the raw scores inside the bin (ties included), each of its
positives is scored by scikit-learn with a precision :math:`(T + a) / (C + a + c)`,
:math:`1 \le a \le p_k`, :math:`0 \le c \le q_k`, which lies between

.. math::

    P^{\min}_k = \min_{a \in \{1, p_k\}} \frac{T + a}{C + a + q_k}, \qquad
    P^{\max}_k = \max_{a \in \{1, p_k\}} \frac{T + a}{C + a},

while the binned AP gives them all :math:`P_k = (T + p_k) / (C + p_k + q_k)`. So the AP of the
raw scores lies in :math:`[\mathrm{AP} - L, \mathrm{AP} + U]` with
:math:`L = \sum_k \frac{p_k}{n_+}(P_k - P^{\min}_k)` and
:math:`U = \sum_k \frac{p_k}{n_+}(P^{\max}_k - P_k)`; the reported bound is
:math:`\max(L, U)`. For AUROC only the pairs inside one bin are uncertain: the bound is
:math:`\frac{1}{2 n_+ n_-}\sum_k p_k q_k`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "DEFAULT_BINS",
    "LOGIT_RANGE",
    "BinnedMetrics",
    "bin_index",
    "binned_counts",
    "metrics_from_counts",
]

DEFAULT_BINS = 1 << 17  # 131 072 bins: a 2 MiB all-reduce per evaluation
# The bins cover logits in [-LOGIT_RANGE, LOGIT_RANGE]. The float32 sigmoid is exactly 1 from a
# logit of about +16.6 up, but not 0 below -17: sigmoid(-17) = 4.1e-8 and sigmoid(-20) = 2.1e-9;
# torch's float32 sigmoid gives 0 only below about -88.7. The range is not where scores vanish: it
# is chosen to span the logits of a model still learning (the top end a little past the point
# where float32 probabilities saturate), so that its 2^17 bins are 3e-4 wide. Scores beyond share
# an end bin, and a run warns when many test scores do (slate.evaluation.end_bin_warning).
LOGIT_RANGE = 20.0


def bin_index(scores: Tensor, bins: int = DEFAULT_BINS, limit: float = LOGIT_RANGE) -> Tensor:
    """The bin of each logit: ``floor((clamp(s, -limit, limit) + limit) / width)``, 0..bins-1."""
    s = scores.detach().to(torch.float64).clamp(-limit, limit)
    index = torch.floor((s + limit) * (bins / (2 * limit))).to(torch.int64)
    return index.clamp_(0, bins - 1)


def binned_counts(
    scores: Tensor, labels: Tensor, bins: int = DEFAULT_BINS, limit: float = LOGIT_RANGE
) -> Tensor:
    """``(2, bins)`` float64 counts: row 0 the negatives, row 1 the positives, per bin."""
    index = bin_index(scores, bins, limit)
    y = labels.detach().to(torch.int64).reshape(-1)
    flat = torch.bincount(y * bins + index, minlength=2 * bins)
    return flat.to(torch.float64).view(2, bins)


class BinnedMetrics:
    """The ranking metrics of the rows counted in a ``(2, bins)`` table (see the module doc)."""

    def __init__(self, counts: Tensor) -> None:
        counts = counts.detach().to(torch.float64).cpu()
        if counts.ndim != 2 or counts.shape[0] != 2:
            raise ValueError(f"counts must have shape (2, bins), got {tuple(counts.shape)}")
        # Decreasing score order, empty bins dropped: each remaining bin is one threshold.
        flipped = torch.flip(counts, (1,))
        keep = flipped.sum(0) > 0
        self.negatives, self.positives = flipped[0, keep], flipped[1, keep]
        self.bin = torch.arange(counts.shape[1] - 1, -1, -1)[keep]  # bin index, decreasing
        self.n_pos = float(self.positives.sum())
        self.n_neg = float(self.negatives.sum())
        self.tp = torch.cumsum(self.positives, 0)  # after each bin
        self.seen = torch.cumsum(self.positives + self.negatives, 0)

    @property
    def rows(self) -> int:
        return int(self.n_pos + self.n_neg)

    def average_precision(self) -> tuple[float, float]:
        """``(AP, bound)``: AP of the binned scores and the bound on the raw scores' AP."""
        if self.n_pos == 0:
            raise ValueError("AP is undefined without a positive example")
        p, q = self.positives, self.negatives
        tp_before, seen_before = self.tp - p, self.seen - p - q
        precision = self.tp / self.seen
        ap = float((p * precision).sum() / self.n_pos)
        has = p > 0
        one = torch.ones_like(p)
        low = torch.minimum(
            (tp_before + one) / (seen_before + one + q), (tp_before + p) / (seen_before + p + q)
        )
        high = torch.maximum(
            (tp_before + one) / (seen_before + one), (tp_before + p) / (seen_before + p)
        )
        below = float((p * (precision - low))[has].sum() / self.n_pos)
        above = float((p * (high - precision))[has].sum() / self.n_pos)
        return ap, max(below, above, 0.0)

    def auroc(self) -> tuple[float, float]:
        """``(AUROC, bound)``: ties within a bin count one half, as in scikit-learn."""
        if self.n_pos == 0 or self.n_neg == 0:
            raise ValueError("AUROC needs both classes")
        pos_above = self.tp - self.positives
        pairs = float((self.negatives * (pos_above + 0.5 * self.positives)).sum())
        tied = float((self.negatives * self.positives).sum())
        total = self.n_pos * self.n_neg
        return pairs / total, 0.5 * tied / total

    def precision_recall_curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :func:`slate.metrics.precision_recall_curve` on the bin indices (increasing)."""
        precision = torch.flip(self.tp / self.seen, (0,))
        recall = torch.flip(self.tp / self.n_pos, (0,))
        return (
            np.append(precision.numpy(), 1.0),
            np.append(recall.numpy(), 0.0),
            torch.flip(self.bin, (0,)).numpy(),
        )


def metrics_from_counts(counts: Tensor) -> dict[str, float]:
    """AP, AUROC and their bounds from a summed ``(2, bins)`` table."""
    binned = BinnedMetrics(counts)
    ap, ap_bound = binned.average_precision()
    auc, auc_bound = binned.auroc()
    return {
        "test_ap": ap,
        "test_ap_error_bound": ap_bound,
        "test_auroc": auc,
        "test_auroc_error_bound": auc_bound,
    }
