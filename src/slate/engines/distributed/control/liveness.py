"""Who is alive in a distributed run: heartbeats, registered processes, and who left at the end.

Every party registers its ``host:pid`` under ``process/<rank>`` and beats under
``beat/<rank>`` (:class:`Heartbeat`: a counter, or a signed record under a roster).
:class:`Liveness` tells from those records whether a member is *gone*: its registered process on
this host has exited or was replaced, or its heartbeat has not moved for ``silence_s`` seconds.
The agreement on lost and returning parties (:mod:`slate.engines.distributed.control.membership`),
the lookout (:mod:`slate.engines.distributed.control.lookout`) and the launcher read these records;
a party that finishes the run records that it left (:func:`leave_run`, :func:`parties_left`,
:func:`final_members`) and, when a ``slate rendezvous`` serves the store, waits briefly until the
rendezvous says it saw those records, writing again any that someone deleted
(:func:`confirm_leave`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from slate.engines.distributed.control.store_records import RECORD_LIMIT, Records, parse_rank, read

__all__ = [
    "BEAT_SECONDS",
    "FINAL_MEMBERS_KEY",
    "PREFIX",
    "SEEN_KEY",
    "Heartbeat",
    "Liveness",
    "confirm_leave",
    "final_members",
    "final_ranks",
    "has_left",
    "leave_run",
    "parties_left",
    "process_alive",
    "registered_process",
    "registered_processes",
    "signed_beats",
]

PREFIX = "slate/"
BEAT_SECONDS = 0.5  # a live party's heartbeat counter moves this often
MAX_SILENCE_SECONDS = 10.0  # a heartbeat silent this long (timeout / 2 if less) means gone
LEFT_KEY = f"{PREFIX}left"  # LEFT_KEY/<rank>: that party finished the run and left
FINAL_MEMBERS_KEY = f"{PREFIX}final_members"  # the ranks that finished it (set by the main)
#: What ``slate rendezvous`` saw of the end (plain JSON ``{"final": [ranks] or null, "left":
#: [ranks]}``); written when it starts, so its presence also says that one serves the store.
SEEN_KEY = f"{PREFIX}rendezvous/seen"
CONFIRM_SECONDS = 5.0  # how long a leaving party waits for the rendezvous to see its records
BEATS_KEY = f"{PREFIX}beats"  # every party's heartbeats together: the rendezvous sees activity


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
    """A daemon thread that beats for party ``rank`` every ``BEAT_SECONDS``.

    Without a roster a beat bumps the counter ``beat/<rank>``; with one it writes a signed
    record ``"<host:pid> <count>"`` there (a stranger can neither fake nor replay a live beat).
    It talks through its own store connection (``connect()``), so that it never shares a socket
    with the training thread. When the store cannot be reached (a network outage at this site),
    it opens a new connection every ``BEAT_SECONDS`` until one answers, so the heartbeat resumes
    as soon as the site is reachable again. With ``identity`` (this process's ``host:pid``), a
    new connection is used only if the store still records this party as that process: a store
    restarted empty, or serving another run, gets no beats from this one.

    The thread opens its connection and sends the first beat itself, at once: the caller makes
    no round trip to the store (over a wide-area link, a connection and a beat are four).
    ``first_beat`` is set once that first attempt is over.
    """

    def __init__(
        self, connect: Callable[[], Any], rank: int, records: Records, identity: str | None = None
    ) -> None:
        self._connect = connect
        self._rank, self._identity = rank, identity
        self._template = records
        self._records: Records | None = None
        self._count = 0
        self._stopped = threading.Event()
        self.first_beat = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slate-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self, records: Records) -> None:
        key = f"{PREFIX}beat/{self._rank}"
        if records.signed:  # no counter: a stranger's text under a counter's key would make
            self._count += 1  # the store close the connection of the next party that adds
            records.put(key, f"{self._identity or '?'} {self._count}")
            return
        records.store.add(key, 1)
        records.store.add(BEATS_KEY, 1)

    def _run(self) -> None:
        first = True  # the first connection needs no check: this process just registered
        while first or not self._stopped.wait(BEAT_SECONDS):
            try:
                if self._records is None:
                    records = self._template.with_store(self._connect())
                    self._records = records if first else self._same_run(records)
                if self._records is not None:
                    self._beat(self._records)
            except Exception:  # unreachable for now: a new connection at the next beat
                self._records = None
            if first:
                first = False
                self.first_beat.set()

    def _same_run(self, records: Records) -> Records | None:
        if self._identity is None:
            return records
        registered = records.get(f"{PREFIX}process/{self._rank}", signer=self._rank)
        return records if registered == self._identity else None

    def stop(self) -> None:
        """Stop beating, and wait briefly for a beat in progress (a thread left inside a store
        call when the interpreter exits can abort it)."""
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=4 * BEAT_SECONDS)


class Liveness:
    """Tells whether a member is gone: its local process exited, or its heartbeat fell silent."""

    def __init__(
        self,
        records: Records,
        silence_s: float,
        incarnations: dict[int, str] | None = None,
        seen: dict[int, tuple[Any, float]] | None = None,
    ) -> None:
        self.records = records
        self.silence_s = silence_s
        # rank -> (beat, when it last moved); shared with another thread's liveness when given
        self.seen: dict[int, tuple[Any, float]] = {} if seen is None else seen
        # rank -> "host:pid" of the process in the run (shared with the membership, not copied)
        self.incarnations = incarnations if incarnations is not None else {}

    def gone(self, rank: int) -> str | None:
        """Why ``rank`` counts as gone, or None while it may still be alive."""
        return self._verdict(rank, registered_process(self.records, rank), self._beat(rank))

    def gone_of(self, ranks: list[int]) -> dict[int, str]:
        """:meth:`gone` of several ranks, their records read together (two round trips)."""
        keys, signers = [], []
        for rank in ranks:
            signer = rank if self.records.signed else None
            keys += [f"{PREFIX}process/{rank}", f"{PREFIX}beat/{rank}"]
            signers += [signer, signer]
        bodies = self.records.get_many(keys, signers)
        found = {}
        for i, rank in enumerate(ranks):
            where, beat = _process_of(bodies[2 * i]), self._beat_of(bodies[2 * i + 1])
            why = self._verdict(rank, where, beat)
            if why is not None:
                found[rank] = why
        return found

    def _verdict(self, rank: int, where: tuple[str, int] | None, beat: Any) -> str | None:
        known = self.incarnations.get(rank)
        if where is not None and known is not None and f"{where[0]}:{where[1]}" != known:
            # A supervisor restarted it at once: the new process bumps the same heartbeat.
            return f"its process was replaced by a new one (pid {where[1]} on {where[0]})"
        if where is not None and where[0] == socket.gethostname() and not process_alive(where[1]):
            return f"its process (pid {where[1]}) exited"
        now = time.monotonic()
        last = self.seen.get(rank)
        if last is None or _moved(beat, last[0]):
            self.seen[rank] = (beat, now)
            return None
        if now - last[1] >= self.silence_s:
            return f"no heartbeat for {now - last[1]:.1f} s"
        return None

    def _beat(self, rank: int) -> Any:
        """The member's last beat: its counter, or (signed) its process and count."""
        key = f"{PREFIX}beat/{rank}"
        if not self.records.signed:
            try:
                return int(self.records.store.add(key, 0))
            except ValueError:  # not a counter (an in-memory store says so; TCPStore hangs up)
                return None
        return self._beat_of(self.records.get(key, signer=rank))

    def _beat_of(self, body: str | None) -> Any:
        """A beat from its stored text: a counter, or (signed) its process and count."""
        if not self.records.signed:
            text = (body or "").strip()
            return int(text) if text.isdigit() and len(text) < 19 else None
        process, _, count = (body or "").rpartition(" ")
        return (process, int(count)) if count.isdigit() and len(count) < 19 else None


def _moved(beat: Any, last: Any) -> bool:
    """Whether a heartbeat moved on: a new counter, or a signed beat of another process or with
    a larger count (an old signed beat written again is not a sign of life)."""
    if beat is None or beat == last:
        return False
    if isinstance(beat, tuple) and isinstance(last, tuple) and beat[0] == last[0]:
        return beat[1] > last[1]
    return True


def registered_process(records: Records, rank: int) -> tuple[str, int] | None:
    """``(host, pid)`` that party ``rank`` registered (signed by it under a roster), or None."""
    return _process_of(
        records.get(f"{PREFIX}process/{rank}", signer=rank if records.signed else None)
    )


def registered_processes(records: Records, ranks: list[int]) -> dict[int, tuple[str, int] | None]:
    """:func:`registered_process` of each of ``ranks``, read together (three round trips
    whatever their number, when every one is there)."""
    signers = [rank if records.signed else None for rank in ranks]
    bodies = records.get_many([f"{PREFIX}process/{rank}" for rank in ranks], signers)
    return {rank: _process_of(body) for rank, body in zip(ranks, bodies, strict=True)}


def _process_of(body: str | None) -> tuple[str, int] | None:
    host, _, pid = (body or "").rpartition(":")
    if not host or not pid.isdigit() or len(pid) > 10:
        return None
    return host, int(pid)


def signed_beats(records: Records) -> tuple[Any, ...]:
    """Every party's last signed heartbeat (None where there is none): what moves while the
    parties of a run under a roster are alive."""
    return tuple(records.get(f"{PREFIX}beat/{r}", signer=r) for r in range(records.nodes))


def leave_run(records: Records, rank: int) -> None:
    """Record that party ``rank`` finished the run and left (signed under a roster)."""
    records.put(f"{LEFT_KEY}/{rank}", str(rank))


def has_left(records: Records, rank: int) -> bool:
    """Whether party ``rank`` recorded that it left (its own signed record under a roster)."""
    body = records.get(f"{LEFT_KEY}/{rank}", signer=rank if records.signed else None)
    return body == str(rank)


def parties_left(records: Records, ranks: tuple[int, ...] | list[int]) -> int:
    """How many of ``ranks`` recorded that they left."""
    return sum(has_left(records, r) for r in ranks)


def final_ranks(records: Records) -> tuple[int, ...] | None:
    """The ranks that finished the run, as the main party recorded them; None before the end
    (or when the record is not a valid one)."""
    return parse_final(records.get(FINAL_MEMBERS_KEY), records.nodes)


def parse_final(body: str | None, nodes: int) -> tuple[int, ...] | None:
    """The ranks of a final-members record's body (a JSON list of distinct ranks), or None."""
    if body is None or len(body) > RECORD_LIMIT:
        return None
    try:
        ranks = json.loads(body)
    except ValueError:
        return None
    if not isinstance(ranks, list) or not ranks:
        return None
    found = [parse_rank(str(r), nodes) if isinstance(r, int) else None for r in ranks]
    if any(r is None for r in found) or len(set(found)) != len(found):
        return None
    return tuple(r for r in found if r is not None)


def final_members(records: Records) -> int | None:
    """How many parties finished the run, as the main party recorded it; None before the end
    (or when the record is not a valid one)."""
    ranks = final_ranks(records)
    return None if ranks is None else len(ranks)


def confirm_leave(
    records: Records,
    rank: int,
    final: str | None,
    timeout_s: float = CONFIRM_SECONDS,
    say: Callable[[str], None] | None = None,
) -> bool:
    """After party ``rank`` wrote its leave record (and, for the main party, the final members
    ``final``): when a ``slate rendezvous`` serves the store (:data:`SEEN_KEY` is there), wait
    up to ``timeout_s`` until it says that it saw them, writing again, with one warning, any of
    them that is gone from the store meanwhile. Returns whether the rendezvous saw them (True
    at once where no rendezvous serves the store: the launcher, or party 0 as host; False
    when the store stops answering: a rendezvous that ends has seen the end of the run)."""
    try:
        return _confirm_leave(records, rank, final, timeout_s, say)
    except RuntimeError:  # (torch's DistError) the store's host is gone
        return False


def _confirm_leave(
    records: Records,
    rank: int,
    final: str | None,
    timeout_s: float,
    say: Callable[[str], None] | None,
) -> bool:
    if read(records.store, SEEN_KEY) is None:
        return True
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    mine = [(f"{LEFT_KEY}/{rank}", str(rank))] + ([(FINAL_MEMBERS_KEY, final)] if final else [])
    deadline = time.monotonic() + timeout_s
    warned = False
    while True:
        seen = _seen(records)
        if seen is not None and rank in seen[1] and (final is None or seen[0]):
            return True
        if time.monotonic() > deadline:
            return False
        for key, body in mine:
            if records.store.check([key]):
                continue
            if not warned:
                warned = True
                say(
                    f"slate: warning: party {rank}'s record {key} was deleted from the "
                    "rendezvous store before 'slate rendezvous' saw it: someone may be "
                    "deleting records in the rendezvous store; written again."
                )
            records.put(key, body)
        time.sleep(0.1)


def _seen(records: Records) -> tuple[bool, set[int]] | None:
    """What the rendezvous says it saw: whether the final members, and which leave records."""
    text = read(records.store, SEEN_KEY)
    if text is None:
        return None
    try:
        raw = json.loads(text[:RECORD_LIMIT])
        left = {int(r) for r in raw["left"]}
        return raw["final"] is not None, left
    except (ValueError, TypeError, KeyError):
        return None
