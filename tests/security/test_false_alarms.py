"""No warning about strangers in a clean roster run (it once came in every roster run), and the
real warning still for a stranger's record.

The cause: torch's libuv ``TCPStore`` (the default since torch 2.4) wakes every client waiting
for a key whenever anyone calls ``compare_set`` on that key, even when the key is absent, and then
answers the missing key with an empty value. :func:`store_reads.read` is a ``compare_set``, so a
site (or ``slate rendezvous``) that read a session nonce record not yet written woke the other
sites' waits for it: they read an empty "record" and warned that someone other than the sites was
writing to the rendezvous, sometimes naming a site that had not started yet. Waits now check an
empty value and wait again while the key is missing.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from slate.engines.distributed.control import session
from slate.engines.distributed.control.store_reads import (
    multi_get_within,
    read,
    read_within,
)
from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    finish,
    free_port,
    identity_flags,
    make_roster,
    serve,
    start_party,
    write_sites,
)

STRANGER_LINES = ("ignored a record", "Someone other than the sites")


@pytest.fixture
def clients() -> Iterator[tuple[dist.TCPStore, dist.TCPStore]]:
    """Two clients of a fresh libuv store (as ``slate rendezvous`` hosts it)."""
    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, 1, True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=30))  # fmt: skip
    timeout = datetime.timedelta(seconds=30)
    a = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    b = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    yield a, b
    del a, b, host


def later(seconds: float, action) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()))
    thread.start()
    return thread


def test_a_read_of_a_missing_record_does_not_end_another_clients_wait(clients):
    """What the sites do: one waits for every nonce record, another reads a missing one (a
    ``compare_set``) meanwhile; the first still finds the record missing, not empty."""
    a, b = clients
    a.set("here", "x")
    reader = later(0.2, lambda: read(b, "absent"))
    started = time.monotonic()
    assert multi_get_within(a, ["here", "absent"], 1.5) is None
    assert time.monotonic() - started >= 1.4  # it waited its whole time
    reader.join()
    # ... and finds the record once it is written, after a read woke it early
    reader = later(0.2, lambda: read(b, "late"))
    writer = later(0.6, lambda: b.set("late", "y"))
    assert multi_get_within(a, ["here", "late"], 10) == [b"x", b"y"]
    reader.join()
    writer.join()


def test_a_waited_nonce_read_early_is_still_waited_for(clients):
    a, b = clients
    reader = later(0.2, lambda: read(b, session.STORE_NONCE_KEY))
    writer = later(0.6, lambda: session.publish_store_nonce(b))
    assert session.is_nonce(session.read_store_nonce(a, 10))
    reader.join()
    writer.join()
    assert read_within(a, "never", 0.3) is None


def test_an_empty_record_that_is_there_is_read_as_it_is(clients):
    """A stranger's empty record is returned (and refused as unsigned by its reader), not waited
    past: the real warning stays."""
    a, b = clients
    a.set("here", "x")
    b.set("blank", "")
    assert multi_get_within(a, ["here", "blank"], 5) == [b"x", b""]
    assert read_within(a, "blank", 5) == ""


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")
def test_a_clean_roster_run_of_four_sites_prints_no_warning_about_strangers(tmp_path):
    """Four sites under a roster on a ``slate rendezvous``, nobody else: no site and not the
    rendezvous says it ignored a record (before the fix at least one site did in 3 runs of 3)."""
    write_sites(tmp_path, parties=4, rows=200)
    roster = make_roster(tmp_path, 4)
    port = free_port()
    server = serve(port, "--roster", str(roster))
    flags = ["--nodes", "4", "--external-store", "--iterations", "20", *SITE_FLAGS]
    try:
        parties = [
            start_party(tmp_path, r, port, *flags, *identity_flags(roster, r)) for r in range(4)
        ]
        done = finish(parties)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    for rank, (code, text) in enumerate(done):
        assert code == 0, f"site {rank}: {text[-3000:]}"
        for line in STRANGER_LINES:
            assert line not in text, f"site {rank}: {text[-3000:]}"
    assert server.returncode == 0, out + err
    assert not any(line in out + err for line in STRANGER_LINES), out + err
