"""The agreement on lost and returning parties, on a real TCPStore with one thread per party."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import torch.distributed as dist

from slate.engines.distributed.control.failures import ExchangeFailed, FailureGuard, Waiter
from slate.engines.distributed.control.liveness import FINAL_MEMBERS_KEY, PREFIX, Heartbeat
from slate.engines.distributed.control.lookout import LOOK_SECONDS, Lookout, Sighting
from slate.engines.distributed.control.membership import Change, Membership, PartyLost
from slate.engines.distributed.control.store_records import Records


@pytest.fixture
def store_address():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    master = dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=30),
                           wait_for_workers=False)  # fmt: skip
    yield port
    del master


@pytest.fixture
def heartbeat(store_address):
    """Start heartbeats at the test's store; each is stopped before the store goes away (a
    heartbeat left reconnecting to a dead store can abort the interpreter at exit)."""
    started: list[Heartbeat] = []

    def start(rank: int) -> Heartbeat:
        started.append(Heartbeat(lambda: client(store_address), rank, Records(None, 8)))
        return started[-1]

    yield start
    for beat in started:
        beat.stop()


def client(port: int):
    return dist.TCPStore("127.0.0.1", port, is_master=False,
                         timeout=datetime.timedelta(seconds=30))  # fmt: skip


def records(port: int, nodes: int = 8) -> Records:
    return Records(client(port), nodes)


def in_threads(*calls):
    """Run each call in its own thread; return their results (or the exception each raised)."""
    results: list = [None] * len(calls)

    def run(k, call):
        try:
            results[k] = call()
        except Exception as err:  # the test looks at it
            results[k] = err

    threads = [threading.Thread(target=run, args=(k, c)) for k, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_change_round_trips_through_text():
    change = Change(3, (0, 2, 5), lost=(1, 4), position=17, reasons={1: "gone", 4: "silent"})
    assert Change.from_text(change.to_text(), 6) == change
    assert change.iteration == 8


def test_survivors_agree_on_a_silent_party_and_on_the_smallest_position(store_address):
    """Party 2 registers a heartbeat, then falls silent without checking in (a frozen machine);
    parties 0 and 1 check in at different positions and must adopt one identical change."""
    port = store_address
    members = [Membership(records(port), rank, [0, 1, 2], timeout_s=4.0) for rank in range(3)]
    silent = client(port)
    silent.add(f"{PREFIX}beat/2", 1)
    silent.set(f"{PREFIX}process/2", "elsewhere:1")  # on another host: only the heartbeat tells
    beats = [Heartbeat(lambda: client(port), rank, Records(None, 8)) for rank in (0, 1)]
    started = time.monotonic()
    first, second = in_threads(lambda: members[0].agree_on_loss(41),
                               lambda: members[1].agree_on_loss(40))  # fmt: skip
    for beat in beats:
        beat.stop()
    assert first == second
    assert first.members == (0, 1) and first.lost == (2,) and first.position == 40
    assert "no heartbeat" in first.reasons[2]
    assert time.monotonic() - started < 4.0 + 2  # silence = timeout / 2 = 2 s, plus polling
    assert members[0].generation == members[1].generation == 1


def test_a_dead_local_process_is_seen_at_once(store_address):
    port = store_address
    a, b = (Membership(records(port), rank, [0, 1], timeout_s=30.0) for rank in (0, 1))
    b.store.set(f"{PREFIX}process/1", f"{socket.gethostname()}:{2**22 + 12345}")  # no such pid
    started = time.monotonic()
    change = a.agree_on_loss(10)
    assert time.monotonic() - started < 2
    assert change.lost == (1,) and "exited" in change.reasons[1]


def test_a_party_that_checks_in_too_late_learns_it_was_counted_as_lost(store_address, heartbeat):
    port = store_address
    a, b = (Membership(records(port), rank, [0, 1], timeout_s=2.0) for rank in (0, 1))
    heartbeat(1)  # alive, never checks in in time
    change = a.agree_on_loss(5)
    assert change.lost == (1,) and "did not answer" in change.reasons[1]
    with pytest.raises(PartyLost, match="counted as lost"):
        b.agree_on_loss(6)


def test_a_failure_where_every_party_is_alive_is_a_network_fault(store_address):
    port = store_address
    parties = [Membership(records(port), rank, [0, 1], timeout_s=10.0) for rank in (0, 1)]
    results = in_threads(lambda: parties[0].agree_on_loss(3), lambda: parties[1].agree_on_loss(3))
    for result in results:
        assert isinstance(result, PartyLost) and "network fault" in str(result)


def test_members_admit_a_returning_party_at_one_boundary(store_address, heartbeat):
    port = store_address
    members = [Membership(records(port), rank, [0, 2], timeout_s=10.0) for rank in (0, 2)]
    returning = Membership(records(port), 1, [0, 1, 2], timeout_s=10.0)
    heartbeat(1)
    assert members[0].agree_on_joins(100) is None  # nobody asked yet: no change
    assert members[1].agree_on_joins(100) is None

    def ask() -> None:
        returning.admitted = returning.request_join()

    asked = threading.Thread(target=ask)
    asked.start()
    deadline = time.monotonic() + 10
    while not members[0].store.check([f"{PREFIX}join_request/1"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    changes = [m.agree_on_joins(200) for m in members]
    asked.join(timeout=10)
    assert changes[0] == changes[1] == returning.admitted
    assert changes[0].members == (0, 1, 2) and changes[0].joined == (1,)
    assert changes[0].position == 401  # after iteration 200's checkpoint
    assert changes[0].reasons == {1: "restarted with --resume"}  # for party_events
    assert returning.generation == members[0].generation


def test_a_party_cannot_rejoin_a_finished_run(store_address):
    port = store_address
    store = client(port)
    store.set(FINAL_MEMBERS_KEY, "[0, 2, 3]")  # the ranks that finished
    with pytest.raises(PartyLost, match="already finished"):
        Membership(Records(store, 8), 1, [0, 1, 2], timeout_s=5.0).request_join()


def until_moved(read: Callable[[], int], least: int, within_s: float = 10.0) -> int:
    """``read()`` polled until it is at least ``least`` (a heartbeat beats every 0.5 s: two
    beats take about a second, more on a loaded machine) or ``within_s`` passed; its last value."""
    deadline = time.monotonic() + within_s
    while (value := read()) < least and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def test_heartbeat_moves_and_stops():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    master = dist.TCPStore("127.0.0.1", port, 1, True, wait_for_workers=False)
    beat = Heartbeat(lambda: client(port), 7, Records(None, 8))
    first = int(master.add(f"{PREFIX}beat/7", 0))
    second = until_moved(lambda: int(master.add(f"{PREFIX}beat/7", 0)), first + 2)
    beat.stop()
    time.sleep(0.7)
    third = int(master.add(f"{PREFIX}beat/7", 0))
    time.sleep(0.7)
    assert second >= first + 2
    assert int(master.add(f"{PREFIX}beat/7", 0)) == third
    assert os.getpid()  # the heartbeat is a thread of this process, not a child


def test_rejoining_a_run_nobody_runs_any_more_is_refused(store_address):
    """A stale store (every party gone, e.g. all restarted against an old 'slate rendezvous')."""
    port = store_address
    store = client(port)
    for rank in (0, 2):
        store.add(f"{PREFIX}beat/{rank}", 5)  # heartbeats that never move again
    started = time.monotonic()
    with pytest.raises(PartyLost, match="fresh 'slate rendezvous'"):
        Membership(Records(store, 8), 1, [0, 1, 2], timeout_s=3.0).request_join()
    assert time.monotonic() - started < 5


def test_a_process_restarted_under_the_same_rank_is_told_apart(store_address):
    """A supervisor may restart a killed party at once; the new process bumps the same
    heartbeat, but it is not the process that was in the run, so the others count it lost
    without waiting out --timeout."""
    a, b = (Membership(records(store_address), r, [0, 1], timeout_s=60) for r in (0, 1))
    a.note_incarnations()
    watched = Heartbeat(lambda: client(store_address), 1, Records(None, 8))
    try:
        # The same rank, a new process: it registers itself as party 1 again.
        b.store.set(f"{PREFIX}process/1", f"{socket.gethostname()}:{os.getpid() + 1}")
        started = time.monotonic()
        (change,) = in_threads(lambda: a.agree_on_loss(position=10))
    finally:
        watched.stop()
    assert not isinstance(change, Exception), change
    assert change.lost == (1,) and "replaced by a new one" in change.reasons[1]
    assert time.monotonic() - started < 5  # not after --timeout 60


def test_a_silent_member_is_named_on_the_heartbeat_timer_not_after_timeout(store_address):
    """A wait ends once the member it waits for is silent for silence_s (here
    min(10, 4 / 2) = 2 s), long before --timeout; the lookout thread, not the wait, finds it."""
    a = Membership(records(store_address), 0, [0, 1], timeout_s=4.0)
    Membership(records(store_address), 1, [0, 1], timeout_s=4.0)  # registers party 1 (alive)
    assert a.silence_s == 2.0
    a.store.add(f"{PREFIX}beat/1", 1)
    lookout = Lookout(lambda: client(store_address), a, records(store_address))
    try:
        started = time.monotonic()
        while lookout.sighting() is None:  # the first look: the counter is new
            assert time.monotonic() - started < 5
            time.sleep(0.02)
        assert lookout.sighting().gone == {} and not lookout.sighting().failed
        a.store.add(f"{PREFIX}beat/1", 1)  # it beats once more, then falls silent
        moved = time.monotonic()
        while 1 not in (lookout.sighting() or Sighting(0, (), ())).gone:
            assert time.monotonic() - started < 10
            time.sleep(0.02)
        elapsed = time.monotonic() - moved
        assert "no heartbeat" in lookout.sighting().gone[1]
        assert 2.0 - LOOK_SECONDS <= elapsed < 2.0 + 3 * LOOK_SECONDS
    finally:
        lookout.stop()


class _NoStore:
    """A store connection that fails the test on any use."""

    def __getattr__(self, name):
        raise AssertionError(f"the training thread called the store ({name})")


def test_a_watched_wait_reads_the_lookouts_sighting_and_never_the_store(store_address):
    """With --on-party-loss continue a wait longer than POLL_SECONDS reads what the lookout saw and
    makes no round trip to the rendezvous on the training thread (asking the store from the wait
    cost 63 calls, 38.7 s over an 80 ms link): with the training thread's store connection unusable,
    a wait still ends, naming the party the lookout saw gone, and the flag another party raised."""
    a = Membership(records(store_address), 0, [0, 1, 2], timeout_s=60.0)
    lookout = Lookout(lambda: client(store_address), a, records(store_address))
    waiter = Waiter(FailureGuard(0), lookout)
    try:
        a.records.store = a.store = _NoStore()  # the training thread's own connection
        waiter._watch([1, 2])  # no sighting yet: the wait goes on
        gone = {2: "its process (pid 1) exited"}
        lookout._sighting = Sighting(0, (0, 1, 2), (), gone=gone)
        waiter._watch([1])  # party 1 is not gone
        with pytest.raises(ExchangeFailed, match="party 2 is gone: its process"):
            waiter._watch([1, 2])
        lookout._sighting = Sighting(1, (0, 1, 2), (), failed=True)  # of another generation
        waiter._watch([1, 2])
        lookout._sighting = Sighting(0, (0, 1, 2), (), failed=True)
        with pytest.raises(ExchangeFailed, match="another party left"):
            waiter._watch([1])
    finally:
        lookout.stop()


def test_a_party_whose_rank_a_newer_process_took_does_not_rejoin(store_address):
    """A frozen party that wakes after a supervisor started a replacement must stop, not come
    back beside it."""
    frozen = Membership(records(store_address), 1, [0, 1], timeout_s=5.0)
    frozen.store.set(f"{PREFIX}process/1", f"{socket.gethostname()}:{os.getpid() + 1}")
    with pytest.raises(PartyLost, match="taken its place"):
        frozen.request_join("came back by itself")
    assert not frozen.store.check([f"{PREFIX}join_request/0"])  # it asked nothing


class _Cuttable:
    """A store connection that fails while ``cut`` is set, as during a network outage."""

    def __init__(self, store, state: dict) -> None:
        self.store, self.state = store, state

    def add(self, key, amount):
        if self.state["cut"]:
            raise RuntimeError("connection timed out")
        return self.store.add(key, amount)


def test_the_heartbeat_reconnects_after_an_outage(store_address):
    state = {"cut": False, "connects": 0}

    def connect():
        if state["cut"]:
            raise RuntimeError("connect timed out")
        state["connects"] += 1
        return _Cuttable(client(store_address), state)

    watcher = client(store_address)
    beat = Heartbeat(connect, 3, Records(None, 8))
    try:
        assert beat.first_beat.wait(10)  # (the thread connects and beats first)
        state["cut"] = True
        time.sleep(1.2)
        during = int(watcher.add(f"{PREFIX}beat/3", 0))
        time.sleep(1.2)
        assert int(watcher.add(f"{PREFIX}beat/3", 0)) == during  # silent while cut off
        state["cut"] = False
        beats = until_moved(lambda: int(watcher.add(f"{PREFIX}beat/3", 0)), during + 2)
        assert beats >= during + 2  # beating again
        assert state["connects"] == 2  # on a new connection
    finally:
        beat.stop()


@pytest.mark.processes
def test_a_second_copy_of_a_running_party_is_refused(store_address):
    """A second copy of site 1 started with --resume is refused at once ("already running"), rather
    than waiting silently (and, once registered, pushing the running process out); the running
    process's registration is untouched."""
    store = client(store_address)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        store.set(f"{PREFIX}process/1", f"{socket.gethostname()}:{child.pid}")
        with pytest.raises(PartyLost, match="already running"):
            Membership(records(store_address), 1, [0, 1], timeout_s=5.0)
        assert store.get(f"{PREFIX}process/1").decode().endswith(f":{child.pid}")  # untouched
    finally:
        child.kill()
        child.wait()
    Membership(records(store_address), 1, [0, 1], timeout_s=5.0)  # its process exited: welcome
