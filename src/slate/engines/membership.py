"""Who is still in a distributed run: heartbeats, agreeing on lost parties, admitting returners.

Every agreement goes through the rendezvous store (torch's ``TCPStore``). It must live outside
the parties for any party to be lost safely: the local launcher hosts it, and so does
``slate rendezvous`` for parties on separate machines.

The parties of one *generation* ``g`` form one process group. When an exchange fails, a party
leaves generation ``g`` and agrees with the others on the next one
(:meth:`Membership.agree_on_loss`):

1. it raises the generation's *failed* flag, which stops every other party's pending collective
   within ``POLL_SECONDS``, and checks in under ``down/<rank>`` with the position it can
   resume from;
2. it classifies every member: *checked in*, *gone* (its registered process on this host has
   exited, or its heartbeat counter has not moved for ``silence_s`` seconds) or *pending*;
3. once no member is pending (or ``timeout_s`` has passed: the pending ones count as gone), it
   proposes ``members = checked in, lost = the rest, position = the smallest checked-in
   position`` with the store's ``compare_set``: the first proposal wins and every party adopts it.

A returning party asks to join under ``join/<rank>``; the members look for such requests at each
checkpoint boundary and agree on the admitted ones the same way (:meth:`Membership.agree_on_joins`).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from slate.errors import SlateError

__all__ = ["Change", "CountedLost", "Heartbeat", "Membership", "PartyLost", "process_alive"]

PREFIX = "slate/"
BEAT_SECONDS = 0.5  # a live party's heartbeat counter moves this often
POLL_SECONDS = 0.05  # how often an agreeing party looks at the store
MAX_SILENCE_SECONDS = 10.0  # a heartbeat silent this long (timeout / 2 if less) means gone
LEFT_KEY = f"{PREFIX}left"  # parties that finished the run and left
FINAL_MEMBERS_KEY = f"{PREFIX}final_members"  # how many parties finished it (set by the main)
BEATS_KEY = f"{PREFIX}beats"  # every party's heartbeats together: the rendezvous sees activity


class PartyLost(SlateError):
    """Another party stopped answering (its process died or its machine became unreachable)."""


class CountedLost(PartyLost):
    """The others counted this party as lost while it was out of reach (frozen, or cut off from
    the network) and went on without it; it is alive, so it can ask to come back."""

    def __init__(self, rank: int, why: str, iteration: int) -> None:
        self.why, self.iteration = why, iteration
        super().__init__(
            f"Party {rank} was counted as lost by the others ({why}) and left the run at "
            f"iteration {iteration}. Restart it with --resume to rejoin at their next checkpoint."
        )


@dataclass(frozen=True)
class Change:
    """One agreed change of the party set: generation ``generation`` has ``members``.

    ``position`` is where the members continue: ``2 t`` before iteration ``t``'s evaluation and
    checkpoint, ``2 t + 1`` after them (:class:`slate.recovery.Snapshots`). ``reasons`` says why
    each lost party counts as lost.
    """

    generation: int
    members: tuple[int, ...]
    lost: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()
    position: int = 0
    reasons: dict[int, str] = field(default_factory=dict)

    def to_text(self) -> str:
        return json.dumps({**asdict(self), "reasons": {str(k): v for k, v in self.reasons.items()}})

    @staticmethod
    def from_text(text: str | bytes) -> Change:
        raw = json.loads(text)
        return Change(
            generation=raw["generation"],
            members=tuple(raw["members"]),
            lost=tuple(raw["lost"]),
            joined=tuple(raw["joined"]),
            position=raw["position"],
            reasons={int(k): v for k, v in raw["reasons"].items()},
        )

    @property
    def iteration(self) -> int:
        return self.position // 2


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host; a zombie (exited, not yet reaped) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


class Heartbeat:
    """A daemon thread that bumps ``beat/<rank>`` in the store every ``BEAT_SECONDS``.

    It talks through its own store connection (``connect()``), so that it never shares a socket
    with the training thread. When the store cannot be reached (a network outage at this site),
    it opens a new connection every ``BEAT_SECONDS`` until one answers, so the heartbeat resumes
    as soon as the site is reachable again. With ``identity`` (this process's ``host:pid``), a
    new connection is used only if the store still records this party as that process: a store
    restarted empty, or serving another run, gets no beats from this one.
    """

    def __init__(self, connect: Callable[[], Any], rank: int, identity: str | None = None) -> None:
        self._connect = connect
        self._store: Any = connect()
        self._key = f"{PREFIX}beat/{rank}"
        self._process_key, self._identity = f"{PREFIX}process/{rank}", identity
        self._stopped = threading.Event()
        self._store.add(self._key, 1)
        self._thread = threading.Thread(target=self._run, name="slate-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(BEAT_SECONDS):
            try:
                if self._store is None:
                    self._store = self._same_run(self._connect())
                if self._store is None:
                    continue
                self._store.add(self._key, 1)
                self._store.add(BEATS_KEY, 1)
            except Exception:  # unreachable for now: a new connection at the next beat
                self._store = None

    def _same_run(self, store: Any) -> Any:
        if self._identity is None:
            return store
        known = store.check([self._process_key])
        return store if known and store.get(self._process_key).decode() == self._identity else None

    def stop(self) -> None:
        self._stopped.set()


class _Liveness:
    """Tells whether a member is gone: its local process exited, or its heartbeat fell silent."""

    def __init__(self, store, silence_s: float, incarnations: dict[int, str] | None = None) -> None:
        self.store = store
        self.silence_s = silence_s
        self.seen: dict[int, tuple[int, float]] = {}  # rank -> (counter, when it last moved)
        # rank -> "host:pid" of the process in the run (shared with the membership, not copied)
        self.incarnations = incarnations if incarnations is not None else {}

    def gone(self, rank: int) -> str | None:
        """Why ``rank`` counts as gone, or None while it may still be alive."""
        where = self._registered(rank)
        known = self.incarnations.get(rank)
        if where is not None and known is not None and f"{where[0]}:{where[1]}" != known:
            # A supervisor restarted it at once: the new process bumps the same heartbeat.
            return f"its process was replaced by a new one (pid {where[1]} on {where[0]})"
        if where is not None and where[0] == socket.gethostname() and not process_alive(where[1]):
            return f"its process (pid {where[1]}) exited"
        counter = int(self.store.add(f"{PREFIX}beat/{rank}", 0))
        now = time.monotonic()
        last = self.seen.get(rank)
        if last is None or last[0] != counter:
            self.seen[rank] = (counter, now)
            return None
        if now - last[1] >= self.silence_s:
            return f"no heartbeat for {now - last[1]:.1f} s"
        return None

    def _registered(self, rank: int) -> tuple[str, int] | None:
        key = f"{PREFIX}process/{rank}"
        if not self.store.check([key]):
            return None
        host, _, pid = self.store.get(key).decode().rpartition(":")
        return host, int(pid)


class Membership:
    """This party's view of the run's membership, kept in agreement through the store.

    Args:
        store: the rendezvous store (a client connection).
        rank: this party's rank in the whole run (0..N-1), which never changes.
        members: the parties of the current generation, in rank order.
        timeout_s: ``--timeout``: how long to wait for a party that neither answers nor is gone.
    """

    def __init__(self, store, rank: int, members: list[int], timeout_s: float) -> None:
        self.store = store
        self.rank = rank
        self.members = tuple(members)
        self.generation = 0
        self.timeout_s = timeout_s
        self.silence_s = max(3 * BEAT_SECONDS, min(MAX_SILENCE_SECONDS, timeout_s / 2))
        self.process = f"{socket.gethostname()}:{os.getpid()}"
        self._refuse_a_second_copy()
        store.set(f"{PREFIX}process/{rank}", self.process)
        self.incarnations: dict[int, str] = {}  # each member's process, once its group opened
        # Kept for the whole run: a member's heartbeat counter is compared with the value seen
        # last, whenever that was, so silence is measured from its last beat anyone saw.
        self.liveness = _Liveness(store, self.silence_s, self.incarnations)

    def _refuse_a_second_copy(self) -> None:
        """Refuse to stand in for a process of this rank that is still running: one on this host
        whose pid is alive, or one elsewhere whose heartbeat moves (watched for
        ``3 * BEAT_SECONDS``). A process that died or froze may be replaced."""
        key = f"{PREFIX}process/{self.rank}"
        if not self.store.check([key]):
            return  # nobody has had this rank at this store yet
        running = self.store.get(key).decode()
        host, _, pid = running.rpartition(":")
        if host == socket.gethostname():
            alive = int(pid) != os.getpid() and process_alive(int(pid))
        else:
            beat = f"{PREFIX}beat/{self.rank}"
            before = int(self.store.add(beat, 0))
            time.sleep(3 * BEAT_SECONDS)
            alive = int(self.store.add(beat, 0)) != before
        if alive:
            raise PartyLost(
                f"Party {self.rank} is already running at this rendezvous (process {running}), "
                "so this second copy stops. Stop that process first, or give this one another "
                "--rank."
            )

    def note_incarnations(self) -> None:
        """Remember which process (``host:pid``) each member is, once the generation's group is
        open: a process restarted under the same rank is then told apart from the one that was
        in the run, although it bumps the same heartbeat."""
        known = {}
        for member in self.members:  # a lost party is forgotten: it may come back as a new one
            key = f"{PREFIX}process/{member}"
            if self.store.check([key]):
                known[member] = self.store.get(key).decode()
        self.incarnations.clear()
        self.incarnations.update(known)

    def key(self, name: str, generation: int | None = None) -> str:
        g = self.generation if generation is None else generation
        return f"{PREFIX}g{g}/{name}"

    # -- losses -------------------------------------------------------------------------------

    def raise_failed_flag(self) -> None:
        """Tell every member that generation ``g`` is over (their waits stop within a poll)."""
        self.store.set(self.key("failed"), str(self.rank))

    def failed(self) -> bool:
        """Whether some member has left the current generation (a quick store lookup)."""
        return bool(self.store.check([self.key("failed")]))

    def silent_member(self, ranks: list[int]) -> tuple[int, str] | None:
        """The first of ``ranks`` (other than this party) that is gone, with why: its heartbeat
        has not moved for ``silence_s`` seconds, or its process exited or was replaced. A wait
        for such a member ends on this timer, long before ``--timeout``."""
        for rank in ranks:
            if rank != self.rank:
                why = self.liveness.gone(rank)
                if why is not None:
                    return rank, why
        return None

    def agree_on_loss(self, position: int) -> Change:
        """Leave the current generation at ``position`` and return the agreed next one.

        Raises :class:`PartyLost` when this party was counted as lost, and when no party was
        lost at all (an exchange failed although every party is alive: a network fault that a
        new process group would hit again).
        """
        self.raise_failed_flag()
        self.store.set(self.key(f"down/{self.rank}"), str(position))
        change = self._decide(self._loss_proposal)
        return self._adopt(change)

    def _loss_proposal(self, liveness: _Liveness, late: bool) -> Change | None:
        down, lost, reasons = {}, [], {}
        for member in self.members:
            key = self.key(f"down/{member}")
            if self.store.check([key]):
                down[member] = int(self.store.get(key))
                continue
            why = liveness.gone(member)
            if why is None and late:
                why = f"did not answer within --timeout {self.timeout_s:g} s"
            if why is None:
                return None  # a live member has not checked in yet: wait for it
            lost.append(member)
            reasons[member] = why
        return Change(
            generation=self.generation + 1,
            members=tuple(sorted(down)),
            lost=tuple(lost),
            position=min(down.values()),
            reasons=reasons,
        )

    # -- joins --------------------------------------------------------------------------------

    def agree_on_joins(self, iteration: int) -> Change | None:
        """At a checkpoint boundary: the agreed admission of returning parties, if any."""
        liveness = _Liveness(self.store, self.silence_s, self.incarnations)
        pending = [
            rank
            for rank in self._requests()
            if rank not in self.members and liveness.gone(rank) is None
        ]
        proposal = json.dumps(pending)
        agreed = json.loads(self.store.compare_set(self.key(f"joins/{iteration}"), "", proposal))
        if not agreed:
            return None
        change = Change(
            generation=self.generation + 1,
            members=tuple(sorted({*self.members, *agreed})),
            joined=tuple(agreed),
            position=2 * iteration + 1,
            reasons={rank: self._join_reason(rank) for rank in agreed},
        )
        winner = Change.from_text(self.store.compare_set(self.key("change"), "", change.to_text()))
        for rank in winner.joined:
            self.store.set(f"{PREFIX}admitted/{rank}", winner.to_text())
        return self._adopt(winner)

    def _join_reason(self, rank: int) -> str:
        key = f"{PREFIX}join_reason/{rank}"
        return self.store.get(key).decode() if self.store.check([key]) else "returned"

    def _requests(self) -> list[int]:
        count = int(self.store.add(f"{PREFIX}join_requests", 0))
        ranks = []
        for k in range(count):
            key = f"{PREFIX}join_request/{k}"
            if self.store.check([key]):
                ranks.append(int(self.store.get(key)))
        return sorted(set(ranks))

    def request_join(self, reason: str = "restarted with --resume") -> Change:
        """Ask the running parties to admit this one and wait for their next checkpoint
        boundary, where they admit it; return the admission. ``reason`` goes into their
        ``party_events``.

        Raises :class:`PartyLost` when the run has finished, when a newer process has taken
        this party's rank, or when no other party's heartbeat moves (nobody is left to admit
        it: a full restart needs a fresh rendezvous store).
        """
        registered = self.store.get(f"{PREFIX}process/{self.rank}").decode()
        if registered != self.process:
            raise PartyLost(
                f"Party {self.rank} ({self.process}) was out of reach, and another process "
                f"({registered}) has since taken its place in the run; this one stops."
            )
        self.store.set(f"{PREFIX}join_reason/{self.rank}", reason)
        admitted = f"{PREFIX}admitted/{self.rank}"
        self.store.delete_key(admitted)
        slot = int(self.store.add(f"{PREFIX}join_requests", 1)) - 1
        self.store.set(f"{PREFIX}join_request/{slot}", str(self.rank))
        liveness = _Liveness(self.store, self.silence_s, self.incarnations)
        others = [rank for rank in self.members if rank != self.rank]
        while not self.store.check([admitted]):
            if self.store.check([FINAL_MEMBERS_KEY]):
                raise PartyLost(
                    f"Party {self.rank} cannot rejoin: the other parties have already finished "
                    "the run."
                )
            if all(liveness.gone(rank) is not None for rank in others):
                raise PartyLost(
                    f"Party {self.rank} cannot rejoin: no other party of the run at this "
                    "rendezvous is running (their heartbeats have stopped). To restart every "
                    "party, start a fresh 'slate rendezvous' first, then all parties with "
                    "--resume."
                )
            time.sleep(POLL_SECONDS)
        change = Change.from_text(self.store.get(admitted))
        self.store.delete_key(f"{PREFIX}join_request/{slot}")
        self.generation = change.generation - 1
        return self._adopt(change)

    def running_generation(self) -> int | None:
        """The generation of a run in progress at this store, or None before any started."""
        key = f"{PREFIX}generation"
        return int(self.store.get(key)) if self.store.check([key]) else None

    def announce(self) -> None:
        """Record that the current generation's process group is open."""
        self.store.set(f"{PREFIX}generation", str(self.generation))
        self.note_incarnations()

    # -- shared -------------------------------------------------------------------------------

    def _decide(self, propose: Callable[[_Liveness, bool], Change | None]) -> Change:
        liveness = self.liveness
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.store.check([self.key("change")]):
                return Change.from_text(self.store.get(self.key("change")))
            proposal = propose(liveness, time.monotonic() > deadline)
            if proposal is not None:
                text = self.store.compare_set(self.key("change"), "", proposal.to_text())
                return Change.from_text(text)
            time.sleep(POLL_SECONDS)

    def _adopt(self, change: Change) -> Change:
        if self.rank not in change.members:
            why = change.reasons.get(self.rank, "it did not answer in time")
            raise CountedLost(self.rank, why, change.iteration)
        if not change.lost and not change.joined:
            raise PartyLost(
                "An exchange between parties failed although every party is still alive: a "
                "network fault between sites (check the VPN or tunnels, docs/deployment.md). "
                "Every party stops; restart them with --resume."
            )
        self.generation, self.members = change.generation, change.members
        self.note_incarnations()  # a returning party is a new process
        return change
