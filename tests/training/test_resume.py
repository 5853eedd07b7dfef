"""Crash safety: a run killed (SIGKILL) or interrupted (SIGINT) and resumed ends bit-identical.

Guaranteed, not bounded: the resumed run repeats the same operations on the same shapes with the
same kernels (one machine), from the checkpointed state and random streams.

Every interrupted run is a real ``python -m slate train`` process (signals are sent to it). The
reference is the same command run without interruption; parameters (``model.pt``), history (all
but wall times) and test AP must be exactly equal. Simulator runs that are not interrupted (the
references, the resumes) and the refusals run ``slate`` in the test process.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.sites import run_command, slate_here, start

# Long enough that the kill (at most 0.1 s after the first checkpoint, at 25) comes before the
# end on a fast machine too (0.6 ms an iteration: about iteration 200; here, about 4 ms an
# iteration, it still falls anywhere in the first checkpoint interval or the next).
ITERATIONS = 300
DELAY_S = 0.1
FLAGS = [
    "--dataset", "digits", "--nodes", "4", "--iterations", str(ITERATIONS),
    "--eval-every", "100", "--checkpoint-every", "25", "--seed", "1", "--no-progress", "--no-plots",
]  # fmt: skip
ALGORITHMS = {
    "slate": ["--algorithm", "slate", "--gradient-tracking"],
    "slate-m": ["--algorithm", "slate-m"],
    "dpsgd": ["--algorithm", "dpsgd"],
    "coda": ["--algorithm", "coda", "--lr-dual", "0.01"],
    # Parties dropped before and after the checkpoints: the party set is restored on resume.
    "slate-drops": [
        "--algorithm",
        "slate",
        "--gradient-tracking",
        "--drop-party",
        "1@100",
        "--drop-party",
        "3@250",
    ],
    # Local steps, a time-varying graph and compressed gossip: CHOCO's public copies and the
    # round counter are part of the checkpoint.
    "slate-choco": [
        "--algorithm",
        "slate",
        "--topology",
        "base-2",
        "--gossip-every",
        "3",
        "--compress",
        "topk:0.1",
    ],
}


def slate(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", "slate", *args], timeout=300, **kwargs)


def history_without_times(folder: Path) -> list[dict[str, str]]:
    with open(folder / "history.csv") as handle:
        return [{k: v for k, v in row.items() if k != "elapsed_seconds"}
                for row in csv.DictReader(handle)]  # fmt: skip


def assert_identical(ours: Path, reference: Path) -> None:
    a = torch.load(ours / "model.pt", weights_only=True)
    b = torch.load(reference / "model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert history_without_times(ours) == history_without_times(reference)
    summary_a = json.loads((ours / "summary.json").read_text())
    summary_b = json.loads((reference / "summary.json").read_text())
    for key in ("test_ap", "test_auroc", "party_ap_min", "party_ap_max", "consensus_distance",
                "comm_bytes_per_party", "messages_per_party", "rounds", "iterations"):  # fmt: skip
        assert summary_a[key] == summary_b[key], key


def interrupt_after_first_checkpoint(
    command: list[str], marker, sig: int, seed: int
) -> tuple[int, str]:
    """Start ``command``, wait for its first checkpoint, wait a random moment, send ``sig``;
    its exit code and standard error."""
    process = start(command, start_new_session=True)
    deadline = time.monotonic() + 120
    while not marker() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    time.sleep(random.Random(seed).uniform(0.0, DELAY_S))
    os.killpg(process.pid, sig)  # the launcher and its workers, like a crash or a Ctrl-C
    _, stderr = process.communicate(timeout=120)
    return process.returncode, stderr


def _unfinished(out: Path, sig: signal.Signals) -> bool:
    """The folder's summary is the short one of a run that goes (``"running"``: killed) or that
    stopped (``"stopped"``: SIGINT), never a finished run's."""
    state = json.loads((out / "summary.json").read_text())["state"]
    return state == ("running" if sig == signal.SIGKILL else "stopped")


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted runs of each algorithm (simulator), in this process."""
    root = tmp_path_factory.mktemp("reference")
    for name, flags in ALGORITHMS.items():
        done = slate_here("train", *FLAGS, *flags, "--out", str(root / name))
        assert done.returncode == 0, done.stderr
    return root


#: Every algorithm's state is checkpointed (SIGKILL: the last checkpoint on disk); a Ctrl-C's
#: own path (the checkpoint it writes as it stops) once with plain and once with compressed
#: gossip.
CASES = [(name, signal.SIGKILL) for name in ALGORITHMS] + [
    (name, signal.SIGINT) for name in ("slate", "slate-choco")
]


@pytest.mark.processes
@pytest.mark.parametrize(("name", "sig"), CASES, ids=[f"{n}-{s.name.lower()}" for n, s in CASES])
def test_simulator_resume_is_bit_identical(references, tmp_path, name, sig):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "slate", "train", *FLAGS, *ALGORITHMS[name], "--out", str(out)]
    code, stderr = interrupt_after_first_checkpoint(
        command, lambda: (out / "checkpoint.pt").exists(), sig, seed=hash(name) % 1000
    )
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 130)
    if sig == signal.SIGINT:  # Ctrl-C says how to go on, without a traceback
        assert f"slate train --resume {out}" in stderr and "Traceback" not in stderr, stderr
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert 0 < saved["iteration"] < ITERATIONS
    assert _unfinished(out, sig)
    done = slate_here("train", "--resume", str(out), "--no-progress", "--no-plots")
    assert done.returncode == 0, done.stderr
    assert f"resumed from iteration {saved['iteration']}" in done.stdout
    assert_identical(out, references / name)


DISTRIBUTED = [*FLAGS[:3], "2", *FLAGS[4:], "--algorithm", "slate", "--engine", "distributed"]


@pytest.fixture(scope="module")
def distributed_reference(tmp_path_factory) -> Path:
    """The uninterrupted distributed run (a launcher and two workers)."""
    reference = tmp_path_factory.mktemp("distributed") / "reference"
    done = slate("train", *DISTRIBUTED, "--out", str(reference))
    assert done.returncode == 0, done.stderr
    return reference


@pytest.mark.processes
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "sigint"])
def test_distributed_resume_is_bit_identical(distributed_reference, tmp_path, sig):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "slate", "train", *DISTRIBUTED, "--out", str(out)]
    code, _ = interrupt_after_first_checkpoint(
        command, lambda: len(list(out.glob("checkpoint-rank1-*.pt"))) > 0, sig, seed=7
    )
    assert code != 0
    assert _unfinished(out, sig)
    done = slate(
        "train", "--resume", str(out), "--engine", "distributed", "--no-progress", "--no-plots"
    )
    assert done.returncode == 0, done.stderr
    assert_identical(out, distributed_reference)


@pytest.mark.processes
def test_resume_refuses_a_changed_config(tmp_path):
    out = tmp_path / "run"
    code, _ = interrupt_after_first_checkpoint(
        [sys.executable, "-m", "slate", "train", *FLAGS, "--out", str(out)],
        lambda: (out / "checkpoint.pt").exists(), signal.SIGKILL, seed=3,
    )  # fmt: skip
    assert code == -signal.SIGKILL
    done = slate_here("train", "--resume", str(out), "--lr", "0.5", "--nodes", "3")
    assert done.returncode == 2
    assert "lr" in done.stderr and "nodes" in done.stderr and "Traceback" not in done.stderr
    longer = slate_here("train", "--resume", str(out), "--iterations", str(ITERATIONS + 100),
                        "--no-progress", "--no-plots")  # fmt: skip
    assert longer.returncode == 0, longer.stderr
    assert json.loads((out / "summary.json").read_text())["iterations"] == ITERATIONS + 100


@pytest.mark.parametrize("content", [b"", b"garbage", b"PK\x03\x04broken zip"])
def test_resume_from_a_damaged_checkpoint_is_a_clear_error(tmp_path, content):
    (tmp_path / "checkpoint.pt").write_bytes(content)
    done = slate_here("train", "--resume", str(tmp_path))
    assert done.returncode == 2
    assert "not a readable slate checkpoint" in done.stderr and "Traceback" not in done.stderr


def test_resume_without_a_checkpoint_says_so(tmp_path):
    done = slate_here("train", "--resume", str(tmp_path / "nothing"))
    assert done.returncode == 2 and "no checkpoint" in done.stderr
    # It names both kinds of checkpoint a run folder can hold.
    assert "checkpoint.pt" in done.stderr and "checkpoint-rank<r>-<iteration>.pt" in done.stderr


def test_every_torch_load_is_weights_only():
    src = Path(__file__).resolve().parents[2] / "src"
    calls = [
        (path, line)
        for path in src.rglob("*.py")
        for line in path.read_text().splitlines()
        if "torch.load(" in line
    ]
    assert calls, "expected slate to load checkpoints with torch.load"
    for path, line in calls:
        assert "weights_only=True" in line, f"{path}: {line.strip()}"
    assert not any("pickle" in p.read_text() and "import pickle" in p.read_text()
                   for p in src.rglob("*.py"))  # fmt: skip


@pytest.mark.parametrize("hidden", [True, False], ids=["no-progress", "bar"])
def test_resume_keeps_the_progress_choice(tmp_path, hidden):
    """A run started with --no-progress resumes without a bar (and one with a bar,
    with one), although --no-progress is no part of the run's config."""
    out = tmp_path / "run"
    flags = ["--dataset", "digits", "--nodes", "2", "--iterations", "200", "--eval-every", "100",
             "--checkpoint-every", "100", "--no-plots", "--out", str(out)]  # fmt: skip
    first = slate_here("train", *flags, *(["--no-progress"] if hidden else []))
    assert first.returncode == 0, first.stderr
    resumed = slate_here("train", "--resume", str(out), "--iterations", "300", "--no-plots")
    assert resumed.returncode == 0, resumed.stderr
    assert ("%|" in resumed.stderr) is not hidden, resumed.stderr
