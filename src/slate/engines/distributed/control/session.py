"""The session of one start of a run under a roster: an id made fresh by every site, bound into
every signed record and every sealing key.

A roster's run id stays the same for every run made with it (``--resume``, or a roster reused
for a new run), so a record signed in an earlier run with the same roster would verify in a
later one: an outsider who kept a store's records could replay them (the signed end of the run,
the leave records, ``slate/generation``). The *session id* closes that gap:

1. **Nonces.** Whoever hosts the store (``slate rendezvous``, or party 0 when it hosts) writes a
   fresh 32-byte *store nonce* under ``slate/session/store`` when the store opens. At the start
   of the run every site writes a fresh 32-byte nonce, signed by its key under
   ``slate/session/nonce/<rank>``. A nonce record is bound to the run id, its key (so its rank)
   and generation 0, and to no session (it is what makes one), so an earlier run's nonce
   record still verifies: it is handled by steps 2 and 3.
2. **The id.** A site reads every site's nonce and computes ``session = sha256(["slate-session-1",
   run id, store nonce, [nonce of rank 0, ..., nonce of rank N-1]])`` (:func:`session_id`). It
   only uses a set that holds its own fresh nonce (one that does not is written again), so its
   session id contains randomness it made itself and never equals an earlier session's: every
   record signed in an earlier session, replayed or not, is refused.
3. **Agreement.** A site that read an old (replayed) nonce of another site, or read before that
   site wrote its own, computes another id than the others. Each site therefore signs the id it
   computed under ``slate/session/agreed/<rank>`` (bound to that id), reads the set again while
   the ids differ, and goes on only once every site's agreed record carries its own id
   (:func:`derive`). Sites that cannot agree within ``--timeout`` stop with one paragraph
   (:class:`SessionNotAgreed`).

From then on every record (:class:`~slate.engines.distributed.control.store_records.Records`) and
every sealing key (:mod:`slate.security.sealing`, HKDF's ``info``) binds the session id. ``slate
rendezvous`` learns it the same way from its own store nonce (:func:`learn`), so it never accepts an
earlier session's end of the run; a party returning with ``--resume`` learns it from the sites'
nonce and agreed records (:func:`running`), which must hash with this store's nonce: an earlier
store's session, replayed into this one, is no run in progress. Without a roster records are not
signed and there is no session.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slate.engines.distributed.control.store_records import Records, read_within

__all__ = [
    "GENERATION_KEY",
    "STORE_NONCE_KEY",
    "SessionNotAgreed",
    "agreed_key",
    "derive",
    "learn",
    "nonce_key",
    "publish_store_nonce",
    "read_store_nonce",
    "running",
    "session_id",
]

FORMAT = "slate-session-1"
PREFIX = "slate/session"
STORE_NONCE_KEY = f"{PREFIX}/store"
GENERATION_KEY = "slate/generation"  # a run in progress (:meth:`Membership.announce`)
NONCE_BYTES = 32
POLL_SECONDS = 0.05
WAIT_SLICE_S = 1.0  # the longest one wait for the other sites' session records


def nonce_key(rank: int) -> str:
    return f"{PREFIX}/nonce/{rank}"


def agreed_key(rank: int) -> str:
    return f"{PREFIX}/agreed/{rank}"


def fresh_nonce() -> str:
    """A fresh random nonce from the operating system, as hex."""
    return secrets.token_hex(NONCE_BYTES)


def is_nonce(text: str | None) -> bool:
    """Whether ``text`` is a nonce as :func:`fresh_nonce` makes them."""
    return (
        text is not None
        and len(text) == 2 * NONCE_BYTES
        and all(c in "0123456789abcdef" for c in text)
    )


def session_id(run_id: str, store_nonce: str, nonces: list[str]) -> str:
    """The session id: SHA-256 (hex) of the compact JSON ``["slate-session-1", run_id,
    store_nonce, [nonce of rank 0, ..., nonce of rank N-1]]``."""
    text = json.dumps([FORMAT, run_id, store_nonce, nonces], separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def publish_store_nonce(store: Any) -> str:
    """A fresh store nonce, written by whoever hosts the store, right after opening it."""
    nonce = fresh_nonce()
    store.set(STORE_NONCE_KEY, nonce)
    return nonce


def read_store_nonce(store: Any, timeout_s: float = 0.0) -> str | None:
    """The store's nonce (waiting up to ``timeout_s`` for it), or None when there is none.

    One round trip when the nonce is there, as it is from the moment ``slate rendezvous``
    listens: the read comes first, and only a missing nonce is waited for, then read
    (:func:`~slate.engines.distributed.control.store_reads.read_within`: a wait that the
    store ends early is waited again)."""
    text = read_within(store, STORE_NONCE_KEY, timeout_s)
    return text if is_nonce(text) else None


@dataclass
class SessionNotAgreed(Exception):
    """The sites did not agree on a session within ``--timeout``: who was missing, and what."""

    missing: list[int] = field(default_factory=list)  # no valid nonce record of theirs
    disagreeing: dict[int, str] = field(default_factory=dict)  # rank -> the id it signed
    replaced: int = 0  # times this site's own nonce record was gone or replaced
    session: str = ""  # the id this site computed last ("" if it never could)


def _nonces(records: Records, wait_s: float = 0.0) -> list[str | None]:
    """Every rank's nonce, None where its record is missing, unsigned or not a nonce (all of
    them waited for up to ``wait_s`` first: three round trips for them all)."""
    found = records.get_many_any_session(
        [nonce_key(r) for r in range(records.nodes)], list(range(records.nodes)), wait_s
    )
    return [f[1] if f is not None and f[0] == "" and is_nonce(f[1]) else None for f in found]


def _agreed(records: Records, wait_s: float = 0.0) -> list[str | None]:
    """The session id each rank signed as agreed (None where it signed none), waited for as
    :func:`_nonces`."""
    found = records.get_many_any_session(
        [agreed_key(r) for r in range(records.nodes)], list(range(records.nodes)), wait_s
    )
    return [f[0] if f is not None and f[0] == f[1] else None for f in found]


def derive(
    records: Records,
    rank: int,
    timeout_s: float,
    store_nonce: str,
    say: Callable[[str], None] | None = None,
) -> str:
    """This start's session id, agreed with every other site (steps 1-3 of the module doc).

    Raises :class:`SessionNotAgreed` after ``timeout_s`` seconds without agreement.
    """
    say = say or records.say
    assert records.roster is not None
    run = records.roster.run_id
    mine = fresh_nonce()
    records.put(nonce_key(rank), mine, 0, session="")
    deadline = time.monotonic() + timeout_s
    published, replaced = "", 0
    while True:
        # Every record waited for together (a site that starts late is waited for here, in
        # one round trip, rather than polled for), then read with one multi_get.
        nonces = _nonces(records, _wait_slice(deadline))
        agreed: list[str | None] = []
        if nonces[rank] != mine:
            replaced += 1
            if replaced == 1:
                say(
                    f"slate: warning: party {rank}'s session nonce record {nonce_key(rank)} "
                    "was deleted or replaced in the rendezvous store after it was written: "
                    "someone may be writing to or deleting records in the rendezvous store; "
                    "written again."
                )
            records.put(nonce_key(rank), mine, 0, session="")
        elif all(n is not None for n in nonces):
            sid = session_id(run, store_nonce, [n for n in nonces if n is not None])
            if sid != published:
                records.put(agreed_key(rank), sid, 0, session=sid)
                published = sid
            agreed = _agreed(records, _wait_slice(deadline))
            if all(a == sid for a in agreed):
                records.session = sid
                return sid
        if time.monotonic() > deadline:
            missing = [r for r, n in enumerate(nonces) if n is None]
            others = {r: a or "" for r, a in enumerate(agreed) if a != published and r != rank}
            raise SessionNotAgreed(missing, {} if missing else others, replaced, published)
        time.sleep(POLL_SECONDS)


def _wait_slice(deadline: float) -> float:
    """How long one read in :func:`derive` waits for records still missing: at most
    :data:`WAIT_SLICE_S`, and never past ``deadline`` (then at least a moment)."""
    return max(0.01, min(WAIT_SLICE_S, deadline - time.monotonic()))


def _agreed_session(records: Records, store_nonce: str | None) -> str | None:
    """The session that every site's nonce and agreed records make with ``store_nonce``."""
    if store_nonce is None or records.roster is None:
        return None
    nonces = _nonces(records)
    if any(n is None for n in nonces):
        return None
    sid = session_id(records.roster.run_id, store_nonce, [n for n in nonces if n is not None])
    return sid if all(a == sid for a in _agreed(records)) else None


def running(records: Records, store_nonce: str | None) -> str | None:
    """The session of a run in progress at this store, for a party that may be returning:
    every site's nonce and agreed records hash to one id with this store's nonce, and the
    ``slate/generation`` record (written once the run's first process group opened) is signed
    in that session. None otherwise: an earlier store's records, replayed here, are no run in
    progress."""
    if not records.store.check([GENERATION_KEY]):
        return None
    sid = _agreed_session(records, store_nonce)
    if sid is None:
        return None
    previous, records.session = records.session, sid
    try:
        generation = records.get_signed(GENERATION_KEY)
    finally:
        records.session = previous
    return sid if generation is not None else None


def learn(records: Records, store_nonce: str) -> str | None:
    """For ``slate rendezvous``: the session the sites agreed on, once they have, made with
    this rendezvous's own ``store_nonce`` (so never an earlier store's); None before."""
    return _agreed_session(records, store_nonce)
