"""Who is gone, found off the training thread: a daemon that reads the store and tells waits.

A party waiting for a gossip message or a collective must give up as soon as another member raised
the generation's *failed* flag or fell silent (:mod:`slate.engines.distributed.control.membership`).
Asking the store from the wait itself puts round trips to the rendezvous on the training thread:
over an 80 ms link (the testbed of ``docs/wan.md``), 63 such calls cost a 2000-iteration run 38.7 s.
The :class:`Lookout` asks instead, every ``LOOK_SECONDS`` on its own store connection: the failed
flag of the current generation (one ``check``), then every other member's registered process and
heartbeat together (``check`` and ``multi_get``: two round trips for all of them), and, while a
party is out of the generation, its join request. A wait reads its last :class:`Sighting`, without
touching the network: the lookout alone tells a wait who is gone. At a checkpoint boundary the
parties agree on returning parties through the store only when some lookout saw a join request (one
flag in the boundary's one exchange).

A sighting belongs to one generation, one member list and one set of member processes: one
made before the party set changed is never applied to the next one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slate.engines.distributed.control.liveness import BEAT_SECONDS, Liveness
from slate.engines.distributed.control.membership import Membership
from slate.engines.distributed.control.store_records import Records

__all__ = ["LOOK_SECONDS", "Lookout", "Sighting"]

LOOK_SECONDS = BEAT_SECONDS  # how often the lookout reads the store
UNREACHABLE_SECONDS = 4 * LOOK_SECONDS  # no look reached the store for this long: out of reach


@dataclass(frozen=True)
class Sighting:
    """What the lookout saw of one generation: its failed flag and the members gone (why)."""

    generation: int
    members: tuple[int, ...]
    incarnations: tuple[tuple[int, str], ...]  # each member's process when it looked
    failed: bool = False
    gone: dict[int, str] = field(default_factory=dict)
    joins: bool = False  # a party outside the generation asks to join


class Lookout:
    """A daemon thread that watches the store for ``membership`` (see the module doc).

    ``connect()`` opens its own store connection, and a new one after any failure (a site cut
    off keeps its last sighting, so its waits go on, bounded by ``--timeout``, as before).
    """

    def __init__(
        self, connect: Callable[[], Any], membership: Membership, records: Records
    ) -> None:
        self._connect, self._membership, self._template = connect, membership, records
        self._records: Records | None = None
        self._liveness: Liveness | None = None
        self._sighting: Sighting | None = None
        self._last_look = time.monotonic()  # when a look last reached the store
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slate-lookout", daemon=True)
        self._thread.start()

    def sighting(self) -> Sighting | None:
        """The last sighting of the current generation and members, or None."""
        seen, membership = self._sighting, self._membership
        if seen is None or seen.generation != membership.generation:
            return None
        current = (tuple(membership.members), _processes(membership))
        return seen if (seen.members, seen.incarnations) == current else None

    def joins_requested(self) -> bool:
        """Whether the last sighting saw a party outside the generation asking to join."""
        seen = self.sighting()
        return seen is not None and seen.joins

    def out_of_reach(self) -> bool:
        """Whether no look has reached the store for ``UNREACHABLE_SECONDS``."""
        return time.monotonic() - self._last_look > UNREACHABLE_SECONDS

    def _run(self) -> None:
        while not self._stopped.wait(LOOK_SECONDS):
            try:
                self._sighting = self._look()
            except Exception:  # unreachable for now: a new connection at the next look
                self._records = None

    def _look(self) -> Sighting:
        membership = self._membership
        generation, members = membership.generation, tuple(membership.members)
        processes = _processes(membership)
        if self._records is None:
            self._records = self._template.with_store(self._connect())
            # Its own connection, and the membership's record of when each beat last moved:
            # an agreement on a loss then measures a member's silence from the last beat the
            # lookout saw, not from the moment the agreement began.
            self._liveness = Liveness(
                self._records, membership.silence_s, membership.incarnations,
                membership.liveness.seen,
            )  # fmt: skip
        assert self._liveness is not None
        failed = membership.failed(self._records, generation)
        others = [rank for rank in members if rank != membership.rank]
        gone = self._liveness.gone_of(others)
        joins = len(members) < membership.nodes and membership.joins_requested(self._records)
        self._last_look = time.monotonic()
        return Sighting(generation, members, processes, failed, gone, joins)

    def stop(self) -> None:
        """Stop looking; waits briefly for a look in progress (as the heartbeat does)."""
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=4 * LOOK_SECONDS)


def _processes(membership: Membership) -> tuple[tuple[int, str], ...]:
    return tuple(sorted(dict(membership.incarnations).items()))
