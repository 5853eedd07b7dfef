r"""Graph primitives shared by the topology modules.

A network of :math:`N` parties is an undirected graph; these helpers check :math:`N`, build
:math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top`, put Metropolis-Hastings weights on a
boolean adjacency matrix, list the connected components of a weight matrix and say whether it
is connected.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from slate.errors import TopologyError

__all__ = [
    "averaging_matrix",
    "check_n",
    "connected_components",
    "diameter",
    "is_connected",
    "metropolis_hastings",
]


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


def diameter(W: np.ndarray) -> int:
    """The most hops between two nodes of the graph of ``W`` (breadth-first search from each
    node); the largest component's when the graph is disconnected."""
    n = W.shape[0]
    linked = (W > 0) | (W.T > 0)
    np.fill_diagonal(linked, False)
    longest = 0
    for start in range(n):
        hops = np.full(n, -1)
        hops[start] = 0
        frontier = [start]
        while frontier:
            reached = np.flatnonzero(linked[frontier].any(axis=0) & (hops < 0))
            hops[reached] = hops[frontier[0]] + 1
            frontier = reached.tolist()
        longest = max(longest, int(hops.max()))
    return longest


def is_connected(W: object) -> bool:
    r"""Whether the graph of ``W`` is connected.

    The graph has the nodes :math:`0, \dots, N - 1` and an undirected edge :math:`\{i, j\}`
    wherever :math:`w_{ij} > 0` or :math:`w_{ji} > 0` (:math:`i \ne j`); the diagonal is
    ignored. It is connected when every node reaches every other along edges (breadth-first
    search from node 0). A single node is connected. For a symmetric doubly stochastic ``W``
    with a positive diagonal this is equivalent to :math:`\lambda = \|\mathbf{W} - \mathbf{J}\|_2
    < 1`, but it is decided combinatorially, without a tolerance.

    Args:
        W: an (N, N) weight matrix, or a boolean adjacency matrix, :math:`N \ge 1`.

    Returns:
        True iff the graph has exactly one connected component.

    Raises:
        TopologyError: if ``W`` is not a non-empty square 2-D array of real numbers or booleans.
    """
    arr = np.asarray(W)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] == 0:
        raise TopologyError(
            f"Cannot tell whether a graph is connected from an array of shape "
            f"{tuple(arr.shape)}: it must be a non-empty square (N x N) matrix."
        )
    if arr.dtype.kind not in "biuf":
        raise TopologyError(
            f"Cannot tell whether a graph is connected from entries of dtype {arr.dtype}: the "
            "matrix must hold real numbers or booleans."
        )
    return len(connected_components(arr)) == 1
