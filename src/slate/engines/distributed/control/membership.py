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
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from slate.engines.distributed.control.liveness import (
    BEAT_SECONDS,
    MAX_SILENCE_SECONDS,
    PREFIX,
    Liveness,
    final_members,
    process_alive,
    registered_process,
    registered_processes,
)
from slate.engines.distributed.control.store_records import RECORD_LIMIT, Records, parse_rank
from slate.errors import SlateError
from slate.security.messages import ListOf, MalformedMessage, MapOf, decode

__all__ = ["Change", "CountedLost", "Membership", "PartyLost"]

POLL_SECONDS = 0.05  # how often an agreeing party looks at the store


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


RANKS = ListOf(int, 65536)
CHANGE_SHAPE = {
    "generation": int, "members": RANKS, "lost": RANKS, "joined": RANKS, "position": int,
    "reasons": MapOf(str, 65536, int_keys=True),
}  # fmt: skip


@dataclass(frozen=True)
class Change:
    """One agreed change of the party set: generation ``generation`` has ``members``.

    ``position`` is where the members continue: ``2 t`` before iteration ``t``'s evaluation and
    checkpoint, ``2 t + 1`` after them (:class:`slate.training.recovery.Snapshots`). ``reasons``
    says why each lost party counts as lost.
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
    def from_text(text: str | bytes, nodes: int) -> Change | None:
        """The change in ``text``, or None unless it is a change of this run: every rank in
        ``0..nodes-1``, the generation and position non-negative."""
        try:
            raw = decode(text if isinstance(text, bytes) else text.encode(), CHANGE_SHAPE,
                         "?", "membership change", RECORD_LIMIT)  # fmt: skip
        except MalformedMessage:
            return None
        ranks = [*raw["members"], *raw["lost"], *raw["joined"], *map(int, raw["reasons"])]
        if not all(0 <= r < nodes for r in ranks) or min(raw["generation"], raw["position"]) < 0:
            return None
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


class Membership:
    """This party's view of the run's membership, kept in agreement through the store.

    Args:
        records: the rendezvous store's records
        (:class:`slate.engines.distributed.control.store_records.Records`). rank: this party's rank
        in the whole run (0..N-1), which never changes. members: the parties of the current
        generation, in rank order. timeout_s: ``--timeout``: how long to wait for a party that
        neither answers nor is gone.
    """

    def __init__(self, records: Records, rank: int, members: list[int], timeout_s: float) -> None:
        self.records = records
        self.store = records.store
        self.nodes = records.nodes
        self.rank = rank
        self.members = tuple(members)
        self.generation = 0
        self.timeout_s = timeout_s
        self.silence_s = max(3 * BEAT_SECONDS, min(MAX_SILENCE_SECONDS, timeout_s / 2))
        self.process = f"{socket.gethostname()}:{os.getpid()}"
        self._refuse_a_second_copy()
        records.put(f"{PREFIX}process/{rank}", self.process)
        self.incarnations: dict[int, str] = {}  # each member's process, once its group opened
        # Kept for the whole run: a member's heartbeat counter is compared with the value seen
        # last, whenever that was, so silence is measured from its last beat anyone saw.
        self.liveness = Liveness(records, self.silence_s, self.incarnations)

    def _refuse_a_second_copy(self) -> None:
        """Refuse to stand in for a process of this rank that is still running: one on this host
        whose pid is alive, or one elsewhere whose heartbeat moves (watched for
        ``3 * BEAT_SECONDS``). A process that died or froze may be replaced; a registration
        that is not this site's (unsigned under a roster) is no process of this rank at all."""
        running = registered_process(self.records, self.rank)
        if running is None:
            return  # nobody has had this rank at this store yet
        host, pid = running
        if host == socket.gethostname():
            alive = pid != os.getpid() and process_alive(pid)
        else:
            liveness = Liveness(self.records, 3 * BEAT_SECONDS)
            liveness.gone(self.rank)
            time.sleep(3 * BEAT_SECONDS)
            alive = liveness.gone(self.rank) is None
        if alive:
            raise PartyLost(
                f"Party {self.rank} is already running at this rendezvous (process "
                f"{host}:{pid}), so this second copy stops. Stop that process first, or give "
                "this one another --rank."
            )

    def note_incarnations(self) -> None:
        """Remember which process (``host:pid``) each member is, once the generation's group is
        open: a process restarted under the same rank is then told apart from the one that was
        in the run, although it bumps the same heartbeat."""
        known = {}
        # (a lost party is forgotten: it may come back as a new one)
        for member, where in registered_processes(self.records, list(self.members)).items():
            if where is not None:
                known[member] = f"{where[0]}:{where[1]}"
        self.incarnations.clear()
        self.incarnations.update(known)

    def key(self, name: str, generation: int | None = None) -> str:
        g = self.generation if generation is None else generation
        return f"{PREFIX}g{g}/{name}"

    # -- losses -------------------------------------------------------------------------------

    def raise_failed_flag(self) -> None:
        """Tell every member that generation ``g`` is over (their waits stop within a poll)."""
        self.records.put(self.key("failed"), str(self.rank), self.generation)

    def failed(self, records: Records | None = None, generation: int | None = None) -> bool:
        """Whether some member has left the current generation (a quick store lookup), through
        ``records`` (another thread's connection) when given."""
        records = records or self.records
        generation = self.generation if generation is None else generation
        key = self.key("failed", generation)
        if not records.store.check([key]):
            return False
        found = records.get_signed(key, generation)
        if found is None:
            return False
        signer, body = found
        rank = parse_rank(body, self.nodes)
        if rank is None or rank not in self.members or signer not in (-1, rank):
            records.note(key, str(signer), "it raises the flag for another party")
            return False
        return True

    def agree_on_loss(self, position: int) -> Change:
        """Leave the current generation at ``position`` and return the agreed next one.

        Raises :class:`PartyLost` when this party was counted as lost, and when no party was
        lost at all (an exchange failed although every party is alive: a network fault that a
        new process group would hit again).
        """
        self.raise_failed_flag()
        self.records.put(self.key(f"down/{self.rank}"), str(position), self.generation)
        change = self._decide(self._loss_proposal)
        return self._adopt(change)

    def report_refused(self, sender: int, why: str) -> None:
        """Record (signed by this party) that a sealed message of ``sender`` was refused: the
        survivors then count ``sender`` as lost in this generation's loss agreement."""
        self.records.put(self.key(f"refused/{sender}"), why[:1000], self.generation)

    def _refused(self, member: int) -> str | None:
        return self.records.get(self.key(f"refused/{member}"), None, self.generation)

    def _checked_in(self, member: int) -> int | None:
        """The position ``member`` checked in with after leaving this generation, if it did."""
        body = self.records.get(self.key(f"down/{member}"), self._signer(member), self.generation)
        if body is None or not body.isdigit() or len(body) > 18:
            return None
        return int(body)

    def _signer(self, rank: int) -> int | None:
        return rank if self.records.signed else None

    def _loss_proposal(self, liveness: Liveness, late: bool) -> Change | None:
        down, lost, reasons = {}, [], {}
        for member in self.members:
            refused = self._refused(member)
            if refused is not None:  # its sealed messages were refused: never mixed again
                lost.append(member)
                reasons[member] = f"its sealed message was refused ({refused[:200]})"
                continue
            position = self._checked_in(member)
            if position is not None:
                down[member] = position
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
        liveness = Liveness(self.records, self.silence_s, self.incarnations)
        requests = self._requests()
        pending = [rank for rank in requests if liveness.gone(rank) is None]
        agreed = self.records.first(
            self.key(f"joins/{iteration}"), json.dumps(pending), self.generation,
            valid=lambda text: self._ranks(text) is not None,
        )  # fmt: skip
        ranks = [r for r in self._ranks(agreed) or [] if r not in self.members]
        if not ranks:
            return None
        change = Change(
            generation=self.generation + 1,
            members=tuple(sorted({*self.members, *ranks})),
            joined=tuple(ranks),
            position=2 * iteration + 1,
            reasons={rank: requests.get(rank, {}).get("reason", "returned") for rank in ranks},
        )
        winner = self._first_change(change)
        for rank in winner.joined:  # each admission answers the request it admits
            request = requests.get(rank) or self._request_of(rank) or {"nonce": ""}
            admitted = f"{PREFIX}admitted/{rank}/{request['nonce']}"
            self.records.put(admitted, winner.to_text(), winner.generation)
        return self._adopt(winner)

    def _ranks(self, text: str) -> list[int] | None:
        try:
            ranks = decode(text.encode(), RANKS, "?", "list of ranks", RECORD_LIMIT)
        except MalformedMessage:
            return None
        return ranks if all(0 <= r < self.nodes for r in ranks) else None

    def _requests(self, records: Records | None = None) -> dict[int, dict[str, str]]:
        """The valid join requests of parties outside the generation: rank -> its request (one
        lookup per party outside it; none while every party is in), read through ``records``
        (another thread's connection) when given."""
        found = {}
        for rank in range(self.nodes):
            if rank in self.members:
                continue
            request = self._request_of(rank, records)
            if request is not None:
                found[rank] = request
        return found

    def joins_requested(self, records: Records) -> bool:
        """Whether a party outside the generation asks to join (for the lookout)."""
        return bool(self._requests(records))

    def _request_of(self, rank: int, records: Records | None = None) -> dict[str, str] | None:
        records = records or self.records
        body = records.get(f"{PREFIX}join_request/{rank}", self._signer(rank))
        try:
            request = decode((body or "").encode(), REQUEST_SHAPE, rank, "join request", 4096)
        except MalformedMessage:
            return None
        return request if request["process"] == self.incarnation_of(rank, records) else None

    def incarnation_of(self, rank: int, records: Records | None = None) -> str | None:
        where = registered_process(records or self.records, rank)
        return None if where is None else f"{where[0]}:{where[1]}"

    def request_join(self, reason: str = "restarted with --resume") -> Change:
        """Ask the running parties to admit this one and wait for their next checkpoint
        boundary, where they admit it; return the admission. ``reason`` goes into their
        ``party_events``.

        Raises :class:`PartyLost` when the run has finished, when a newer process has taken
        this party's rank, or when no other party's heartbeat moves (nobody is left to admit
        it: a full restart needs a fresh rendezvous store).
        """
        registered = self.incarnation_of(self.rank)
        if registered != self.process:
            raise PartyLost(
                f"Party {self.rank} ({self.process}) was out of reach, and another process "
                f"({registered}) has since taken its place in the run; this one stops."
            )
        nonce = secrets.token_hex(8)  # the admission answers this request, not an older one
        request = {"process": self.process, "reason": reason[:500], "nonce": nonce}
        self.records.put(f"{PREFIX}join_request/{self.rank}", json.dumps(request))
        admitted = f"{PREFIX}admitted/{self.rank}/{nonce}"
        liveness = Liveness(self.records, self.silence_s, self.incarnations)
        others = [rank for rank in self.members if rank != self.rank]
        while (change := self._admission(admitted)) is None:
            if self.run_finished():
                raise PartyLost(
                    f"Party {self.rank} cannot rejoin: the other parties have already finished "
                    "the run (their final model is in their --out folders); this party's "
                    "checkpoints stay as they were."
                )
            if all(liveness.gone(rank) is not None for rank in others):
                raise PartyLost(
                    f"Party {self.rank} cannot rejoin: no other party of the run at this "
                    "rendezvous is running (their heartbeats have stopped). To restart every "
                    "party, start a fresh 'slate rendezvous' first, then all parties with "
                    "--resume."
                )
            time.sleep(POLL_SECONDS)
        self.store.delete_key(f"{PREFIX}join_request/{self.rank}")
        self.generation = change.generation - 1
        return self._adopt(change)

    def _admission(self, key: str) -> Change | None:
        if not self.store.check([key]):
            return None
        found = self.records.get_signed(key)
        change = None if found is None else Change.from_text(found[1], self.nodes)
        return change if change is not None and self.rank in change.joined else None

    def run_finished(self) -> bool:
        """Whether the main party recorded that the run is over."""
        return final_members(self.records) is not None

    def running_generation(self) -> int | None:
        """The generation of a run in progress at this store, or None before any started."""
        body = self.records.get(f"{PREFIX}generation")
        return int(body) if body is not None and body.isdigit() and len(body) < 10 else None

    def announce(self) -> None:
        """Record that the current generation's process group is open."""
        self.records.put(f"{PREFIX}generation", str(self.generation), self.generation)
        self.note_incarnations()

    # -- shared -------------------------------------------------------------------------------

    def _first_change(self, proposal: Change) -> Change:
        """The first valid change proposed for the next generation (``proposal`` if none was)."""
        text = self.records.first(
            self.key("change"), proposal.to_text(), self.generation,
            valid=lambda text: self._valid_change(Change.from_text(text, self.nodes)),
        )  # fmt: skip
        change = Change.from_text(text, self.nodes)
        assert change is not None
        return change

    def _valid_change(self, change: Change | None) -> bool:
        return change is not None and change.generation == self.generation + 1

    def _decide(self, propose: Callable[[Liveness, bool], Change | None]) -> Change:
        liveness = self.liveness
        deadline = time.monotonic() + self.timeout_s
        while True:
            agreed = self._proposed_change()
            if agreed is not None:
                return agreed
            proposal = propose(liveness, time.monotonic() > deadline)
            if proposal is not None:
                return self._first_change(proposal)
            time.sleep(POLL_SECONDS)

    def _proposed_change(self) -> Change | None:
        key = self.key("change")
        if not self.store.check([key]):
            return None
        body = self.records.get(key, generation=self.generation)
        change = None if body is None else Change.from_text(body, self.nodes)
        return change if self._valid_change(change) else None

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


REQUEST_SHAPE = {"process": str, "reason": str, "nonce": str}
