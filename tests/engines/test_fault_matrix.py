"""A representative subset of the fault matrix (docs/reliability.md), on the local launcher.

Each cell kills or freezes one party at one moment (``SLATE_KILL_AT=RANK@ITER:MOMENT[:FAULT]``)
of a 3-party run with ``--on-party-loss continue``, and checks the outcome the table promises:

* killed: the survivors finish and the loss is recorded in ``summary.json``;
* frozen (SIGSTOP) for longer than the heartbeat's silence: the others count it as lost on the
  heartbeat's timer (not after ``--timeout``) and go on; when it wakes, it comes back by itself
  at their next checkpoint boundary, and the run ends with every party;

and in every cell the terminal shows no traceback and no native (C++) line. The whole matrix
runs with ``SLATE_FULL_FAULT_MATRIX=1``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo on Linux")

FLAGS = ["--dataset", "digits", "--nodes", "3", "--topology", "ring", "--iterations", "120",
         "--eval-every", "40", "--checkpoint-every", "40", "--seed", "1", "--no-progress",
         "--timeout", "20"]  # fmt: skip
SUBSET = [
    ("1@0:evaluation", 1, "during the first evaluation, before the first step"),
    ("2@80:checkpoint", 2, "while writing a checkpoint"),
    ("0@55:step", 0, "mid-run, the main party"),
]
FULL = [
    (f"{rank}@{at}:{moment}", rank, f"rank {rank}, {moment} {at}")
    for rank in (0, 1, 2)
    for moment, at in (
        ("evaluation", 0),
        ("step", 1),
        ("step", 55),
        ("evaluation", 80),
        ("checkpoint", 40),
        ("step", 119),
    )
]
FREEZE_FLAGS = ["--dataset", "digits", "--nodes", "3", "--topology", "ring", "--eval-every",
                "1000", "--checkpoint-every", "250", "--seed", "1", "--no-progress"]  # fmt: skip
# (fault, --timeout, --iterations, what): silence_s = min(10, timeout / 2)
FREEZE_SUBSET = [("1@100:step:freeze14", 30, 6000, "mid-run for 14 s: over the 10 s silence")]
FREEZE_FULL = [
    (f"{rank}@{at}:{moment}:freeze{seconds}", timeout, 12000, f"rank {rank}, {moment} {at}")
    for rank in (0, 1, 2)
    for moment, at, seconds, timeout in (
        ("step", 100, 14, 30),  # longer than the heartbeat's silence, shorter than --timeout
        ("step", 100, 20, 12),  # longer than --timeout
        ("evaluation", 1000, 14, 30),
        ("checkpoint", 250, 14, 30),
    )
]
FULL_MATRIX = bool(os.environ.get("SLATE_FULL_FAULT_MATRIX"))
CELLS = FULL if FULL_MATRIX else SUBSET
FREEZES = FREEZE_FULL if FULL_MATRIX else FREEZE_SUBSET
NATIVE = re.compile(r"^\[[WIEF] |^terminate called|c10::|gloo::", re.MULTILINE)


@pytest.mark.parametrize(("kill", "lost", "moment"), CELLS, ids=[c[0] for c in CELLS])
def test_a_party_lost_at_this_moment_leaves_the_others_finishing(tmp_path, kill, lost, moment):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "slate", "train", *FLAGS, "--engine", "distributed",
         "--out", str(out)],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "SLATE_KILL_AT": kill},
    )  # fmt: skip
    assert done.returncode == 0, f"{moment}: {done.stderr}"
    assert "Traceback" not in done.stderr and not NATIVE.search(done.stderr), done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["members"] == [p for p in range(3) if p != lost]
    (event,) = summary["party_events"]
    assert event["rank"] == lost and event["event"] == "lost"
    at = int(kill.split("@")[1].split(":")[0])
    assert event["iteration"] <= at
    assert summary["iterations"] == 120


@pytest.mark.parametrize(("fault", "timeout", "iterations", "moment"), FREEZES,
                         ids=[c[0] for c in FREEZES])  # fmt: skip
def test_a_frozen_party_is_counted_lost_on_time_and_comes_back_by_itself(
    tmp_path, fault, timeout, iterations, moment
):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "slate", "train", *FREEZE_FLAGS, "--timeout", str(timeout),
         "--iterations", str(iterations), "--engine", "distributed", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "SLATE_KILL_AT": fault},
    )  # fmt: skip
    assert done.returncode == 0, f"{moment}: {done.stderr}"
    assert "Traceback" not in done.stderr and not NATIVE.search(done.stderr), done.stderr
    summary = json.loads((out / "summary.json").read_text())
    frozen = int(fault.split("@")[0])
    assert summary["members"] == [0, 1, 2]
    lost, back = summary["party_events"]
    assert (lost["rank"], lost["event"]) == (frozen, "lost")
    silence = min(10.0, timeout / 2)
    assert lost["reason"] == f"no heartbeat for {silence:.1f} s"  # its timer, not --timeout
    assert (back["rank"], back["event"]) == (frozen, "rejoined")
    assert back["reason"] == "came back by itself after being out of reach"
    assert back["iteration"] % 250 == 0 and back["iteration"] > lost["iteration"]
    assert summary["iterations"] == iterations
