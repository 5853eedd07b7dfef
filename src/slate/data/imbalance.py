"""The paper's imbalanced binary construction for multi-class image sets (Section 6.1)."""

from __future__ import annotations

import numpy as np

__all__ = ["binarize_classes", "drop_positives"]


def binarize_classes(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Classes ``0 .. n/2 - 1`` become negative (0), classes ``n/2 .. n - 1`` positive (1)."""
    return (labels >= n_classes // 2).astype(np.int64)


def drop_positives(labels: np.ndarray, n_classes: int, keep: float, seed: int) -> np.ndarray:
    """Indices to keep in the training set: all negatives and, of each positive class ``c``, a
    random ``int(keep * count_c)`` of its examples (REFERENCE.md: keep 20%)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x1B4A]))
    kept = [np.flatnonzero(labels < n_classes // 2)]
    for cls in range(n_classes // 2, n_classes):
        members = np.flatnonzero(labels == cls)
        kept.append(rng.choice(members, size=int(keep * len(members)), replace=False))
    return np.sort(np.concatenate(kept))
