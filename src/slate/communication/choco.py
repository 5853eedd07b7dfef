r"""Compressed gossip with error feedback: CHOCO-Gossip (Koloskova, Stich and Jaggi, ICML 2019).

Party :math:`i` keeps *public copies*: :math:`\hat x_{i \to j}`, its own parameters as its
neighbour :math:`j` knows them, and :math:`\hat x_{j \to i}`, the neighbour's as it knows them.
Both ends of an edge hold the same two copies, because they change only by what is sent. One
gossip round with the matrix :math:`W(r)`, after the local step has produced
:math:`x_i^{t+1/2}` (CHOCO-SGD: Koloskova et al., ICML 2019; for deep learning, ICLR 2020):

.. math::

    q_{i \to j} &= C\big(x_i^{t+1/2} - \hat x_{i \to j}\big)
        \quad\text{sent to every neighbour } j \text{ of round } r, \\
    \hat x_{i \to j} &\leftarrow \hat x_{i \to j} + q_{i \to j}, \qquad
    \hat x_{j \to i} \leftarrow \hat x_{j \to i} + q_{j \to i}, \\
    x_i^{t+1} &= x_i^{t+1/2} + \gamma \textstyle\sum_j w_{ij}(r)\,
        \big(\hat x_{j \to i} - \hat x_{i \to j}\big).

The copies are kept *per edge* rather than one per party, so that time-varying graphs (a
different neighbour every round) stay exact: a copy changes only on the rounds its edge is used.
On a fixed graph, every copy :math:`\hat x_{i \to j}` of one party receives the same ``q`` (the
operators are deterministic), so this is the original one-copy-per-party algorithm.

All parties start from the same parameters (Alg. 1 line 2), which every party knows, so the
copies start there rather than at zero: the first rounds then send only how far each party has
moved. When the party set changes (:mod:`slate.training.recovery`), every copy restarts at zero on
every survivor, which keeps both ends of each edge equal without an extra exchange.

:func:`auto_consensus_step` picks :math:`\gamma` by simulating gossip on the run's own graph
and compressor over a grid of :math:`\gamma`, as the CHOCO authors do, but with every party
adding SGD-like noise before each round (:func:`noisy_consensus_error`), and keeps the one with
the smallest consensus error. Tuned on noiseless consensus, the choice was too large: with the
noise that SGD steps add it gave 1.5-1.7x the error of the operators' defaults
(``benchmarks/consensus_step_auto.py`` measures both).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from slate.communication.compression import Compressor
from slate.security.robust import MessageGuard
from slate.topology import Topology

__all__ = [
    "ChocoGossip",
    "EdgeSlots",
    "RoundEdges",
    "auto_consensus_step",
    "consensus_error_after",
    "noisy_consensus_error",
    "simulated_exchange",
    "tuning_rounds",
]

#: A round's payloads, one row per outgoing edge, in; each edge's incoming payload out.
Exchange = Callable[[Tensor, "RoundEdges"], Tensor]


@dataclass(frozen=True)
class RoundEdges:
    """The directed edges ``i -> j`` of one gossip round whose sender ``i`` runs here.

    Attributes:
        rows: the local row of each edge's sender in ``x (P, d)``.
        peers: each edge's receiver ``j`` (a party index of the topology).
        weights: :math:`w_{ij}(r)`, shape ``(E, 1)``.
        slots: each edge's public-copy slot (see :class:`EdgeSlots`).
        reverse: for every edge ``i -> j``, the position of ``j -> i`` in this list, when both
            ends run here (the simulator); ``None`` otherwise.
    """

    rows: Tensor
    peers: tuple[int, ...]
    weights: Tensor
    slots: Tensor
    reverse: Tensor | None

    @property
    def count(self) -> int:
        return len(self.peers)


class EdgeSlots:
    """One public-copy slot per directed edge ``i -> j`` of the union of all rounds' graphs,
    for the senders ``i`` in ``local_parties``; and each round's :class:`RoundEdges`."""

    def __init__(self, topology: Topology, local_parties: Sequence[int], device) -> None:
        self.topology = topology
        self.local = list(local_parties)
        self.device = torch.device(device)
        row_of = {party: row for row, party in enumerate(self.local)}
        pairs = [(i, j) for i in self.local for j in _union_neighbours(topology, i)]
        self.slot_of = {pair: k for k, pair in enumerate(pairs)}
        self.slot_rows = torch.tensor([row_of[i] for i, _ in pairs], dtype=torch.long)
        self._row_of = row_of
        self._rounds: dict[int, RoundEdges] = {}

    @property
    def count(self) -> int:
        return len(self.slot_of)

    def at(self, r: int, dtype: torch.dtype) -> RoundEdges:
        """Round ``r``'s edges (cached per position in the topology's cycle)."""
        key = r % max(1, _cycle_length(self.topology))
        if key not in self._rounds:
            self._rounds[key] = self._build(r, dtype)
        return self._rounds[key]

    def _build(self, r: int, dtype: torch.dtype) -> RoundEdges:
        edges = [
            (i, j, w) for i in self.local for j, w in _neighbours_at(self.topology, i, r) if w > 0
        ]
        position = {(i, j): e for e, (i, j, _) in enumerate(edges)}
        both_here = all((j, i) in position for i, j, _ in edges)
        reverse = (
            torch.tensor([position[(j, i)] for i, j, _ in edges], dtype=torch.long)
            if both_here
            else None
        )
        return RoundEdges(
            rows=torch.tensor([self._row_of[i] for i, _, _ in edges], dtype=torch.long).to(
                self.device
            ),
            peers=tuple(j for _, j, _ in edges),
            weights=torch.tensor([[w] for _, _, w in edges], dtype=dtype, device=self.device),
            slots=torch.tensor([self.slot_of[(i, j)] for i, j, _ in edges], dtype=torch.long).to(
                self.device
            ),
            reverse=None if reverse is None else reverse.to(self.device),
        )


def simulated_exchange(payload: Tensor, edges: RoundEdges) -> Tensor:
    """Every party runs here: the payload received on edge ``i -> j`` is the one sent on
    ``j -> i``."""
    assert edges.reverse is not None, "simulated_exchange needs both ends of every edge"
    return payload.index_select(0, edges.reverse)


class ChocoGossip:
    """CHOCO-Gossip's state (the public copies) and its round (module docstring).

    Args:
        topology: the network; round ``r`` uses ``topology.matrix_at(r)``.
        local_parties: the parties whose rows ``x`` holds, in row order.
        compressor: the operator :math:`C`.
        gamma: the consensus step :math:`\\gamma`.
        x0: the parties' common starting parameters ``(P, d)`` (the copies' first value).
        exchange: sends each edge's payload to its peer and returns the peers' payloads.
        guard: what the parties send and how the copies mix
            (:class:`~slate.security.robust.MessageGuard`); None: plain, unwatched.
    """

    def __init__(
        self,
        topology: Topology,
        local_parties: Sequence[int],
        compressor: Compressor,
        gamma: float,
        x0: Tensor,
        exchange: Exchange,
        guard: MessageGuard | None = None,
    ) -> None:
        self.compressor = compressor
        self.gamma = float(gamma)
        self.exchange = exchange
        self.edges = EdgeSlots(topology, local_parties, x0.device)
        start = x0.index_select(0, self.edges.slot_rows.to(x0.device))
        self.sent = start.clone()  # hat x_{i -> j}: our own public copy on each edge
        self.received = start.clone()  # hat x_{j -> i}: the neighbour's public copy
        self.guard = guard  # the watch, --robust, a test's attacker (slate.security.robust)

    def payload_bytes(self, d: int) -> int:
        return self.compressor.payload_bytes(d)

    def gossip(self, x: Tensor, r: int) -> tuple[Tensor, int]:
        """One round on ``x (P, d)``; returns the new ``x`` and the number of messages sent."""
        edges = self.edges.at(r, x.dtype)
        if edges.count == 0:
            return x, 0
        d = x.shape[1]
        sending = x if self.guard is None else self.guard.sent(x)
        delta = sending.index_select(0, edges.rows) - self.sent.index_select(0, edges.slots)
        payload = self.compressor.encode(delta)
        incoming = self.exchange(payload, edges)
        if sending is not x:  # an attacker (tests only) keeps its own copies honest
            honest = x.index_select(0, edges.rows) - self.sent.index_select(0, edges.slots)
            payload = self.compressor.encode(honest)
        self.sent.index_add_(0, edges.slots, self.compressor.decode(payload, d, x.dtype))
        arrived = self.compressor.decode(incoming, d, x.dtype)
        if self.guard is not None:
            senders = torch.tensor(edges.peers, dtype=torch.long, device=x.device)
            mixed = self.guard.copies_round(
                x, arrived, self.received, self.sent, edges.slots, edges.rows, edges.weights,
                senders, self.gamma,
            )  # fmt: skip
            return mixed, edges.count
        self.received.index_add_(0, edges.slots, arrived)
        gap = self.received.index_select(0, edges.slots) - self.sent.index_select(0, edges.slots)
        return x.index_add(0, edges.rows, gap * edges.weights, alpha=self.gamma), edges.count

    def restart(self) -> None:
        """Every copy to zero (after a change of the party set; module docstring)."""
        self.sent.zero_()
        self.received.zero_()

    def state_dict(self) -> dict[str, Tensor]:
        return {"sent": self.sent.cpu().clone(), "received": self.received.cpu().clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.sent = state["sent"].to(self.sent.device, self.sent.dtype).clone()
        self.received = state["received"].to(self.received.device, self.received.dtype).clone()


# --------------------------------------------------------------------------- choosing gamma

#: The CHOCO authors' grid: :math:`\gamma` on a log scale from 1e-3 to 1 (the operator's default
#: is tried too).
GAMMA_GRID = tuple(float(g) for g in np.logspace(-3, 0, 19))
TUNING_DIMENSION = 2048  # coordinates of the simulated vectors (at most the model's size)
TUNING_CYCLES = 50  # simulated rounds: this many cycles of the topology ...
TUNING_ROUNDS = 400  # ... and at least this many rounds
TUNING_SEED = 0  # the simulated noise's seed: every party of a run draws the same noise
DIVERGED = 1e8  # a simulated error above this (in units of one round's noise) has diverged


def consensus_error_after(
    topology: Topology, compressor: Compressor, gamma: float, d: int, rounds: int, seed: int = 0
) -> float:
    r"""Relative consensus error :math:`\|X_T - \bar X\|_F^2 / \|X_0 - \bar X\|_F^2` of CHOCO
    average consensus (no gradients) after ``rounds`` rounds from standard normal parameters
    and zero public copies (the setting of the CHOCO paper's consensus experiments). A
    diverging run gives ``inf``."""
    n = topology.n
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    x = x - x.mean(dim=0)  # the mean is preserved; only the disagreement matters
    start = float((x**2).sum())
    choco = ChocoGossip(
        topology, range(n), compressor, gamma, torch.zeros(n, d), simulated_exchange
    )
    for r in range(rounds):
        x, _ = choco.gossip(x, r)
    error = float(((x - x.mean(dim=0)) ** 2).sum()) / start
    return error if math.isfinite(error) else math.inf


def noisy_consensus_error(
    topology: Topology,
    compressor: Compressor,
    gamma: float,
    d: int,
    rounds: int,
    seed: int = TUNING_SEED,
) -> float:
    r"""Consensus error of CHOCO gossip driven by SGD-like noise, averaged over the second half
    of ``rounds`` rounds.

    As in a run, every party starts at the same point (zero) with its copies there; before each
    round :math:`r` every party moves by a zero-mean perturbation, as a stochastic gradient
    step does, and then gossips:

    .. math::

        x_i \leftarrow x_i + \xi_i(r), \quad \xi_i(r) \sim \mathcal N(0, I_d)
        \text{ i.i.d.}; \qquad X \leftarrow \mathrm{CHOCO}_\gamma(X)
        \quad\text{(module docstring)};

    .. math::

        E(\gamma) = \frac{1}{R - \lfloor R/2 \rfloor} \sum_{r = \lfloor R/2 \rfloor}^{R-1}
        \frac{\lVert X_r - \mathbf 1 \bar x_r^\top \rVert_F^2}{N d},

    the mean squared distance of a coordinate to the average, in units of one round's noise
    variance, once the error has had half the rounds to build up. Too small a :math:`\gamma`
    lets the noise accumulate (a random walk); too large a one amplifies the compression error
    (or diverges: ``inf``). Every operator is positively homogeneous (:math:`C(a x) = a\,C(x)`,
    :math:`a > 0`) and the start is zero, so scaling :math:`\xi` by :math:`a` scales
    :math:`E` by :math:`a^2` for every :math:`\gamma` (up to float32 rounding): the choice
    does not depend on the noise's size, which therefore needs no setting. The noise comes
    from a generator seeded with ``seed``: the result is a deterministic function of the
    arguments.
    """
    n = topology.n
    gen = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, d)
    choco = ChocoGossip(topology, range(n), compressor, gamma, x.clone(), simulated_exchange)
    burn_in, total = rounds // 2, 0.0
    for r in range(rounds):
        x, _ = choco.gossip(x + torch.randn(n, d, generator=gen), r)
        error = float(((x - x.mean(dim=0)).double() ** 2).sum()) / (n * d)
        if not error <= DIVERGED:  # (also NaN)
            return math.inf
        if r >= burn_in:
            total += error
    return total / (rounds - burn_in)


def tuning_rounds(topology: Topology) -> int:
    """Rounds simulated by :func:`auto_consensus_step`: ``max(TUNING_ROUNDS, TUNING_CYCLES x
    cycle length)``."""
    return max(TUNING_ROUNDS, TUNING_CYCLES * _cycle_length(topology))


def auto_consensus_step(
    topology: Topology, compressor: Compressor, d: int, grid: Sequence[float] | None = None
) -> float:
    """``--consensus-step auto``: the :math:`\\gamma` among ``grid`` (default
    :data:`GAMMA_GRID`) and the operator's default whose noisy simulated consensus on this
    topology and compressor stays closest to the average (:func:`noisy_consensus_error`,
    ``min(d, TUNING_DIMENSION)`` coordinates, :func:`tuning_rounds` rounds; ties go to the
    smaller :math:`\\gamma`), on one thread. Since the default is a candidate, the choice's
    simulated error is never above the default's. Deterministic, so that every party of a
    distributed run picks the same value."""
    tried = GAMMA_GRID if grid is None else grid
    candidates = sorted({*tried, compressor.default_consensus_step})
    rounds = tuning_rounds(topology)
    dim = max(1, min(d, TUNING_DIMENSION))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: threads only add overhead (and reorder sums)
    try:
        errors = [noisy_consensus_error(topology, compressor, g, dim, rounds) for g in candidates]
    finally:
        torch.set_num_threads(threads)
    return float(candidates[int(np.argmin(errors))])


def _neighbours_at(topology: Topology, n: int, r: int) -> list[tuple[int, float]]:
    return topology.neighbours_at(n, r)


def _union_neighbours(topology: Topology, n: int) -> list[int]:
    return list(topology.union_neighbours(n))


def _cycle_length(topology: Topology) -> int:
    return int(topology.cycle_length)
