r"""Feature standardisation with statistics that no party has to pool rows for.

``--standardize`` z-scores every feature, :math:`z_j = (x_j - \mu_j) / \sigma_j`, with the mean
and the (population) standard deviation of the union of all parties' training rows. They come
from two rounds of summed aggregates, so that only per-feature sums leave a party:

1. every party sums its row count :math:`n_k` and its feature sums :math:`\sum_i x_{ij}`;
   summed over parties, :math:`\mu_j = \sum_k \sum_i x_{ij} / \sum_k n_k`;
2. every party sums its squared deviations from that global mean,
   :math:`\sum_i (x_{ij} - \mu_j)^2`; summed, :math:`\sigma_j^2 = \cdot / \sum_k n_k`.

The second round is the sum of squares taken about the global mean instead of about zero: the
same aggregate, without the cancellation that :math:`E[x^2] - \mu^2` suffers for features of
large magnitude (an income of 1e6). The result equals the pooled statistics up to float64
rounding. A constant feature (:math:`\sigma_j = 0`) is only centred: it is divided by 1.
LIBSVM data is scaled without centring, :math:`x_j / \sigma_j`, so that zeros stay zeros.

With the sites' declarations (:class:`slate.data.declared.Declared`), the summed rows must equal
the declared training rows, each mean must lie in its column's declared range, and each
variance in :math:`[0, (hi - lo)^2 / 4]`; a sum that breaks one stops the run. Each site then
clamps the federated mean and standard deviation by its own rows' (``--declared-bounds``
scale, :func:`slate.data.plausible.bound_moments`), saying where the clamp bound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from slate.data.plausible import bound_moments

if TYPE_CHECKING:
    from slate.data.declared import Declared

__all__ = ["Standardizer", "federated_moments"]

ALL_FEATURES = ""  # slate.data.declared.ALL_FEATURES: one declared range over every feature
Total = Callable[..., Tensor]  # (value, what) -> the value summed over all processes


def _local_total(value: Tensor, what: str = "") -> Tensor:
    del what
    return value


def federated_moments(
    blocks: Sequence[np.ndarray],
    total: Total = _local_total,
    declared: Declared | None = None,
    columns: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Global per-feature mean and standard deviation of the rows of all parties.

    Args:
        blocks: this process's parties' training features, each ``(n_k, d)``.
        total: sums a float64 tensor over all processes (identity in one process); it is
            told what it sums (``"standardisation sums"``, ``"standardisation squares"``).
        declared: the sites' declarations that the sums are checked against (module
            docstring); ``None`` in one process.
        columns: each feature's column in the declared ranges (default: one range over every
            feature, :data:`~slate.data.declared.ALL_FEATURES`).

    Returns:
        ``(mean, std, rows)``: float64 arrays of shape ``(d,)`` and the global row count.
    """
    width = blocks[0].shape[1]
    sums = torch.zeros(width + 1, dtype=torch.float64)
    for block in blocks:
        sums[0] += block.shape[0]
        sums[1:] += torch.from_numpy(block.sum(axis=0, dtype=np.float64))
    sums = total(sums, "standardisation sums")
    names = list(columns) if columns is not None else [ALL_FEATURES] * width
    if declared is not None:
        declared.check_rows(float(sums[0]), "rows of the standardisation sums")
    rows = int(sums[0])
    mean = (sums[1:] / max(rows, 1)).numpy()
    if declared is not None:
        declared.check_means(mean, names, "standardisation sums")
    squares = torch.zeros(width, dtype=torch.float64)
    for block in blocks:
        squares += torch.from_numpy(((block.astype(np.float64) - mean) ** 2).sum(axis=0))
    variance = total(squares, "standardisation squares").numpy() / max(rows, 1)
    if declared is not None:
        declared.check_variances(variance, names)
    std = np.sqrt(variance)
    if declared is not None and declared.scale_bound is not None:
        mean, std = _bounded(blocks, mean, std, declared, columns)
    return mean, std, rows


def _bounded(
    blocks: Sequence[np.ndarray],
    mean: np.ndarray,
    std: np.ndarray,
    declared: Declared,
    columns: Sequence[str] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The federated moments clamped by this site's own rows
    (:func:`slate.data.plausible.bound_moments`); where the clamp bound, the site's note."""
    assert declared.scale_bound is not None
    mean, std, note = bound_moments(blocks, mean, std, declared.scale_bound, columns)
    if note:
        declared.notes.append(note)
    return mean, std


@dataclass(frozen=True)
class Standardizer:
    """``z = (x - mean) / scale`` per feature; ``scale`` is the std, 1 where the std is 0."""

    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def fit(
        cls,
        blocks: Sequence[np.ndarray],
        total: Total = _local_total,
        centre: bool = True,
        declared: Declared | None = None,
        columns: Sequence[str] | None = None,
    ) -> Standardizer:
        """Fit on every party's training rows. ``centre=False`` only divides by the standard
        deviation (LIBSVM data: zeros stay zeros, a sparse matrix stays sparse);
        ``declared`` and ``columns``: :func:`federated_moments`'."""
        mean, std, _ = federated_moments(blocks, total, declared, columns)
        scale = np.where(std > 0, std, 1.0)
        return cls(mean if centre else np.zeros_like(mean), scale)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The standardised copy of ``x (n, d)``, float32."""
        out = (x.astype(np.float64) - self.mean) / self.scale
        return out.astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "standardize", "mean": self.mean.tolist(), "scale": self.scale.tolist()}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Standardizer:
        return cls(np.asarray(saved["mean"], np.float64), np.asarray(saved["scale"], np.float64))
