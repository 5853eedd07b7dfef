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

import contextlib
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slate.faults.kills import parse_kills
from tests.engines.test_party_loss import kill_and_bring_back
from tests.sites import HAVE_W7A, descendants, run_command, start, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo on Linux")

FLAGS = ["--dataset", "digits", "--nodes", "3", "--topology", "ring", "--iterations", "120",
         "--eval-every", "40", "--checkpoint-every", "40", "--seed", "1", "--no-progress",
         "--no-plots",
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
FREEZE_EVERY = 100  # the checkpoint boundaries, where a lost party comes back
FREEZE_FLAGS = ["--dataset", "digits", "--nodes", "3", "--topology", "ring", "--eval-every",
                "1000", "--checkpoint-every", str(FREEZE_EVERY), "--seed", "1", "--no-progress",
                "--no-plots"]  # fmt: skip
# (fault, --timeout, --iterations, what): silence_s = min(10, timeout / 2). A plain ``freeze``
# lasts until the others' first checkpoint after it (100: train_with_fault wakes it), so over
# the silence; it comes back at a later boundary (300 here, about a second after it woke, seen
# on two busy cores), before the end at 600, which leaves it two boundaries more (400, 500).
FREEZE_SUBSET = [("1@50:step:freeze", 10, 600, "mid-run until the others went on without it")]
FREEZE_FULL = [
    (f"{rank}@{at}:{moment}:freeze{seconds}", timeout, 12000, f"rank {rank}, {moment} {at}")
    for rank in (0, 1, 2)
    for moment, at, seconds, timeout in (
        ("step", 50, 14, 30),  # longer than the heartbeat's silence, shorter than --timeout
        ("step", 50, 20, 12),  # longer than --timeout
        ("evaluation", 1000, 14, 30),
        ("checkpoint", 200, 14, 30),
    )
]
FULL_MATRIX = bool(os.environ.get("SLATE_FULL_FAULT_MATRIX"))
CELLS = FULL if FULL_MATRIX else SUBSET
FREEZES = FREEZE_FULL if FULL_MATRIX else FREEZE_SUBSET
NATIVE = re.compile(r"^\[[WIEF] |^terminate called|c10::|gloo::", re.MULTILINE)


def train_with_fault(fault: str, *flags: str) -> subprocess.CompletedProcess:
    """``slate train --engine distributed`` with ``SLATE_KILL_AT=fault``; whatever the outcome,
    the terminal shows no traceback and no native (C++) line.

    A plain ``freeze`` (no timer) is woken here on an event: once the main party (the lowest
    other rank) wrote a checkpoint past the freeze's iteration, the others have counted the
    frozen party lost and gone on; it gets SIGCONT then, and the run needs to last only until
    it is back, rather than for a timer chosen long enough on the slowest machine."""
    command = [sys.executable, "-m", "slate", "train", *flags, "--engine", "distributed"]
    env = {**os.environ, "SLATE_KILL_AT": fault}
    frozen = [k for k in parse_kills(fault) if k.fault == "freeze"]
    if not frozen:
        done = run_command(command, timeout=300, env=env)
    else:
        (freeze,) = frozen
        out = Path(flags[flags.index("--out") + 1])
        main = min(r for r in range(3) if r != freeze.rank)

        def past_the_freeze() -> bool:
            saved = out.glob(f"checkpoint-rank{main}-*.pt")
            return any(int(path.stem.rsplit("-", 1)[1]) > freeze.iteration for path in saved)

        launcher = start(command, env=env, start_new_session=True)
        try:
            wait_for(past_the_freeze, "the others' checkpoint after the freeze", 240, launcher)
            os.kill(stopped_child(launcher.pid), signal.SIGCONT)
            stdout, stderr = launcher.communicate(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the workers too, on a failure
                os.killpg(launcher.pid, signal.SIGKILL)
        done = subprocess.CompletedProcess(command, launcher.returncode, stdout, stderr)
    assert "Traceback" not in done.stderr and not NATIVE.search(done.stderr), done.stderr
    return done


def stopped_child(parent: int) -> int:
    """The process under ``parent`` that is stopped (state T in /proc)."""
    stopped = [pid for pid, state in descendants(parent).items() if state == "T"]
    assert len(stopped) == 1, f"stopped processes under {parent}: {stopped}"
    return stopped[0]


@pytest.mark.processes
@pytest.mark.parametrize(("kill", "lost", "moment"), CELLS, ids=[c[0] for c in CELLS])
def test_a_party_lost_at_this_moment_leaves_the_others_finishing(tmp_path, kill, lost, moment):
    out = tmp_path / "run"
    done = train_with_fault(kill, *FLAGS, "--out", str(out))
    assert done.returncode == 0, f"{moment}: {done.stderr}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["members"] == [p for p in range(3) if p != lost]
    (event,) = summary["party_events"]
    assert event["rank"] == lost and event["event"] == "lost"
    at = int(kill.split("@")[1].split(":")[0])
    assert event["iteration"] <= at
    assert summary["iterations"] == 120


# ------------------------------------------------------------- local steps between gossip rounds

# 3 parties on base-2 (rounds 0-1, 0-2, 0-1; round r ends step 25 r + 24): party 2 talks to
# party 0 only every third gossip round, so with --gossip-every 25 it runs up to 100 iterations
# past a party blocked on the lost one before its own next exchange holds it: killed
# at 130, party 1 leaves party 0 blocked at step 149 while party 2 reaches step 199.
LOCAL_STEPS_FLAGS = ["--dataset", "digits", "--nodes", "3", "--topology", "base-2",
                     "--gossip-every", "25", "--iterations", "300", "--eval-every", "100",
                     "--checkpoint-every", "100", "--seed", "1", "--no-progress", "--no-plots",
                     "--timeout", "20"]  # fmt: skip
INT8 = ("--compress", "int8")
LOCAL_STEPS_SUBSET = [("1@130:step", ()), ("0@130:step", INT8)]
LOCAL_STEPS_FULL = [
    *((f"{rank}@{at}:{moment}", ())
      for rank in (0, 1, 2)
      for moment, at in (("step", 60), ("step", 130), ("step", 240), ("checkpoint", 200))),
    *((f"{rank}@130:step", INT8) for rank in (0, 1, 2)),
]  # fmt: skip
LOCAL_STEPS = LOCAL_STEPS_FULL if FULL_MATRIX else LOCAL_STEPS_SUBSET


@pytest.mark.parametrize(("kill", "extra"), LOCAL_STEPS,
                         ids=[" ".join((c[0], *c[1])) for c in LOCAL_STEPS])  # fmt: skip
@pytest.mark.processes
def test_a_party_lost_under_local_steps_leaves_every_healthy_party_finishing(tmp_path, kill, extra):
    """With H local steps between gossip rounds a party runs up to H
    iterations per hop ahead of one blocked on the lost party; each survivor must still hold
    the state the survivors agree to roll back to (none stops), and all record one loss. With
    --compress int8 the rollback also restarts CHOCO's public copies on every survivor."""
    out = tmp_path / "run"
    done = train_with_fault(kill, *LOCAL_STEPS_FLAGS, *extra, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "cannot roll back" not in done.stderr, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    lost = int(kill.split("@")[0])
    assert summary["members"] == [p for p in range(3) if p != lost], done.stderr
    (event,) = summary["party_events"]
    assert (event["rank"], event["event"]) == (lost, "lost")
    assert summary["iterations"] == 300


# Four sites on base-2 (rounds 0-1 2-3, then 0-2 1-3) with --gossip-every 25: the killed site's
# two neighbours stop one gossip round (25 iterations) apart. Killed at 20%, 50% and 80% of the
# run, at multiples of 100 (no chunk ends between those two rounds), with 4 000 iterations left
# for the restarted site to return in (it took 600 to 2 100 on two busy cores). Full matrix
# only: about 1, 1.5 and 2.5 min on two cores.
SITE_KILLS = [(1, 1000, 5000), (2, 4000, 8000), (3, 16000, 20000)] if FULL_MATRIX else []


@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
@pytest.mark.parametrize(("lost", "at", "iterations"), SITE_KILLS,
                         ids=[f"{r}@{at}of{t}" for r, at, t in SITE_KILLS])  # fmt: skip
def test_a_site_killed_under_local_steps_rejoins_and_no_healthy_site_stops(
    tmp_path, lost, at, iterations
):
    """Under local steps every healthy site rolls back to the agreed iteration and goes on (none
    stops), the sites record the same events, and the killed site returns with --resume."""
    flags = ("--topology", "base-2", "--gossip-every", "25", "--eval-every", "1000")
    outputs, _ = kill_and_bring_back(tmp_path, lost, at, iterations, flags=flags, reach_s=600)
    assert f"party {lost} rejoined the run at iteration" in outputs[lost][0]
    results = [json.loads((tmp_path / f"site{r}" / "run" / "summary.json").read_text())
               for r in range(4)]  # fmt: skip
    events = results[0]["party_events"]
    assert [(e["rank"], e["event"]) for e in events] == [(lost, "lost"), (lost, "rejoined")]
    assert at - 25 <= events[0]["iteration"] < at + 25  # the first gossip round it missed
    for result in results:
        assert result["members"] == [0, 1, 2, 3] and result["party_events"] == events
        assert result["test_ap"] == results[0]["test_ap"]


SET_UP = [0, 1, 2] if FULL_MATRIX else [2]


@pytest.mark.processes
@pytest.mark.xdist_group("timing")
@pytest.mark.parametrize("lost", SET_UP, ids=[f"{r}@0:setup" for r in SET_UP])
def test_a_party_lost_during_the_set_up_stops_every_party_naming_it(tmp_path, lost):
    """Before step 1 the parties agree on the data and the run's flags, which needs every one:
    the others stop within --timeout + 10 s with one paragraph naming the lost party and the
    phase (a raw gloo line before)."""
    started = time.monotonic()
    done = train_with_fault(f"{lost}@0:setup", *FLAGS, "--out", str(tmp_path / "run"))
    assert time.monotonic() - started < 20 + 10
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("slate: error:")]
    assert len(said) == 2, done.stderr  # each survivor, one paragraph
    for line in said:
        assert "during the set-up, before step 1" in line
        assert f"party {lost} was lost (its process" in line


def silent_for(reason: str) -> float:
    """The seconds in a loss reason "no heartbeat for S s" (which fails on any other reason)."""
    match = re.fullmatch(r"no heartbeat for (\d+\.\d) s", reason)
    assert match is not None, reason
    return float(match.group(1))


@pytest.mark.parametrize(("fault", "timeout", "iterations", "moment"), FREEZES,
                         ids=[c[0] for c in FREEZES])  # fmt: skip
@pytest.mark.processes
@pytest.mark.xdist_group("timing")
def test_a_frozen_party_is_counted_lost_on_time_and_comes_back_by_itself(
    tmp_path, fault, timeout, iterations, moment
):
    out = tmp_path / "run"
    done = train_with_fault(fault, *FREEZE_FLAGS, "--timeout", str(timeout), "--iterations",
                            str(iterations), "--out", str(out))  # fmt: skip
    assert done.returncode == 0, f"{moment}: {done.stderr}"
    summary = json.loads((out / "summary.json").read_text())
    frozen = int(fault.split("@")[0])
    assert summary["members"] == [0, 1, 2]
    lost, back = summary["party_events"]
    assert (lost["rank"], lost["event"]) == (frozen, "lost")
    assert silent_for(lost["reason"]) < min(10.0, timeout / 2) + 2  # its timer, not --timeout
    assert (back["rank"], back["event"]) == (frozen, "rejoined")
    assert back["reason"] == "came back by itself after being out of reach"
    assert back["iteration"] % FREEZE_EVERY == 0 and back["iteration"] > lost["iteration"]
    assert summary["iterations"] == iterations


# ------------------------------------------------------------------------------- network cuts

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
CUTS = [(5, 20000, "shorter than the heartbeat's 10 s"), (60, 60000, "as long as --timeout")]


def _may_cut_networks() -> bool:
    root = sys.platform.startswith("linux") and os.geteuid() == 0
    tools = shutil.which("ip") is not None and (SHARED / "w7a" / "w7a.gz").is_file()
    return FULL_MATRIX and root and tools


def _ip(*args: str, netns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True)


@pytest.fixture
def cut_off_site():
    """Site 1's own network namespace, joined to this host by a veth pair (10.77.0.1 here,
    10.77.0.2 there); yields (namespace, host-side interface, site-side interface)."""
    tag = os.getpid() % 100000
    netns, here, there = f"slcut{tag}", f"slh{tag}", f"sln{tag}"
    subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", netns)
        _ip("addr", "add", "10.77.0.1/24", "dev", here)
        _ip("link", "set", here, "up")
        _ip("addr", "add", "10.77.0.2/24", "dev", there, netns=netns)
        _ip("link", "set", there, "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        yield netns, here, there
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def _write_w7a_sites(root: Path) -> None:
    for source, name in (("w7a.gz", "train.svm"), ("w7a.t.gz", "test.svm")):
        with gzip.open(SHARED / "w7a" / source, "rt") as handle:
            lines = handle.readlines()[:12000]
        for r in range(3):
            (root / f"site{r}").mkdir(parents=True, exist_ok=True)
            (root / f"site{r}" / name).write_text("".join(lines[r::3]))


@pytest.mark.skipif(not _may_cut_networks(), reason="the full matrix, as root, with iproute2")
@pytest.mark.parametrize(("seconds", "iterations", "what"), CUTS, ids=[f"{c[0]}s" for c in CUTS])
def test_a_network_cut_at_one_site(tmp_path, cut_off_site, seconds, iterations, what):
    """Site 1 sits in its own network namespace; its link goes down for ``seconds`` (packets
    dropped, connections kept, as in a WAN outage). Shorter than the heartbeat's silence: nothing
    happens. As long as --timeout: the others go on after 10 s, and site 1 comes back by itself."""
    netns, here, there = cut_off_site
    _write_w7a_sites(tmp_path)
    port = 29000 + os.getpid() % 1000
    flags = ["--dataset", "libsvm", "--train", "train.svm", "--test", "test.svm", "--features",
             "300", "--nodes", "3", "--rendezvous", f"10.77.0.1:{port}", "--external-store",
             "--iterations", str(iterations), "--eval-every", "1000", "--checkpoint-every", "1000",
             "--timeout", "60", "--no-progress", "--seed", "1", "--out", "run"]  # fmt: skip
    server = subprocess.Popen([sys.executable, "-m", "slate", "rendezvous", "--port", str(port),
                               "--host", "10.77.0.1"], stdout=subprocess.DEVNULL)  # fmt: skip
    time.sleep(1)
    parties = []
    for rank in range(3):
        inside = ["ip", "netns", "exec", netns] if rank == 1 else []
        env = {**os.environ, "GLOO_SOCKET_IFNAME": there if rank == 1 else here}
        command = [*inside, sys.executable, "-m", "slate", "train", "--rank", str(rank), *flags]
        parties.append(subprocess.Popen(command, cwd=tmp_path / f"site{rank}", env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True))  # fmt: skip
    try:
        time.sleep(10)
        _ip("link", "set", here, "down")
        time.sleep(seconds)
        _ip("link", "set", here, "up")
        outputs = [p.communicate(timeout=600) for p in parties]
    finally:
        for process in (*parties, server):
            process.kill()
    for rank, (process, (_, err)) in enumerate(zip(parties, outputs, strict=True)):
        assert process.returncode == 0, f"party {rank}: {err}"
        assert "Traceback" not in err and not NATIVE.search(err), err
    results = [json.loads((tmp_path / f"site{r}" / "run" / "summary.json").read_text())
               for r in range(3)]  # fmt: skip
    for result in results:
        assert result["members"] == [0, 1, 2] and result["test_ap"] == results[0]["test_ap"]
        assert result["party_events"] == results[0]["party_events"]
    events = [(e["rank"], e["event"], e["reason"]) for e in results[0]["party_events"]]
    if seconds < 10:
        assert events == []
    else:
        back = "came back by itself after being out of reach"
        assert [(rank, event) for rank, event, _ in events] == [(1, "lost"), (1, "rejoined")]
        assert silent_for(events[0][2]) < 12.0 and events[1][2] == back


@pytest.mark.processes
def test_a_party_killed_while_it_rejoins_is_lost_again_and_the_others_finish(tmp_path):
    """The moment "during a rejoin": party 1 freezes (until the others went on, over the 5 s
    silence of --timeout 10), is counted as lost, comes back by itself, and dies once admitted,
    in the admission's first collective. The others roll back, lose it again and finish; the
    evaluation made again after the rollback is no false "not learning"."""
    out = tmp_path / "run"
    done = train_with_fault("1@50:step:freeze,1@0:rejoin", *FREEZE_FLAGS, "--timeout", "10",
                            "--iterations", "600", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not learning" not in done.stdout, done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["members"] == [0, 2] and summary["iterations"] == 600
    first, second = summary["party_events"]
    assert [(e["rank"], e["event"]) for e in (first, second)] == [(1, "lost"), (1, "lost")]
    silent_for(first["reason"])
    assert "exited" in second["reason"] and second["iteration"] % FREEZE_EVERY == 0
