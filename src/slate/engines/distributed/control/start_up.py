"""How a party of the distributed engine starts: the session it joins, its watched
``init_process_group``, and the one paragraph that says why a run did not start.

* :func:`join_session`: under a roster, the session of this start of the run
  (:mod:`slate.engines.distributed.control.session`): the one in progress at this store for a party
  that may be returning, else a new one agreed with every other site.
* :func:`open_watched`: ``init_process_group`` on a thread of its own, given up after
  ``--timeout`` + :data:`~slate.engines.distributed.wire.handshake.MARGIN_S` seconds; while it
  waits, the other sites' roster digests are read once a second (for the message, should the store
  be gone by then: a site with a roster that gives up may have hosted it).
* :func:`failure`, :func:`session_failure`: why the run did not start, in this order: this
  party's own records of the set-up gone from the store (someone may be deleting records: the
  sites never delete them while a run starts), sites with another roster or none, records of
  another site gone although it wrote them, sites that never reached the rendezvous, sites that
  are gone, else addresses the sites could not reach.

The functions take the :class:`~slate.engines.distributed.engine.DistributedEngine` whose start they
serve (``engine``): its ``rank``, ``records``, ``rendezvous``, ``timeout_s``, ``members`` and
the prefix store of its group (``_prefix``).
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import torch.distributed as dist

from slate.engines.distributed.control import session
from slate.engines.distributed.control.failures import first_line
from slate.engines.distributed.control.liveness import PREFIX, registered_process
from slate.engines.distributed.control.membership import PartyLost
from slate.engines.distributed.control.store_records import Records, read
from slate.engines.distributed.wire import handshake
from slate.errors import parties_text

__all__ = [
    "DELETING",
    "ROSTER_KEY",
    "failure",
    "join_session",
    "open_watched",
    "other_rosters",
    "publish_roster",
    "session_failure",
]

ROSTER_KEY = "slate/roster"  # each party's roster digest ("none" without one), for messages
DELETING = (
    "someone may be deleting records in the rendezvous store (the sites never delete them "
    "while a run starts)."
)


def join_session(engine: Any, recover: bool) -> str | None:
    """Under a roster: join the session of a run in progress at this store (returned), or
    derive a new one with the other sites (None returned). A party that may return
    (``recover``) looks for a run in progress first."""
    records, rendezvous = engine.records, engine.rendezvous
    nonce = rendezvous.store_nonce or session.read_store_nonce(records.store, engine.timeout_s)
    if nonce is None:
        raise PartyLost(
            f"Party {engine.rank} found no store nonce ({session.STORE_NONCE_KEY}) at the "
            f"rendezvous within --timeout {engine.timeout_s:g} s: whoever hosts the store writes "
            "it when the store opens, so someone deleted it, or the store is served by another "
            "slate version. Restart the rendezvous ('slate rendezvous') and the sites."
        )
    found = session.running(records, nonce) if recover else None
    if found is not None:
        records.session = found
        return found
    try:
        session.derive(records, engine.rank, engine.timeout_s, nonce)
    except session.SessionNotAgreed as err:
        raise PartyLost(session_failure(engine, err)) from None
    return None


def _waited(engine: Any) -> str:
    return f"Party {engine.rank} waited --timeout {engine.timeout_s:g} s for the run to start"


def session_failure(engine: Any, err: session.SessionNotAgreed) -> str:
    """Why the sites did not agree on a session within --timeout, for a message."""
    waited, records = _waited(engine), engine.records
    try:
        if err.missing:
            other = other_rosters(records, err.missing)
            if other:
                return f"{waited}, but {other}"
            reached = [r for r in err.missing if records.store.check([f"{ROSTER_KEY}/{r}"])]
            if reached:
                one = len(reached) == 1
                keys = session.nonce_key(reached[0]) if one else f"{session.PREFIX}/nonce/R"
                return (
                    f"{waited}, but the session nonce records of {parties_text(reached)} ({keys}) "
                    "are not in the rendezvous store although those parties reached it "
                    f"(their {ROSTER_KEY}/R records are there): {DELETING} No step was taken; "
                    "restart every site."
                )
            return _never_reached(waited, err.missing)
    except (RuntimeError, dist.DistStoreError):
        return _never_reached(waited, err.missing)
    theirs = "; ".join(
        f"party {r} signed {sid[:16] + '...' if sid else 'none yet'}"
        for r, sid in sorted(err.disagreeing.items())
    )
    replaced = (
        f" (this party's own nonce record was deleted or replaced {err.replaced} times)"
        if err.replaced
        else ""
    )
    return (
        f"{waited}, but the sites did not agree on the run's session id within it: this party "
        f"computed {err.session[:16] or 'none'}..., while {theirs or 'the others signed none'}"
        f"{replaced}. Someone replaced or deleted session nonce records (slate/session/nonce/R) "
        "in the rendezvous store while the sites read them, for example with an earlier run's; "
        "no step was taken. Keep the rendezvous port reachable by the sites only "
        "(docs/security.md) and restart every site."
    )


def open_watched(engine: Any, prefix: Any) -> None:
    """``init_process_group`` of ``engine``'s current members over ``prefix`` on a watched
    thread: it returns, raises what it raised, or raises :class:`TimeoutError` after
    ``--timeout`` + ``handshake.MARGIN_S`` seconds (gloo's and the store's own waits are bounded
    by ``--timeout``, but a wait that starts again, or a connection that is held open without a
    word, could go on)."""
    outcome: list[BaseException | None] = []

    def opening() -> None:
        try:
            dist.init_process_group(
                engine.backend,
                store=prefix,
                rank=engine.members.index(engine.rank),
                world_size=len(engine.members),
                timeout=datetime.timedelta(seconds=engine.timeout_s),
            )
            outcome.append(None)
        except BaseException as err:  # handed to the waiting thread
            outcome.append(err)

    watched = threading.Thread(target=opening, name="slate-open-group", daemon=True)
    watched.start()
    deadline = time.monotonic() + engine.timeout_s + handshake.MARGIN_S
    if not engine.generation_opened:  # (on a thread of its own: it never delays the join)
        _RosterLook(engine).watch(watched)
    watched.join(max(0.0, deadline - time.monotonic()))
    if not outcome:
        raise TimeoutError(
            f"the process group did not open within --timeout {engine.timeout_s:g} s + "
            f"{handshake.MARGIN_S:g} s"
        )
    if outcome[0] is not None:
        raise outcome[0]


def failure(engine: Any, err: Exception) -> str:
    """Why the run's first process group did not open (see the module doc's order)."""
    waited, records, world = _waited(engine), engine.records, engine.rendezvous.world
    try:
        own, theirs = _deleted_records(engine)
        missing = [r for r in range(world) if registered_process(records, r) is None]
        rosters = other_rosters(records, missing)
    except (RuntimeError, dist.DistStoreError):  # (its host may have stopped)
        own, theirs, missing, rosters = [], [], [], engine.rosters_seen
    if own or (theirs and not rosters):
        return (
            f"{waited}, but {'; '.join(own + theirs)}: {DELETING} No step was taken; keep the "
            "rendezvous port reachable by the sites only (docs/security.md) and restart every "
            "site."
        )
    if rosters:
        return f"{waited}, but {rosters}"
    if missing:
        return _never_reached(waited, missing)
    gone = engine.gone_parties()
    if gone:
        return f"{waited}, but {gone} before the process group opened. Restart every party."
    return (
        f"{waited}: every party reached the rendezvous, but they could not connect to each "
        "other's published addresses (check GLOO_SOCKET_IFNAME and firewalls between the "
        f"sites, docs/deployment.md). Backend said: {first_line(err)}"
    )


def _deleted_records(engine: Any) -> tuple[list[str], list[str]]:
    """The records of the set-up that were in the store and are gone, described: this party's
    own gloo address or registration (certainly deleted), and the gloo address or registration
    of a party that wrote the record it writes right after them (:func:`_reached`)."""
    records, own, others = engine.records, [], []
    registration = f"{PREFIX}process/{engine.rank}"
    if not records.store.check([registration]):
        own.append(f"this party's registration {registration}, which it wrote, is gone")
    prefix = engine._prefix
    if prefix is not None:
        written, awaited = prefix.vanished()
        for key in written:
            own.append(
                f"this party's gloo address record {prefix.name(key)}, which it wrote, is gone"
            )
        for key, index in awaited:
            owner = engine.members[index] if index is not None else None
            if owner is not None and _reached(records, owner):
                others.append(
                    f"party {owner}'s gloo address record {prefix.name(key)} is not there "
                    f"although party {owner} reached the rendezvous"
                )
    for rank in range(engine.rendezvous.world):
        key = f"{PREFIX}process/{rank}"
        if rank != engine.rank and not records.store.check([key]) and _reached(records, rank):
            others.append(
                f"party {rank}'s registration {key} is not there although party {rank} "
                "reached the rendezvous"
            )
    return own, others


def _reached(records: Records, rank: int) -> bool:
    """Whether party ``rank`` wrote its registration and its gloo address: its hello record
    of the first process group is there (:func:`slate.engines.distributed.wire.handshake.publish`:
    written after the registration, right before the address, with nothing to wait for in
    between)."""
    return bool(records.store.check([handshake.hello_key(0, rank)]))


def _never_reached(waited: str, missing: list[int]) -> str:
    return (
        f"{waited}, but {parties_text(missing)} never reached the rendezvous. Start every site "
        "within --timeout seconds of the others (or raise --timeout), with the same --nodes and "
        "--rendezvous."
    )


def publish_roster(records: Records, rank: int) -> None:
    """Say which roster this party runs with (plain text: a party with another roster cannot
    verify this one's signatures, but can still be told why the run does not start)."""
    identity = records.identity
    records.store.set(f"{ROSTER_KEY}/{rank}", identity.roster.digest if identity else "none")


def other_rosters(records: Records, missing: list[int]) -> str:
    """Which of ``missing`` registered with another roster (or without one), for a message."""
    identity = records.identity
    mine = identity.roster.digest if identity else "none"
    holders: dict[str, list[int]] = {}  # the roster digest (or "none") -> its parties
    for rank in missing:
        key = f"{ROSTER_KEY}/{rank}"
        found = read(records.store, key)
        theirs = None if found is None else found[:64]
        if theirs is not None and theirs != mine:
            holders.setdefault(theirs, []).append(rank)
    if not holders:
        return ""
    found = [
        f"{parties_text(ranks)} "
        + (f"run{'s' if len(ranks) == 1 else ''} without --roster" if theirs == "none"
           else f"hold{'s' if len(ranks) == 1 else ''} another roster (sha256 {theirs[:16]}...)")
        for theirs, ranks in holders.items()
    ]  # fmt: skip
    here = (
        f"this site's roster {identity.roster.path or ''} has sha256 {mine[:16]}..."
        if identity
        else "this site runs without --roster"
    )
    return (
        f"{'; '.join(found)}, while {here}. Every site must start with the same roster file "
        "(and its own --key), or all without one; no step was taken."
    )


class _RosterLook:
    """While the first process group opens: once a second, on a connection and a daemon thread
    of its own, whether another site published another roster digest (or none), kept in
    ``engine.rosters_seen``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.records: Records | None = None

    def watch(self, opening: threading.Thread) -> None:
        """Look once a second while ``opening`` (the thread that opens the group) runs."""

        def run() -> None:
            while opening.is_alive():
                opening.join(1.0)
                if opening.is_alive():
                    self.look()

        threading.Thread(target=run, name="slate-roster-look", daemon=True).start()

    def look(self) -> None:
        engine = self.engine
        others = [r for r in range(engine.rendezvous.world) if r != engine.rank]
        try:
            if self.records is None:
                self.records = Records(
                    engine.rendezvous.connect(), engine.rendezvous.world, engine.records.identity
                )
            found = other_rosters(self.records, others)
        except (RuntimeError, dist.DistStoreError):
            return
        if found:
            engine.rosters_seen = found
