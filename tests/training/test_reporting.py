"""What a run reports as it goes (``slate.training.reporting``): ``run.log`` with levels, party
and iteration, ``--log-level``; ``history.csv`` and ``summary.json`` written at every evaluation,
ending as the finished run's files; ``--tensorboard``'s scalars read back with TensorBoard's own
reader; the paragraph when the ``tensorboard`` package is missing; and, on the distributed
engine, a history that grows while the sites train, with no native stack trace at the end."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest

from slate.training import reporting
from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    finish,
    free_port,
    serve,
    slate_here,
    start_party,
    wait_for,
    write_sites,
)

RUN = ("train", "--iterations", "60", "--eval-every", "10", "--checkpoint-every", "30",
       "--no-plots", "--no-progress")  # fmt: skip
LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) rank=(\d+) "
    r"iteration=(\d+) slate\.run: (.*)$"
)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_run_logs_writes_its_history_as_it_goes_and_its_scalars(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, board = tmp_path / "run", tmp_path / "board"
    seen: list[tuple[str, dict]] = []  # the live files after each evaluation
    evaluated = reporting.Reporter.evaluated

    def record(self) -> None:
        evaluated(self)
        live = json.loads((out / "summary.json").read_text())
        seen.append(((out / "history.csv").read_text(), live))

    monkeypatch.setattr(reporting.Reporter, "evaluated", record)
    done = slate_here(*RUN, "--out", out, "--tensorboard", board)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"results written to {out}"  # the console as before

    lines = [LINE.match(line) for line in (out / "run.log").read_text().splitlines()]
    assert all(lines), (out / "run.log").read_text()
    events = [(m[1], int(m[3]), m[4].split(":")[0]) for m in lines if m]
    assert {m[2] for m in lines if m} == {"0"}
    assert events[0] == ("INFO", 0, "start") and events[-1] == ("INFO", 60, "end")
    assert [i for _, i, what in events if what == "evaluation"] == list(range(0, 61, 10))
    assert [i for _, i, what in events if what == "checkpoint"] == [30]

    final = (out / "history.csv").read_text()
    assert len(seen) == 7 and seen[-1][0] == final  # the last live file is the final one
    for k, (text, live) in enumerate(seen):
        assert final.startswith(text) and len(_rows_of(text)) == k + 1
        assert live["state"] == "running" and live["iteration"] == 10 * k
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "done" and list(summary)[-1] == "state"

    accumulator = EventAccumulator(str(board))
    accumulator.Reload()
    history = _rows(out / "history.csv")
    ap = accumulator.Scalars("ap/pooled")
    assert [e.step for e in ap] == [int(r["iteration"]) for r in history]
    assert [e.value for e in ap] == pytest.approx([float(r["test_ap"]) for r in history],
                                                  rel=1e-6)  # fmt: skip
    sent = [e.value for e in accumulator.Scalars("bytes/sent_per_party")]
    assert sent == pytest.approx([float(r["comm_bytes_per_party"]) for r in history], rel=1e-6)
    assert len(accumulator.Scalars("loss/train")) == 6  # (none at iteration 0: nothing trained)


def _rows_of(text: str) -> list[str]:
    return text.splitlines()[1:]


def test_log_level_warning_drops_the_info_lines_and_debug_adds_the_steps(tmp_path):
    done = slate_here(*RUN, "--out", tmp_path / "run", "--log-level", "warning")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "run.log").read_text() == ""
    assert len(_rows(tmp_path / "run" / "history.csv")) == 7
    done = slate_here(*RUN, "--out", tmp_path / "debug", "--log-level", "debug")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "debug" / "run.log").read_text()
    assert "DEBUG rank=0 iteration=10 slate.run: steps: 10 to iteration 10\n" in text
    assert text.count(" INFO ") == 10  # start, 7 evaluations, 1 checkpoint, end


def test_tensorboard_without_its_package_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # (import tensorboard now fails)
    done = slate_here(*RUN, "--out", tmp_path / "run", "--tensorboard", tmp_path / "board")
    assert done.returncode == 2
    message = done.stderr.strip()
    assert message.startswith("slate: error: --tensorboard ") and "\n" not in message
    assert "pip install 'slate[tensorboard]'" in message
    assert not (tmp_path / "run").exists() and not (tmp_path / "board").exists()


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
def test_a_site_s_history_grows_while_it_trains_and_it_leaves_no_native_trace(tmp_path):
    write_sites(tmp_path, parties=2, rows=300)
    port = free_port()
    server = serve(port)
    # (31 evaluations, 0 to 600; the first two come at 20, with 580 iterations still to go)
    flags = [*SITE_FLAGS, "--nodes", "2", "--external-store", "--iterations", "600",
             "--eval-every", "20"]  # fmt: skip
    parties = [start_party(tmp_path, r, port, *flags) for r in range(2)]
    run = tmp_path / "site0" / "run"

    def running_with_rows() -> bool:  # a live summary after two evaluations
        try:
            live = json.loads((run / "summary.json").read_text())
        except (OSError, ValueError):
            return False
        return live["state"] == "running" and len(_rows(run / "history.csv")) >= 2

    try:
        wait_for(running_with_rows, "two rows of history.csv while the run goes", 120,
                 parties[0])  # fmt: skip
        early = (run / "history.csv").read_text()
        results = finish(parties)
        assert [code for code, _ in results] == [0, 0], results
        assert server.wait(30) == 0
    finally:
        for process in (*parties, server):
            if process.poll() is None:
                process.kill()
    final = (run / "history.csv").read_text()
    assert final.startswith(early) and len(_rows(run / "history.csv")) == 31
    assert json.loads((run / "summary.json").read_text())["state"] == "done"
    for r, (_, output) in enumerate(results):
        debug = (tmp_path / f"site{r}" / "run" / f"debug-rank{r}.log").read_text()
        assert "frame #" not in debug and "frame #" not in output, debug + output


def test_the_summary_says_stopped_when_the_run_is_interrupted(tmp_path, monkeypatch):
    """A stop asked before the first step (as SIGINT asks it): the run stops after its first
    evaluation, and its summary and log say so."""
    from slate.training.interruption import StopOnSignal

    enter = StopOnSignal.__enter__

    def asked(self):
        self.run.stop_requested = True
        return enter(self)

    monkeypatch.setattr(StopOnSignal, "__enter__", asked)
    done = slate_here(*RUN, "--out", tmp_path / "run")
    assert done.returncode == 130, done.stderr
    live = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert live["state"] == "stopped" and live["iteration"] == 0
    assert "INFO rank=0 iteration=0 slate.run: stop: " in (tmp_path / "run" / "run.log").read_text()
