"""The first exchange of every process group: a hello between every pair of members, bounded in
time, that tells a stranger at a gloo listener from the real peer.

**The gap.** gloo's TCP transport (``gloo/transport/tcp``) opens a group like this: each member
binds one listening socket and publishes, in the rendezvous store, its address and one *pair
identifier* per peer. For each pair the member with the larger address connects to the other's
listener and writes, as its first 8 bytes, the identifier the listener published for it; the
listener pairs the *first* connection that carries that identifier with that peer, and parks any
later one unused. Nothing authenticates the connecting side, and the store is readable by anyone
who reaches it: a stranger who connects first with the right identifier takes the peer's place.
The listener then waits for messages that never come (or gets the stranger's bytes), and the
real peer sends into a connection that nobody reads; without a bound every exchange of the run
waits on that pair.

**The hello.** Before the process group opens, every member publishes a fresh 32-byte nonce
(:func:`publish`, ``slate/pg<g>/hello/<rank>``, signed under a roster). Right after it opens,
every member sends every other member its nonce (sealed under a roster: a stranger can produce
no valid seal) and receives theirs, with one bounded wait: ``--timeout`` from the moment the
group opened. A hello that does not come in time, does not open, or is not the sender's
published nonce is a problem of that pair. Every member then reports (signed under a roster)
which hellos it missed under ``slate/pg<g>/hello_report/<rank>`` and reads every other
member's report, for at most :data:`REPORT_S` more seconds. Either every member goes on, or
every member stops with one paragraph that names the pairs and the listener that took a
connection that was not its peer's (:func:`listener_of`, gloo's rule: the lower address
listens).

**The bound.** With the watchdog on ``init_process_group`` (``DistributedEngine._open_group``),
no member waits more than ``--timeout`` + :data:`MARGIN_S` seconds for its process group to
open, and, once it opened, more than ``--timeout`` + :data:`MARGIN_S` seconds for the hello and
the reports.

Without a roster a stranger who reads the store can also send the right nonce: the hello then
only proves that the connection carries what the peer published, and bounds the wait. With a
roster only the peer can seal its hello.
"""

from __future__ import annotations

import json
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from slate.engines.distributed.control.failures import ExchangeFailed, first_line
from slate.engines.distributed.control.membership import PartyLost
from slate.engines.distributed.control.store_records import Records
from slate.errors import GROUPS_SHOWN, parties_text
from slate.security.messages import ListOf, MalformedMessage, MapOf, decode
from slate.security.sealing import SealedMessageRefused

__all__ = [
    "MARGIN_S",
    "REPORT_S",
    "Hello",
    "hello_key",
    "listener_of",
    "publish",
    "report_key",
]

NONCE_BYTES = 32
REPORT_S = 10.0  # how long a member waits for the others' reports after its own hello wait
MARGIN_S = 15.0  # the stated margin over --timeout (REPORT_S and the store's round trips)
POLL_SECONDS = 0.05
#: How long a member first waits for every other member's report at once, before it looks one
#: by one for members that are gone (the reports follow the hellos within a round trip or two).
REPORT_WAIT_S = 2.0
REPORT_SHAPE = {"missing": ListOf(int, 65536), "wrong": MapOf(str, 65536, int_keys=True)}


def hello_key(generation: int, rank: int) -> str:
    return f"slate/pg{generation}/hello/{rank}"


def report_key(generation: int, rank: int) -> str:
    return f"slate/pg{generation}/hello_report/{rank}"


def publish(records: Records, generation: int, rank: int) -> bytes:
    """A fresh hello nonce of this member for ``generation``, published in the store."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    records.put(hello_key(generation, rank), nonce.hex(), generation)
    return nonce


# --------------------------------------------------------------------------------------------
# gloo's records: who listens


def _listener_address(record: bytes) -> tuple[tuple[bytes, int], str] | None:
    """The listening address in one member's gloo record (see the module doc): a key that
    orders addresses as gloo's ``Device::isInitiator`` does, and ``host:port`` for messages."""
    try:
        (host_size,) = struct.unpack_from("<Q", record, 0)
        at = 8 + host_size
        (address_size,) = struct.unpack_from("<Q", record, at)
        address = record[at + 8 : at + 8 + address_size]
        (family,) = struct.unpack_from("<H", address, 0)
        port_bytes = address[2:4]
        if family == socket.AF_INET:
            ip = address[4:8]
            text = socket.inet_ntop(socket.AF_INET, ip)
        elif family == socket.AF_INET6:
            ip = address[8:24]
            text = "[" + socket.inet_ntop(socket.AF_INET6, ip) + "]"
        else:
            return None
    except (struct.error, ValueError, OSError):
        return None
    if len(port_bytes) != 2:
        return None
    # gloo compares the raw address bytes, then the port as the host reads the stored
    # (network-order) 16 bits: little-endian on the hosts torch runs on.
    return (ip, int.from_bytes(port_bytes, "little")), f"{text}:{int.from_bytes(port_bytes, 'big')}"


def listener_of(records: dict[int, bytes], a: int, b: int) -> tuple[int, str] | None:
    """Which of group ranks ``a`` and ``b`` listens for their pair's connection (the lower
    address, as gloo decides), and its ``host:port``; None when their records do not tell."""
    first, second = records.get(a), records.get(b)
    if first is None or second is None:
        return None
    ours, theirs = _listener_address(first), _listener_address(second)
    if ours is None or theirs is None or ours[0] == theirs[0]:
        return None
    return (a, ours[1]) if ours[0] < theirs[0] else (b, theirs[1])


# --------------------------------------------------------------------------------------------
# the hello


@dataclass
class _Outcome:
    """What one member saw of the hello: peers (global ranks) whose hello did not come, and
    peers whose hello came wrong, with why."""

    missing: list[int] = field(default_factory=list)
    wrong: dict[int, str] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.missing and not self.wrong

    def text(self) -> str:
        return json.dumps({"missing": self.missing,
                           "wrong": {str(k): v[:300] for k, v in self.wrong.items()}})  # fmt: skip


class _Waits:
    """Each ``work.wait()`` in a daemon thread of its own, so that one pair that never answers
    leaves the others' outcomes readable (a wait given up on ends with gloo's own timeout, or
    with the process)."""

    def __init__(self, works: list[Any]) -> None:
        self.done: list[threading.Event] = [threading.Event() for _ in works]
        self.errors: list[str | None] = [None for _ in works]
        for k, work in enumerate(works):
            threading.Thread(target=self._wait, args=(k, work), daemon=True,
                             name="slate-hello").start()  # fmt: skip

    def _wait(self, k: int, work: Any) -> None:
        try:
            work.wait()
        except Exception as err:  # handed to the main thread as text
            self.errors[k] = first_line(err)
        self.done[k].set()

    def until(self, deadline: float) -> None:
        for event in self.done:
            event.wait(max(0.0, deadline - time.monotonic()))


class Hello:
    """The hello of one process group (see the module doc).

    ``members`` are the group's global ranks in group order; ``wire`` is the generation's
    :class:`~slate.engines.distributed.wire.sealed_wire.SealedWire` (None without a roster);
    ``addresses`` gloo's record of each group rank (``SigningStore.addresses``); ``gone(rank)`` says
    why a member is gone, or None.
    """

    def __init__(
        self,
        records: Records,
        generation: int,
        rank: int,
        members: tuple[int, ...],
        timeout_s: float,
        nonce: bytes,
        device: torch.device,
        wire: Any = None,
        addresses: dict[int, bytes] | None = None,
        gone: Callable[[int], str | None] | None = None,
        published: dict[int, str | None] | None = None,
    ) -> None:
        self.records, self.generation, self.rank = records, generation, rank
        self.members, self.timeout_s, self.nonce = members, timeout_s, nonce
        self.device, self.wire = device, wire
        self.addresses = addresses or {}
        self.gone = gone or (lambda rank: None)
        #: the other members' published hellos, when already read (with their sealing keys)
        self.published = published

    def run(self, opened_at: float) -> None:
        """Exchange the hellos and the reports; return when every member heard every other
        one. Raises :class:`PartyLost` naming what happened otherwise (:class:`ExchangeFailed`
        when a member is gone and the run can go on without it)."""
        if len(self.members) < 2:
            return
        hello_by = opened_at + self.timeout_s
        mine = self._exchange(hello_by)
        self.records.put(report_key(self.generation, self.rank), mine.text(), self.generation)
        reports = self._reports(hello_by + REPORT_S, mine)
        if mine.clean and all(r is not None and r.clean for r in reports.values()):
            return
        raise self._failure(mine, reports)

    def _exchange(self, deadline: float) -> _Outcome:
        index = self.members.index(self.rank)
        others = [i for i in range(len(self.members)) if i != index]
        plain = torch.tensor(list(self.nonce), dtype=torch.uint8)
        sends, buffers = [], []
        for peer in others:
            message = self.wire.seal(plain, peer) if self.wire is not None else plain
            sends.append(message.to(self.device))
            like = self.wire.buffer(plain) if self.wire is not None else torch.empty_like(plain)
            buffers.append(like.to(self.device))
        ops = [dist.P2POp(dist.isend, m, p) for m, p in zip(sends, others, strict=True)]
        ops += [dist.P2POp(dist.irecv, b, p) for b, p in zip(buffers, others, strict=True)]
        outcome = _Outcome()
        try:
            works = dist.batch_isend_irecv(ops)
        except (RuntimeError, dist.DistBackendError) as err:
            for peer in others:
                outcome.wrong[self.members[peer]] = f"the exchange failed ({first_line(err)})"
            return outcome
        waits = _Waits(works)
        waits.until(deadline)
        k = len(sends)
        ranks = [self.members[peer] for peer in others]
        # Every hello at once: each member published its own before the group opened, so one
        # multi_get finds them (two round trips); one still missing is waited for a moment.
        wait_s = min(REPORT_WAIT_S, max(0.001, deadline - time.monotonic()))
        published = self.published or dict(
            zip(ranks, self.records.get_many(
                [hello_key(self.generation, r) for r in ranks], [self._signer(r) for r in ranks],
                wait_s,
            ), strict=True)
        )  # fmt: skip
        for j, peer in enumerate(others):
            rank = self.members[peer]
            finished = waits.done[k + j].is_set()  # (its error, if any, is set before)
            error = waits.errors[k + j] if finished else None
            if not finished or (error is not None and _timed_out(error)):
                outcome.missing.append(rank)  # (gloo's own timeout may have ended the wait)
            elif error is not None:
                outcome.wrong[rank] = f"the connection failed ({error})"
            else:
                why = self._check(buffers[j].cpu(), peer, plain, published[rank])
                if why is not None:
                    outcome.wrong[rank] = why
        return outcome

    def _check(
        self, received: torch.Tensor, peer: int, like: torch.Tensor, published: str | None
    ) -> str | None:
        """Why the hello received from group rank ``peer`` is not its own (``published``, as
        read from the store), or None."""
        if self.wire is not None:
            try:
                opened = self.wire.open(received, peer, like)
            except SealedMessageRefused:
                return "its seal does not open (it was not sealed by that party for this one)"
        else:
            opened = received
        if published is None or bytes(opened.tolist()).hex() != published:
            return "it is not the nonce that party published in the rendezvous store"
        return None

    def _signer(self, rank: int) -> int | None:
        return rank if self.records.signed else None

    def _reports(self, deadline: float, mine: _Outcome) -> dict[int, _Outcome | None]:
        """Every other member's report (None for a member that gave none by ``deadline`` or is
        seen gone; a report that is not one counts as a problem of its own)."""
        reports: dict[int, _Outcome | None] = {r: None for r in self.members if r != self.rank}
        waiting = set(reports)
        first = True
        while waiting:
            ranks = sorted(waiting)
            bodies = self.records.get_many(  # first waited for together: three round trips
                [report_key(self.generation, r) for r in ranks], [self._signer(r) for r in ranks],
                wait_s=min(REPORT_WAIT_S, max(0.0, deadline - time.monotonic())) if first else 0.0,
            )  # fmt: skip
            first = False
            for rank, body in zip(ranks, bodies, strict=True):
                report = None if body is None else _parse(body, rank)
                if report is None and self.gone(rank) is not None:
                    report = self._report_of(rank)  # (it may have reported, then left, since)
                    if report is None:
                        waiting.discard(rank)
                if report is not None:
                    reports[rank] = report
                    waiting.discard(rank)
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(POLL_SECONDS)
        return reports

    def _report_of(self, rank: int) -> _Outcome | None:
        body = self.records.get(report_key(self.generation, rank), self._signer(rank))
        return None if body is None else _parse(body, rank)

    def _failure(self, mine: _Outcome, reports: dict[int, _Outcome | None]) -> PartyLost:
        silent = {r: self.gone(r) for r, report in reports.items() if report is None}
        stage = "before step 1" if self.generation == 0 else f"(process group {self.generation})"
        lead = f"Party {self.rank} stops {stage}: the process group opened, but "
        gone = [f"party {r} {why}" if why else f"party {r} did not report its hello in time"
                for r, why in silent.items()]  # fmt: skip
        if gone and self._pairs(mine, reports, set(silent)) == []:
            text = lead + "; ".join(gone) + "."
            if self.generation > 0 and any(why is not None for why in silent.values()):
                return ExchangeFailed(text)
            return PartyLost(text + " Every site stops; restart them all.")
        described = self._describe(mine, reports, set(silent))
        return PartyLost(
            lead + described + (f" Also, {'; '.join(gone)}." if gone else "") + " No step "
            "was taken after it; keep the sites' gloo ports and the rendezvous reachable by "
            "the sites only (a firewall, or a VPN: docs/security.md), then restart every site."
        )

    def _pairs(
        self, mine: _Outcome, reports: dict[int, _Outcome | None], silent: set[int]
    ) -> list[tuple[int, int, str | None]]:
        """The pairs (receiver, sender, why when the hello came wrong) whose hello failed, as
        the members reported them; pairs with a silent member are left out."""
        found = []
        for receiver, report in [(self.rank, mine), *reports.items()]:
            if report is None:
                continue
            for sender in report.missing:
                if sender not in silent:
                    found.append((receiver, sender, None))
            for sender, why in report.wrong.items():
                if sender not in silent:
                    found.append((receiver, sender, why))
        return found

    def _describe(
        self, mine: _Outcome, reports: dict[int, _Outcome | None], silent: set[int]
    ) -> str:
        pairs = self._pairs(mine, reports, silent)
        keys = sorted({(min(a, b), max(a, b)) for a, b, _ in pairs})
        heard = ", and ".join(f"parties {a} and {b}" for a, b in keys[:GROUPS_SHOWN])
        if len(keys) > GROUPS_SHOWN:
            heard += f", and {len(keys) - GROUPS_SHOWN} more pairs"
        wrong = [f"party {a} got a hello from party {b} that {why}"
                 for a, b, why in pairs if why is not None]  # fmt: skip
        by_listener: dict[tuple[int, str], list[int]] = {}
        unknown = []
        for a, b in keys:
            found = listener_of(self.addresses, self.members.index(a), self.members.index(b))
            if found is None:
                unknown.append(f"the connection between parties {a} and {b}")
                continue
            index, where = found
            listener = self.members[index]
            by_listener.setdefault((listener, where), []).append(b if listener == a else a)
        lines = [
            f"{'a connection' if len(c) == 1 else 'connections'} to party {listener}'s gloo "
            f"listener ({where}) did not come from {parties_text(c)}"
            for (listener, where), c in sorted(by_listener.items())
        ]
        if unknown:
            lines.append(f"{' and '.join(unknown)} was not made between them")
        return (
            f"{heard}{',' if len(keys) > 1 else ''} did not hear each other's hello within "
            f"--timeout {self.timeout_s:g} s"
            + (f" ({'; '.join(wrong)})" if wrong else "")
            + f": {'; '.join(lines)}. A stranger may have connected first, sending the pair "
            "identifier that the real party would send (gloo's connections are not "
            "authenticated), so the real party's own connection was left unused."
        )


def _timed_out(error: str) -> bool:
    """Whether gloo's error says that a wait ran out of time (its own ``--timeout``)."""
    text = error.lower()
    return "timed out" in text or "timeout" in text


def _parse(body: str, rank: int) -> _Outcome | None:
    """A member's report, or None when it is not one (counted as no report)."""
    try:
        raw = decode(body.encode(), REPORT_SHAPE, rank, "hello report", 1 << 20)
    except MalformedMessage:
        return None
    return _Outcome(list(raw["missing"]), {int(k): v for k, v in raw["wrong"].items()})
