r"""AP, AUROC and the PR curve of the union of all parties' test sets, from summed histograms.

No party sends another its scores. Each party sorts the scores of its own test rows into the same
fixed public bins and counts, per bin, its negatives and positives: a ``(2, B)`` table. The
tables are summed over the parties (one all-reduce; under ``--roster`` a masked sum, so that a
party learns only the summed table, not another's), and every party computes the metrics of the
union from the sum. The sum is the only exchange: the bins are known to every site before the
run and depend on no data, so nothing but the summed counts is revealed. This is the building
block torchmetrics uses for fixed thresholds, applied here to AP.

**Bins** (:func:`grid_edges`). ``B = 4096`` bins, uniform in :math:`\operatorname{asinh}(s / c)`
of the logit :math:`s` on :math:`[-L, L]`, :math:`L` = :data:`LOGIT_RANGE` = 100,
:math:`c` = :data:`GRID_SCALE` = 0.5: bin :math:`k` holds the logits with
:math:`e_k \le s < e_{k+1}`, where

.. math::

    e_k = c \sinh\bigl((2k / B - 1)\,\operatorname{asinh}(L / c)\bigr), \quad 0 < k < B,
    \qquad e_0 = -\infty, \quad e_B = +\infty.

The asinh is linear near 0 and logarithmic far out, so the bins are about 1.5e-3 wide around
logit 0 (probabilities near 1/2), 0.029 at logit 10 and 0.29 at 100; logits beyond
:math:`\pm L` (past what a float32 probability resolves: its sigmoid is 0 below about -88.7)
fall into the end bins. The edge :math:`e_{B/2}` is 0, probability 1/2. A bin is a threshold:
the metrics from the counts are *exactly* those of scikit-learn on the scores rounded to their
bins (the bin index), ties within a bin included. On w7a the AP of the binned scores was within
2e-4 of scikit-learn's AP on the raw scores for every model measured (``python -m
benchmarks.histogram_grid``, docs/deployment.md).

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
:math:`\max(L, U)`. It is computed from the summed counts alone, holds for any bins (the end
bins and exact ties included), and is a worst case: it covers every order inside a bin, also
of scores that are exactly tied in the raw data. For AUROC only the pairs inside one bin are
uncertain: the bound is :math:`\frac{1}{2 n_+ n_-}\sum_k p_k q_k`.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "DEFAULT_BINS",
    "GRID_SCALE",
    "LOGIT_RANGE",
    "BinnedMetrics",
    "bin_index",
    "binned_counts",
    "grid_edges",
    "lower_edges",
    "metrics_from_counts",
]

DEFAULT_BINS = 4096  # the public grid: a (2, 4096) table of counts, summed over the sites
# The grid covers logits in [-LOGIT_RANGE, LOGIT_RANGE], uniform in asinh(logit). The float32
# sigmoid is exactly 1 from a logit of about +16.6 up and 0 below about -88.7: the range spans
# every logit a float32 probability tells apart, and more. Scores beyond share an end bin, and a
# run warns when many test scores do (slate.training.evaluation.end_bin_warning).
LOGIT_RANGE = 100.0
# The logit below which the grid is about uniform in the logit and above which in its logarithm:
# on w7a's models 0.5 gave the smallest largest AP error of 1, 0.5, 0.25 and 0.1.
GRID_SCALE = 0.5


@functools.lru_cache(maxsize=8)
def _inner_edges(bins: int, limit: float) -> np.ndarray:
    k = np.arange(1, bins, dtype=np.float64)
    edges = GRID_SCALE * np.sinh((2.0 * k / bins - 1.0) * np.arcsinh(limit / GRID_SCALE))
    if bins % 2 == 0:
        edges[bins // 2 - 1] = 0.0  # exactly (sinh(0) is 0; the product may round off it)
    edges.flags.writeable = False
    return edges


def grid_edges(bins: int = DEFAULT_BINS, limit: float = LOGIT_RANGE) -> np.ndarray:
    r"""The ``bins + 1`` edges :math:`e_0 = -\infty < e_1 < \dots < e_{B-1} < e_B = +\infty`
    of the public grid (module doc): bin :math:`k` holds the logits in :math:`[e_k, e_{k+1})`.
    Fixed by ``bins`` and ``limit`` alone, so every site knows them before the run."""
    return np.concatenate([[-np.inf], _inner_edges(bins, limit), [np.inf]])


def lower_edges(index: np.ndarray, bins: int = DEFAULT_BINS, limit: float = LOGIT_RANGE):
    r"""The logit threshold of each bin in ``index``: its lower edge :math:`e_k`
    (:math:`-\infty` for bin 0, which also holds every logit below :math:`e_1`).

    A logit :math:`s` falls in a bin :math:`\ge k` exactly when :math:`s \ge e_k`
    (:func:`bin_index` compares with the same float64 edges), so "positive when logit >=
    :math:`e_k`" flags the rows counted in bins :math:`k` and above."""
    return grid_edges(bins, limit)[np.asarray(index, dtype=np.int64)]


def bin_index(scores: Tensor, bins: int = DEFAULT_BINS, limit: float = LOGIT_RANGE) -> Tensor:
    """The bin of each logit, ``0..bins-1``: how many inner edges :math:`e_1..e_{B-1}` are at or
    below it (``-inf`` and logits below :math:`e_1` in bin 0, ``+inf`` in the last; NaN, which
    stops a run before its metrics are read, in the last)."""
    s = scores.detach().to(torch.float64).cpu().reshape(-1).contiguous()
    edges = torch.from_numpy(_inner_edges(bins, limit).copy())
    return torch.searchsorted(edges, s, right=True)


def binned_counts(
    scores: Tensor, labels: Tensor, bins: int = DEFAULT_BINS, limit: float = LOGIT_RANGE
) -> Tensor:
    """``(2, bins)`` float64 counts: row 0 the negatives, row 1 the positives, per bin."""
    index = bin_index(scores, bins, limit)
    y = labels.detach().cpu().to(torch.int64).reshape(-1)
    flat = torch.bincount(y * bins + index, minlength=2 * bins)
    return flat.to(torch.float64).view(2, bins)


class BinnedMetrics:
    """The ranking metrics of the rows counted in a ``(2, bins)`` table (see the module doc)."""

    def __init__(self, counts: Tensor) -> None:
        """``counts[:, k]``: negatives and positives of bin ``k``, bins in increasing score
        order."""
        counts = counts.detach().to(torch.float64).cpu()
        if counts.ndim != 2 or counts.shape[0] != 2:
            raise ValueError(f"counts must have shape (2, bins), got {tuple(counts.shape)}")
        # Decreasing score order, empty bins dropped: each remaining bin is one threshold.
        flipped = torch.flip(counts, (1,))
        keep = flipped.sum(0) > 0
        self.negatives, self.positives = flipped[0, keep], flipped[1, keep]
        self.bin = torch.flip(torch.arange(counts.shape[1]), (0,))[keep]  # bin index, decreasing
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
