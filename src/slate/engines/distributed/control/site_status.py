"""What each site of a distributed run is doing, published in the rendezvous store for
``slate status`` and ``slate rendezvous``.

Every party keeps a :class:`StatusBoard` (its state, iteration, total iterations, latest pooled
AP, the sites it waits for, when it started and when its training started) that the
training thread updates for free, and a :class:`StatusPublisher`: a daemon thread on a store
connection of its own that writes the board under ``slate/status/<rank>`` once a second, signed
by the site under a roster (:class:`~slate.engines.distributed.control.store_records.Records`),
with the time of writing. A site's AP on its own test rows is never in it (it stays in that
site's folder: docs/security.md). The record is a short JSON object (about 200 bytes, under 600
signed), so it doubles as a heartbeat that every run has. The last record, ``done``, is written
by the training thread itself before the site records that it left, so the rendezvous is still
there.

:func:`read_statuses` reads every site's record (the reader never writes): with a roster only
records signed by their own site in the run's session (or, before the session is agreed, in
none) are kept, and the others are counted.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slate.engines.distributed.control.store_records import RECORD_LIMIT, Records, read

__all__ = [
    "PUBLISH_SECONDS",
    "STATES",
    "SiteStatus",
    "StatusBoard",
    "StatusPublisher",
    "StatusRead",
    "read_statuses",
    "status_key",
]

PUBLISH_SECONDS = 1.0  # a site writes its status record at most this often
STATES = ("starting", "waiting", "training", "evaluating", "done")


def status_key(rank: int) -> str:
    return f"slate/status/{rank}"


@dataclass
class SiteStatus:
    """One site's status as published (``written``: the writer's clock, seconds since 1970)."""

    state: str = "starting"
    iteration: int = 0
    iterations: int = 0
    pooled_ap: float | None = None
    waiting: list[int] = field(default_factory=list)
    process: str = ""  # host:pid, so that a restarted site is told apart
    started: float = 0.0  # when the site started
    trained_from: tuple[int, float] | None = None  # (iteration, time) when training started
    written: float = 0.0

    def to_body(self) -> str:
        """The record's compact JSON body."""
        fields: dict[str, Any] = {"s": self.state, "i": self.iteration, "n": self.iterations,
                                  "p": self.process, "t0": round(self.started, 2),
                                  "t": round(self.written, 2)}  # fmt: skip
        if self.pooled_ap is not None and math.isfinite(self.pooled_ap):
            fields["ap"] = round(self.pooled_ap, 4)
        if self.waiting:
            fields["w"] = self.waiting
        if self.trained_from is not None:
            fields["tr"] = [self.trained_from[0], round(self.trained_from[1], 2)]
        return json.dumps(fields, separators=(",", ":"))

    @staticmethod
    def from_body(body: str) -> SiteStatus | None:
        """A status from a record's body, or None when it is not one."""
        try:
            raw = json.loads(body[:RECORD_LIMIT])
            status = SiteStatus(
                state=str(raw["s"]), iteration=int(raw["i"]), iterations=int(raw["n"]),
                pooled_ap=_number(raw.get("ap")),
                waiting=[int(r) for r in raw.get("w", [])][:64], process=str(raw["p"])[:80],
                started=float(raw["t0"]), written=float(raw["t"]),
            )  # fmt: skip
            if "tr" in raw:
                status.trained_from = (int(raw["tr"][0]), float(raw["tr"][1]))
        except (ValueError, TypeError, KeyError, IndexError):
            return None
        return status if status.state in STATES else None

    def finish_time(self) -> float | None:
        """When the site should reach its last iteration at its pace since training started
        (its own clock), or None before it can tell."""
        if self.state == "done" or self.trained_from is None:
            return None
        done, since = self.iteration - self.trained_from[0], self.written - self.trained_from[1]
        if done <= 0 or since <= 0:
            return None
        return self.written + (self.iterations - self.iteration) * since / done


def _number(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class StatusBoard:
    """A site's current status, updated by the training thread, read by the publisher."""

    def __init__(self, process: str) -> None:
        self._lock = threading.Lock()
        self._status = SiteStatus(process=process, started=time.time())
        self.version = 0  # bumped at each change

    def update(self, **changes: Any) -> None:
        """Change some fields (:class:`SiteStatus`'s names); the start of training is noted."""
        with self._lock:
            status = self._status
            for name, value in changes.items():
                setattr(status, name, value)
            if status.state in ("training", "evaluating") and status.trained_from is None:
                status.trained_from = (status.iteration, time.time())
            if status.state != "waiting":
                status.waiting = []
            self.version += 1

    def body(self) -> str:
        """The record's body as of now."""
        with self._lock:
            self._status.written = time.time()
            return self._status.to_body()


class StatusPublisher:
    """A daemon thread that writes ``board`` under ``slate/status/<rank>`` once a second, on
    its own store connection (``connect()``: a new one after a failure)."""

    def __init__(
        self, connect: Callable[[], Any], rank: int, records: Records, board: StatusBoard
    ) -> None:
        self._connect, self._rank, self._template, self.board = connect, rank, records, board
        self._records: Records | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slate-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                if self._records is None:
                    self._records = self._template.with_store(self._connect())
                if not self._stopped.is_set():
                    self._records.put(status_key(self._rank), self.board.body())
            except Exception:  # unreachable for now: a new connection next time
                self._records = None
            self._stopped.wait(PUBLISH_SECONDS)

    def stop(self, records: Records | None = None, **last: Any) -> None:
        """Stop writing; with ``records``, write the board once more with ``last`` changes (on
        the caller's connection: the rendezvous is there until the site leaves)."""
        self._stopped.set()
        self._thread.join(timeout=2 * PUBLISH_SECONDS)
        if records is not None:
            self.board.update(**last)
            records.put(status_key(self._rank), self.board.body())


@dataclass
class StatusRead:
    """What :func:`read_statuses` found: each rank's status (None: no valid record) and how
    many records it ignored (present, but not signed by their site in this run)."""

    statuses: dict[int, SiteStatus | None]
    ignored: int = 0


def read_statuses(records: Records, ranks: list[int], run_id: str | None = None) -> StatusRead:
    """Every one of ``ranks``' status records (a ``check`` each, then one ``multi_get``). Under
    a roster a record counts only when its signature verifies and it is bound to the run's
    session (``records.session``) or, before the session is agreed, to none. Without one, with
    ``run_id``, only the signed envelopes of that run count (unchecked)."""
    keys = [status_key(r) for r in ranks]
    exist = [records.store.check([key]) for key in keys] if ranks else []
    present = [key for key, there in zip(keys, exist, strict=True) if there]
    raws = dict(zip(present, records.store.multi_get(present), strict=True)) if present else {}
    found = StatusRead({})
    for rank, key in zip(ranks, keys, strict=True):
        raw = raws.get(key)
        text = None if raw is None else raw.decode("utf-8", "replace")
        body = None if text is None else _opened(records, key, text, rank, run_id)
        status = None if body is None else SiteStatus.from_body(body)
        if text is not None and status is None:
            found.ignored += 1
        found.statuses[rank] = status
    return found


def _opened(
    records: Records, key: str, text: str, rank: int, run_id: str | None = None
) -> str | None:
    """The body of a status record, or None when it is refused."""
    if not records.signed:
        return _plain_or_envelope(text, run_id)
    found = records.open_any_session(key, text, rank)
    if found is None or found[0] not in ("", records.session):
        return None
    return found[1]


def _plain_or_envelope(text: str, run_id: str | None) -> str | None:
    """Without a roster: a plain record's text (not with ``run_id``), or a signed envelope's
    body (unchecked; of run ``run_id`` when given)."""
    if not text.startswith('{"run":'):
        return text if run_id is None else None
    try:
        envelope = json.loads(text)
        body, run = envelope.get("body"), envelope.get("run")
    except (ValueError, AttributeError):
        return None
    if run_id is not None and run != run_id:
        return None
    return body if isinstance(body, str) else None


def read_one(records: Records, rank: int) -> SiteStatus | None:
    """One rank's status (for tests and messages)."""
    text = read(records.store, status_key(rank))
    body = None if text is None else _opened(records, status_key(rank), text, rank)
    return None if body is None else SiteStatus.from_body(body)


WAIT_NOTE_SECONDS = 5.0  # a waiting site says for whom every this many seconds


class WaitingNote:
    """While a site waits for the others to reach the rendezvous (at the start): every
    :data:`WAIT_NOTE_SECONDS`, on a daemon thread and a store connection of its own, which
    sites have not published their roster digest yet (``slate/roster/<r>``, the first record a
    site writes), said on the console and put on the board."""

    def __init__(
        self,
        connect: Callable[[], Any],
        rank: int,
        world: int,
        board: StatusBoard,
        names: Callable[[int], str] = str,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self._connect, self._rank, self._world, self.board = connect, rank, world, board
        self._names, self._say = names, say or (lambda line: print(line, flush=True))
        self._stopped = threading.Event()
        self._since = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="slate-waiting", daemon=True)
        self._thread.start()

    def _missing(self, store: Any) -> list[int]:
        others = [r for r in range(self._world) if r != self._rank]
        return [r for r in others if not store.check([f"slate/roster/{r}"])]

    def _run(self) -> None:
        store = None
        while not self._stopped.wait(WAIT_NOTE_SECONDS):
            try:
                store = store or self._connect()
                missing = self._missing(store)
            except Exception:  # the store is out of reach for now: the start says why
                store = None
                continue
            if missing and not self._stopped.is_set():
                self.board.update(state="waiting", waiting=missing)
                who = ", ".join(self._names(r) for r in missing)
                waited = time.monotonic() - self._since
                plural = "sites" if len(missing) > 1 else "site"
                self._say(f"party {self._rank}: waiting for {plural} {who} ({waited:.0f} s)")

    def stop(self) -> None:
        """Stop watching (the start is over)."""
        self._stopped.set()


class SiteReport:
    """A party's status board, its publisher and, while it starts, its waiting note: what the
    distributed engine holds (``connect``: a new store connection; ``identity``: the site's
    key and roster, for the names in the waiting note)."""

    def __init__(
        self, connect: Callable[[], Any], rank: int, world: int, records: Records, identity: Any
    ) -> None:
        import os
        import socket

        self.board = StatusBoard(f"{socket.gethostname()}:{os.getpid()}")
        self.publisher = StatusPublisher(connect, rank, records, self.board)
        sites = identity.roster.sites if identity is not None else None
        names = (lambda r: f"{r} ({sites[r].name})") if sites else str
        self.waiting: WaitingNote | None = WaitingNote(connect, rank, world, self.board, names)

    def started(self) -> None:
        """The start is over: no more waiting notes; the site trains."""
        if self.waiting is not None:
            self.waiting.stop()
            self.waiting = None
        self.board.update(state="training")

    def note(self, **changes: Any) -> None:
        """Changes to the published status (:class:`SiteStatus`'s field names)."""
        self.board.update(**changes)

    def done(self, records: Records) -> None:
        """The site finished: the last record, ``done``, written now (errors ignored)."""
        self.started()
        with contextlib.suppress(Exception):  # the store's host is gone: nobody to tell
            self.publisher.stop(records, state="done")
