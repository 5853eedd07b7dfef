"""Real-world tables end to end: IDs, text categories, missing cells and raw scales."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from slate.config import TrainConfig
from slate.errors import ConfigError
from slate.training.loop import train
from tests.sites import slate_here

N_ROWS = 3000


def messy_table(seed: int = 0, rows: int = N_ROWS) -> dict[str, list]:
    """A hospital-style table: an ID, two text categoricals, raw scales from 1 to 1e6, 2%
    missing cells in three columns written as '', 'NA' and '?', labels pos/neg."""
    rng = np.random.default_rng(seed)
    age = rng.uniform(20, 90, rows)
    income = np.exp(rng.uniform(np.log(1e3), np.log(1e6), rows))
    visits = rng.integers(1, 40, rows).astype(float)
    sex = rng.choice(["M", "F"], rows)
    smoker = rng.choice(["yes", "no"], rows, p=[0.3, 0.7])
    score = 0.06 * (age - 55) - 0.8 * (np.log10(income) - 4.5) + 1.2 * (smoker == "yes")
    label = np.where(score + rng.normal(0, 0.7, rows) > 2.0, "pos", "neg")
    table = {
        "pid": [str(1000 + k) for k in range(rows)],
        "age": [f"{v:.1f}" for v in age],
        "income": [f"{v:.2f}" for v in income],
        "visits": [f"{v:.0f}" for v in visits],
        "sex": list(sex),
        "smoker": list(smoker),
        "y": list(label),
    }
    for column, token in (("age", ""), ("income", "NA"), ("smoker", "?")):
        for k in rng.choice(rows, int(0.02 * rows), replace=False):
            table[column][k] = token
    return table


def write(path: Path, table: dict[str, list], order: list[str] | None = None) -> Path:
    names = order or list(table)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(names)
        writer.writerows(zip(*(table[c] for c in names), strict=True))
    return path


def cleaned_by_hand(train: dict, test: dict) -> tuple[np.ndarray, np.ndarray]:
    """The same encoding written out with numpy: mean imputation plus indicators, one-hot
    (sorted categories, a missing category), z-scores of the numeric columns."""

    def numbers(table, c):
        return np.array([float(v) if v not in ("", "NA", "?") else np.nan for v in table[c]])

    numeric = ["age", "income", "visits"]
    means = {c: np.nanmean(numbers(train, c)) for c in numeric}

    def encode(table):
        cols = [np.where(np.isnan(numbers(table, c)), means[c], numbers(table, c)) for c in numeric]
        cols += [np.isnan(numbers(table, c)).astype(float) for c in ("age", "income")]
        for c, cats in (("sex", ["F", "M"]), ("smoker", ["no", "yes", "?"])):
            cols += [np.array([v == cat for v in table[c]], dtype=float) for cat in cats]
        return np.column_stack(cols)

    x_train, x_test = encode(train), encode(test)
    mu, sd = x_train[:, :3].mean(0), x_train[:, :3].std(0)
    x_train[:, :3] = (x_train[:, :3] - mu) / sd
    x_test[:, :3] = (x_test[:, :3] - mu) / sd
    return x_train, x_test


COMMON = dict(dataset="csv", label_column="y", positive_label="pos", nodes=4, iterations=600,
              batch_size=20, positives=4, lr=0.05, seed=0)  # fmt: skip


def run(tmp_path, name, **flags):
    return train(TrainConfig(**{**COMMON, **flags}), write=False, progress=False,
                 log=lambda _: None).summary  # fmt: skip


def test_messy_table_trains_like_the_hand_cleaned_one(tmp_path):
    train_t, test_t = messy_table(0), messy_table(1, rows=2000)
    # 200 iterations, not COMMON's 600: both tables' test APs are equal to the last digit for
    # seeds 0, 1 and 2 (0.793, 0.805, 0.800 against a bound of 0.54), measured here, as at 600
    # (0.800, 0.809, 0.810).
    messy = run(tmp_path, "messy", train=str(write(tmp_path / "tr.csv", train_t)),
                test=str(write(tmp_path / "te.csv", test_t)), id_columns=("pid",),
                iterations=200)  # fmt: skip
    x_train, x_test = cleaned_by_hand(train_t, test_t)
    clean = {}
    for split, x, t in (("train", x_train, train_t), ("test", x_test, test_t)):
        path = tmp_path / f"clean_{split}.csv"
        names = [f"f{j}" for j in range(x.shape[1])]
        rows = [[*map(repr, r), lab] for r, lab in zip(x.tolist(), t["y"], strict=True)]
        with open(path, "w", newline="") as handle:
            csv.writer(handle).writerows([[*names, "y"], *rows])
        clean[split] = str(path)
    by_hand = run(tmp_path, "clean", train=clean["train"], test=clean["test"], standardize=False,
                  iterations=200)  # fmt: skip
    assert messy["test_ap"] > 3 * float(np.mean(np.array(test_t["y"]) == "pos"))
    assert abs(messy["test_ap"] - by_hand["test_ap"]) <= 0.02
    encoding = messy["preprocessing"]
    assert encoding["numeric"] == ["age", "income", "visits"]
    assert encoding["indicators"] == ["age", "income"]
    assert encoding["categories"] == {"sex": ["F", "M"], "smoker": ["no", "yes", "<missing>"]}
    assert encoding["id_columns"] == ["pid"]
    assert encoding["imputed_cells"] == {"age": 60, "income": 60}


def test_columns_in_another_order_give_the_same_ap(tmp_path):
    train_t, test_t = messy_table(0, rows=1200), messy_table(1, rows=800)
    train_path = str(write(tmp_path / "tr.csv", train_t))
    ordered = run(tmp_path, "a", train=train_path, iterations=100, id_columns=("pid",),
                  test=str(write(tmp_path / "te.csv", test_t)))  # fmt: skip
    shuffled = ["smoker", "y", "income", "pid", "sex", "visits", "age"]
    reordered = run(tmp_path, "b", train=train_path, iterations=100, id_columns=("pid",),
                    test=str(write(tmp_path / "te2.csv", test_t, shuffled)))  # fmt: skip
    assert reordered["test_ap"] == pytest.approx(ordered["test_ap"], abs=1e-9)


def test_a_test_file_without_a_training_column_is_refused_by_name(tmp_path):
    train_t, test_t = messy_table(0, rows=600), messy_table(1, rows=300)
    del test_t["visits"]
    with pytest.raises(Exception, match="visits"):
        run(tmp_path, "x", train=str(write(tmp_path / "tr.csv", train_t)), iterations=10,
            test=str(write(tmp_path / "te.csv", test_t)), id_columns=("pid",))  # fmt: skip


def test_raw_scales_without_standardising_warn_that_the_model_is_not_learning(tmp_path):
    rng = np.random.default_rng(0)
    rows = 1500
    income = rng.uniform(1e4, 1e6, rows)
    age = rng.uniform(20, 90, rows)
    y = (income / 1e6 + rng.normal(0, 0.2, rows) > 0.9).astype(int)
    path = tmp_path / "raw.csv"
    path.write_text("income,age,y\n" + "".join(
        f"{a:.2f},{b:.1f},{t}\n" for a, b, t in zip(income, age, y, strict=True)))  # fmt: skip
    flags = dict(train=str(path), positive_label="1", iterations=200, lr=0.05)
    lines: list[str] = []
    raw = train(TrainConfig(**{**COMMON, **flags, "standardize": False}), write=False,
                progress=False, log=lines.append).summary  # fmt: skip
    assert raw["learning_warning"] and "not learning" in raw["learning_warning"]
    assert sum("not learning" in line for line in lines) == 1
    scaled = run(tmp_path, "s", **flags)  # standardised by default
    assert scaled["learning_warning"] is None
    assert scaled["test_ap"] > 2 * float(y.mean())


def test_an_id_like_column_is_warned_about(tmp_path):
    path = write(tmp_path / "t.csv", messy_table(0, rows=600))
    lines: list[str] = []
    train(TrainConfig(**{**COMMON, "train": str(path), "iterations": 5}), write=False,
          progress=False, log=lines.append)  # fmt: skip
    assert any("column 'pid'" in line and "looks like a row ID" in line for line in lines)


def test_out_under_a_file_is_refused_before_loading(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        train(TrainConfig(dataset="csv", train="never-read.csv", label_column="y",
                          positive_label="1", out=str(blocker / "run")))  # fmt: skip
    done = slate_here("train", "--dataset", "csv", "--train", "missing.csv", "--label-column",
                      "y", "--positive-label", "1", "--out", str(blocker / "run"))  # fmt: skip
    assert done.returncode == 2
    assert "is a file, not a folder" in done.stderr and "Traceback" not in done.stderr


def test_summary_reports_load_time_and_one_party(tmp_path):
    path = write(tmp_path / "t.csv", messy_table(0, rows=400))
    lines: list[str] = []
    result = train(TrainConfig(**{**COMMON, "train": str(path), "iterations": 5, "nodes": 1,
                                  "id_columns": ("pid",), "out": str(tmp_path / "r")}),
                   progress=False, figures=False, log=lines.append)  # fmt: skip
    assert result.summary["load_seconds"] > 0
    assert any("on 1 party (" in line for line in lines)
    assert any("data loaded in" in line for line in lines)
    saved = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert saved["preprocessing"]["kind"] == "table"


def test_the_standardise_hint_is_not_given_to_a_standardised_run(tmp_path):
    """The not-learning warning never says "try --standardize" to a run that standardises
    already; it suggests a lower --lr instead."""
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (800, 3))
    y = (x[:, 0] + rng.normal(0, 0.5, 800) > 1.2).astype(int)
    path = tmp_path / "t.csv"
    path.write_text("a,b,c,y\n" + "".join(
        f"{a:.3f},{b:.3f},{c:.3f},{t}\n" for (a, b, c), t in zip(x, y, strict=True)))  # fmt: skip
    flags = dict(train=str(path), positive_label="1", iterations=100, lr=1e4)
    scaled = run(tmp_path, "big-lr", **flags)  # standardised by default; scores saturate
    assert "saturated" in scaled["learning_warning"]
    assert "--standardize" not in scaled["learning_warning"]
    assert "lower --lr than 10000" in scaled["learning_warning"]


def test_the_load_time_counts_reading_the_file_when_n_is_chosen_from_it(tmp_path, monkeypatch):
    """With N chosen from the positives, the table is read before the run starts; the load time
    printed still counts that reading (not "data loaded in 0.0 s")."""
    import time

    from slate.cli import main
    from slate.data import whole as sources

    read = sources._read_csv_files

    def slow_read(*args, **kwargs):
        time.sleep(0.6)
        return read(*args, **kwargs)

    monkeypatch.setattr(sources, "_read_csv_files", slow_read)
    path = write(tmp_path / "t.csv", messy_table(0, rows=600))
    out = tmp_path / "run"
    code = main(["train", "--dataset", "csv", "--train", str(path), "--label-column", "y",
                 "--positive-label", "pos", "--id-column", "pid", "--iterations", "5",
                 "--no-progress", "--no-plots", "--out", str(out)])  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nodes"] >= 1 and summary["load_seconds"] >= 0.6
