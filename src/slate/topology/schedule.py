r"""The time-varying :class:`Topology`: a gossip matrix and, optionally, periodic averaging.

On iteration :math:`t` the parties apply :math:`\mathbf{J}` when a period :math:`q` is set and
:math:`(t + 1) \bmod q = 0`, and the gossip matrix :math:`\mathbf{W}` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from slate.errors import TopologyError
from slate.topology.graph import averaging_matrix
from slate.topology.validation import mixing_rate, validate

__all__ = ["Topology"]


@dataclass(frozen=True, eq=False, repr=False)
class Topology:
    r"""A validated network: the gossip matrix and, optionally, periodic exact averaging.

    On iteration :math:`t` (0-based) the parties apply :meth:`matrix_at`:
    :math:`\mathbf{J}` when ``period`` is set and :math:`(t + 1) \bmod q = 0`, and the gossip
    matrix ``W`` otherwise. Federated learning is ``W = I`` with ``period = q``: local steps,
    then an exact average every :math:`q`-th iteration (Section 3.1).

    Attributes:
        name: the topology's name (e.g. ``"ring"`` or ``"file:W.csv"``).
        W: the (N, N) gossip matrix of ordinary rounds; stored as a read-only float64 copy.
        period: :math:`q \ge 1` for periodic exact averaging, or ``None``.

    Raises:
        TopologyError: on construction, if ``W`` is invalid (without a period it must also be
            connected) or ``period`` is not a positive integer.
    """

    name: str
    W: np.ndarray
    period: int | None = None
    _J: np.ndarray = field(init=False, repr=False)
    _w_is_j: bool = field(init=False, repr=False)

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

    def __repr__(self) -> str:
        return f"Topology(name={self.name!r}, n={self.n}, period={self.period}, lam={self.lam:.6g})"

    @property
    def n(self) -> int:
        """Number of nodes :math:`N`."""
        return int(self.W.shape[0])

    def _averages_at(self, t: int) -> bool:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"iteration t must be an integer >= 0, got {t!r}")
        return self.period is not None and (int(t) + 1) % self.period == 0

    def matrix_at(self, t: int) -> np.ndarray:
        r"""The matrix applied at iteration ``t`` (0-based), read-only.

        :math:`\mathbf{J}` if ``period`` is set and :math:`(t + 1) \bmod q = 0`, else ``W``
        (the identity for federated).

        Raises:
            ValueError: if ``t`` is not an integer >= 0.
        """
        return self._J if self._averages_at(t) else self.W

    def is_full_average_at(self, t: int) -> bool:
        r"""True when :meth:`matrix_at` ``(t)`` is exactly :math:`\mathbf{J}`.

        An engine can then replace gossip with an all-reduce mean. This holds on every
        averaging round of a periodic topology and on every round when ``W`` equals
        :math:`\mathbf{J}` entry for entry (``full``, or any topology with ``N = 1``).
        """
        return self._averages_at(t) or self._w_is_j

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
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n < self.n:
            raise IndexError(f"node {n!r} is not in 0..{self.n - 1}")
        row = self.W[int(n)]
        return [(int(r), float(row[r])) for r in np.flatnonzero(row > 0) if r != n]

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
        do not mix; see :attr:`effective_lambda`.
        """
        return mixing_rate(self.W)

    @cached_property
    def effective_lambda(self) -> float:
        r"""Per-iteration mixing rate over one period.

        :math:`\lambda(\mathbf{M}_{q-1} \cdots \mathbf{M}_0)^{1/q}` where
        :math:`\mathbf{M}_t` = :meth:`matrix_at` ``(t)``; with a period this is
        :math:`\lambda(\mathbf{J}\mathbf{W}^{q-1})^{1/q} = 0` for doubly stochastic ``W``.
        Without a period it equals :attr:`lam`.
        """
        if self.period is None:
            return self.lam
        product = np.eye(self.n)
        for t in range(self.period):
            product = self.matrix_at(t) @ product
        return mixing_rate(product) ** (1.0 / self.period)

    @property
    def spectral_gap(self) -> float:
        r"""The spectral gap :math:`1 - \lambda` of ``W`` (see :attr:`lam`)."""
        return 1.0 - self.lam
