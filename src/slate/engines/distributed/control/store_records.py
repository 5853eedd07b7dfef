"""The run's coordination records in the rendezvous store: bounded, checked, and signed under a
roster.

torch's ``TCPStore`` authenticates nobody: any client that reaches its port can read, write and
delete every key. Every record that a party acts on therefore goes through :class:`Records`:

* **Without a roster** (a trusted network), a record is its plain text. What a party reads is
  refused when it is longer than :data:`RECORD_LIMIT` bytes, and the ranks it names are checked
  against ``--nodes`` by the reader (:func:`parse_rank`).
* **With a roster** (``--roster``, ``--key``), a record is a signed *envelope*:
  ``{"run", "sess", "key", "signer", "gen", "body", "sig"}``. ``sig`` is the signer's Ed25519
  signature (:class:`slate.security.SiteIdentity`) of the run id, the session id, the store key,
  the signer's rank, the generation and the body together, so a record cannot be moved to another
  key, another run or another session (an earlier run with the same roster), or passed off as
  another site's or another generation's. The session id
  (:mod:`slate.engines.distributed.control.session`) is derived at each start from fresh random
  values of every site; until it is known (the session's own nonce records) it is empty. A record
  that does not verify, names a rank off the roster, comes from another rank than the key belongs
  to, belongs to another session or carries an old generation is ignored, as if it were absent; each
  party says once per claimed rank that it ignored one.

A record that the first writer wins (:meth:`Records.first`, the store's ``compare_set``) and
that a stranger wrote first is replaced atomically by the honest proposal, so a forged record
cannot block an agreement either.

:class:`SigningStore` puts the same signatures on the records that ``torch.distributed`` itself
keeps in the store when a process group opens (gloo's addresses of every party).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from slate.engines.distributed.control.store_reads import (
    ABSENT,
    RECORD_LIMIT,
    _text,
    multi_get_within,
    read,
    read_within,
    wait_for,
)
from slate.security.identity import SiteIdentity
from slate.security.roster import Roster

__all__ = [
    "ABSENT", "RECORD_LIMIT", "Records", "SigningStore", "multi_get_within", "parse_rank", "read",
    "read_within",
]  # fmt: skip

FORMAT = "slate-record-2"
POLL_SECONDS = 0.05
ENVELOPE_START = b'{"run":'  # how every signed record begins
MAX_REPLACEMENTS = 100  # forged records replaced under one key before giving up


def parse_rank(text: str | None, nodes: int) -> int | None:
    """The rank in ``text`` if it is a decimal integer in ``0..nodes-1``, else None."""
    if text is None or not 0 < len(text) <= 6 or not text.isascii() or not text.isdigit():
        return None
    rank = int(text)
    return rank if rank < nodes else None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Records:
    """Reads and writes coordination records for party ``rank`` of a run of ``nodes`` parties.

    ``identity`` (this site's key and the roster) turns signatures on; ``roster`` alone checks
    them without signing (``slate rendezvous``). ``say`` prints the once-per-rank notes about
    ignored records.
    """

    def __init__(
        self,
        store: Any,
        nodes: int,
        identity: SiteIdentity | None = None,
        say: Callable[[str], None] = _say,
        roster: Roster | None = None,
    ) -> None:
        self.store = store
        self.nodes = nodes
        self.identity = identity
        self.roster = identity.roster if identity is not None else roster
        self.say = say
        self._noted: set[str] = set()
        # the session id, shared by every copy over another connection (:meth:`with_store`)
        self._session: list[str] = [""]

    @property
    def session(self) -> str:
        """The run's session id (:mod:`slate.engines.distributed.control.session`); "" before it is
        known (and always without a roster)."""
        return self._session[0]

    @session.setter
    def session(self, value: str) -> None:
        self._session[0] = value

    @property
    def signed(self) -> bool:
        """Whether records are signed and checked (a roster is in force)."""
        return self.roster is not None

    def names_a_rank(self, body: str) -> bool:
        """Whether ``body`` is a rank of this run (``0..nodes-1``)."""
        return parse_rank(body, self.nodes) is not None

    def with_store(self, store: Any) -> Records:
        """The same records over another connection to the store (one per thread)."""
        other = Records(store, self.nodes, self.identity, self.say, self.roster)
        other._noted, other._session = self._noted, self._session
        return other

    # -- writing ------------------------------------------------------------------------------

    def seal(self, key: str, body: str, generation: int = 0, session: str | None = None) -> str:
        """What is stored under ``key``: ``body`` itself, or its signed envelope, bound to
        ``session`` (this run's session when None)."""
        if self.identity is None:
            if self.roster is not None:
                raise RuntimeError("records are only checked here: this process holds no key")
            return body
        run, signer = self.identity.roster.run_id, self.identity.rank
        session = self.session if session is None else session
        signed = _signed_bytes(run, session, key, signer, generation, body)
        signature = self.identity.sign(signed)
        return json.dumps(
            {"run": run, "sess": session, "key": key, "signer": signer, "gen": generation,
             "body": body, "sig": base64.b64encode(signature).decode("ascii")},
            separators=(",", ":"),
        )  # fmt: skip

    def put(self, key: str, body: str, generation: int = 0, session: str | None = None) -> None:
        """Store ``body`` under ``key`` (signed by this site under a roster, bound to
        ``session``: this run's session when None)."""
        self.store.set(key, self.seal(key, body, generation, session))

    def first(
        self,
        key: str,
        body: str,
        generation: int = 0,
        valid: Callable[[str], bool] | None = None,
    ) -> str:
        """The first valid record under ``key``: ``body`` if none was there. A record that does
        not verify (a stranger's), or whose body ``valid`` refuses, is replaced by ``body``
        atomically."""
        mine = self.seal(key, body, generation)
        expected = ""
        for _ in range(MAX_REPLACEMENTS):
            current = _text(self.store.compare_set(key, expected, mine))
            if current == mine:
                return body
            opened = self.open(key, current, generation=generation)
            if opened is not None and (valid is None or valid(opened[1])):
                return opened[1]
            expected = current  # replace exactly the record that did not verify
        raise dist.DistStoreError(
            f"the record {key} was overwritten {MAX_REPLACEMENTS} times with records that do not "
            "verify: someone other than the sites is writing to the rendezvous"
        )

    # -- reading ------------------------------------------------------------------------------

    def get(self, key: str, signer: int | None = None, generation: int | None = None) -> str | None:
        """The body stored under ``key``, or None when there is none or it is refused (one
        round trip, :func:`read`)."""
        raw = read(self.store, key)
        opened = None if raw is None else self.open(key, raw, signer, generation)
        return None if opened is None else opened[1]

    def get_many(
        self, keys: list[str], signers: list[int | None], wait_s: float = 0.0
    ) -> list[str | None]:
        """:meth:`get` of each key: with ``wait_s``, one ``multi_get`` that waits up to that
        long for all of them (:func:`multi_get_within`, two round trips); without, ``check``
        (one) then ``multi_get`` (two) when all exist. Only when some key is still missing, one
        key at a time (one round trip each)."""
        if not keys:
            return []
        raws = self._all_of(keys, wait_s)
        if raws is None:
            return [self.get(key, signer) for key, signer in zip(keys, signers, strict=True)]
        found = []
        for key, raw, signer in zip(keys, raws, signers, strict=True):
            opened = self.open(key, _text(raw), signer)
            found.append(None if opened is None else opened[1])
        return found

    def _all_of(self, keys: list[str], wait_s: float) -> list[bytes] | None:
        """Every key's stored value, or None when some key is missing (after ``wait_s``)."""
        if wait_s > 0:
            return multi_get_within(self.store, keys, wait_s)
        return list(self.store.multi_get(keys)) if self.store.check(keys) else None

    def get_signed(self, key: str, generation: int | None = None) -> tuple[int, str] | None:
        """``(signer, body)`` of the record under ``key`` (signer -1 without a roster)."""
        raw = read(self.store, key)
        return None if raw is None else self.open(key, raw, None, generation)

    def get_any_session(self, key: str, signer: int) -> tuple[str, str] | None:
        """``(session, body)`` of ``signer``'s record under ``key``, whatever session it is
        bound to (the session's own records, :mod:`slate.engines.distributed.control.session`); None
        when there is none or it does not verify (noted like any forgery; another session's record
        is no forgery here: the session code decides what it means)."""
        raw = read(self.store, key)
        return None if raw is None else self._any_session(key, raw, signer)

    def get_many_any_session(
        self, keys: list[str], signers: list[int], wait_s: float = 0.0
    ) -> list[tuple[str, str] | None]:
        """:meth:`get_any_session` of each key, as :meth:`get_many` reads them (``wait_s``:
        waited for up to that long first)."""
        if not keys:
            return []
        raws = self._all_of(keys, wait_s)
        if raws is None:
            return [self.get_any_session(k, s) for k, s in zip(keys, signers, strict=True)]
        found: list[tuple[str, str] | None] = []
        for key, raw, signer in zip(keys, raws, signers, strict=True):
            found.append(self._any_session(key, _text(raw), signer))
        return found

    def open_any_session(self, key: str, raw: str, signer: int) -> tuple[str, str] | None:
        """:meth:`get_any_session` of the stored text ``raw`` (read already)."""
        return self._any_session(key, raw, signer)

    def _any_session(self, key: str, raw: str, signer: int) -> tuple[str, str] | None:
        if self.roster is None:
            return None
        if len(raw) > RECORD_LIMIT:
            self.note(key, "?", f"{len(raw)} bytes, over the limit of {RECORD_LIMIT}")
            return None
        envelope, problem = self._verified(key, raw)
        if envelope is None:
            self.note(key, problem[0], problem[1])
            return None
        if envelope["signer"] != signer:
            self.note(key, str(envelope["signer"]), f"the record belongs to rank {signer}")
            return None
        return envelope["sess"], envelope["body"]

    def open(
        self, key: str, raw: str, signer: int | None = None, generation: int | None = None
    ) -> tuple[int, str] | None:
        """``(signer, body)`` of the stored text ``raw``, or None when it is refused: too long,
        or (with a roster) not a valid envelope of this run, session and key, signed by
        ``signer`` (any site on the roster when None) in ``generation`` (any when None)."""
        if len(raw) > RECORD_LIMIT:
            self.note(key, "?", f"{len(raw)} bytes, over the limit of {RECORD_LIMIT}")
            return None
        if self.roster is None:
            return -1, raw
        envelope, problem = self._verified(key, raw)
        if envelope is None:
            self.note(key, problem[0], problem[1])
            return None
        claimed = envelope["signer"]
        if envelope["sess"] != self.session:
            self.note(key, str(claimed), _another_session(envelope["sess"], self.session))
            return None
        if signer is not None and claimed != signer:
            self.note(key, str(claimed), f"the record belongs to rank {signer}")
            return None
        if generation is not None and envelope["gen"] != generation:
            why = f"it is of generation {envelope['gen']}, not {generation}"
            self.note(key, str(claimed), why)
            return None
        return claimed, envelope["body"]

    def _verified(self, key: str, raw: str) -> tuple[dict | None, tuple[str, str]]:
        roster = self.roster
        assert roster is not None
        try:
            envelope = json.loads(raw)
        except ValueError:
            return None, ("?", "it is not a signed record")
        fields = {"run": str, "sess": str, "key": str, "signer": int, "gen": int, "body": str,
                  "sig": str}  # fmt: skip
        if not isinstance(envelope, dict) or set(envelope) != set(fields):
            return None, ("?", "it is not a signed record")
        if any(not _is(envelope[name], kind) for name, kind in fields.items()):
            return None, ("?", "it is not a signed record")
        claimed = str(envelope["signer"])
        if envelope["run"] != roster.run_id:
            return None, (claimed, "it belongs to another run id")
        if envelope["key"] != key:
            return None, (claimed, f"it was signed for another key ({envelope['key'][:60]})")
        if not 0 <= envelope["signer"] < roster.n:
            return None, (claimed, "that rank is not on the roster")
        try:
            signature = base64.b64decode(envelope["sig"], validate=True)
        except (binascii.Error, ValueError):
            return None, (claimed, "its signature is not base64")
        signed = _signed_bytes(
            envelope["run"], envelope["sess"], key, envelope["signer"], envelope["gen"],
            envelope["body"],
        )  # fmt: skip
        if not roster.verify(envelope["signer"], signed, signature):
            return None, (claimed, "its signature does not verify with that rank's key")
        return envelope, ("", "")

    def note(self, key: str, claimed: str, why: str) -> None:
        """Say once per claimed rank that a record was ignored."""
        if claimed in self._noted:
            return
        self._noted.add(claimed)
        who = "no valid rank" if claimed == "?" else f"rank {claimed}"
        self.say(
            f"slate: warning: ignored a record in the rendezvous store under {key[:80]!r} that "
            f"claims to come from {who}: {why}. Someone other than the sites on the roster may "
            "be writing to the rendezvous (further such records from that rank are ignored "
            "silently)."
        )


def _signed_bytes(
    run: str, session: str, key: str, signer: int, generation: int, body: str
) -> bytes:
    return json.dumps(
        [FORMAT, run, session, key, signer, generation, body], separators=(",", ":")
    ).encode()


def _another_session(theirs: str, ours: str) -> str:
    if not ours:
        return f"it belongs to a session ({theirs[:16]}...) that this process has not joined"
    if not theirs:
        return "it is not bound to this run's session (only a session's own nonce records are)"
    return (
        f"it belongs to another session of this run ({theirs[:16]}..., not {ours[:16]}...): an "
        "earlier run with the same roster wrote it, and someone replayed it here"
    )


def _is(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


_GROUP_RANK = re.compile(r"//\d+/(\d+)$")  # gloo's address key of group rank k ends in /k


class SigningStore(dist.Store):
    """The store that ``init_process_group`` uses for the records torch.distributed keeps.

    Under a roster, every value torch sets is sealed by this site, and every value it reads must
    be signed by a member of the generation (by the member whose group rank the key names, for
    gloo's address keys); a value that does not verify is waited past until a valid one replaces
    it, up to the store's timeout. Without a roster, values pass as they are, except a signed
    envelope (a party of a roster run), which is refused: read as an address, it would make gloo
    allocate at random.

    gloo reads the members' addresses one after the other (a ``wait`` and a ``get`` each: three
    round trips per member). The first time it asks for one, every member's address of that
    group is waited for together and read with one ``multi_get`` (three round trips for all of
    them); gloo's later reads are answered from what was read. A value that does not verify is
    not kept: its own read waits past it, as above.
    """

    def __init__(
        self,
        inner: Any,
        records: Records,
        members: tuple[int, ...],
        timeout_s: float,
        scope: str = "",
    ) -> None:
        super().__init__()
        self.inner, self.records, self.members = inner, records.with_store(inner), members
        self.timeout_s = timeout_s
        self.scope = scope  # signed with each key: a record of another group does not verify
        # What torch did through this store, for the messages when the group does not open:
        self.written: dict[str, int | None] = {}  # key -> group rank, the records set here
        self.awaited: dict[str, int | None] = {}  # key -> group rank, the records waited for
        self.addresses: dict[int, bytes] = {}  # group rank -> its gloo record (as torch read it)
        self._fetched: dict[str, bytes] = {}  # gloo's address records read ahead, not yet asked
        self._bases: set[str] = set()  # the address keys' stems already read ahead
        self._late = False  # a read-ahead ran out of time

    def _group_rank(self, key: str) -> int | None:
        found = _GROUP_RANK.search(key)
        if found is not None and int(found.group(1)) < len(self.members):
            return int(found.group(1))
        return None

    def _signer(self, key: str) -> int | None:
        index = self._group_rank(key)
        return None if index is None else self.members[index]

    def name(self, key: str) -> str:
        """The key as it is named in the rendezvous store (with the group's prefix)."""
        return f"{self.scope}/{key}" if self.scope else key

    def vanished(self) -> tuple[list[str], list[tuple[str, int | None]]]:
        """The records this party set that are no longer in the store, and the records it
        waited for that are not there (with the group rank each belongs to); torch never
        deletes them while a group opens, so a record set here and gone was deleted."""
        mine = [key for key in self.written if not self.inner.check([key])]
        theirs = [(key, rank) for key, rank in self.awaited.items()
                  if key not in self.written and not self.inner.check([key])]  # fmt: skip
        return mine, theirs

    def set(self, key: str, value: bytes | str) -> None:
        index = self._group_rank(key)
        self.written[key] = index
        if index is not None:
            self.addresses[index] = value if isinstance(value, bytes) else value.encode()
        self.inner.set(key, self._seal(key, value))

    def _seal(self, key: str, value: bytes | str) -> bytes | str:
        if not self.records.signed:
            return value
        raw = value if isinstance(value, bytes) else value.encode()
        return self.records.seal(self.scope + key, base64.b64encode(raw).decode("ascii"))

    def _read_ahead(self, key: str) -> None:
        """Every member's address record of the group that ``key`` (one of them) belongs to,
        waited for and read together, kept for gloo's reads; nothing for any other key. A wait
        that runs out of time raises as gloo's own would have."""
        found = _GROUP_RANK.search(key)
        if found is None or self._group_rank(key) is None:
            return
        base = key[: found.start(1)]
        if base in self._bases:
            return
        self._bases.add(base)
        keys = [f"{base}{i}" for i in range(len(self.members))]
        for name in keys:
            self.awaited.setdefault(name, self._group_rank(name))
        # (a wait, then a multi_get: on this thread, which gloo's process group opens on while
        # the main thread watches the store on the same connection, the connection's timeout
        # is never changed)
        if not wait_for(self.inner, keys, self.timeout_s):
            self._late = True  # what is missing now had the whole timeout to show
            return
        for name, raw in zip(keys, self.inner.multi_get(keys), strict=True):
            if not raw:  # (missing: the wait was woken early, see multi_get_within; its own
                continue  # read waits for it, and checks an empty record that is there)
            value = self._accepted(name, raw)
            if value is not None:
                self._fetched[name] = value

    def _refuse_late(self, key: str) -> None:
        """After a read-ahead that ran out of time: an address record still missing is not
        waited for again (gloo's own wait would have given up)."""
        if self._late and self._group_rank(key) is not None and not self.inner.check([key]):
            raise dist.DistStoreError(f"no record under {key} within {self.timeout_s:g} s")

    def _accepted(self, key: str, raw: bytes) -> bytes | None:
        """The value torch may use from the stored ``raw``, or None (refused, or not signed)."""
        if not self.records.signed:
            if raw.startswith(ENVELOPE_START):
                raise dist.DistStoreError(
                    f"the record {key} is signed: its party runs with a --roster, this one without"
                )
            return raw
        return self._open(key, _text(raw))

    def get(self, key: str) -> bytes:
        self.awaited.setdefault(key, self._group_rank(key))
        self._read_ahead(key)
        value = self._fetched.pop(key, None)
        if value is None:
            self._refuse_late(key)
            value = self._get(key)
        index = self._group_rank(key)
        if index is not None:
            self.addresses[index] = value
        return value

    def _get(self, key: str) -> bytes:
        if not self.records.signed:
            value = self.inner.get(key)
            if value.startswith(ENVELOPE_START):
                raise dist.DistStoreError(
                    f"the record {key} is signed: its party runs with a --roster, this one without"
                )
            return value
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise dist.DistStoreError(f"no valid signed record under {key} in time")
            self.inner.wait([key], datetime.timedelta(seconds=left))
            if self.inner.check([key]):  # (not deleted since: a get would wait for it)
                value = self._open(key, _text(self.inner.get(key)))
                if value is not None:
                    return value
            time.sleep(POLL_SECONDS)

    def _open(self, key: str, raw: str) -> bytes | None:
        opened = self.records.open(self.scope + key, raw, self._signer(key))
        if opened is None or (opened[0] not in self.members and self.records.signed):
            return None
        try:
            return base64.b64decode(opened[1], validate=True)
        except (binascii.Error, ValueError):
            return None

    def add(self, key: str, amount: int) -> int:
        return self.inner.add(key, amount)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self.inner.compare_set(key, expected, self._seal(key, desired))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        for key in keys:
            self.awaited.setdefault(key, self._group_rank(key))
            self._read_ahead(key)
        if all(key in self._fetched for key in keys):
            return
        for key in keys:
            self._refuse_late(key)
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.inner.set_timeout(timeout)
