r"""The named graphs: ring, full, star, torus, exponential, Erdős–Rényi and federated.

Every builder but :func:`federated` returns a plain ``float64`` (N, N) mixing matrix; the graphs
other than ring and full carry Metropolis-Hastings weights
:math:`w_{ij} = 1 / (1 + \max(d_i, d_j))` on their edges. :func:`federated` returns a
:class:`~slate.topology.schedule.Topology` with a period.
"""

from __future__ import annotations

import math

import numpy as np

from slate.errors import TopologyError
from slate.topology.graph import (
    averaging_matrix,
    check_n,
    connected_components,
    metropolis_hastings,
)
from slate.topology.schedule import Topology

__all__ = ["erdos_renyi", "exponential", "federated", "full", "ring", "star", "torus"]

#: Attempts :func:`erdos_renyi` makes to draw a connected graph.
_ER_MAX_TRIES = 1000


def ring(n: int) -> np.ndarray:
    r"""The paper's ring: each node averages itself and its two neighbours.

    For :math:`N \ge 3`, :math:`w_{ii} = w_{i,i\pm1 \bmod N} = 1/3`; its eigenvalues are
    :math:`(1 + 2\cos(2\pi k/N))/3`, so :math:`\lambda = (1 + 2\cos(2\pi/N))/3` for
    :math:`N \ge 4` (:math:`N = 3` gives :math:`\mathbf{J}`). For :math:`N = 1` it is
    ``[[1]]``. For :math:`N = 2` the two neighbours :math:`i \pm 1` coincide, so the 1/3 weights
    would give rows ``[1/3, 2/3]`` (neither symmetric-looking nor the intended ring); we use
    :math:`w_{ij} = 1/2` for all entries, i.e. :math:`\mathbf{J}`.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix.
    """
    n = check_n(n)
    if n <= 2:
        return averaging_matrix(n)
    W = np.zeros((n, n), dtype=np.float64)
    idx = np.arange(n)
    W[idx, idx] = 1.0 / 3.0
    W[idx, (idx + 1) % n] = 1.0 / 3.0
    W[idx, (idx - 1) % n] = 1.0 / 3.0
    return W


def full(n: int) -> np.ndarray:
    r"""Complete averaging :math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top` (lambda = 0).

    With this matrix every round is an exact average: SLATE becomes distributed
    (data-parallel) training.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix with every entry :math:`1/N`.
    """
    return averaging_matrix(check_n(n))


def star(n: int) -> np.ndarray:
    r"""A star: node 0 is linked to every other node, with Metropolis-Hastings weights.

    The hub has degree :math:`N - 1` and the leaves degree 1, so :math:`w_{0j} = 1/N`,
    :math:`w_{00} = 1/N` and :math:`w_{jj} = 1 - 1/N` for the leaves; :math:`\lambda = 1 - 1/N`.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix.
    """
    n = check_n(n)
    adj = np.zeros((n, n), dtype=bool)
    adj[0, 1:] = True
    adj[1:, 0] = True
    return metropolis_hastings(adj)


def _torus_shape(n: int) -> tuple[int, int]:
    """Rows r <= cols c with r * c = n and r the largest divisor of n not above sqrt(n)."""
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def torus(n: int) -> np.ndarray:
    r"""A 2-D torus (grid with wrap-around) with Metropolis-Hastings weights.

    The :math:`N` nodes form an :math:`r \times c` grid with :math:`rc = N` and :math:`r`
    the divisor of :math:`N` closest to :math:`\sqrt N` from below (a prime :math:`N` gives a
    :math:`1 \times N` ring). Node :math:`(a, b)` is linked to
    :math:`(a \pm 1 \bmod r, b)` and :math:`(a, b \pm 1 \bmod c)`; neighbours that coincide
    (a side of length 2) or are the node itself (a side of length 1) are counted once or not at
    all, so the degree is 4 when both sides are at least 3.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix.
    """
    n = check_n(n)
    rows, cols = _torus_shape(n)
    adj = np.zeros((n, n), dtype=bool)
    for a in range(rows):
        for b in range(cols):
            node = a * cols + b
            for da, db in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                other = ((a + da) % rows) * cols + (b + db) % cols
                if other != node:
                    adj[node, other] = adj[other, node] = True
    return metropolis_hastings(adj)


def exponential(n: int) -> np.ndarray:
    r"""The exponential graph with Metropolis-Hastings weights.

    Node :math:`i` is linked to :math:`i \pm 2^k \bmod N` for every :math:`k \ge 0` with
    :math:`2^k < N` (the relation is symmetric by construction; coinciding neighbours count
    once). For :math:`N = 2^m` every node has degree :math:`2m - 1`.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix.
    """
    n = check_n(n)
    adj = np.zeros((n, n), dtype=bool)
    idx = np.arange(n)
    hop = 1
    while hop < n:
        adj[idx, (idx + hop) % n] = True
        adj[idx, (idx - hop) % n] = True
        hop *= 2
    adj = adj | adj.T
    return metropolis_hastings(adj)


def erdos_renyi(n: int, p: float | None = None, seed: int = 0) -> np.ndarray:
    r"""A connected Erdős–Rényi graph :math:`G(N, p)` with Metropolis-Hastings weights.

    Each of the :math:`N(N-1)/2` possible edges is present independently with probability
    :math:`p` (default :math:`\min(1, 2\ln N / N)`, above the connectivity threshold
    :math:`\ln N / N`). Graphs are drawn from ``numpy.random.default_rng(seed)`` until one is
    connected, so the result is a deterministic function of ``(n, p, seed)``.

    Args:
        n: number of nodes :math:`N \ge 1`.
        p: edge probability in :math:`(0, 1]`, or ``None`` for the default.
        seed: seed of the random generator.

    Returns:
        The (N, N) float64 matrix.

    Raises:
        TopologyError: if ``p`` is not in :math:`(0, 1]` or no connected graph was drawn in
            1000 tries.
    """
    n = check_n(n)
    if p is None:
        p = 1.0 if n == 1 else min(1.0, 2.0 * math.log(n) / n)
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating, np.integer)):
        raise TopologyError(
            f"The Erdős–Rényi edge probability must be a number in (0, 1], got {p!r}."
        )
    p = float(p)
    if not (0.0 < p <= 1.0):
        raise TopologyError(
            f"The Erdős–Rényi edge probability must be in (0, 1] (0 can never give a connected "
            f"graph), got {p!r}."
        )
    if n == 1:
        return np.ones((1, 1), dtype=np.float64)
    rng = np.random.default_rng(seed)
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    for _ in range(_ER_MAX_TRIES):
        adj = (rng.random((n, n)) < p) & upper
        adj = adj | adj.T
        if len(connected_components(adj.astype(np.float64))) == 1:
            return metropolis_hastings(adj)
    raise TopologyError(
        f"Could not draw a connected Erdős–Rényi graph with N = {n} nodes and edge probability "
        f"p = {p:g} in {_ER_MAX_TRIES} tries (seed {seed}); use a larger probability, e.g. "
        f"at least 2 ln(N)/N = {2.0 * math.log(n) / n:.3g}."
    )


def federated(n: int, period: int = 10) -> Topology:
    r"""Federated learning: :math:`\mathbf{W} = \mathbf{I}`, :math:`\mathbf{J}` every q-th round.

    Args:
        n: number of nodes :math:`N \ge 1`.
        period: :math:`q \ge 1`; iteration :math:`t` averages exactly when
            :math:`(t + 1) \bmod q = 0`.

    Returns:
        The :class:`Topology` named ``"federated"``.
    """
    n = check_n(n)
    return Topology(name="federated", W=np.eye(n, dtype=np.float64), period=period)
