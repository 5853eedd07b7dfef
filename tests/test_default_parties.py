"""A user's own small file without ``--nodes``: N follows its positives, the largest N <= 20
whose stratified parties each hold ``b`` training positives (slate.training.plan)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from slate.cli import main
from slate.config import TrainConfig
from slate.training.configuration import resolve_and_check
from slate.training.plan import choose_parties, whole_rows


def _write(path, rows: int, positives: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    y = np.zeros(rows, dtype=int)
    y[rng.choice(rows, positives, replace=False)] = 1
    lines = ["a,b,y"] + [f"{rng.normal() + t:.4f},{rng.normal():.4f},{t}" for t in y]
    path.write_text("\n".join(lines) + "\n")


def test_a_table_with_17_positives_trains_with_its_default_flags(tmp_path, capsys):
    _write(tmp_path / "small.csv", 400, 17)
    out = tmp_path / "run"
    code = main(["train", "--dataset", "csv", "--train", str(tmp_path / "small.csv"),
                 "--label-column", "y", "--positive-label", "1", "--iterations", "200",
                 "--no-progress", "--no-plots", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr()
    assert code == 0, printed.err
    summary = json.loads((out / "summary.json").read_text())
    # 13 of the 17 positives land in the 75% training part: 6 parties of b = 2 each.
    assert summary["nodes"] == 13 // 2
    assert "running N = 6" in printed.out and "--nodes N overrides" in printed.out


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (TrainConfig(dataset="csv", nodes=4), None),  # given by the user
        (TrainConfig(dataset="digits"), None),  # a named dataset keeps its preset
    ],
)
def test_the_default_applies_only_to_own_files_without_nodes(config, expected):
    """No rows are read for N, and N is the flags' (4 given; the digits preset's 8)."""
    resolved = resolve_and_check(config)
    assert whole_rows(resolved, from_data=True) is expected
    assert choose_parties(resolved, None, from_data=True) == resolved.flags.nodes


def test_enough_positives_keep_twenty_parties_without_a_note(tmp_path):
    _write(tmp_path / "big.csv", 2000, 300)
    config = TrainConfig(dataset="csv", train=str(tmp_path / "big.csv"), label_column="y",
                         positive_label="1")  # fmt: skip
    resolved = resolve_and_check(config)
    data, notes = whole_rows(resolved, from_data=True), []
    nodes = choose_parties(resolved, data, from_data=True, log=notes.append)
    assert nodes == 20 and notes == [] and int(data.y_train.sum()) == 225
