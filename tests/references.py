"""Independent references shared by several test files, written straight from the formulas."""

from __future__ import annotations

import numpy as np


def brute_force_mh(adjacency: np.ndarray) -> np.ndarray:
    """Metropolis-Hastings weights, one entry at a time, straight from the formula."""
    n = adjacency.shape[0]
    degree = [sum(1 for j in range(n) if j != i and adjacency[i, j]) for i in range(n)]
    W = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j and adjacency[i, j]:
                W[i, j] = 1.0 / (1.0 + max(degree[i], degree[j]))
        W[i, i] = 1.0 - sum(W[i, j] for j in range(n) if j != i)
    return W
