"""``--roster`` and ``--key`` on the command line: bad files and mismatched sites get one
paragraph naming the file or the rank and exit 2, before any data is read or any site is
reached. Those refusals run ``slate`` in the test process (nothing is reached, so nothing needs a
process of its own); the sites that meet and name each other are real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    Done,
    free_port,
    identity_flags,
    make_roster,
    run_command,
    serve,
    slate_here,
    start_party,
    write_sites,
)


def train(cwd: Path, *flags: str) -> Done:
    """One site of three at a rendezvous nobody serves; its --train file does not exist, so an
    error about anything but the identity would name the data instead."""
    return slate_here("train", "--nodes", "3", "--rendezvous", f"127.0.0.1:{free_port()}",
                      "--train", "missing.svm", "--dataset", "libsvm", "--timeout", "5", *flags,
                      cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sites")
    return root, make_roster(root, 3)


def one_paragraph(done: Done | subprocess.CompletedProcess, *names: str) -> str:
    err = done.stderr.strip()
    assert done.returncode == 2, err
    assert err.startswith("slate: error:") and "\n" not in err and "Traceback" not in err, err
    for name in names:
        assert name in err, err
    assert "missing.svm" not in err, err
    return err


def test_a_missing_key_file(keys):
    root, roster = keys
    done = train(root / "site0", "--rank", "0", "--roster", str(roster), "--key", "nope.key")
    one_paragraph(done, "nope.key")


def test_a_key_file_others_can_read(keys, tmp_path):
    root, roster = keys
    loose = tmp_path / "loose.key"
    loose.write_bytes((root / "site0" / "site0.key").read_bytes())
    loose.chmod(0o644)
    done = train(root / "site0", "--rank", "0", "--roster", str(roster), "--key", str(loose))
    one_paragraph(done, str(loose), "chmod 600")


def test_a_key_that_is_not_on_the_roster(keys, tmp_path):
    root, roster = keys
    assert slate_here("keygen", "--out", tmp_path / "other").returncode == 0
    done = train(root, "--rank", "0", "--roster", str(roster), "--key", str(tmp_path / "other.key"))
    one_paragraph(done, "other.key", str(roster))


def test_a_key_of_another_rank(keys):
    root, roster = keys
    done = train(root / "site0", "--rank", "1", *identity_flags(roster, 0))
    one_paragraph(done, "Rank 1", "rank 0")


def test_a_roster_with_one_key_twice(keys, tmp_path):
    root, roster = keys
    raw = json.loads(roster.read_text())
    raw["sites"][2]["public_key"] = raw["sites"][0]["public_key"]
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(raw))
    done = train(root / "site0", "--rank", "0", "--roster", str(twice), "--key", "site0.key")
    one_paragraph(done, str(twice), "rank")


def test_a_roster_with_one_rank_twice(keys, tmp_path):
    root, roster = keys
    raw = json.loads(roster.read_text())
    raw["sites"][2]["rank"] = 1
    twice = tmp_path / "rank-twice.json"
    twice.write_text(json.dumps(raw))
    done = train(root / "site0", "--rank", "0", "--roster", str(twice), "--key", "site0.key")
    one_paragraph(done, str(twice), "1")


def test_a_roster_for_another_number_of_sites(keys):
    root, roster = keys
    done = train(root / "site0", "--rank", "0", *identity_flags(roster, 0), "--nodes", "4")
    one_paragraph(done, "4", "3 sites")


def test_one_flag_without_the_other(keys):
    root, roster = keys
    one_paragraph(train(root / "site0", "--rank", "0", "--key", "site0.key"), "--roster")
    one_paragraph(train(root / "site0", "--rank", "0", "--roster", str(roster)), "--key")


def test_the_local_launcher_takes_no_roster(keys):
    root, roster = keys
    done = slate_here("train", "--dataset", "digits", "--engine", "distributed", "--nodes", "3",
                      *identity_flags(roster, 0), cwd=root / "site0")  # fmt: skip
    assert done.returncode == 2 and "--rank" in done.stderr, done.stderr


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
def test_sites_with_different_rosters_are_named(tmp_path):
    """Two sites whose rosters list the same keys under different run ids: neither can verify
    the other, and each names the other and its roster within --timeout. (Party 0 hosts the
    store: a 'slate rendezvous' would refuse one of them at once, as the next test shows.)"""
    write_sites(tmp_path, parties=2, rows=100)
    first = make_roster(tmp_path, 2, run_id="run-a")
    second = tmp_path / "roster-run-b.json"
    raw = json.loads(first.read_text())
    second.write_text(json.dumps({**raw, "run_id": "run-b"}))
    port = free_port()
    flags = ["--nodes", "2", *SITE_FLAGS]
    started = time.monotonic()
    # Party 1 gives up first: party 0 hosts the store, and once it has left, the store has too.
    parties = [
        start_party(tmp_path, 0, port, *flags, "--timeout", "10", *identity_flags(first, 0)),
        start_party(tmp_path, 1, port, *flags, "--timeout", "5", *identity_flags(second, 1)),
    ]
    outputs = [p.communicate(timeout=90) for p in parties]
    assert time.monotonic() - started < 60
    for rank, (process, (_, err)) in enumerate(zip(parties, outputs, strict=True)):
        other = 1 - rank
        assert process.returncode == 2, err
        assert f"party {other} holds another roster" in err, err
        assert "Traceback" not in err
    assert "roster-run-a.json" in outputs[0][1] and "roster-run-b.json" in outputs[1][1]


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
@pytest.mark.parametrize("rendezvous_has_roster", [False, True], ids=["plain-rdv", "roster-rdv"])
def test_a_site_and_its_rendezvous_must_share_the_roster(tmp_path, rendezvous_has_roster):
    """A rendezvous without the roster could not see a roster run end (it would exit after
    --idle-timeout mid-run); a site without it at a roster rendezvous would be ignored."""
    write_sites(tmp_path, parties=2, rows=100)
    roster = make_roster(tmp_path, 2)
    port = free_port()
    server = serve(port, *(["--roster", str(roster)] if rendezvous_has_roster else []))
    flags = ["--nodes", "2", "--external-store", *SITE_FLAGS]
    try:
        wait = time.monotonic() + 60
        while server.poll() is None and time.monotonic() < wait:
            done = run_command(
                [sys.executable, "-m", "slate", "train", "--rank", "0", "--rendezvous",
                 f"127.0.0.1:{port}", *flags,
                 *([] if rendezvous_has_roster else identity_flags(roster, 0))],
                cwd=tmp_path / "site0", timeout=60,
            )  # fmt: skip
            if "could not reach" not in done.stderr:  # (the rendezvous had not started yet)
                break
    finally:
        server.kill()
    err = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in err and "Traceback" not in err, err
    expected = "serves a run with a roster" if rendezvous_has_roster else "without --roster"
    assert expected in err, err


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
def test_a_site_without_the_roster_is_named_by_both_sides(tmp_path):
    """Party 0 hosts the store (no 'slate rendezvous'), with the roster; party 1 has none. Party
    1 must not read party 0's signed address as an address (gloo once aborted on it)."""
    write_sites(tmp_path, parties=2, rows=100)
    roster = make_roster(tmp_path, 2)
    port = free_port()
    flags = ["--nodes", "2", *SITE_FLAGS, "--timeout", "5"]
    parties = [start_party(tmp_path, 0, port, *flags, *identity_flags(roster, 0))]
    parties.append(start_party(tmp_path, 1, port, *flags))
    outputs = [p.communicate(timeout=90) for p in parties]
    for process, (_, err) in zip(parties, outputs, strict=True):
        assert process.returncode == 2 and "Traceback" not in err, err
    assert "party 1 runs without --roster" in outputs[0][1], outputs[0][1]
    assert "party 0 holds another roster" in outputs[1][1], outputs[1][1]


def test_roster_show_prints_the_digest_every_site_compares(keys):
    from slate.security import Roster

    _, roster = keys
    done = slate_here("roster", "--show", roster)
    assert done.returncode == 0 and f"sha256: {Roster.read(roster).digest}" in done.stdout
