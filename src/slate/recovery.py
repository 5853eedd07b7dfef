"""Changes of the party set during a run: lost parties, returning ones, and injected drops.

A run keeps going when a party is lost (``--on-party-loss continue``). What the training loop
needs for that lives here:

* :class:`Snapshots`: the last few states of this process, by *position*. Position ``2 t`` is
  iteration ``t`` before its evaluation and checkpoint, ``2 t + 1`` after them, ready for step
  ``t``. A distributed party that detects a loss has usually finished a step or two more than a
  party farther away in the graph (a step needs only the neighbours' messages); the survivors
  agree to resume from the smallest position any of them holds, and each rolls back to it.
  Every saved tensor is replaced (never written in place) by the steps, so a snapshot holds
  references, not copies.
* :func:`parse_drops`: the simulator's ``--drop-party RANK@ITER`` schedule, the same event
  injected deterministically.
* :func:`party_event`: the records of ``summary.json``'s ``party_events``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from slate.errors import ConfigError

__all__ = [
    "RecordedExchange",
    "Snapshot",
    "Snapshots",
    "parse_drops",
    "party_event",
    "snapshot_depth",
]


@dataclass(frozen=True)
class Snapshot:
    """Everything a party needs to resume from one position (references, not copies)."""

    position: int
    x: Tensor
    algorithm_state: dict[str, Tensor]
    buffers: dict[str, Tensor]
    sampler_start: dict[str, Any]
    sampler_used: int
    loss_sum: Tensor
    loss_steps: int
    traffic: tuple[float, float]
    history_length: int

    @property
    def iteration(self) -> int:
        return self.position // 2


class Snapshots:
    """The newest ``depth`` snapshots, one per position."""

    def __init__(self, depth: int) -> None:
        self._items: deque[Snapshot] = deque(maxlen=depth)

    def add(self, snapshot: Snapshot) -> None:
        if self._items and self._items[-1].position == snapshot.position:
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
        held = [s.position for s in self._items]
        raise RuntimeError(f"no snapshot at position {position}; held: {held}")


def snapshot_depth(diameter: int) -> int:
    """Positions to keep: a party can be ahead of another by at most one step per hop between
    them (two positions each), plus the evaluation positions around a chunk's end."""
    return 2 * diameter + 6


def parse_drops(values: tuple[str, ...], nodes: int, iterations: int) -> dict[int, list[int]]:
    """``--drop-party RANK@ITER`` values to ``{iteration: [ranks]}``, checked.

    A party dropped at ``ITER`` takes part in iterations ``0 .. ITER-1``; the others switch to
    the surviving graph before step ``ITER``.
    """
    drops: dict[int, list[int]] = {}
    seen: set[int] = set()
    for text in values:
        rank_text, sep, at_text = text.partition("@")
        if not sep or not rank_text.strip().isdigit() or not at_text.strip().isdigit():
            raise ConfigError(
                f"--drop-party {text!r} is not RANK@ITER (for example 2@800: party 2 leaves "
                "before iteration 800)."
            )
        rank, at = int(rank_text), int(at_text)
        if rank >= nodes:
            raise ConfigError(f"--drop-party {text}: rank {rank} is not one of 0..{nodes - 1}.")
        if not 0 < at < iterations:
            raise ConfigError(
                f"--drop-party {text}: the iteration must lie in 1..{iterations - 1} "
                f"(--iterations {iterations})."
            )
        if rank in seen:
            raise ConfigError(f"--drop-party names party {rank} twice.")
        seen.add(rank)
        drops.setdefault(at, []).append(rank)
    if len(seen) >= nodes:
        raise ConfigError(f"--drop-party drops all {nodes} parties; at least one must remain.")
    return {at: sorted(ranks) for at, ranks in sorted(drops.items())}


def party_event(rank: int, iteration: int, event: str, reason: str) -> dict[str, Any]:
    """One entry of ``summary.json``'s ``party_events``: ``event`` is "lost" or "rejoined"."""
    return {"rank": rank, "iteration": iteration, "event": event, "reason": reason}


class RecordedExchange:
    """The data set-up's exchanges with the other parties, recorded, or replayed from a record.

    Setting up per-party data (:func:`slate.data.sources.load_local_data`) agrees on the schema
    and sums feature statistics with every party. A party that returns to a run in progress
    cannot repeat those exchanges (the others are training), so every party records their
    results in its checkpoints, and a returning party replays its own record: the same
    agreed schema and statistics, with no message sent.
    """

    def __init__(self, engine: Any = None, record: list[Any] | None = None) -> None:
        self.engine = engine
        self.replaying = record is not None
        self.record: list[Any] = list(record) if record is not None else []
        self._next = 0

    def total(self, value: Tensor) -> Tensor:
        if self.replaying:
            return self._replay().to(value.device)
        result = self.engine.total(value)
        self.record.append(result.detach().cpu())
        return result

    def gather_objects(self, items: list[Any]) -> list[Any]:
        if self.replaying:
            return self._replay()
        result = self.engine.gather_objects(items)
        self.record.append(result)
        return result

    def _replay(self) -> Any:
        if self._next >= len(self.record):
            raise ConfigError(
                "This party's checkpoint records fewer data set-up exchanges than its files "
                "need now: were its --train/--test files or flags changed since the run began?"
            )
        self._next += 1
        return self.record[self._next - 1]
