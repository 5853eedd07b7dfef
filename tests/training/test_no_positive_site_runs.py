"""Runs where one site holds no positive training row: it joins (a note says so), mixes, its
test rows are scored, and every algorithm finishes; on the simulator (``{rank}`` files, in
this process) and on the distributed engine (four roster sites, one process each)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    finish,
    free_port,
    identity_flags,
    make_roster,
    slate_here,
    start_party,
    write_sites,
)

pytestmark = pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")

PARTIES, EMPTY = 4, 2  # EMPTY: the site without positive training rows
RUN = ["--iterations", "8", "--eval-every", "4", "--topology", "ring", "--positives", "2",
       "--batch-size", "16", "--lr", "0.05"]  # fmt: skip
NOTE = f"note: party {EMPTY} holds no positive training row and joins the run"


def drop_positives(path: Path) -> None:
    """Remove the positive lines (``+1``) of a LIBSVM file."""
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if line.split()[0] != "+1"))


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    """Four sites' w7a files; site 2's training file has no positive, its test file does."""
    root = tmp_path_factory.mktemp("sites")
    write_sites(root, parties=PARTIES, rows=150)
    drop_positives(root / f"site{EMPTY}" / "train.svm")
    return root


def simulate(root: Path, out: str, *flags: str) -> dict:
    files = ["--train", str(root / "site{rank}" / "train.svm"), "--test",
             str(root / "site{rank}" / "test.svm")]  # fmt: skip
    done = slate_here("train", *files, *SITE_FLAGS[6:], "--out", str(root / out), "--nodes",
                      str(PARTIES), *RUN, *flags)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert NOTE in done.stdout + done.stderr
    summary = json.loads((root / out / "summary.json").read_text())
    assert summary["state"] == "done" and math.isfinite(summary["test_ap"])
    assert math.isfinite(summary["consensus_distance"])
    return summary


@pytest.mark.parametrize("algorithm", ["slate", "slate-m", "dpsgd", "coda"])
def test_every_algorithm_finishes_with_a_site_without_positives(sites, algorithm):
    summary = simulate(sites, f"run-{algorithm}", "--algorithm", algorithm)
    assert set(summary["party_test_ap"]) == {str(r) for r in range(PARTIES)}


@pytest.mark.parametrize("algorithm", ["slate", "dpsgd"])
def test_under_dp_the_ap_site_without_positives_releases_nothing(sites, algorithm):
    summary = simulate(sites, f"dp-{algorithm}", "--algorithm", algorithm, "--dp-epsilon", "8")
    party = next(p for p in summary["privacy"]["parties"] if p["party"] == EMPTY)
    assert party["positives"] == 0 and party["q_positives"] == 0.0
    assert party["epsilon_positives"] == 0.0  # no positive row: nothing to release of one
    if algorithm == "slate":  # no AP term: nothing sampled, nothing released
        assert party["q_negatives"] == 0.0 and party["epsilon_negatives"] == 0.0
    else:  # cross-entropy trains on its negatives, each release accounted
        assert party["q_negatives"] > 0 and party["epsilon_negatives"] > 0


def test_a_site_without_positive_test_rows_has_no_own_ap(tmp_path):
    write_sites(tmp_path, parties=PARTIES, rows=150)
    for name in ("train.svm", "test.svm"):
        drop_positives(tmp_path / f"site{EMPTY}" / name)
    summary = simulate(tmp_path, "run", "--algorithm", "slate")
    assert summary["party_test_ap"][str(EMPTY)] is None, summary["party_test_ap"]


@pytest.mark.processes
def test_four_roster_sites_finish_when_site_2_has_no_positives(sites):
    roster = make_roster(sites, PARTIES)
    port = free_port()
    flags = ["--nodes", str(PARTIES), *SITE_FLAGS, *RUN, "--algorithm", "slate"]
    parties = [
        start_party(sites, r, port, *flags, *identity_flags(roster, r)) for r in range(PARTIES)
    ]
    done = finish(parties, timeout=120)
    assert [code for code, _ in done] == [0] * PARTIES, done
    assert NOTE in done[0][1]  # the main site says the shared notes
    summary = json.loads((sites / f"site{EMPTY}" / "run" / "summary.json").read_text())
    assert summary["state"] == "done" and math.isfinite(summary["test_ap"])
