"""Sessions, deleted records and a stranger at a gloo listener.

* the session id of a start (:mod:`slate.engines.distributed.control.session`): two starts give two
  ids, each the SHA-256 spelt out here; a record or sealing key of another session is refused; a
  replayed old nonce never makes an old session again; sites that cannot agree stop;
* real processes (per-site w7a files, ``slate rendezvous``, one ``--rank`` process per site):
  an earlier run's signed records (the end of the run, the leave records, ``slate/generation``,
  its session records and store nonce) replayed into a new run with the same roster are refused,
  and ``slate rendezvous`` ends only at the real end; gloo's address records deleted during the
  set-up are named at every site; a stranger who connects first to the sites' gloo listeners
  (``gloo_stranger.py``) is named at every site within ``--timeout`` + ``MARGIN_S``, with and
  without a roster.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from slate.engines.distributed.control import session, start_up
from slate.engines.distributed.control.launch import RENDEZVOUS_ROSTER_KEY, serve_rendezvous
from slate.engines.distributed.control.liveness import (
    FINAL_MEMBERS_KEY,
    LEFT_KEY,
    confirm_leave,
    leave_run,
)
from slate.engines.distributed.control.store_records import Records
from slate.engines.distributed.wire.handshake import MARGIN_S
from slate.security import Roster, SiteIdentity, make_roster, read_private_key, write_keypair
from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    free_port,
    identity_flags,
    script,
    serve,
    start_party,
    write_sites,
)
from tests.sites import make_roster as make_site_roster
from tests.sites import start as start_process

RUN = "session-run"
STRANGER = Path(__file__).with_name("gloo_stranger.py")


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> list[SiteIdentity]:
    root = tmp_path_factory.mktemp("keys")
    pairs = [write_keypair(root / f"site{r}") for r in range(3)]
    roster = make_roster([pub for _, pub in pairs], run_id=RUN)
    return [SiteIdentity(read_private_key(pairs[r][0]), roster, r) for r in range(3)]


def reference_id(store_nonce: str, nonces: list[str]) -> str:
    """The session id, spelt out without slate."""
    text = f'["slate-session-1","{RUN}","{store_nonce}",[' + ",".join(f'"{n}"' for n in nonces)
    return hashlib.sha256((text + "]]").encode()).hexdigest()


def start(store, sites, ranks, timeout_s=20.0, say=None) -> dict[int, object]:
    """``session.derive`` for each of ``ranks`` on its own thread and store view: rank -> the
    id it agreed on, or the exception it raised."""
    nonce = session.read_store_nonce(store)
    out: dict[int, object] = {}

    def one(rank: int) -> None:
        records = Records(store, 3, sites[rank], say=say or (lambda _: None))
        try:
            out[rank] = session.derive(records, rank, timeout_s, nonce)
        except session.SessionNotAgreed as err:
            out[rank] = err

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return out


def fresh_store() -> dist.HashStore:
    store = dist.HashStore()
    session.publish_store_nonce(store)
    return store


def raw(store, key: str) -> bytes:
    return store.get(key)


def test_two_starts_give_two_session_ids_each_the_reference_hash(sites):
    ids = []
    for _ in range(2):
        store = fresh_store()
        agreed = start(store, sites, [0, 1, 2])
        assert len(set(agreed.values())) == 1, agreed
        nonces = [json.loads(raw(store, session.nonce_key(r)))["body"] for r in range(3)]
        expected = reference_id(session.read_store_nonce(store), nonces)
        assert (
            agreed[0]
            == expected
            == session.session_id(RUN, session.read_store_nonce(store), nonces)
        )
        ids.append(expected)
    assert ids[0] != ids[1]


def test_a_record_of_another_session_is_refused_with_a_warning(sites):
    store = dist.HashStore()
    said: list[str] = []
    earlier, later = (Records(store, 3, sites[1], say=said.append) for _ in range(2))
    earlier.session, later.session = "a" * 64, "b" * 64  # two starts of the run
    earlier.put(FINAL_MEMBERS_KEY, "[0, 1, 2]")
    assert earlier.get(FINAL_MEMBERS_KEY) == "[0, 1, 2]"
    assert later.get(FINAL_MEMBERS_KEY) is None
    assert len(said) == 1 and "another session" in said[0] and "replayed" in said[0]


def test_a_replayed_old_nonce_never_makes_an_old_session(sites):
    """The nonce and agreed records of ranks 1 and 2 of an earlier start are in the store when
    rank 0 starts: rank 0 reads them first, yet all three agree on a new id, made with the fresh
    nonces of ranks 1 and 2."""
    old_store = fresh_store()
    first = start(old_store, sites, [0, 1, 2])[0]
    store = fresh_store()
    for key in [k(r) for r in (1, 2) for k in (session.nonce_key, session.agreed_key)]:
        store.set(key, raw(old_store, key))
    out: dict[int, object] = {}
    early = threading.Thread(target=lambda: out.update(start(store, sites, [0])))
    early.start()
    deadline = time.monotonic() + 30
    while not store.check([session.agreed_key(0)]):  # rank 0 agreed with the old nonce
        assert time.monotonic() < deadline
        time.sleep(0.01)
    out.update(start(store, sites, [1, 2]))
    early.join(60)
    assert len(set(out.values())) == 1 and out[0] != first, out
    nonces = [json.loads(raw(store, session.nonce_key(r)))["body"] for r in range(3)]
    for rank in (1, 2):
        assert nonces[rank] != json.loads(raw(old_store, session.nonce_key(rank)))["body"]
    assert out[0] == reference_id(session.read_store_nonce(store), nonces)


def test_sites_that_read_an_old_nonce_they_cannot_replace_stop_naming_it(sites):
    """Rank 2 never starts; its nonce and agreed records of an earlier start are replayed:
    ranks 0 and 1 compute a new id with the old nonce (never the old id: their own nonces are
    fresh), see that rank 2 signed another one, and stop after --timeout."""
    old_store = fresh_store()
    old = start(old_store, sites, [0, 1, 2])[0]
    store = fresh_store()
    for key in (session.nonce_key(2), session.agreed_key(2)):
        store.set(key, raw(old_store, key))
    out = start(store, sites, [0, 1], timeout_s=1.5)
    for rank in (0, 1):
        err = out[rank]
        assert isinstance(err, session.SessionNotAgreed), err
        assert err.missing == [] and err.disagreeing == {2: old} and err.session not in ("", old)
        engine = SimpleNamespace(rank=rank, timeout_s=1.5, records=Records(store, 3, sites[rank]))
        message = start_up.session_failure(engine, err)
        assert message.startswith(f"Party {rank} waited --timeout 1.5 s") and "\n" not in message
        assert "did not agree on the run's session id" in message, message
        assert f"party 2 signed {old[:16]}..." in message and err.session[:16] in message


def test_a_run_in_progress_is_only_one_of_this_stores_sessions(sites):
    store = fresh_store()
    sid = start(store, sites, [0, 1, 2])[0]
    records = Records(store, 3, sites[0])
    records.session = sid
    records.put(session.GENERATION_KEY, "0", 0)
    viewer = Records(store, 3, sites[1], say=lambda _: None)
    assert session.running(viewer, session.read_store_nonce(store)) == sid
    # every session record and the generation, replayed into another store: not running there
    other = fresh_store()
    keys = [session.GENERATION_KEY]
    keys += [k(r) for r in range(3) for k in (session.nonce_key, session.agreed_key)]
    for key in keys:
        other.set(key, raw(store, key))
    viewer = Records(other, 3, sites[1], say=lambda _: None)
    assert session.running(viewer, session.read_store_nonce(other)) is None


def test_the_rendezvous_sees_an_end_whose_records_were_deleted(sites, tmp_path):
    """A stranger deletes the leave record and the final members the moment they appear: the
    leaving party writes them again until 'slate rendezvous' says it saw them, and the
    rendezvous ends (at the real end, with the session it learned)."""
    port = free_port()
    lines: list[str] = []
    result: list[int] = []
    server = threading.Thread(
        target=lambda: result.append(serve_rendezvous(
            port, "127.0.0.1", lines.append, idle_timeout=0, roster=sites[0].roster,
            linger=0)),
    )  # fmt: skip
    server.start()
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=30))  # fmt: skip
    while session.read_store_nonce(store) is None:
        time.sleep(0.01)
    agreed = start(store, sites, [0, 1, 2])
    sid = agreed[0]
    deleted: list[str] = []

    def deleter() -> None:
        keys = [FINAL_MEMBERS_KEY, *(f"{LEFT_KEY}/{r}" for r in range(3))]
        while len(deleted) < len(keys):
            for key in keys:
                if key not in deleted and store.check([key]):
                    store.delete_key(key)
                    deleted.append(key)
            time.sleep(0.001)

    stranger = threading.Thread(target=deleter, daemon=True)
    stranger.start()
    said: list[str] = []
    for rank in range(3):
        records = Records(store, 3, sites[rank], say=lambda _: None)
        records.session = sid
        final = json.dumps([0, 1, 2]) if rank == 0 else None
        if final is not None:
            records.put(FINAL_MEMBERS_KEY, final)
        leave_run(records, rank)
        seen = confirm_leave(records, rank, final, timeout_s=20, say=said.append)
        assert seen or rank == 2  # (the last may find the rendezvous gone: it saw the end)
    server.join(30)
    assert result == [0], lines
    assert len(deleted) == 4 and said and "deleting records" in said[0]
    assert "every party has left" in lines[-1]


# -- real processes ---------------------------------------------------------------------------

real_sites = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and HAVE_W7A), reason="gloo on Linux, and w7a"
)

#: Party 0 of the run, held before it opens its process group until the file GO exists (a site
#: that is slow to start): the others publish their gloo addresses and wait for party 0's, so
#: that a stranger (or a deleter) can act on theirs first, every time.
HELD = """
import os, sys, time
import torch.distributed as dist

opening = dist.init_process_group

def held(*args, **kwargs):
    while not os.path.exists({go!r}):
        time.sleep(0.01)
    return opening(*args, **kwargs)

dist.init_process_group = held
from slate.cli import main
sys.exit(main(sys.argv[1:]))
"""


def client(port: int):
    return dist.TCPStore("127.0.0.1", port, is_master=False,
                         timeout=datetime.timedelta(seconds=30))  # fmt: skip


def lines_of(stream) -> queue.SimpleQueue:
    """The lines of ``stream``, read by a daemon thread as they come."""
    found: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: [found.put(line) for line in stream], daemon=True).start()
    return found


def expect(lines: queue.SimpleQueue, words: str, timeout: float = 120) -> str:
    """The first line (from now on) that holds ``words``."""
    deadline = time.monotonic() + timeout
    while True:
        line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        if words in line:
            return line


def ends(parties: list[subprocess.Popen], timeout: float = 180) -> list[float]:
    """When each party ended (time.monotonic()); one still running after ``timeout`` is
    killed and its end left at infinity."""
    deadline = time.monotonic() + timeout
    ended = [float("inf")] * len(parties)
    while any(t == float("inf") for t in ended) and time.monotonic() < deadline:
        for k, party in enumerate(parties):
            if ended[k] == float("inf") and party.poll() is not None:
                ended[k] = time.monotonic()
        time.sleep(0.05)
    for party in parties:
        if party.poll() is None:
            party.kill()
    return ended


def held_run(root: Path, roster: Path | None, timeout: int, port: int) -> tuple[list, Path]:
    """Three sites at ``port``, party 0 held until ``root/go`` exists."""
    go = root / "go"
    (root / "held.py").write_text(HELD.format(go=str(go)))
    flags = ["--nodes", "3", "--external-store", *SITE_FLAGS, "--iterations", "20"]
    flags[flags.index("--timeout") + 1] = str(timeout)
    parties = []
    for rank in range(3):
        program = script(root / "held.py") if rank == 0 else None
        ids = identity_flags(roster, rank) if roster else []
        parties.append(start_party(root, rank, port, *flags, *ids, program=program))
    return parties, go


@real_sites
@pytest.mark.processes
@pytest.mark.xdist_group("timing")  # they time the wait against --timeout
@pytest.mark.parametrize("with_roster", [False, True], ids=["plain", "roster"])
def test_a_stranger_first_at_a_gloo_listener_is_named_within_the_timeout(tmp_path, with_roster):
    """The stranger connects to the listeners of parties 1 and 2 with the pair identifiers it
    read in their gloo records, before party 0 opens its group (and so before 1 and 2 connect to
    each other). Before: every site exited at --timeout with a plain timeout (roster), or every
    site hung until killed (no roster)."""
    write_sites(tmp_path, parties=3, rows=100)
    roster = make_site_roster(tmp_path, 3) if with_roster else None
    port = free_port()
    server = serve(port, *(["--roster", str(roster)] if roster else []))
    timeout = 6
    stranger = start_process(script(STRANGER, port, 3, 0))
    try:
        parties, go = held_run(tmp_path, roster, timeout, port)
        heard = lines_of(stranger.stdout)
        assert {expect(heard, "connected").split()[1] for _ in range(2)} == {"1", "2"}
        go.touch()
        opened = time.monotonic()
        ended = ends(parties)
    finally:
        stranger.kill()
        server.kill()
    for rank, party in enumerate(parties):
        err = party.stderr.read().strip()
        assert party.returncode == 2, err[-3000:]
        assert ended[rank] - opened <= timeout + MARGIN_S, ended[rank] - opened
        assert err.count("slate: error:") == 1 and "Traceback" not in err, err[-3000:]
        message = err[err.index("slate: error:") :]
        assert "\n" not in message, message
        assert "did not hear each other's hello" in message, message
        assert "gloo listener (127.0.0.1:" in message and "did not come from part" in message
        assert "A stranger may have connected first" in message
        print(f"party {rank} ended {ended[rank] - opened:.1f} s after party 0 opened: {message}")


@real_sites
@pytest.mark.processes
@pytest.mark.xdist_group("timing")  # they time the wait against --timeout
@pytest.mark.parametrize("with_roster", [False, True], ids=["plain", "roster"])
def test_deleted_gloo_address_records_are_named_at_every_site(tmp_path, with_roster):
    """A stranger deletes every gloo address record as it appears. Before: every site blamed
    firewalls (or named a live peer as exited) after --timeout."""
    write_sites(tmp_path, parties=3, rows=100)
    roster = make_site_roster(tmp_path, 3) if with_roster else None
    port = free_port()
    server = serve(port, *(["--roster", str(roster)] if roster else []))
    store = client(port)
    keys = [f"slate/pg0/0//cpu//0/{r}" for r in range(3)]
    deleted: list[str] = []
    done = threading.Event()

    def deleter() -> None:
        while not done.is_set():
            for key in keys:
                if store.check([key]):
                    store.delete_key(key)
                    deleted.append(key)
            time.sleep(0.001)

    stranger = threading.Thread(target=deleter, daemon=True)
    try:
        parties, go = held_run(tmp_path, roster, 5, port)
        stranger.start()
        deadline = time.monotonic() + 120
        while not {keys[1], keys[2]} <= set(deleted):
            assert time.monotonic() < deadline, "parties 1 and 2 never published"
            time.sleep(0.01)
        go.touch()
        opened = time.monotonic()
        ended = ends(parties)
        print("ended after go:", [round(t - opened, 1) for t in ended])
    finally:
        done.set()
        stranger.join(10)
        server.kill()
    for party in parties:
        err = party.stderr.read().strip()
        assert party.returncode == 2, err[-3000:]
        message = err[err.index("slate: error:") :]
        assert "someone may be deleting records in the rendezvous store" in message, message
        assert "slate/pg0/0//cpu//0/" in message and "firewall" not in message, message
        assert "exited" not in message and "\n" not in message, message
        print(message)


def checkpoint_reached(site: Path, iteration: int) -> bool:
    """Whether ``site``'s party wrote a checkpoint of ``iteration`` or later."""
    found = [int(p.stem.rsplit("-", 1)[1]) for p in (site / "run").glob("checkpoint-rank*-*.pt")]
    return bool(found) and max(found) >= iteration


def wait_until(condition, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@real_sites
@pytest.mark.processes
def test_an_earlier_runs_records_replayed_into_a_new_run_are_refused(tmp_path):
    """Run 1 (two sites, a roster) keeps its store here, as someone who read a store would.
    Run 2, with the same roster at a new 'slate rendezvous': before it starts, a stranger
    writes run 1's store nonce (the rendezvous puts its own back), session records,
    ``slate/generation``, final members and leave records into its store, and writes the end
    records again mid-run. Before: the sites stopped at start ('a run is already in progress')
    and the rendezvous ended at once on run 1's signed end."""
    roster = make_site_roster(tmp_path / "keys", 2)
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        write_sites(root, parties=2, rows=200)
        for r in range(2):
            key = root / f"site{r}" / f"site{r}.key"
            key.write_bytes((tmp_path / "keys" / f"site{r}" / f"site{r}.key").read_bytes())
            key.chmod(0o600)
    flags = ["--nodes", "2", "--external-store", "--on-party-loss", "continue", *SITE_FLAGS]
    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, 1, True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))  # fmt: skip
    session.publish_store_nonce(host)
    # what 'slate rendezvous' writes as it starts: the sites compare it with their roster at
    # once, instead of waiting ROSTER_KEY_WAIT_S (10 s) for it before they go on without it
    host.set(RENDEZVOUS_ROSTER_KEY, Roster.read(roster).digest)
    parties = [start_party(first, r, port, *flags, "--iterations", "20",
                           *identity_flags(roster, r)) for r in range(2)]  # fmt: skip
    for party in parties:
        _, err = party.communicate(timeout=240)
        assert party.returncode == 0, err[-3000:]
    ends = [FINAL_MEMBERS_KEY, f"{LEFT_KEY}/0", f"{LEFT_KEY}/1"]
    kept = {key: host.get(key) for key in [
        session.STORE_NONCE_KEY, session.GENERATION_KEY, *ends,
        *(k(r) for r in range(2) for k in (session.nonce_key, session.agreed_key))]}  # fmt: skip

    port = free_port()
    server = serve(port, "--roster", str(roster))
    said = lines_of(server.stdout)
    expect(said, "serving one run")
    store = client(port)
    store.set(session.STORE_NONCE_KEY, kept[session.STORE_NONCE_KEY])
    expect(said, "store nonce")  # replaced: the rendezvous wrote its own again
    for key, value in kept.items():
        if key != session.STORE_NONCE_KEY:
            store.set(key, value)
    # 120 iterations with a checkpoint every 40: the end of run 1 is written again at the first
    # and the rendezvous checked at the second, 40 iterations (many of its reads) later.
    parties = [start_party(second, r, port, *flags, "--iterations", "120", "--checkpoint-every",
                           "40", *identity_flags(roster, r)) for r in range(2)]  # fmt: skip
    expect(said, "another session")  # run 1's end, refused once the session is known
    wait_until(lambda: checkpoint_reached(second / "site0", 40), "a checkpoint")
    for key in ends:  # the end of run 1 again, mid-run
        store.set(key, kept[key])
    wait_until(lambda: checkpoint_reached(second / "site0", 80), "a later checkpoint")
    assert server.poll() is None  # still serving the run
    for rank, party in enumerate(parties):
        _, err = party.communicate(timeout=240)
        assert party.returncode == 0, err[-3000:]
        assert "another session" in err, err[-3000:]  # run 1's slate/generation, refused
        summary = json.loads((second / f"site{rank}" / "run" / "summary.json").read_text())
        assert summary["iterations"] == 120 and summary["party_events"] == []
    assert server.wait(timeout=60) == 0
    assert "every party has left" in expect(said, "slate rendezvous: every party")
