"""``--validation-fraction`` and ``--early-stopping``: the model is chosen without the test set.

References: an audit of every file the run opens (the test file only after the last training
step), ``slate evaluate`` on the saved model (the exact AP of the test file), and the validation
split recomputed with the one split function.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slate.cli import main
from slate.config import TrainConfig
from slate.data.parts import hold_out
from slate.data.readers import files
from slate.data.readers.delimited import read_table
from slate.training.loop import train
from slate.training.run import Run


def _write(path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lines = ["a,b,city,y"]
    for _ in range(rows):
        y = int(rng.random() < 0.15)
        lines.append(f"{rng.normal() + y:.4f},{rng.normal() * 3:.3f},"
                     f"{rng.choice(['x', 'y', 'z'])},{y}")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def audit(monkeypatch):
    """Every data file opened, and every chunk of training steps, in order."""
    return _audit(monkeypatch)


def _audit(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """Patches that record every data file opened and every chunk of training steps."""
    events: list[tuple[str, object]] = []
    opened = files.open_data_file
    advance = Run.advance

    def open_data_file(name):
        events.append(("open", str(name)))
        return opened(name)

    def step(run, steps):
        events.append(("steps", run.iteration))
        return advance(run, steps)

    for module in ("slate.data.readers.files", "slate.data.readers.text_records",
                   "slate.data.readers.libsvm"):  # fmt: skip
        monkeypatch.setattr(f"{module}.open_data_file", open_data_file, raising=False)
    monkeypatch.setattr(Run, "advance", step)
    return events


def _config(tmp_path, **kw):
    defaults = dict(
        dataset="csv", label_column="y", positive_label="1", nodes=3, iterations=600, lr=0.01,
        eval_every=50, validation_fraction=0.25, early_stopping=3, threads=1, party_ap=False,
        out=str(tmp_path / "run"),
    )  # fmt: skip
    return TrainConfig(**{**defaults, **kw})


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    """One audited run of 100 iterations on 600 training rows (25% held for validation) and a
    300-row test file, shared by the three tests below that read different things from the
    same run: the files it opened and its final test scorings, its saved model, its validation
    split. (100 iterations, not 600: neither length stops early, and what these tests read
    depends on the files and the split, not on how long it trains.)"""
    tmp_path = tmp_path_factory.mktemp("one_run")
    _write(tmp_path / "train.csv", 600, 0)
    _write(tmp_path / "test.csv", 300, 1)
    finals: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        events = _audit(patch)
        use_final_test = Run.use_final_test
        patch.setattr(Run, "use_final_test", lambda run: (finals.append(1),
                      use_final_test(run))[1])  # fmt: skip
        config = _config(tmp_path, train=str(tmp_path / "train.csv"),
                         test=str(tmp_path / "test.csv"), iterations=100)  # fmt: skip
        result = train(config, progress=False, figures=False, log=lambda _: None)
    return tmp_path, result, events, finals


def test_the_test_file_is_read_after_training_and_scored_once(one_run):
    _, result, audit, finals = one_run
    summary = result.summary
    opens = [
        i for i, (kind, name) in enumerate(audit) if kind == "open" and name.endswith("/test.csv")
    ]
    steps = [i for i, (kind, _) in enumerate(audit) if kind == "steps"]
    assert len(opens) == 1 and opens[0] > max(steps)
    assert finals == [1]
    assert summary["n_validation"] == 150 and summary["n_test"] == 300


def test_evaluate_agrees_with_the_summary(one_run, capsys):
    tmp_path, result, _, _ = one_run
    summary = result.summary
    capsys.readouterr()
    assert main(["evaluate", "--run", str(tmp_path / "run"), "--data",
                 str(tmp_path / "test.csv"), "--json"]) == 0  # fmt: skip
    measured = json.loads(capsys.readouterr().out)
    assert measured["ap"] == pytest.approx(summary["test_ap"], abs=1e-6)


def test_validation_rows_are_the_split_of_the_training_rows_and_nothing_else_is_fitted_on_them(
    one_run,
):
    tmp_path, result, _, _ = one_run
    table = read_table(tmp_path / "train.csv", "y", "1")
    kept, held = hold_out(table.y, 0.25, 0, "t", "--validation-fraction")
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())["preprocessing"]
    assert saved["means"]["a"] == pytest.approx(float(table.numeric["a"][kept].mean()), rel=1e-12)
    assert result.summary["n_train"] == len(kept) and result.summary["n_validation"] == len(held)


def test_early_stopping_keeps_the_best_validation_model(tmp_path):
    _write(tmp_path / "train.csv", 1200, 0)  # about 45 validation positives: no smoothing
    _write(tmp_path / "test.csv", 300, 1)
    config = _config(tmp_path, train=str(tmp_path / "train.csv"), test=str(tmp_path / "test.csv"))
    result = train(config, progress=False, figures=False, log=lambda _: None)
    assert result.summary["early_stopping_smoothed"] is False
    aps = [(r["test_ap"], r["iteration"]) for r in result.history]  # validation APs
    best_ap, best_at = max(aps, key=lambda pair: (pair[0], -pair[1]))
    summary = result.summary
    assert summary["model_iteration"] == best_at and summary["validation_ap"] == best_ap
    if summary["stopped_early_at"] is not None:
        assert summary["stopped_early_at"] == best_at + 3 * 50
    header = (tmp_path / "run" / "history.csv").read_text().splitlines()[0]
    assert "validation_ap" in header and "test_ap" not in header


def test_on_few_validation_positives_early_stopping_smooths_and_never_keeps_iteration_0(
    tmp_path,
):
    """On 4-6 validation positives the validation AP is noisy enough that an unsmoothed choice
    kept the untrained model; the choice is smoothed and never keeps iteration 0."""
    _write(tmp_path / "train.csv", 160, 3)  # about 6 validation positives
    _write(tmp_path / "test.csv", 300, 1)
    lines: list[str] = []
    config = _config(tmp_path, train=str(tmp_path / "train.csv"), test=str(tmp_path / "test.csv"),
                     nodes=1)  # fmt: skip
    result = train(config, progress=False, figures=False, log=lines.append)
    summary = result.summary
    assert summary["early_stopping_smoothed"] is True
    assert sum("validation positives (fewer than 30)" in line for line in lines) == 1
    # The brute-force choice: the mean of the last 3 validation APs, iteration 0 excluded.
    aps = [r["test_ap"] for r in result.history]
    means = [(sum(aps[max(0, k - 2) : k + 1]) / len(aps[max(0, k - 2) : k + 1]), -k)
             for k in range(1, len(aps))]  # fmt: skip
    best = -max(means)[1]
    assert summary["model_iteration"] == result.history[best]["iteration"] != 0


def test_per_party_files_read_their_test_files_after_training(tmp_path, audit):
    """Each party's test file is opened once, after the last training step (100 iterations:
    the order of the reads does not depend on how long it trains)."""
    for rank in range(3):
        _write(tmp_path / f"train{rank}.csv", 300, rank)
        _write(tmp_path / f"test{rank}.csv", 150, 10 + rank)
    config = _config(tmp_path, train=str(tmp_path / "train{rank}.csv"),
                     test=str(tmp_path / "test{rank}.csv"), iterations=100)  # fmt: skip
    summary = train(config, progress=False, figures=False, log=lambda _: None).summary
    opens = [
        i for i, (kind, name) in enumerate(audit)
        if kind == "open" and Path(name).name.startswith("test")
    ]  # fmt: skip
    steps = [i for i, (kind, _) in enumerate(audit) if kind == "steps"]
    assert len(opens) == 3 and min(opens) > max(steps)
    assert summary["n_test"] == 450 and summary["evaluation"] == "federated"


def test_early_stopping_without_validation_is_refused(capsys):
    assert main(["train", "--early-stopping", "3", "--no-progress"]) == 2
    assert "--early-stopping needs --validation-fraction" in capsys.readouterr().err


def test_summary_describes_the_test_rows_not_the_validation_rows(tmp_path):
    """With --validation-fraction, summary.json's test_split (and the PR curve's title, made
    from it) describes the test rows the AP was computed on, never the validation split. (100
    iterations each, not 600: the text depends on the split alone, not on how long it trains.)"""
    _write(tmp_path / "train.csv", 600, 0)
    _write(tmp_path / "test.csv", 300, 1)
    for rank in range(3):
        _write(tmp_path / f"train{rank}.csv", 300, rank)
    cases = {
        "a test file": (dict(test=str(tmp_path / "test.csv")), f"test file {tmp_path}/test.csv"),
        "a test split": ({}, "seeded stratified 25% split of"),
        "own files": (dict(train=str(tmp_path / "train{rank}.csv")),
                      "seeded stratified split of each party's own file"),
    }  # fmt: skip
    for name, (flags, expected) in cases.items():
        config = _config(tmp_path / name, iterations=100,
                         **{"train": str(tmp_path / "train.csv"), **flags})  # fmt: skip
        summary = train(config, progress=False, figures=False, log=lambda _: None).summary
        assert expected in summary["test_split"], (name, summary["test_split"])
        assert "validation" not in summary["test_split"], name
        assert summary["n_validation"] > 0
