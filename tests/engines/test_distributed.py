"""The distributed engine (one process per party, gloo) against the simulator, and its faults.

Every run here is a real launch: ``python -m slate train --engine distributed`` starts one
worker process per party on the loopback interface.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from slate.config import TrainConfig
from slate.training.loop import train
from tests.sites import descendants, run_command, start

COMMON = ["--dataset", "digits", "--nodes", "4", "--topology", "ring", "--iterations", "50",
          "--eval-every", "25", "--seed", "3", "--no-progress", "--no-plots"]  # fmt: skip
CASES = {
    "slate-gt": ["--algorithm", "slate", "--gradient-tracking"],
    "slate-m": ["--algorithm", "slate-m", "--alpha", "0.5"],
    "dpsgd": ["--algorithm", "dpsgd"],
    # Compressed gossip with local steps, four rounds a chunk: each round's receives are posted
    # rounds ahead (transport.DistributedCommunicator._post_rounds_ahead).
    "slate-int8-local": ["--algorithm", "slate", "--topology", "base-2", "--gossip-every", "5",
                         "--compress", "int8", "--checkpoint-every", "25"],
}  # fmt: skip
#: The case whose launch shows the progress bar, in a session of its own (its launcher starts its
#: own fork server and resource tracker, as at a user's prompt: ``tests/forked.py``): a clean
#: run's standard error holds the bar alone (no resource-tracker warning of a leaked semaphore at
#: its end, as there was).
SHOWS_PROGRESS = "dpsgd"
PROGRESS_BAR = re.compile(r"\s*\d+%\|.*\| \d+/\d+ \[.*\]\s*")


def slate_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "slate", *args]


def config_for(case: str) -> TrainConfig:
    flags = dict(zip(CASES[case][::2], CASES[case][1::2], strict=False))
    return TrainConfig(
        dataset="digits", nodes=4, topology=flags.get("--topology", "ring"), iterations=50,
        eval_every=25, seed=3, algorithm=flags["--algorithm"],
        gradient_tracking="--gradient-tracking" in CASES[case],
        alpha=float(flags["--alpha"]) if "--alpha" in flags else None,
        gossip_every=int(flags.get("--gossip-every", 1)), compress=flags.get("--compress", "none"),
        checkpoint_every=int(flags["--checkpoint-every"]) if "--checkpoint-every" in flags
        else None,
    )  # fmt: skip


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """``launched(case)``: the folder of the case's distributed run and its completed launch,
    made once for the module (the traffic test reads the dpsgd run's summary)."""
    runs: dict[str, tuple[Path, subprocess.CompletedProcess]] = {}

    def launch(case: str) -> tuple[Path, subprocess.CompletedProcess]:
        if case not in runs:
            out = tmp_path_factory.mktemp(case) / "dist"
            common = [f for f in COMMON if case != SHOWS_PROGRESS or f != "--no-progress"]
            command = slate_command("train", *common, *CASES[case], "--engine", "distributed",
                                    "--out", str(out))  # fmt: skip
            if case == SHOWS_PROGRESS:
                process = start(command, start_new_session=True)
                try:
                    stdout, stderr = process.communicate(timeout=240)
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
            else:
                done = run_command(command, timeout=240)
            runs[case] = (out, done)
        return runs[case]

    return launch


@pytest.mark.processes
@pytest.mark.parametrize("case", list(CASES))
def test_distributed_engine_equals_simulator(case, tmp_path, launched):
    out, done = launched(case)
    assert done.returncode == 0, done.stderr
    distributed = json.loads((out / "summary.json").read_text())
    sim_out = tmp_path / "sim"
    simulated = train(
        TrainConfig(**{**config_for(case).to_dict(), "out": str(sim_out)}),
        progress=False, figures=False, log=lambda _: None,
    ).summary  # fmt: skip
    assert distributed["engine"] == "distributed" and simulated["engine"] == "simulator"
    # The parameters agree to float32 rounding (checked below, to 1e-5); after 50 steps the
    # logits are close together, so a rounding-level change can swap two of them: the metrics
    # agree to 1e-4 (seen: 2.5e-5 apart on one AVX-512 machine).
    assert distributed["test_ap"] == pytest.approx(simulated["test_ap"], abs=1e-4)
    assert distributed["test_auroc"] == pytest.approx(simulated["test_auroc"], abs=1e-4)
    ours = torch.load(out / "model.pt", weights_only=True)
    theirs = torch.load(sim_out / "model.pt", weights_only=True)
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=0, atol=1e-5)
    # What the simulator says it would send is what the processes sent.
    assert distributed["comm_bytes_per_party"] == simulated["comm_bytes_per_party"]
    assert distributed["messages_per_party"] == simulated["messages_per_party"]
    assert distributed["eval_bytes_per_party"] == simulated["eval_bytes_per_party"] > 0
    # ... and the round trips its collectives waited for (the --wan estimate's Q).
    assert distributed["collective_round_trips"] == simulated["collective_round_trips"] > 0
    # Ranks other than 0 print nothing but errors; rank 0 prints the result (and its bar).
    assert "test AP" in done.stdout
    lines = [line for line in re.split(r"[\r\n]", done.stderr) if line.strip()]
    if case == SHOWS_PROGRESS:
        assert lines and all(PROGRESS_BAR.fullmatch(line) for line in lines), done.stderr
    else:
        assert lines == [], done.stderr


@pytest.mark.processes
def test_ring_traffic_is_two_neighbours_times_parameter_bytes_times_exchanges(launched):
    """Counted on the processes' own sends, in the runs of the test above (no run of its own:
    the count is the communicator's, whatever the algorithm): D-PSGD mixes once per iteration,
    SLATE with gradient tracking twice (the tracker, then the model; without tracking it mixes
    the model only, as D-PSGD does)."""
    for case, per_iteration in (("dpsgd", 1), ("slate-gt", 2)):
        out, done = launched(case)
        assert done.returncode == 0, done.stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["engine"] == "distributed" and summary["algorithm"] == CASES[case][1]
        parameter_bytes = summary["n_parameters"] * 4  # float32, one flat buffer
        exchanges = 50 * per_iteration
        assert summary["comm_bytes_per_party"] == 2 * parameter_bytes * exchanges, case
        assert summary["messages_per_party"] == 2 * exchanges, case


def _children(pid: int) -> dict[int, int]:
    """rank -> pid of the launcher's worker processes: the processes under it whose native
    stderr goes to a party's debug log (``debug-rank<r>.log``, opened as the worker starts)."""
    ranks = {}
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            name = os.readlink(f"/proc/{child}/fd/2").rsplit("/", 1)[-1]
            if name.startswith("debug-rank") and name.endswith(".log"):
                ranks[int(name[len("debug-rank") : -len(".log")])] = child
    return ranks


@pytest.mark.processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_with_stop_killing_a_party_stops_the_others_naming_the_lost_rank(tmp_path):
    timeout = 15
    launcher = start(
        slate_command("train", "--dataset", "digits", "--nodes", "3", "--iterations", "1000000",
                      "--eval-every", "1000", "--no-progress", "--engine", "distributed",
                      "--timeout", str(timeout), "--out", str(tmp_path / "run"),
                      "--on-party-loss", "stop", "--checkpoint-every", "50"),
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ranks = _children(launcher.pid)
            if len(ranks) == 3 and launcher.poll() is None:
                break
            time.sleep(0.5)
        assert len(ranks) == 3, "the three workers did not start"
        # Once party 1 wrote a checkpoint, every party is in the training loop.
        while not list((tmp_path / "run").glob("checkpoint-rank1-*.pt")):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.05)
        os.kill(ranks[1], signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = launcher.communicate(timeout=timeout + 30)
        elapsed = time.monotonic() - killed_at
    finally:
        with contextlib.suppress(ProcessLookupError):  # the workers too, whatever happened
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode != 0
    assert elapsed < timeout + 10
    assert "Traceback" not in stderr
    for survivor in (0, 2):
        assert f"Party {survivor} lost contact with party (rank) 1" in stderr, stderr


@pytest.mark.processes
def test_the_launcher_passes_sigint_on_even_when_it_inherited_it_ignored(tmp_path):
    """A launcher started by a script with ``&`` (no job control) inherits SIGINT ignored; a
    SIGINT sent to it must still reach the parties, which stop with a checkpoint. (Two parties:
    the launcher passes the signal to each of its workers alike, so two show it as four do.)

    The launcher is forked from the tests' server (:func:`tests.sites.start`) rather than
    exec'd as a fresh interpreter: SIGINT is set ignored before ``slate`` runs, which leaves it
    as an inherited one would (ignored, and Python's handler ``SIG_IGN``); in a session of its
    own, so that its workers come from a forkserver of its own, started with SIGINT ignored as
    the launcher's were before."""
    out = tmp_path / "run"
    ignore_then_run = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "sys.argv = ['slate', *sys.argv[1:]]; "
        "runpy.run_module('slate', run_name='__main__', alter_sys=True)"
    )
    process = start(
        [sys.executable, "-c", ignore_then_run, "train", *COMMON, "--nodes", "2",
         "--iterations", "100000", "--checkpoint-every", "50", "--engine", "distributed",
         "--out", str(out)],
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(out.glob("checkpoint-rank0-*.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    saved = sorted(out.glob("checkpoint-rank0-*.pt"))
    assert saved and "Traceback" not in stderr


@pytest.mark.processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_stop_asked_at_one_party_stops_every_party_at_the_same_iteration(tmp_path):
    """SIGTERM to one worker only: its stop flag reaches the others in the chunk's last gossip
    rounds (base-2 carries the flags, slate.communication.flag_flood), and all four write their
    last checkpoint at the same iteration and stop."""
    out = tmp_path / "run"
    launcher = start(
        slate_command("train", "--dataset", "digits", "--nodes", "4", "--topology", "base-2",
                      "--gossip-every", "5", "--iterations", "1000000", "--eval-every", "100000",
                      "--checkpoint-every", "40", "--no-progress", "--no-plots",
                      "--engine", "distributed", "--out", str(out)),
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("checkpoint-rank2-*.pt")):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.05)
        ranks = _children(launcher.pid)
        assert len(ranks) == 4, "the four workers did not start"
        os.kill(ranks[2], signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode != 0 and "Traceback" not in stderr, stderr
    last = {r: max(out.glob(f"checkpoint-rank{r}-*.pt")).name.rsplit("-", 1)[1] for r in range(4)}
    assert len(set(last.values())) == 1, last
    assert "lost" not in stderr, stderr
