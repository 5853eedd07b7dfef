r"""The time-varying :class:`Topology`: a gossip matrix, periodic averaging, or a cycle of rounds.

On iteration :math:`t` the parties apply

- the gossip matrix :math:`\mathbf{W}` (a static topology);
- :math:`\mathbf{J}` when a period :math:`q` is set and :math:`(t + 1) \bmod q = 0`, and
  :math:`\mathbf{W}` otherwise (``federated``);
- or round :math:`t \bmod L` of a cycle :math:`\mathbf{W}^{(0)}, \dots, \mathbf{W}^{(L-1)}`
  of sparse matrices (``one-peer-exponential``, Ying et al., NeurIPS 2021; ``base-K``,
  Takezawa et al., NeurIPS 2023). For a cycle, ``W`` is only a summary: the
  Metropolis-Hastings matrix of the union of the rounds' graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from slate.errors import TopologyError
from slate.topology.graph import averaging_matrix, metropolis_hastings
from slate.topology.matrix_checks import mixing_rate, validate

__all__ = ["Topology", "union_adjacency"]

#: A cycle whose product is within this spectral distance of J averages exactly (the rest is
#: floating-point rounding): its effective lambda is reported as 0.
_EXACT_PRODUCT_TOL = 1e-12


def union_adjacency(matrices: tuple[np.ndarray, ...] | list[np.ndarray]) -> np.ndarray:
    r"""The boolean adjacency of the union graph: :math:`i \sim j` iff some matrix has
    :math:`w_{ij} > 0` or :math:`w_{ji} > 0` (:math:`i \ne j`); the diagonal is False."""
    adj = np.zeros(matrices[0].shape, dtype=bool)
    for M in matrices:
        adj |= (M > 0) | (M.T > 0)
    np.fill_diagonal(adj, False)
    return adj


@dataclass(frozen=True, eq=False, repr=False)
class Topology:
    r"""A validated network: the gossip matrix and, optionally, periodic exact averaging.

    On iteration :math:`t` (0-based) the parties apply :meth:`matrix_at`:
    :math:`\mathbf{J}` when ``period`` is set and :math:`(t + 1) \bmod q = 0`, and the gossip
    matrix ``W`` otherwise. Federated learning is ``W = I`` with ``period = q``: local steps,
    then an exact average every :math:`q`-th iteration (Section 3.1).

    With a cycle of ``rounds`` :math:`\mathbf{W}^{(0)}, \dots, \mathbf{W}^{(L-1)}`, iteration
    :math:`t` applies :math:`\mathbf{W}^{(t \bmod L)}` instead (see :meth:`from_rounds`); ``W``
    is then the Metropolis-Hastings matrix of the union of the rounds' graphs, kept so that
    code that needs one static matrix (lambda, the graph's diameter, the survivors' graph) still
    has a valid, connected one. The rounds, not ``W``, are what the parties apply.

    Attributes:
        name: the topology's name (e.g. ``"ring"``, ``"file:W.csv"`` or ``"base-2"``).
        W: the (N, N) gossip matrix of ordinary rounds (for a cycle: the union's
            Metropolis-Hastings matrix); stored as a read-only float64 copy.
        period: :math:`q \ge 1` for periodic exact averaging, or ``None``.
        rounds: the cycle's (N, N) matrices, each symmetric, doubly stochastic and
            nonnegative (not necessarily connected), stored as read-only float64 copies; or
            ``None`` for a static or periodic topology.

    Raises:
        TopologyError: on construction, if ``W`` is invalid (without a period it must also be
            connected), ``period`` is not a positive integer, a round is invalid or of another
            shape, the cycle is empty, or both ``period`` and ``rounds`` are given.
    """

    name: str
    W: np.ndarray
    period: int | None = None
    rounds: tuple[np.ndarray, ...] | None = None
    _J: np.ndarray = field(init=False, repr=False)
    _w_is_j: bool = field(init=False, repr=False)
    _round_is_j: tuple[bool, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        period = self.period
        if period is not None:
            if isinstance(period, bool) or not isinstance(period, (int, np.integer)):
                raise TopologyError(
                    f"The averaging period of topology '{self.name}' must be an integer >= 1, "
                    f"got {period!r}."
                )
            if period < 1:
                raise TopologyError(
                    f"The averaging period of topology '{self.name}' must be at least 1 "
                    f"(average every q-th iteration), got {int(period)}."
                )
            object.__setattr__(self, "period", int(period))
        W = validate(
            self.W,
            name=f"The W of topology '{self.name}'",
            require_connected=period is None,
        )
        W.setflags(write=False)
        J = averaging_matrix(W.shape[0])
        J.setflags(write=False)
        object.__setattr__(self, "W", W)
        object.__setattr__(self, "_J", J)
        object.__setattr__(self, "_w_is_j", bool(np.array_equal(W, J)))
        rounds = self._checked_rounds(W.shape[0])
        object.__setattr__(self, "rounds", rounds)
        is_j = () if rounds is None else tuple(bool(np.array_equal(R, J)) for R in rounds)
        object.__setattr__(self, "_round_is_j", is_j)

    def _checked_rounds(self, n: int) -> tuple[np.ndarray, ...] | None:
        """The validated, read-only rounds of a cycle, or ``None`` without one."""
        if self.rounds is None:
            return None
        if self.period is not None:
            raise TopologyError(
                f"Topology '{self.name}' has both an averaging period and a cycle of rounds: give "
                "one or the other (a cycle that should average exactly can end in J)."
            )
        if isinstance(self.rounds, np.ndarray) or len(self.rounds) == 0:
            raise TopologyError(
                f"The rounds of topology '{self.name}' must be a non-empty tuple of (N, N) "
                "matrices, one per round of the cycle."
            )
        checked: list[np.ndarray] = []
        for t, R in enumerate(self.rounds):
            M = validate(R, name=f"Round {t} of topology '{self.name}'", require_connected=False)
            if M.shape != (n, n):
                raise TopologyError(
                    f"Round {t} of topology '{self.name}' has shape {M.shape}, but its W is "
                    f"({n}, {n}): every round of a cycle must be an (N, N) matrix."
                )
            M.setflags(write=False)
            checked.append(M)
        return tuple(checked)

    @classmethod
    def from_rounds(cls, name: str, rounds: tuple[np.ndarray, ...] | list[np.ndarray]) -> Topology:
        r"""A cycle of rounds with ``W`` the Metropolis-Hastings matrix of their union graph.

        ``W`` has :math:`w_{ij} = 1 / (1 + \max(d_i, d_j))` on every edge of the union of the
        rounds' graphs (:math:`d` its degrees), and is exactly :math:`\mathbf{J}` when that union
        is complete. It must be connected, or the cycle could never mix all parties.

        Args:
            name: the topology's name.
            rounds: the cycle's (N, N) matrices, applied in order, round :math:`t \bmod L` on
                iteration :math:`t`.

        Raises:
            TopologyError: if a round is invalid or the union graph is disconnected.
        """
        if len(rounds) == 0:
            raise TopologyError(f"Topology '{name}' needs at least one round in its cycle.")
        arrays = tuple(np.asarray(R, dtype=np.float64) for R in rounds)
        adj = union_adjacency(arrays)
        n = adj.shape[0]
        complete = bool(np.all(adj | np.eye(n, dtype=bool)))
        W = averaging_matrix(n) if complete else metropolis_hastings(adj)
        return cls(name=name, W=W, rounds=arrays)

    def __repr__(self) -> str:
        cycle = "" if self.rounds is None else f", cycle={len(self.rounds)}"
        return (
            f"Topology(name={self.name!r}, n={self.n}, period={self.period}{cycle}, "
            f"lam={self.lam:.6g})"
        )

    @property
    def n(self) -> int:
        """Number of nodes :math:`N`."""
        return int(self.W.shape[0])

    @staticmethod
    def _iteration(t: int) -> int:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"iteration t must be an integer >= 0, got {t!r}")
        return int(t)

    def _averages_at(self, t: int) -> bool:
        t = self._iteration(t)
        return self.period is not None and (t + 1) % self.period == 0

    def _node(self, n: int) -> int:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n < self.n:
            raise IndexError(f"node {n!r} is not in 0..{self.n - 1}")
        return int(n)

    def matrix_at(self, t: int) -> np.ndarray:
        r"""The matrix applied at iteration ``t`` (0-based), read-only.

        For a cycle of :math:`L` rounds, round :math:`t \bmod L`. Otherwise
        :math:`\mathbf{J}` if ``period`` is set and :math:`(t + 1) \bmod q = 0`, else ``W``
        (the identity for federated).

        Raises:
            ValueError: if ``t`` is not an integer >= 0.
        """
        if self.rounds is not None:
            return self.rounds[self._iteration(t) % len(self.rounds)]
        return self._J if self._averages_at(t) else self.W

    def is_full_average_at(self, t: int) -> bool:
        r"""True when :meth:`matrix_at` ``(t)`` is exactly :math:`\mathbf{J}`.

        An engine can then replace gossip with an all-reduce mean. This holds on every
        averaging round of a periodic topology, on every round when ``W`` equals
        :math:`\mathbf{J}` entry for entry (``full``, or any topology with ``N = 1``), and on a
        cycle's rounds that equal :math:`\mathbf{J}` entry for entry.
        """
        if self.rounds is not None:
            return self._round_is_j[self._iteration(t) % len(self.rounds)]
        return self._averages_at(t) or self._w_is_j

    @property
    def cycle_length(self) -> int:
        r"""How many iterations before :meth:`matrix_at` repeats.

        :math:`L` for a cycle of rounds, the period :math:`q` for a periodic topology
        (:math:`\mathbf{W}` for :math:`q - 1` iterations, then :math:`\mathbf{J}`), and 1 for a
        static topology.
        """
        if self.rounds is not None:
            return len(self.rounds)
        return self.period if self.period is not None else 1

    @property
    def is_time_varying(self) -> bool:
        r"""True when :meth:`matrix_at` is not the same matrix for every iteration.

        A cycle whose rounds are not all equal, or a period :math:`q > 1` with
        :math:`\mathbf{W} \ne \mathbf{J}`.
        """
        if self.rounds is not None:
            first = self.rounds[0]
            return any(not np.array_equal(R, first) for R in self.rounds[1:])
        return self.period is not None and self.period > 1 and not self._w_is_j

    def neighbours_at(self, n: int, t: int) -> list[tuple[int, float]]:
        r"""Neighbours of node ``n`` in :meth:`matrix_at` ``(t)`` and their weights.

        For a static topology this equals :meth:`neighbours`; on a round that is
        :math:`\mathbf{J}` every other node is a neighbour, with weight :math:`1/N`.

        Returns:
            ``[(r, w_nr), ...]`` for every ``r != n`` with ``w_nr > 0``, in increasing ``r``.

        Raises:
            IndexError: if ``n`` is not a node.
            ValueError: if ``t`` is not an integer >= 0.
        """
        node = self._node(n)
        return _row_neighbours(self.matrix_at(t)[node], node)

    def self_weight_at(self, n: int, t: int) -> float:
        """The weight :math:`w_{nn}` node ``n`` keeps for itself in :meth:`matrix_at` ``(t)``.

        Raises:
            IndexError: if ``n`` is not a node.
            ValueError: if ``t`` is not an integer >= 0.
        """
        node = self._node(n)
        return float(self.matrix_at(t)[node, node])

    def degrees_at(self, t: int) -> tuple[int, ...]:
        """Number of neighbours of every node in :meth:`matrix_at` ``(t)``."""
        off = self.matrix_at(t) > 0
        np.fill_diagonal(off, False)
        return tuple(int(d) for d in off.sum(axis=1))

    def union_neighbours(self, n: int) -> list[int]:
        r"""Every node that node ``n`` exchanges with in some iteration, increasing.

        For a cycle, the union over its rounds; for a periodic topology every other node (its
        :math:`\mathbf{J}` rounds link everyone); for a static one, the neighbours in ``W``.

        Raises:
            IndexError: if ``n`` is not a node.
        """
        node = self._node(n)
        if self.rounds is not None:
            linked = union_adjacency(self.rounds)[node]
            return [int(r) for r in np.flatnonzero(linked)]
        if self.period is not None:
            return [r for r in range(self.n) if r != node]
        return [r for r, _ in self.neighbours(node)]

    def neighbours(self, n: int) -> list[tuple[int, float]]:
        """Neighbours of node ``n`` in the gossip matrix ``W`` and their weights.

        Args:
            n: the node, ``0 <= n < N``.

        Returns:
            ``[(r, w_nr), ...]`` for every ``r != n`` with ``w_nr > 0``, in increasing ``r``.
            Empty for the identity rounds of federated learning.

        Raises:
            IndexError: if ``n`` is not a node.
        """
        node = self._node(n)
        return _row_neighbours(self.W[node], node)

    @property
    def degrees(self) -> tuple[int, ...]:
        """Number of neighbours of every node in ``W``."""
        off = self.W > 0
        np.fill_diagonal(off, False)
        return tuple(int(d) for d in off.sum(axis=1))

    @cached_property
    def lam(self) -> float:
        r""":math:`\lambda = \|\mathbf{W} - \mathbf{J}\|_2` of the gossip matrix ``W``.

        For federated learning ``W = I`` and this is honestly 1.0 (``N > 1``): ordinary rounds
        do not mix; see :attr:`effective_lambda`. For a cycle it is the lambda of the union's
        Metropolis-Hastings matrix, which is never applied; see :attr:`effective_lambda`.
        """
        return mixing_rate(self.W)

    @cached_property
    def effective_lambda(self) -> float:
        r"""Per-iteration mixing rate over one period.

        :math:`\lambda(\mathbf{M}_{q-1} \cdots \mathbf{M}_0)^{1/q}` where
        :math:`\mathbf{M}_t` = :meth:`matrix_at` ``(t)``; with a period this is
        :math:`\lambda(\mathbf{J}\mathbf{W}^{q-1})^{1/q} = 0` for doubly stochastic ``W``.
        For a cycle of :math:`L` rounds it is
        :math:`\lambda(\mathbf{W}^{(L-1)} \cdots \mathbf{W}^{(0)})^{1/L}`, reported as exactly 0
        when that product is within :math:`10^{-12}` of :math:`\mathbf{J}` (rounding; the
        ``one-peer-exponential`` and ``base-K`` cycles multiply to :math:`\mathbf{J}`).
        Without a period or a cycle it equals :attr:`lam`.
        """
        if self.rounds is not None:
            rate = mixing_rate(self.cycle_product)
            return 0.0 if rate <= _EXACT_PRODUCT_TOL else rate ** (1.0 / len(self.rounds))
        if self.period is None:
            return self.lam
        product = np.eye(self.n)
        for t in range(self.period):
            product = self.matrix_at(t) @ product
        return mixing_rate(product) ** (1.0 / self.period)

    @property
    def applied_lambda(self) -> float:
        """The mixing rate of the matrices a run applies: :attr:`effective_lambda` for a cycle
        of one-peer rounds (whose union's :attr:`lam` is never applied), :attr:`lam`
        otherwise."""
        return self.effective_lambda if self.rounds is not None else self.lam

    @cached_property
    def cycle_product(self) -> np.ndarray:
        r"""The product :math:`\mathbf{M}_{L-1} \cdots \mathbf{M}_0` of one cycle's matrices,
        :math:`\mathbf{M}_t` = :meth:`matrix_at` ``(t)``, :math:`L` = :attr:`cycle_length`;
        read-only."""
        product = np.eye(self.n)
        for t in range(self.cycle_length):
            product = self.matrix_at(t) @ product
        product.setflags(write=False)
        return product

    @property
    def spectral_gap(self) -> float:
        r"""The spectral gap :math:`1 - \lambda` of ``W`` (see :attr:`lam`)."""
        return 1.0 - self.lam


def _row_neighbours(row: np.ndarray, node: int) -> list[tuple[int, float]]:
    """``[(r, row[r]), ...]`` for every ``r != node`` with a positive weight, increasing."""
    return [(int(r), float(row[r])) for r in np.flatnonzero(row > 0) if r != node]
