"""``--lr auto`` (:mod:`slate.training.lr_choice`): the rule, its rows and both engines."""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from slate.cli import main
from slate.config import TrainConfig, resolve_config
from slate.data.datasets import Dataset
from slate.training.configuration import resolve_and_check
from slate.training.loop import run_candidates, train
from slate.training.lr_choice import CANDIDATES, choice_iterations, choice_rows, choose_lr, pick
from tests.sites import run_command

ITERATIONS = ["--iterations", "40", "--eval-every", "40", "--no-progress", "--threads", "1",
              "--no-plots"]  # fmt: skip


def separable(rows: int, seed: int, flip: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 4 features whose label is ``x0 > 1.28`` (about 10% positive): a single unit
    separates them exactly. ``flip`` swaps the labels (a test file that must not matter)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    y = (x[:, 0] > 1.28).astype(np.int64)
    return x, (1 - y) if flip else y


def write_table(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    lines = ["a,b,c,d,label"] + [
        ",".join(f"{v:.5f}" for v in row) + f",{label}" for row, label in zip(x, y, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_pick_takes_the_largest_step_within_the_tolerance_of_the_best() -> None:
    aps = {0.003: 0.70, 0.01: 0.80, 0.03: 0.795, 0.1: 0.60, 0.3: math.nan}
    assert pick(aps) == 0.03  # 0.795 >= 0.80 - 0.01; 0.1 is too far below; 0.3 diverged
    assert pick(aps, tolerance=0.0) == 0.01
    assert pick({0.01: 0.5, 0.1: 0.5}) == 0.1  # a tie goes to the larger step
    with pytest.raises(ValueError, match="diverged"):
        pick({0.1: math.nan, 0.3: math.nan})


def test_choice_iterations_are_500_at_most_the_run() -> None:
    assert choice_iterations(5000) == 500
    assert choice_iterations(400) == 400


def test_a_step_that_cannot_move_and_one_that_blows_up_lose_to_a_sane_one() -> None:
    """Known answer: on rows that one unit separates, 1e-7 leaves the random initial model
    where it is, 1e4 throws it far past any sensible weights (or to non-finite values), and 0.1
    learns the boundary in 200 steps: the rule must pick 0.1."""
    x, y = separable(500, seed=0)
    data = Dataset("array", x, y, x[:10], y[:10], "unused")
    settings = resolve_and_check(TrainConfig(dataset="csv", nodes=2, iterations=200, threads=1,
                                             lr="auto", standardize=False))  # fmt: skip
    choice = choose_lr(settings, data, run_candidates, candidates=(1e-7, 0.1, 1e4))
    assert choice.lr == 0.1, choice.aps
    assert choice.aps[0.1] > 0.9 and choice.iterations == 200 and choice.seconds > 0


def test_choice_rows_never_hold_test_rows() -> None:
    x, y = separable(300, seed=1)
    test_x = np.full((50, 4), np.nan, dtype=np.float32)  # a choice that read them would fail
    data = Dataset("array", x, y, test_x, np.zeros(50, dtype=np.int64), "test")
    rows, described = choice_rows(data, seed=0)
    assert len(rows.y_train) + len(rows.y_test) == 300 and "training rows" in described
    assert np.isfinite(rows.x_test).all() and rows.final_test is None
    assert rows.y_test.mean() == pytest.approx(y.mean(), abs=0.02)  # stratified


def test_tables_default_to_auto_and_the_papers_sets_keep_their_step_sizes() -> None:
    table = resolve_config(TrainConfig(dataset="csv"))
    assert table.lr == "auto" and table.iterations == 5000
    assert resolve_config(TrainConfig(dataset="libsvm")).iterations == 2000
    assert resolve_config(TrainConfig(dataset="w7a")).iterations == 10000
    assert resolve_config(TrainConfig(dataset="w7a")).lr == 0.01
    assert resolve_config(TrainConfig(dataset="digits")).lr == 0.05
    assert resolve_config(TrainConfig(dataset="libsvm")).lr == 0.01
    assert resolve_config(TrainConfig(dataset="mnist")).lr == 0.01
    assert resolve_config(TrainConfig(dataset="csv", lr=0.2)).lr == 0.2


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("lr_auto")
    train_path = write_table(root / "train.csv", *separable(400, seed=2))
    test = write_table(root / "test.csv", *separable(200, seed=3))
    flipped = write_table(root / "flipped.csv", *separable(200, seed=3, flip=True))
    return train_path, test, flipped


def run_flags(train_path: Path, test: Path, out: Path) -> list[str]:
    return ["train", "--dataset", "csv", "--train", str(train_path), "--test", str(test),
            "--label-column", "label", "--positive-label", "1", "--nodes", "2", "--lr", "auto",
            "--out", str(out), *ITERATIONS]  # fmt: skip


def without_seconds(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "seconds"}


@pytest.fixture(scope="module")
def simulated(tables, tmp_path_factory) -> tuple[dict, str]:
    """The simulator's ``--lr auto`` run on the tables (its summary and what it printed), made
    once for the tests that read it (the record, the distributed engine's choice)."""
    train_path, test, _ = tables
    out = tmp_path_factory.mktemp("simulated") / "sim"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(run_flags(train_path, test, out)) == 0
    return json.loads((out / "summary.json").read_text()), printed.getvalue()


def test_cli_records_the_choice_and_never_reads_the_test_rows(tables, simulated, tmp_path):
    train_path, _, flipped = tables
    summary, printed = simulated
    assert "--lr auto: lr " in printed and "the choice took" in printed
    choice = summary["lr_choice"]
    assert summary["config"]["lr"] == choice["lr"] and choice["lr"] in CANDIDATES
    assert set(choice["candidates"]) == {f"{c:g}" for c in CANDIDATES}
    assert "training rows" in choice["rows"] and choice["seconds"] > 0
    # The same training file with a test file whose labels are flipped: the same choice.
    assert main(run_flags(train_path, flipped, tmp_path / "b")) == 0
    other = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert without_seconds(other["lr_choice"]) == without_seconds(choice)
    assert other["test_ap"] != summary["test_ap"]  # the test rows did change the test AP


def test_validation_rows_score_the_candidates(tables, tmp_path) -> None:
    train_path, test, _ = tables
    flags = [*run_flags(train_path, test, tmp_path / "v"), "--validation-fraction", "0.25"]
    assert main(flags) == 0
    choice = json.loads((tmp_path / "v" / "summary.json").read_text())["lr_choice"]
    assert choice["rows"] == "the validation rows"


def test_explicit_auto_is_refused_with_per_party_files(tables, tmp_path, capsys) -> None:
    train_path, test, _ = tables
    for rank in (0, 1):
        (tmp_path / f"train{rank}.csv").write_text(train_path.read_text())
        (tmp_path / f"test{rank}.csv").write_text(test.read_text())
    flags = run_flags(tmp_path / "train{rank}.csv", tmp_path / "test{rank}.csv", tmp_path / "p")
    assert main(flags) == 2
    assert "--lr auto scores step sizes on rows of the whole table" in capsys.readouterr().err


@pytest.mark.processes
def test_the_distributed_engine_uses_the_simulators_choice(tables, simulated, tmp_path) -> None:
    train_path, test, _ = tables
    simulated, _ = simulated
    command = [sys.executable, "-m", "slate", *run_flags(train_path, test, tmp_path / "dist"),
               "--engine", "distributed", "--timeout", "30"]  # fmt: skip
    done = run_command(command, timeout=240)
    assert done.returncode == 0, done.stderr
    distributed = json.loads((tmp_path / "dist" / "summary.json").read_text())
    assert distributed["engine"] == "distributed"
    assert without_seconds(distributed["lr_choice"]) == without_seconds(simulated["lr_choice"])
    assert distributed["config"]["lr"] == simulated["config"]["lr"]
    assert distributed["test_ap"] == pytest.approx(simulated["test_ap"], abs=1e-4)


def test_the_choice_reads_the_table_once(tables, monkeypatch) -> None:
    import slate.data.sources as sources

    reads = []
    original = sources.read_whole

    def counted(*args, **kwargs):
        reads.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(sources, "read_whole", counted)
    train_path, test, _ = tables
    config = TrainConfig(
        dataset="csv", train=str(train_path), test=str(test), nodes=2, label_column="label",
        positive_label="1", iterations=20, threads=1,
    )  # fmt: skip
    summary = train(config, write=False, progress=False, log=lambda _: None).summary
    assert summary["lr_choice"]["iterations"] == 20 and len(reads) == 1


def test_the_estimator_accepts_auto() -> None:
    """The estimator's ``lr="auto"`` records the rule's choice (20 iterations: what is checked
    is the record, not how well the chosen step learns)."""
    from slate import SlateClassifier

    x, y = separable(400, seed=4)
    model = SlateClassifier(lr="auto", iterations=20, n_parties=2, threads=1).fit(x, y)
    assert model.lr_ in CANDIDATES and model.lr_choice_["lr"] == model.lr_
    assert "training rows" in model.lr_choice_["rows"]
    assert SlateClassifier().lr == 0.01  # the estimator's default is unchanged
