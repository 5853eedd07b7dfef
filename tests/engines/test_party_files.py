"""Real per-party deployment: separate processes, each with only its own files.

Each party runs ``slate train --rank r --rendezvous 127.0.0.1:PORT`` in its own folder, with an
audit hook that records every file the process opens. The parties must report the same global
AP, agree with the simulator on the same ``{rank}`` files, and never open another party's file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from slate.config import TrainConfig
from slate.training.loop import train
from tests.sites import free_port, run_command, start, write_sites

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
PARTIES = 3  # (the claims hold with three sites: one process fewer than four)

# Runs the slate CLI after installing an audit hook that logs every opened path to OPEN_LOG.
AUDITED = """
import os, sys
log = open(os.environ["OPEN_LOG"], "w")
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        log.write(os.path.abspath(os.fsdecode(args[0])) + "\\n"); log.flush()
sys.addaudithook(hook)
from slate.cli import main
sys.exit(main(sys.argv[1:]))
"""


def write_shards(root: Path, rows: int = 1200) -> None:
    """Site r gets every PARTIES-th line of the first ``PARTIES * rows`` lines of w7a and of
    w7a.t."""
    write_sites(root, PARTIES, rows)


# 100 iterations: the engines' agreement (same AP to 1e-4, every site's bar at its end) is
# checked at the end of any run length; 300 cost two thirds more of the sites' steps.
TRAIN_FLAGS = ["--dataset", "libsvm", "--features", "300", "--iterations", "100",
               "--topology", "ring", "--seed", "1", "--no-plots"]  # fmt: skip


@pytest.mark.processes
@pytest.mark.skipif(not (SHARED / "w7a" / "w7a.t.gz").is_file(), reason="w7a not in shared")
def test_separate_parties_with_their_own_shards_agree_with_the_simulator(tmp_path):
    """... and every site shows its progress bar: with per-party files each site's console is
    its own, and a site other than 0 that printed nothing would look hung for minutes."""
    write_shards(tmp_path)
    port = free_port()
    procs = []
    for r in range(PARTIES):
        site = tmp_path / f"site{r}"
        env = {**os.environ, "OPEN_LOG": str(site / "opened.txt")}
        command = [sys.executable, "-c", AUDITED, "train", "--rank", str(r), "--nodes",
                   str(PARTIES), "--rendezvous", f"127.0.0.1:{port}", "--train", "train.svm",
                   "--test", "test.svm", "--out", "run", *TRAIN_FLAGS]  # fmt: skip
        procs.append(start(command, cwd=site, env=env))
    outputs = [p.communicate(timeout=300) for p in procs]
    for r, (p, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"party {r}: {err}"
        assert "Traceback" not in err
        assert "100/100" in err, f"site {r} showed no progress: {err}"
    summaries = [
        json.loads((tmp_path / f"site{r}" / "run" / "summary.json").read_text())
        for r in range(PARTIES)
    ]
    aps = [s["test_ap"] for s in summaries]
    assert max(aps) - min(aps) <= 1e-6
    assert all(s["evaluation"] == "federated" for s in summaries)
    assert [list(s["party_test_ap"]) for s in summaries] == [[str(r)] for r in range(PARTIES)]
    assert summaries[0]["n_train"] == PARTIES * 1200

    # No party opened a file in another party's folder.
    for r in range(PARTIES):
        opened = (tmp_path / f"site{r}" / "opened.txt").read_text().split("\n")
        assert any(path.endswith(f"site{r}/train.svm") for path in opened)
        others = [p for p in opened for k in range(PARTIES) if k != r and f"/site{k}/" in p]
        assert others == [], f"party {r} opened {others}"

    # The simulator on the same {rank} files gives the same AP.
    simulated = train(
        TrainConfig(
            dataset="libsvm", train=str(tmp_path / "site{rank}" / "train.svm"),
            test=str(tmp_path / "site{rank}" / "test.svm"), n_features=300, iterations=100,
            nodes=PARTIES, topology="ring", seed=1,
        ),
        write=False, progress=False, log=lambda _: None,
    ).summary  # fmt: skip
    assert simulated["test_ap"] == pytest.approx(aps[0], abs=1e-4)
    for r in range(PARTIES):
        assert summaries[r]["party_test_ap"][str(r)] == pytest.approx(
            simulated["party_test_ap"][str(r)], abs=1e-4
        )


def _write_csv(path: Path, header: str, rows: int, seed: int) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    y = (x[:, 0] > 1.0).astype(int)
    y[:3] = 1
    body = "\n".join(f"{a:.5f},{b:.5f},{c:.5f},{t}" for (a, b, c), t in zip(x, y, strict=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + body + "\n")


@pytest.mark.processes
def test_a_renamed_column_stops_every_party_naming_it(tmp_path):
    for r in range(3):
        header = "age,income,bmi,y" if r != 2 else "age,Income,bmi,y"
        _write_csv(tmp_path / "sites" / str(r) / "train.csv", header, 60, r)
    out = tmp_path / "run"
    started = time.monotonic()
    done = run_command(
        [sys.executable, "-m", "slate", "train", "--engine", "distributed", "--nodes", "3",
         "--dataset", "csv", "--train", str(tmp_path / "sites" / "{rank}" / "train.csv"),
         "--label-column", "y", "--positive-label", "1", "--iterations", "20",
         "--batch-size", "10", "--out", str(out), "--timeout", "30", "--no-progress"],
        timeout=200,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 120
    assert "party 2's column 2 is 'Income', party 0's is 'income'" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not list(out.rglob("model.pt")) and not list(out.rglob("summary.json"))


@pytest.mark.processes
def test_local_launch_with_party_files_writes_one_folder_per_party(tmp_path):
    for r in range(2):
        _write_csv(tmp_path / "sites" / str(r) / "train.csv", "age,income,bmi,y", 80, r)
    out = tmp_path / "run"
    done = run_command(
        [sys.executable, "-m", "slate", "train", "--engine", "distributed", "--nodes", "2",
         "--dataset", "csv", "--train", str(tmp_path / "sites" / "{rank}" / "train.csv"),
         "--label-column", "y", "--positive-label", "1", "--iterations", "20",
         "--batch-size", "10", "--standardize", "--out", str(out), "--no-progress",
         "--no-plots"],
        timeout=200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = (json.loads((out / f"party{r}" / "summary.json").read_text()) for r in (0, 1))
    assert first["test_ap"] == second["test_ap"]
    assert first["preprocessing"] == second["preprocessing"]
    assert first["test_split"].startswith("seeded stratified")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rank", "1"], "--rank and --rendezvous go together"),
        (["--rank", "1", "--rendezvous", "127.0.0.1:1"], "--rank needs --nodes"),
        (["--rank", "5", "--nodes", "2", "--rendezvous", "h:1"], r"--rank must lie in 0\.\.1"),
        (["--rank", "0", "--nodes", "2", "--rendezvous", "nohost"], "is not HOST:PORT"),
    ],
)
def test_bad_party_flags_are_one_clear_error(flags, message, capsys):
    from slate.cli import main

    code = main(["train", "--dataset", "csv", "--train", "x.csv", "--label-column", "y",
                 "--positive-label", "1", *flags])  # fmt: skip
    assert code == 2
    import re

    assert re.search(message, capsys.readouterr().err)


def test_non_loopback_rendezvous_warns_about_the_transport():
    from slate.engines.distributed.control.launch import (
        INSECURE_WARNING,
        is_loopback,
        parse_rendezvous,
    )

    assert parse_rendezvous("[::1]:29500") == ("::1", 29500)
    assert is_loopback("127.0.0.5") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.5") and not is_loopback("site0.example.org")
    assert "VPN or SSH" in INSECURE_WARNING


@pytest.mark.processes
@pytest.mark.skipif(not (SHARED / "w7a" / "w7a.t.gz").is_file(), reason="w7a not in shared")
def test_a_flag_changed_at_one_site_stops_every_site_before_step_one(tmp_path):
    """Site 1 differs in two training flags, a word and a number: every site exits 2 with the
    same paragraph naming the site, each flag and both its values, and nobody trains (no
    checkpoint, no model). (One run for both: the sites compare every agreed flag alike, and
    the paragraph names each that differs.)"""
    flag = ["--compress", "int8", "--lr", "0.1"]
    write_shards(tmp_path, rows=300)
    port = free_port()
    procs = []
    for r in range(PARTIES):
        command = [sys.executable, "-m", "slate", "train", "--rank", str(r), "--nodes",
                   str(PARTIES), "--rendezvous", f"127.0.0.1:{port}", "--train", "train.svm",
                   "--out", "run", "--no-progress", *TRAIN_FLAGS,
                   *(flag if r == 1 else [])]  # fmt: skip
        procs.append(start(command, cwd=tmp_path / f"site{r}"))
    outputs = [p.communicate(timeout=200) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 2, err
        assert "--compress 'int8' where party 0 has 'none'" in err, err
        assert "--lr 0.1 where party 0 has 0.01" in err, err
        assert "different training settings: party 1 has --" in err, err
        assert "Traceback" not in err
    assert not list(tmp_path.rglob("checkpoint*")) and not list(tmp_path.rglob("model.pt"))
