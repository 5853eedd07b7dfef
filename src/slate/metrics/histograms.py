r"""AP, AUROC and the PR curve of the union of all parties' test sets, from summed histograms.

No party sends another its scores. Each party sorts the scores of its own test rows into the same
fixed bins and counts, per bin, its negatives and positives: a ``(2, B)`` table. The tables are
summed over the parties (one all-reduce; under ``--roster`` a masked sum, so that a party learns
only the summed table, not another's), and every party computes the metrics of the union from
the sum. The bitmap of the bins that hold a party's positives is OR-ed, not summed: under a
roster every party sees every other's bitmap. This is the building block torchmetrics uses for
fixed thresholds, applied here to AP.

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
    "SegmentTable",
    "bin_index",
    "binned_counts",
    "metrics_from_counts",
    "positive_bins_bitmap",
]

DEFAULT_BINS = 1 << 17  # 131 072 bins, exchanged as a 16 KiB bitmap and segment counts
# The bins cover logits in [-LOGIT_RANGE, LOGIT_RANGE]. The float32 sigmoid is exactly 1 from a
# logit of about +16.6 up, but not 0 below -17: sigmoid(-17) = 4.1e-8 and sigmoid(-20) = 2.1e-9;
# torch's float32 sigmoid gives 0 only below about -88.7. The range is not where scores vanish: it
# is chosen to span the logits of a model still learning (the top end a little past the point
# where float32 probabilities saturate), so that its 2^17 bins are 3e-4 wide. Scores beyond share
# an end bin, and a run warns when many test scores do (slate.training.evaluation.end_bin_warning).
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

    def __init__(self, counts: Tensor, bins: Tensor | np.ndarray | None = None) -> None:
        """``counts[:, j]``: negatives and positives of row ``j``, rows in increasing score
        order; ``bins[j]`` is the bin whose lower edge is row ``j``'s threshold (by default
        row ``j`` is bin ``j``: a dense table)."""
        counts = counts.detach().to(torch.float64).cpu()
        if counts.ndim != 2 or counts.shape[0] != 2:
            raise ValueError(f"counts must have shape (2, bins), got {tuple(counts.shape)}")
        row_bin = torch.arange(counts.shape[1]) if bins is None else torch.as_tensor(bins)
        # Decreasing score order, empty rows dropped: each remaining row is one threshold.
        flipped = torch.flip(counts, (1,))
        keep = flipped.sum(0) > 0
        self.negatives, self.positives = flipped[0, keep], flipped[1, keep]
        self.bin = torch.flip(row_bin.to(torch.int64), (0,))[keep]  # bin index, decreasing
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


def metrics_from_counts(counts: Tensor, bins: np.ndarray | None = None) -> dict[str, float]:
    """AP, AUROC and their bounds from a summed ``(2, bins)`` table (or the rows of a
    :class:`SegmentTable`, with their ``bins``)."""
    binned = BinnedMetrics(counts, bins)
    ap, ap_bound = binned.average_precision()
    auc, auc_bound = binned.auroc()
    return {
        "test_ap": ap,
        "test_ap_error_bound": ap_bound,
        "test_auroc": auc,
        "test_auroc_error_bound": auc_bound,
    }


# -- the exchange: a bitmap of the bins that hold positives, then counts per segment -----------


def positive_bins_bitmap(scores: Tensor, labels: Tensor, bins: int = DEFAULT_BINS) -> Tensor:
    """The bins holding at least one positive, as bits of ``int64`` words (bit ``k % 64`` of
    word ``k // 64`` is bin ``k``): ``ceil(bins / 64)`` words, 16 KiB for the default bins.
    A bitwise OR over the parties gives the union (:class:`SegmentTable`)."""
    held = np.zeros(-(-bins // 64) * 64, dtype=bool)
    index = bin_index(scores, bins)[labels.to(torch.bool)].cpu().numpy()
    held[index] = True
    words = np.packbits(held, bitorder="little").view("<i8")
    return torch.from_numpy(words.copy())


class SegmentTable:
    r"""The rows of a federated evaluation: every bin holding a positive, and between two such
    bins one row of the negatives in the bins strictly between (a *segment*).

    The binned AP, AUROC and their bounds (module doc) read the counts of the bins that hold
    positives, and of the negatives only how many lie above each of those bins. Summing the
    negatives of a segment therefore changes none of them: the metrics of these rows are
    *exactly* those of the dense ``(2, bins)`` table. A segment row's threshold is the lower
    edge of the bin just above the positive bin below it, which flags the same rows as the
    dense curve's point at the segment's lowest non-empty bin; the dense curve's other points
    inside a segment (same recall, lower precision) are left out. The end bins ``0`` and
    ``bins - 1`` are always rows of their own, for
    :func:`slate.training.evaluation.end_bin_warning`.

    The exchange is a bitwise OR of :func:`positive_bins_bitmap` (16 KiB) and a sum of
    :meth:`counts` (``2 (2K - 1)`` integers for ``K`` boundaries): no party learns more than
    the union of the bins that hold positives and the summed counts, instead of a 2 MiB
    float64 table.
    """

    def __init__(self, union: Tensor, bins: int = DEFAULT_BINS) -> None:
        """``union``: the OR of every party's :func:`positive_bins_bitmap`."""
        self.n_bins = bins
        words = union.detach().cpu().numpy().astype("<i8")
        held = np.unpackbits(words.view(np.uint8), bitorder="little")[:bins].astype(bool)
        held[[0, bins - 1]] = True
        self.bounds = np.flatnonzero(held)  # increasing bin indices of the boundary rows

    @property
    def row_bins(self) -> np.ndarray:
        """The threshold bin of each row: a boundary's own bin, or for the segment above
        boundary ``i`` the bin just above it (``bounds[i] + 1``)."""
        rows = np.empty(2 * len(self.bounds) - 1, dtype=np.int64)
        rows[0::2] = self.bounds
        rows[1::2] = self.bounds[:-1] + 1
        return rows

    def counts(self, scores: Tensor, labels: Tensor) -> Tensor:
        """This party's ``(2, 2K - 1)`` ``int64`` counts: row 0 negatives, row 1 positives,
        per boundary bin and per segment, in increasing score order."""
        index = bin_index(scores, self.n_bins).cpu().numpy()
        bounds = self.bounds
        at = np.searchsorted(bounds, index)  # the first boundary >= the bin
        on_bound = bounds[np.minimum(at, len(bounds) - 1)] == index
        rows = np.where(on_bound, 2 * at, 2 * at - 1)
        y = labels.detach().cpu().numpy().astype(np.int64)
        if bool((y[~on_bound] != 0).any()):
            raise ValueError("a positive lies outside the bins of the bitmap it was counted in")
        width = 2 * len(bounds) - 1
        flat = np.bincount(y * width + rows, minlength=2 * width)
        return torch.from_numpy(flat.reshape(2, width).astype(np.int64))
