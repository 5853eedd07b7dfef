"""Changes of the party set during a run: lost parties, returning ones, and injected drops.

A run keeps going when a party is lost (``--on-party-loss continue``). What the training loop
needs for that lives here:

* :class:`Snapshots`: the last few training states of this process
  (:class:`slate.training.state.TrainingState`), by *position*. Position ``2 t`` is
  iteration ``t`` before its evaluation and checkpoint, ``2 t + 1`` after them, ready for step
  ``t``. A distributed party that detects a loss may be some gossip rounds ahead of a party
  farther away in the graph (a step needs only the neighbours' messages, and a local step none);
  the survivors agree to resume from the smallest position any of them holds, and each rolls
  back to it. Only the positions where such a rollback can land are kept: before each gossip
  round's step and around each chunk's end (:meth:`PartySet.snapshot_before_step`), as many as
  :func:`snapshot_depth` says. Every saved tensor is replaced (never written in place) by the
  steps, so a snapshot holds references, not copies.
* :func:`party_event`: the records of ``summary.json``'s ``party_events``.
* :class:`PartySet`: the run's members and the changes of them (a component of
  :class:`slate.training.run.Run`): rollback to a snapshot, losses, drops (the simulator's
  ``--drop-party`` schedule, :func:`slate.training.checks.parse_drops`) and returning parties.
  It decides; the run carries the changes out, through the narrow :class:`PartyRun`
  interface (take and restore a training state, keep parties, switch the topology, join).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from torch import Tensor

from slate.engines.base import Engine
from slate.engines.distributed.control.membership import Change, PartyLost
from slate.faults.kills import Kills
from slate.security.messages import ANY, ListOf, MapOf
from slate.topology import SurvivorGraph, Topology
from slate.training.state import TrainingState

__all__ = [
    "PartyRun",
    "PartySet",
    "Snapshot",
    "Snapshots",
    "drift_rounds",
    "party_event",
    "rollback_rounds",
    "snapshot_depth",
]

#: Snapshots kept around the chunk boundaries in the rollback window (:func:`snapshot_depth`).
BOUNDARY_SNAPSHOTS = 3


@dataclass(frozen=True)
class Snapshot:
    """The training state at one position (references, not copies): everything a party needs
    to resume from there. Its communicator restarts with the change of the party set that
    follows every rollback (:meth:`PartySet.change_parties`)."""

    position: int
    state: TrainingState

    @property
    def iteration(self) -> int:
        return self.position // 2


class Snapshots:
    """The newest ``depth`` snapshots, one per position, in increasing positions."""

    def __init__(self, depth: int) -> None:
        self._items: deque[Snapshot] = deque(maxlen=depth)

    @property
    def depth(self) -> int:
        """How many positions are kept."""
        return self._items.maxlen or 0

    def resize(self, depth: int) -> None:
        """Keep ``depth`` positions from now on; the newest of those held stay."""
        self._items = deque(self._items, maxlen=depth)

    def add(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot``; one held at its position or later is replaced (it belongs to a
        course the party left by rolling back, or by being admitted at an earlier iteration)."""
        while self._items and self._items[-1].position >= snapshot.position:
            self._items.pop()
        self._items.append(snapshot)

    @property
    def position(self) -> int:
        """The newest position this party can resume from."""
        return self._items[-1].position

    def at(self, position: int) -> Snapshot:
        for snapshot in reversed(self._items):
            if snapshot.position == position:
                return snapshot
        held = [s.position // 2 for s in self._items]
        raise PartyLost(
            f"The survivors agreed to resume from iteration {position // 2}, but this party "
            f"holds states of iterations {held[0]}..{held[-1]} only, so it cannot roll back "
            "there; it stops. Restart it with --resume to rejoin at the next checkpoint."
        )

    def rollback(self, position: int) -> Snapshot:
        """The snapshot of ``position`` (:meth:`at`); the newer ones are dropped."""
        snapshot = self.at(position)
        while self._items[-1].position > position:
            self._items.pop()
        return snapshot


def _round_links(topology: Topology, r: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Who hears from whom in gossip round ``r``: ``None`` for an exact average (everyone),
    else slots ``(nodes, others)``: node ``nodes[i]`` exchanges with ``others[i]``, each node at
    most once per slot."""
    if topology.is_full_average_at(r):
        return None
    M = topology.matrix_at(r)
    linked = (M > 0) | (M.T > 0)
    np.fill_diagonal(linked, False)
    peers = [np.flatnonzero(row) for row in linked]
    slots = []
    for k in range(max((len(p) for p in peers), default=0)):
        nodes = np.array([v for v, p in enumerate(peers) if len(p) > k])
        slots.append((nodes, np.array([peers[v][k] for v in nodes])))
    return slots


def rollback_rounds(topology: Topology) -> tuple[bool, ...]:
    """For each round of the topology's cycle (one for a static graph): whether any party
    exchanges in it (an edge, or an exact average). A rollback can land only before such a
    round's step, or around a chunk's end."""
    return tuple(
        topology.is_full_average_at(r) or any(topology.degrees_at(r))
        for r in range(topology.cycle_length)
    )


def drift_rounds(topology: Topology) -> int:
    r"""The most gossip rounds one party can be ahead of another: the *temporal diameter*.

    Party ``p`` can finish round ``r`` only once every neighbour of round ``r`` has started it
    (sent its message, or entered the exact average). So if party ``q`` has started round
    :math:`\rho` and no later one, a neighbour that meets it next in round :math:`r > \rho` cannot
    finish :math:`r`: it has started round :math:`r` at most. Along a path of the time-varying
    graph this repeats hop after hop, one hop per round, each hop in the next round that has its
    edge; a party is therefore at most :math:`\Delta` rounds ahead of any other, where
    :math:`\Delta` is the most rounds information needs to travel from any party to any other,
    over every starting round of the cycle. Other exchanges (collectives at a chunk's end, a
    second exchange within a round) can only hold parties back further.

    For a static graph :math:`\Delta` is its diameter. For a cycle of rounds (``base-K``,
    ``one-peer-exponential``) it is neither the union graph's diameter nor the cycle length:
    3 parties on ``base-2`` (rounds 0-1, 0-2, 0-1; union diameter 2, cycle 3) have
    :math:`\Delta = 4`, 4 parties (0-1 2-3, then 0-2 1-3) :math:`\Delta = 2`. For ``federated``
    (local steps and an exact average every ``q``-th round) it is ``q``.
    """
    n, length = topology.n, topology.cycle_length
    links = [_round_links(topology, r) for r in range(length)]
    most = 0
    for start in range(length):  # the round the slowest party started last, modulo the cycle
        reached = np.eye(n, dtype=bool)  # reached[s, v]: party s's round is known at v
        rounds = 0
        while not reached.all():
            if rounds > n * length:
                raise ValueError(f"topology {topology.name!r} never links every party")
            slots = links[(start + 1 + rounds) % length]
            if slots is None:
                reached[:] = True
            else:
                heard = reached.copy()
                for nodes, others in slots:
                    heard[:, nodes] |= reached[:, others]
                reached = heard
            rounds += 1
        most = max(most, rounds)
    return most


def snapshot_depth(topology: Topology) -> int:
    r"""How many snapshots a party keeps so that it can roll back to any position the
    survivors may agree on.

    The survivors resume from the smallest position any of them holds, the newest snapshot of
    the slowest survivor ``q``. A party ``p`` must still hold it. With :math:`H` iterations per
    gossip round (``--gossip-every``), round :math:`r`'s exchange ends step
    :math:`g_r = (r + 1) H - 1`, and every party takes a snapshot before that step, at position
    :math:`2 g_r + 1` (and at a chunk's end: its last step's position ``2 t`` and ``2 t + 1``).
    If ``q`` has started round :math:`\rho` and no later one, its newest snapshot is at
    :math:`2 g_\rho + 1` or later, and ``p`` has started at most round
    :math:`\rho + \Delta` (:func:`drift_rounds`): it holds nothing newer than
    :math:`2 g_{\rho + \Delta} + 1`. So ``p`` is at most :math:`2 H \Delta` positions,
    :math:`H \Delta` iterations, ahead (a party blocked only at gossip rounds is up to
    :math:`H` iterations ahead per hop, not one), and between the two it holds a snapshot of
    each exchanging round among :math:`\rho, \dots, \rho + \Delta` (:func:`rollback_rounds`),
    at most :math:`\Delta + 1`, whatever :math:`H` is.

    Chunk ends (``_chunk_length`` in :mod:`slate.training.loop`: evaluations, checkpoints, at most
    1 000 steps) add at most :data:`BOUNDARY_SNAPSHOTS` = 3. Every chunk starts with a collective
    of all parties (the stop check), which no party finishes before every party has reached that
    chunk's end ``t`` (position ``2 t``). So once ``p`` has passed ``t``, the slowest is at
    ``2 t`` or later, and between the two lie at most ``2 t``, ``2 t + 1`` and the end ``t'``
    that ``p`` may be waiting at, ``2 t'``. A rollback or an admission puts every party at the
    same position, and the next chunk starts there, with the same collective.

    The brute force in ``tests/training/test_recovery.py`` runs every interleaving of the parties'
    exchanges on small graphs: the drift reaches :math:`2 H \Delta` positions exactly, and never
    needs more than :math:`\Delta + 2` snapshots (the 3 for chunk ends are a union bound).

    Memory: each snapshot holds references to one version of this party's parameters,
    algorithm variables (momentum, tracker) and BatchNorm buffers, so a party holds at most
    :math:`\Delta + 4` versions of its model state, independently of :math:`H`: 6 on a ring of 4
    (one per step, :math:`2 \cdot 2 + 6 = 10` before), 8 on 3 parties of ``base-2``. A
    rollback recomputes at most :math:`H \Delta` steps.
    """
    rounds = drift_rounds(topology)
    exchanging = rollback_rounds(topology)
    length = len(exchanging)
    most = max(sum(exchanging[(s + k) % length] for k in range(rounds + 1)) for s in range(length))
    return most + BOUNDARY_SNAPSHOTS


#: What the staying members send a returning party (:meth:`PartySet.admit`): the history rows
#: and graph changes are only stored and written to summary.json.
WELCOME_SHAPE = {
    "iteration": int, "loss_steps": int, "rounds": float, "history": ListOf(MapOf(ANY, 256)),
    "party_events": ListOf({"rank": int, "iteration": int, "event": str, "reason": str}),
    "graph_changes": ListOf(MapOf(ANY, 256)),
}  # fmt: skip


def party_event(rank: int, iteration: int, event: str, reason: str) -> dict[str, Any]:
    """One entry of ``summary.json``'s ``party_events``: ``event`` is "lost" or "rejoined"."""
    return {"rank": rank, "iteration": iteration, "event": event, "reason": reason}


class PartyRun(Protocol):
    """What a change of the party set needs from the run (:class:`slate.training.run.Run`)."""

    engine: Engine
    faults: Kills
    iteration: int
    history: list[dict[str, Any]]
    topology: Topology

    def training_state(self) -> TrainingState:
        """The state now (references to the run's tensors)."""
        ...

    def restore(self, state: TrainingState) -> None:
        """Continue from ``state``."""
        ...

    def load_state_dict(self, state: dict[str, Any], members_check: bool = True) -> None:
        """Continue from a checkpoint."""
        ...

    def keep_parties(self, members: list[int]) -> None:
        """Keep only the local parties among ``members``; the engine continues with them."""
        ...

    def switch_topology(self, members: list[int]) -> SurvivorGraph:
        """Mix over the surviving graph of ``members`` from now on; returns that graph."""
        ...

    def join_at(
        self, x: Tensor, algorithm_state: dict[str, Tensor], iteration: int, loss_steps: int,
        rounds: float,
    ) -> None:  # fmt: skip
        """A returning party takes the members' model, iteration and clock."""
        ...


class PartySet:
    """The parties in a run and the changes of that set: snapshots and rollback, losses
    (agreed, or injected with ``--drop-party``) and returning parties.

    A :class:`slate.training.run.Run` holds one (``run.party_set``); a change of the party set acts
    on the run's state (its parameters, algorithm variables, sampler streams, communicator, test
    rows) through :class:`PartyRun`. With ``rollback`` (the engine recovers from a lost party)
    it keeps the snapshots to roll back to.

    Attributes:
        members: the parties in the run now.
        party_events: ``summary.json``'s ``party_events`` (:func:`party_event`).
        graph_changes: the surviving graphs the run switched to, with the iteration of each.
        drops: the simulator's ``--drop-party`` schedule, ``{iteration: [ranks]}``.
        snapshots: the positions this process can roll back to (distributed ``continue``
            only; None otherwise).
    """

    def __init__(
        self,
        run: PartyRun,
        drops: dict[int, list[int]],
        nodes: int,
        gossip_every: int,
        rollback: bool,
    ) -> None:
        self.run = run
        self.gossip_every = gossip_every
        self.members = list(range(nodes))
        self.party_events: list[dict[str, Any]] = []
        self.graph_changes: list[dict[str, Any]] = []
        self.drops = drops
        self.snapshots: Snapshots | None = None
        self._rollback_rounds: tuple[bool, ...] = ()
        if rollback:  # (a lost party leaves the others running: distributed, continue)
            self.snapshots = Snapshots(snapshot_depth(run.topology))
            self._rollback_rounds = rollback_rounds(run.topology)

    def snapshot_before_step(self) -> None:
        """Before step ``t`` of a chunk: remember this position if a rollback can land here,
        that is, when step ``t`` ends with a gossip round in which some party exchanges
        (:func:`snapshot_depth`). A party learns of a loss only in an exchange, and every party
        keeps the same positions, so the position the survivors agree on is held by all."""
        if self.snapshots is None:
            return
        t, every = self.run.iteration, self.gossip_every
        phases = self._rollback_rounds
        if (t + 1) % every == 0 and phases[(t // every) % len(phases)]:
            self.snapshot(after_evaluation=True)

    def snapshot(self, after_evaluation: bool) -> None:
        """Remember this position (distributed ``continue`` only): before step ``t`` when
        ``after_evaluation``, else at iteration ``t`` before its evaluation and checkpoint."""
        if self.snapshots is None:
            return
        state = self.run.training_state()
        self.snapshots.add(Snapshot(2 * state.iteration + int(after_evaluation), state))

    def recover(self) -> Change:
        """After a failed exchange: agree with the survivors on who is lost, roll back to the
        position all of them hold, and continue on the surviving graph."""
        assert self.snapshots is not None
        change = self.run.engine.leave_generation(self.snapshots.position)
        self.run.restore(self.snapshots.rollback(change.position).state)
        for rank in change.lost:
            self.party_events.append(
                party_event(rank, change.iteration, "lost", change.reasons.get(rank, "lost"))
            )
        self.change_parties(list(change.members))
        self.snapshot(after_evaluation=bool(change.position % 2))
        return change

    def rejoin_after_loss(self) -> Change:
        """This party was counted as lost while out of reach (:class:`CountedLost`), but it is
        alive: roll back to its own newest snapshot, ask to be admitted again, and take the
        members' average at their next checkpoint boundary (:meth:`admit`), with no restart."""
        assert self.snapshots is not None
        self.run.restore(self.snapshots.at(self.snapshots.position).state)
        change = self.run.engine.rejoin(reason="came back by itself after being out of reach")
        self.admit(change, None)
        return change

    def apply_drops(self) -> list[int]:
        """The simulator's ``--drop-party`` losses due before this iteration's step."""
        iteration = self.run.iteration
        due = [r for r in self.drops.get(iteration, []) if r in self.members]
        if due:
            for rank in due:
                self.party_events.append(party_event(rank, iteration, "lost", "--drop-party"))
            self.change_parties([p for p in self.members if p not in due])
        return due

    def change_parties(self, members: list[int]) -> None:
        """Continue with ``members``: keep their rows, and mix over the surviving graph
        (:func:`slate.topology.surviving_topology`: Metropolis-Hastings weights over the
        remaining edges, bridged where the graph fell apart). The snapshot depth follows the
        new graph (a ring that lost a party is a longer path; :func:`snapshot_depth`), keeping
        the snapshots held, so that a later loss can still roll back as far as it needs."""
        run = self.run
        run.keep_parties(members)
        self.members = sorted(members)
        graph = run.switch_topology(self.members)
        if self.snapshots is not None:  # parties drift apart along the new graph
            self.snapshots.resize(snapshot_depth(run.topology))
            self._rollback_rounds = rollback_rounds(run.topology)
        self.graph_changes.append({"iteration": run.iteration, **graph.to_dict()})

    def admit(self, change: Change, returning_state: dict[str, Any] | None) -> None:
        """Welcome the returning parties of ``change`` (collective over the new members).

        A returning party takes the current members' average of the parameters and of every
        algorithm variable (momentum, tracker), the run's iteration, gossip rounds and history;
        its sampler streams skip ahead to that iteration. ``returning_state`` is this process's own
        checkpoint when it is the one returning.
        """
        run = self.run
        staying = [p for p in change.members if p not in change.joined]
        returning = run.engine.rank in change.joined
        if returning:
            run.faults.check("rejoin", 0)
        if returning and returning_state is not None:
            run.load_state_dict(returning_state, members_check=False)
        mine = run.training_state()
        x = self._staying_mean(mine.x, returning, len(staying))
        state = {
            k: self._staying_mean(v, returning, len(staying))
            for k, v in mine.algorithm_state.items()
        }
        record = {
            "iteration": mine.iteration, "history": run.history, "loss_steps": mine.loss_steps,
            "rounds": mine.traffic[2],
            "party_events": self.party_events, "graph_changes": self.graph_changes,
        }  # fmt: skip
        record = run.engine.broadcast_json(
            record if not returning else None, staying[0], WELCOME_SHAPE, "welcome record"
        )
        if returning:
            run.join_at(x, state, record["iteration"], record["loss_steps"], record["rounds"])
        run.history = record["history"]
        self.party_events = record["party_events"] + [
            party_event(
                rank,
                change.iteration,
                "rejoined",
                change.reasons.get(rank, "restarted with --resume"),
            )
            for rank in change.joined
        ]
        self.graph_changes = record["graph_changes"]
        self.change_parties(list(change.members))
        self.snapshot(after_evaluation=True)

    def _staying_mean(self, value: Tensor, returning: bool, staying: int) -> Tensor:
        """The mean of ``value`` over the staying members (collective; returners add 0)."""
        return self.run.engine.total(value * (0.0 if returning else 1.0), "average") / staying
