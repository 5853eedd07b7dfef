"""Four sites on their own CSV files, started from one ``job.toml`` (``slate job init``), each
with only ``--job``, its identity, where it meets the others, its files and ``--out`` (site 0
also ``--tensorboard``), watched as an operator would: ``slate status`` shows all four with
their iterations mid-run, site 0's ``history.csv`` grows while its ``summary.json`` says
running, ``run.log`` has levels, and the TensorBoard event file holds the AP of every
evaluation, equal to ``history.csv``'s."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from tests.data.test_private_tables import write_table
from tests.engines.test_site_status import frames, training
from tests.sites import (
    finish,
    free_port,
    identity_flags,
    make_roster,
    read_until,
    serve,
    slate_here,
    start_party,
    wait_for,
)

SITES = 4
# 240 iterations, an evaluation every 24 (11 rows, as with 400 and 40): about two seconds of
# training on an idle machine, over the second in which every site publishes its status once.
JOB = ["--nodes", str(SITES), "--iterations", "240", "--eval-every", "24", "--topology", "ring",
       "--lr", "0.05", "--positives", "1", "--batch-size", "8", "--seed", "1"]  # fmt: skip


def _site_flags(rank: int) -> list[str]:
    """What a site adds to the job: its files, its table's label, its folder."""
    board = ["--tensorboard", "board"] if rank == 0 else []
    return ["--external-store", "--dataset", "csv", "--train", "train.csv", "--test",
            "test.csv", "--label-column", "label", "--positive-label", "1", "--out", "run",
            "--no-progress", "--no-plots", "--timeout", "30", *board]  # fmt: skip


def _history_rows(path: Path) -> int:
    try:
        return max(0, len(path.read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


class _Watch:
    """What the operator saw so far: whether ``slate status`` showed every site training, and
    site 0's history rows each time they grew while its summary said running."""

    def __init__(self, port: int, roster: Path, history: Path) -> None:
        self.port, self.roster, self.history = port, roster, history
        self.seen, self.sizes = False, []

    def enough(self) -> bool:
        if not self.seen:
            shown = slate_here("status", f"127.0.0.1:{self.port}", "--roster", str(self.roster))
            self.seen = any(training(frame, SITES) for frame in frames(shown.stdout))
        rows = _history_rows(self.history)
        if rows and (not self.sizes or rows > self.sizes[-1]):
            state = json.loads((self.history.parent / "summary.json").read_text())["state"]
            self.sizes += [rows] if state == "running" else []
        return self.seen and len(self.sizes) >= 2


@pytest.mark.processes
def test_four_csv_sites_from_one_job_file_watched_as_they_go(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for r in range(SITES):
        (tmp_path / f"site{r}").mkdir()
        write_table(tmp_path / f"site{r}" / "train.csv", np.arange(r, 440, SITES))
        write_table(tmp_path / f"site{r}" / "test.csv", np.arange(440 + r, 569, SITES))
    made = slate_here("job", "init", *JOB, "--out", str(tmp_path / "job.toml"))
    assert made.returncode == 0, made.stderr
    roster = make_roster(tmp_path, SITES)
    port = free_port()
    server = serve(port, "--roster", str(roster))
    read_until(server, "serving one run")
    parties = [start_party(tmp_path, r, port, "--job", str(tmp_path / "job.toml"),
                           *_site_flags(r), *identity_flags(roster, r))
               for r in range(SITES)]  # fmt: skip
    history = tmp_path / "site0" / "run" / "history.csv"
    watch = _Watch(port, roster, history)
    try:
        wait_for(watch.enough, "all four sites in slate status and a growing history",
                 process=parties[0])  # fmt: skip
    finally:
        done = finish(parties, timeout=180)
        server.kill()
        server.communicate()
    for rank, (code, text) in enumerate(done):
        assert code == 0, f"site {rank}: {text[-3000:]}"
    assert watch.sizes[0] < watch.sizes[-1], watch.sizes  # grew while the run was going
    log = (tmp_path / "site0" / "run" / "run.log").read_text().splitlines()
    assert any(" INFO " in line and "rank=0" in line for line in log), log[:5]
    rows = list(csv.DictReader(history.open()))
    assert len(rows) == 11  # iterations 0, 24, ..., 240
    board = EventAccumulator(str(tmp_path / "site0" / "board"))
    board.Reload()
    ap = board.Scalars("ap/pooled")
    assert [e.step for e in ap] == [int(r["iteration"]) for r in rows]
    assert [e.value for e in ap] == pytest.approx([float(r["test_ap"]) for r in rows], rel=1e-6)
    summary = json.loads((tmp_path / "site0" / "run" / "summary.json").read_text())
    assert summary["state"] == "done" and summary["config"]["job_sha256"]
