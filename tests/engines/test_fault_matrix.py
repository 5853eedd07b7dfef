"""A representative subset of the fault matrix (docs/reliability.md), on the local launcher.

Each cell kills one party at one moment (``SLATE_KILL_AT=RANK@ITER:MOMENT``) of a 3-party run
with ``--on-party-loss continue``, and checks the outcome the table promises: the survivors
finish, the loss is recorded in ``summary.json``, and the terminal shows no traceback and no
native (C++) line. The whole matrix runs with ``SLATE_FULL_FAULT_MATRIX=1``.
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
CELLS = FULL if os.environ.get("SLATE_FULL_FAULT_MATRIX") else SUBSET
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
