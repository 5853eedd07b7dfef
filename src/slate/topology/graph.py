r"""Graph primitives shared by the topology modules.

A network of :math:`N` parties is an undirected graph; these helpers check :math:`N`, build
:math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top`, put Metropolis-Hastings weights on a
boolean adjacency matrix and list the connected components of a weight matrix.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from slate.errors import TopologyError

__all__ = ["averaging_matrix", "check_n", "connected_components", "metropolis_hastings"]


def check_n(n: object, what: str = "the number of nodes") -> int:
    """Return ``n`` as an int, or raise TopologyError unless it is an integer >= 1."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TopologyError(
            f"Invalid topology size: {what} must be an integer of at least 1, got {n!r} "
            f"(type {type(n).__name__})."
        )
    if n < 1:
        raise TopologyError(
            f"Invalid topology size: {what} must be at least 1 (a network needs one party or "
            f"more), got {int(n)}."
        )
    return int(n)


def averaging_matrix(n: int) -> np.ndarray:
    r"""Return :math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top` as float64."""
    return np.full((n, n), 1.0 / n, dtype=np.float64)


def metropolis_hastings(adjacency: np.ndarray) -> np.ndarray:
    r"""Metropolis-Hastings weights for a symmetric boolean adjacency matrix.

    :math:`w_{ij} = 1 / (1 + \max(d_i, d_j))` for every edge :math:`(i, j)`,
    :math:`w_{ii} = 1 - \sum_{j \ne i} w_{ij}` and 0 elsewhere, where :math:`d_i` is the degree
    of node :math:`i`. The result is symmetric and doubly stochastic with a positive diagonal,
    so :math:`\lambda < 1` exactly when the graph is connected.

    Args:
        adjacency: (N, N) symmetric boolean matrix; the diagonal is ignored.

    Returns:
        The (N, N) float64 mixing matrix.
    """
    adj = np.array(adjacency, dtype=bool)
    np.fill_diagonal(adj, False)
    degree = adj.sum(axis=1)
    pair_max = np.maximum(degree[:, None], degree[None, :])
    W = np.where(adj, 1.0 / (1.0 + pair_max), 0.0)
    np.fill_diagonal(W, 1.0 - W.sum(axis=1))
    return W


def connected_components(W: np.ndarray) -> list[list[int]]:
    """Connected components of the graph with an edge wherever ``w_ij > 0`` (``i != j``)."""
    n = W.shape[0]
    linked = (W > 0) | (W.T > 0)
    seen = np.zeros(n, dtype=bool)
    components: list[list[int]] = []
    for start in range(n):
        if seen[start]:
            continue
        seen[start] = True
        queue = deque([start])
        members = [start]
        while queue:
            node = queue.popleft()
            for other in np.flatnonzero(linked[node] & ~seen):
                seen[other] = True
                queue.append(int(other))
                members.append(int(other))
        components.append(sorted(members))
    return components
