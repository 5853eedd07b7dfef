"""Every kind of store record a party acts on, checked as Flower checks a node: a valid one is
accepted, and a bad signature, an unknown key, a rank off the roster, a key of another rank, a
stale generation, a record of another session (an earlier run with the same roster), a record
replayed from elsewhere and one flipped byte are each refused.

Each record is written into a real ``torch.distributed`` store and read back through the code
that a party runs (``Membership``, the liveness check, ``SigningStore``, the rendezvous's end
check), not through a test double.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.distributed as dist

from slate.engines.distributed.control.liveness import (
    FINAL_MEMBERS_KEY,
    Liveness,
    final_members,
    registered_process,
)
from slate.engines.distributed.control.membership import Change, Membership
from slate.engines.distributed.control.store_records import (
    RECORD_LIMIT,
    Records,
    SigningStore,
    _signed_bytes,
)
from slate.security import SiteIdentity, make_roster, read_private_key, write_keypair

GENERATION = 2  # the reader's current generation
HOST = "site.example:4242"
SESSION = "a1" * 32  # the reader's session
EARLIER = "b2" * 32  # the session of an earlier run with the same roster


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> tuple[list[SiteIdentity], SiteIdentity]:
    """Three sites on one roster, and an outsider whose key is on another roster."""
    root: Path = tmp_path_factory.mktemp("keys")
    pairs = [write_keypair(root / f"site{r}") for r in range(4)]
    roster = make_roster([pub for _, pub in pairs[:3]], run_id="run-under-test")
    own = make_roster([pairs[3][1]], run_id="run-under-test")
    identities = [SiteIdentity(read_private_key(pairs[r][0]), roster, r) for r in range(3)]
    return identities, SiteIdentity(read_private_key(pairs[3][0]), own, 0)


def envelope(
    signer_key: SiteIdentity,
    key: str,
    signer: int,
    generation: int,
    body: str,
    session: str = SESSION,
) -> str:
    """A record as an attacker may build it: any claimed signer, signed by any key."""
    run = "run-under-test"
    signature = signer_key.sign(_signed_bytes(run, session, key, signer, generation, body))
    return json.dumps({"run": run, "sess": session, "key": key, "signer": signer,
                       "gen": generation, "body": body,
                       "sig": base64.b64encode(signature).decode()})  # fmt: skip


@dataclass(frozen=True)
class Kind:
    """One kind of record: where it lives, whose it is, what it says, and how a party reads it.

    ``owner``: the rank whose record it is (None: any member may write it); ``bound``: whether
    it carries the generation it belongs to; ``read(records, store)`` returns what the party
    takes from the store, None when it takes nothing.
    """

    name: str
    key: str
    body: str
    owner: int | None
    bound: bool
    read: Callable[[Records, object], object]
    generation: int = GENERATION


def reader(records: Records, rank: int = 0) -> Membership:
    membership = Membership.__new__(Membership)  # without registering a process of its own
    membership.records, membership.store, membership.nodes = records, records.store, 3
    membership.rank, membership.members, membership.generation = rank, (0, 1, 2), GENERATION
    membership.incarnations = {}
    return membership


def gloo_address(records: Records, store) -> bytes | None:
    signing = SigningStore(store, records, (0, 1, 2), timeout_s=0.2)
    try:
        return signing.get("0//cpu//0/2")
    except dist.DistStoreError:
        return None


def admission(records: Records, store) -> Change | None:
    return reader(records, rank=1)._admission("slate/admitted/1/ab12")


CHANGE = Change(GENERATION + 1, (0, 1, 2), joined=(1,), position=41, reasons={1: "back"})
REQUEST = json.dumps({"process": HOST, "reason": "restarted", "nonce": "ab12"})
KINDS = [
    Kind("registration", "slate/process/2", HOST, 2, False,
         lambda r, s: registered_process(r, 2)),
    Kind("heartbeat", "slate/beat/2", f"{HOST} 7", 2, False,
         lambda r, s: Liveness(r, 10.0)._beat(2)),
    Kind("gloo address", "0//cpu//0/2", base64.b64encode(b"tcp://10.0.0.2").decode(), 2, False,
         gloo_address),
    Kind("join request", "slate/join_request/2", REQUEST, 2, False,
         lambda r, s: reader(r)._request_of(2)),
    Kind("admission", "slate/admitted/1/ab12", CHANGE.to_text(), None, False, admission),
    Kind("change", f"slate/g{GENERATION}/change", Change(GENERATION + 1, (0, 1), lost=(2,),
         position=40, reasons={2: "gone"}).to_text(), None, True,
         lambda r, s: reader(r)._proposed_change()),
    Kind("failed flag", f"slate/g{GENERATION}/failed", "2", 2, True,
         lambda r, s: reader(r).failed() or None),
    Kind("check-in", f"slate/g{GENERATION}/down/2", "40", 2, True,
         lambda r, s: reader(r)._checked_in(2)),
    Kind("final members", FINAL_MEMBERS_KEY, "[0, 1, 2]", None, False,
         lambda r, s: final_members(r)),
    Kind("generation", "slate/generation", str(GENERATION), None, False,
         lambda r, s: reader(r).running_generation()),
]  # fmt: skip


def read_back(kind: Kind, sites: list[SiteIdentity], raw: str) -> tuple[object, list[str]]:
    """Store ``raw`` under the record's key (with a valid registration of site 2 beside it, as
    a join request needs) and read it back as site 0 does; also return what site 0 said."""
    store = dist.HashStore()
    said: list[str] = []
    records = Records(store, 3, sites[0], say=said.append)
    records.session = SESSION
    if kind.name != "registration":
        store.set("slate/process/2", envelope(sites[2], "slate/process/2", 2, 0, HOST))
    store.set(kind.key, raw)
    return kind.read(records, store), said


def valid(kind: Kind, sites: list[SiteIdentity]) -> str:
    writer = kind.owner if kind.owner is not None else 1
    generation = kind.generation if kind.bound else 0
    return envelope(sites[writer], kind.key, writer, generation, kind.body)


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_a_valid_record_is_accepted(sites, kind):
    value, said = read_back(kind, sites[0], valid(kind, sites[0]))
    assert value is not None and said == []


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_without_a_roster_a_plain_record_is_read(sites, kind):
    store = dist.HashStore()
    if kind.name != "registration":
        store.set("slate/process/2", HOST)
    store.set(kind.key, "7" if kind.name == "heartbeat" else kind.body)  # a counter there
    records = Records(store, 3)
    if kind.name == "gloo address":
        return  # without a roster torch reads its own records directly
    assert kind.read(records, store) is not None
    store.set(kind.key, " " * (RECORD_LIMIT + 1))  # but never one over the size limit
    if kind.name != "heartbeat":
        assert kind.read(records, store) is None


def forgeries(kind: Kind, sites: list[SiteIdentity], outsider: SiteIdentity) -> dict[str, str]:
    """Every way of getting this record wrong that must be refused."""
    owner = kind.owner if kind.owner is not None else 1
    other = 0 if owner != 0 else 1
    generation = kind.generation if kind.bound else 0
    good = json.loads(valid(kind, sites))
    forged = {
        "bad signature": json.dumps({**good, "sig": base64.b64encode(b"\x01" * 64).decode()}),
        "unknown key": envelope(outsider, kind.key, owner, generation, kind.body),
        "rank off the roster": envelope(outsider, kind.key, 7, generation, kind.body),
        "key of another rank": envelope(sites[other], kind.key, owner, generation, kind.body),
        "replayed from another key": envelope(
            sites[owner], "slate/elsewhere", owner, generation, kind.body
        ),
        "flipped byte": json.dumps({**good, "body": _flip(kind.body)}),
        "another run": json.dumps({**good, "run": "another-run"}),
        "another session": envelope(sites[owner], kind.key, owner, generation, kind.body, EARLIER),
        "no session": envelope(sites[owner], kind.key, owner, generation, kind.body, ""),
        "not a record": kind.body,
        "oversized": " " * (RECORD_LIMIT + 1),
    }
    if kind.owner is not None:  # another site's honest record under this rank's key
        forged["another site's record"] = envelope(
            sites[other], kind.key, other, generation, kind.body
        )
    if kind.bound:
        forged["stale generation"] = envelope(
            sites[owner], kind.key, owner, generation - 1, kind.body
        )
    return forged


def _flip(body: str) -> str:
    k = len(body) // 2
    return body[:k] + chr(ord(body[k]) ^ 1) + body[k + 1 :]


FORGERIES = ["bad signature", "unknown key", "rank off the roster", "key of another rank",
             "replayed from another key", "flipped byte", "another run", "another session",
             "no session", "not a record", "oversized", "another site's record",
             "stale generation"]  # fmt: skip


@pytest.mark.parametrize("how", FORGERIES)
@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_a_forged_record_is_refused_and_named_once(sites, kind, how):
    identities, outsider = sites
    forged = forgeries(kind, identities, outsider)
    if how not in forged:
        pytest.skip(f"a {kind.name} record has no {how}")
    value, said = read_back(kind, identities, forged[how])
    assert value is None, how
    assert len(said) == 1 and "ignored a record" in said[0], said


def test_an_old_heartbeat_written_again_is_no_sign_of_life(sites):
    identities, _ = sites
    store = dist.HashStore()
    records = Records(store, 3, identities[0], say=lambda _: None)
    records.session = SESSION
    liveness = Liveness(records, silence_s=0.0)
    beats = [envelope(identities[2], "slate/beat/2", 2, 0, f"{HOST} {n}") for n in (5, 6)]
    store.set("slate/beat/2", beats[0])
    assert liveness.gone(2) is None  # first seen
    store.set("slate/beat/2", beats[1])
    assert liveness.gone(2) is None  # moved on
    store.set("slate/beat/2", beats[0])  # a stranger replays an older beat
    assert "no heartbeat" in (liveness.gone(2) or "")


def test_a_forged_first_record_is_replaced_by_the_honest_proposal(sites):
    """A stranger who writes a membership change first cannot block the agreement."""
    identities, outsider = sites
    store = dist.HashStore()
    records = Records(store, 3, identities[1], say=lambda _: None)
    records.session = SESSION
    key = f"slate/g{GENERATION}/change"
    store.set(key, envelope(outsider, key, 1, GENERATION, "{}"))
    assert records.first(key, "honest", GENERATION) == "honest"
    reader = Records(store, 3, identities[0])
    reader.session = SESSION
    assert reader.get(key, generation=GENERATION) == "honest"
    # ... while a valid record of another member stays the agreed one
    assert records.first(key, "later", GENERATION) == "honest"


def test_each_claimed_rank_is_named_once(sites):
    identities, outsider = sites
    store = dist.HashStore()
    said: list[str] = []
    records = Records(store, 3, identities[0], say=said.append)
    records.session = SESSION
    for n in range(3):
        store.set("slate/process/2", envelope(outsider, "slate/process/2", 2, 0, f"h:{n}"))
        assert registered_process(records, 2) is None
    store.set("slate/process/1", envelope(outsider, "slate/process/1", 1, 0, "h:1"))
    assert registered_process(records, 1) is None
    assert len(said) == 2 and "rank 2" in said[0] and "rank 1" in said[1]


def test_without_a_roster_ranks_outside_the_run_are_ignored():
    """A stranger's fake join of rank 7 in a run of 3 (``tests/security/test_attacks.py``) is
    never looked at."""
    store = dist.HashStore()
    records = Records(store, 3, say=lambda _: None)
    store.set("slate/process/7", HOST)
    store.set("slate/join_request/7", json.dumps({"process": HOST, "reason": "x", "nonce": "1"}))
    membership = reader(records)
    membership.members = (0, 1)
    assert membership._requests() == {}
    bad = Change(GENERATION + 1, (0, 1, 7), joined=(7,), position=3).to_text()
    assert Change.from_text(bad, 3) is None
