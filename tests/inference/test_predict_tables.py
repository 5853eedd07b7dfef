"""slate predict / evaluate / export on a CSV run: features by header name, ID columns carried,
the label column optional, a missing column refused, the exported program's in-graph imputation.

The run folder is written as a CSV run writes it (describe_run with a fitted TableEncoder), and the
CSV reader (slate.data.readers.delimited.read_table) is replaced by in-memory tables with the
RawTable fields, so that these tests pin down predict's part; the last test runs real files end to
end.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from slate.cli import main
from slate.config import TrainConfig, resolve_config
from slate.data.encoding import ColumnChoice, TableEncoder
from slate.data.readers.delimited import RawTable
from slate.inference.model_file import describe_run, load_model, save_model
from slate.models import build_model

NAN = float("nan")


def table(path: str = "t.csv", y=None, **columns) -> RawTable:
    """Numbers (NaN = missing) or lists of strings (None = missing) per column."""
    return RawTable.from_columns(path, y, **columns)


TRAIN = dict(
    id=[101.0, 102.0, 103.0, 104.0, 105.0, 106.0],
    age=[20.0, NAN, 40.0, 61.5, 33.0, 50.0],
    city=["a", "b", None, "a", "c", "b"],
    income=[1e5, 2e5, 3.5e5, 4e5, 1.2e5, 9e4],
)


@pytest.fixture
def csv_run(tmp_path, monkeypatch):
    """A CSV run folder and a reader serving in-memory tables by path."""
    encoder = TableEncoder.fit(
        [table("train.csv", y=[0, 1, 0, 1, 0, 0], **TRAIN)], ColumnChoice(id_columns=("id",)), True
    )
    config = resolve_config(
        TrainConfig(dataset="csv", label_column="fraud", positive_label="yes", hidden=6,
                    id_columns=("id",))
    )  # fmt: skip
    model = build_model("mlp", (encoder.width,), hidden=6, seed=1)
    run = tmp_path / "run"
    run.mkdir()
    save_model(run, model, describe_run(config, (encoder.width,), encoder))
    files: dict[str, RawTable] = {}

    def read(options, path, labels="required", empty_ok=False):
        assert options.label_column == "fraud" and options.positive_label == "yes"
        assert labels in ("optional", "single_class_ok")
        return files[str(path)]

    def read_chunks(options, path, labels="optional", *_, **__):
        return iter([read(options, path, labels)])

    monkeypatch.setattr("slate.data.options.TableOptions.read", read)
    monkeypatch.setattr("slate.data.options.TableOptions.read_chunks", read_chunks)
    return run, files, encoder


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_predict_matches_by_name_carries_ids_and_needs_no_label(csv_run, tmp_path):
    run, files, encoder = csv_run
    new = dict(
        income=[5e4, NAN, 3e5],
        city=["c", "zzz", None],
        id=[7.0, 8.0, 9.0],
        age=[NAN, 25.0, 70.0],
        note=["x", "y", "z"],
    )  # fmt: skip  (other column order, an extra column, no label column)
    files["new.csv"] = table("new.csv", **new)
    out = tmp_path / "scores.csv"
    assert main(["predict", "--run", str(run), "--data", "new.csv", "--out", str(out)]) == 0
    rows = _rows(out)
    assert list(rows[0]) == ["id", "score"]
    assert [r["id"] for r in rows] == ["7", "8", "9"]
    model, _ = load_model(run)
    with torch.no_grad():
        expected = torch.sigmoid(model(torch.from_numpy(encoder.transform(files["new.csv"]))))
    np.testing.assert_allclose([float(r["score"]) for r in rows], expected.numpy(), atol=1e-6)


def test_a_missing_feature_column_is_a_clear_error(csv_run, capsys):
    run, files, _ = csv_run
    partial = {k: v for k, v in TRAIN.items() if k != "income"}
    files["partial.csv"] = table("partial.csv", **partial)
    for command in ("predict", "evaluate"):
        assert main([command, "--run", str(run), "--data", "partial.csv"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("slate: error: partial.csv lacks the columns ['income']")
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_evaluate_a_labelled_table(csv_run, capsys):
    import json

    run, files, _ = csv_run
    files["test.csv"] = table("test.csv", y=[1, 0, 0, 1, 0, 1], **TRAIN)
    assert main(["evaluate", "--run", str(run), "--data", "test.csv", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rows"] == 6 and result["positive_rate"] == 0.5
    files["unlabelled.csv"] = table("unlabelled.csv", **TRAIN)
    assert main(["evaluate", "--run", str(run), "--data", "unlabelled.csv"]) == 2
    assert "holds no labels" in capsys.readouterr().err


def test_exported_table_program_imputes_and_scales_inside(csv_run, tmp_path):
    run, files, _ = csv_run
    files["new.csv"] = table(
        "new.csv", age=[NAN, 25.0, 70.0, 33.0], income=[5e4, NAN, 3e5, 1e5],
        city=["c", "zzz", None, "a"], id=[1.0, 2.0, 3.0, 4.0],
    )  # fmt: skip
    scores = tmp_path / "scores.csv"
    assert main(["predict", "--run", str(run), "--data", "new.csv", "--out", str(scores)]) == 0
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "t.pt2")]) == 0
    _, pre = load_model(run)
    raw = torch.from_numpy(pre.raw_table(files["new.csv"]))
    assert torch.isnan(raw).any()  # missing cells go in as NaN and are imputed in the graph
    extra = {"slate.json": ""}
    program = torch.export.load(tmp_path / "t.pt2", extra_files=extra).module()
    with torch.no_grad():
        got = program(raw).numpy()
    want = np.array([float(r["score"]) for r in _rows(scores)])
    assert np.abs(got - want).max() <= 1e-6
    import json

    sidecar = json.loads(extra["slate.json"])
    assert sidecar["input_columns"] == pre.raw_columns
    assert sidecar["input_columns"][:2] == ["age", "income"]


def test_csv_end_to_end_with_real_files(tmp_path, capsys):
    """Train on a real CSV, then predict on a file without the label column whose columns come
    in another order, and on one that lacks a feature column."""
    from slate.training.loop import train

    rng = np.random.default_rng(0)
    n = 400
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    y = (x1 + 0.5 * x2 + rng.normal(scale=0.5, size=n) > 1.2).astype(int)
    lines = ["row,x1,x2,fraud"] + [
        f"{k},{a:.4f},{b:.4f},{'yes' if t else 'no'}"
        for k, (a, b, t) in enumerate(zip(x1, x2, y, strict=True))
    ]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    config = TrainConfig(
        dataset="csv", train=str(tmp_path / "train.csv"), label_column="fraud",
        positive_label="yes", id_columns=("row",), nodes=2, iterations=20, threads=1,
        party_ap=False, out=str(tmp_path / "run"),
    )  # fmt: skip
    threads = torch.get_num_threads()
    try:
        train(config, progress=False, figures=False, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    (tmp_path / "new.csv").write_text("x2,row,x1\n0.5,1,2.0\n-1.0,2,0.1\n")
    out = tmp_path / "scores.csv"
    assert main(["predict", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "new.csv"),
                 "--out", str(out)]) == 0  # fmt: skip
    assert [r["row"] for r in _rows(out)] == ["1", "2"]
    (tmp_path / "short.csv").write_text("row,x1\n1,2.0\n")
    capsys.readouterr()
    assert (
        main(["predict", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "short.csv")])
        == 2
    )
    err = capsys.readouterr().err
    assert "x2" in err and "Traceback" not in err


@pytest.fixture
def abalone_like_run(tmp_path):
    """A run trained on real files with a text column (sex) and numeric ones."""
    from slate.training.loop import train

    rng = np.random.default_rng(1)
    n = 300
    lines = ["sex,length,weight,rings"]
    for _ in range(n):
        sex, length = rng.choice(["M", "F", "I"]), rng.normal()
        lines.append(f"{sex},{length:.4f},{rng.normal():.4f},{'old' if length > 0.8 else 'young'}")
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    config = TrainConfig(
        dataset="csv", train=str(tmp_path / "train.csv"), label_column="rings",
        positive_label="old", nodes=2, iterations=20, threads=1, party_ap=False,
        out=str(tmp_path / "run"),
    )  # fmt: skip
    threads = torch.get_num_threads()
    try:
        train(config, progress=False, figures=False, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    return tmp_path / "run"


def _predict(run, path, tmp_path, capsys):
    out = tmp_path / "scores.csv"
    capsys.readouterr()
    code = main(["predict", "--run", str(run), "--data", str(path), "--out", str(out)])
    return code, capsys.readouterr(), out


def test_predict_takes_column_kinds_from_the_model(abalone_like_run, tmp_path, capsys):
    """A one-row file with an empty text cell: the cell is <missing> (all zeros for a column
    that had no missing cell in training), never a kind error."""
    (tmp_path / "one.csv").write_text("sex,length,weight\n,0.3,0.1\n")
    code, printed, out = _predict(abalone_like_run, tmp_path / "one.csv", tmp_path, capsys)
    assert code == 0, printed.err
    (tmp_path / "same.csv").write_text("sex,length,weight\nQ,0.3,0.1\n")  # an unseen value
    _, _, other = _predict(abalone_like_run, tmp_path / "same.csv", tmp_path, capsys)
    # Neither M, F nor I: both rows are encoded alike, so they score alike.
    assert _rows(out)[0]["score"] == _rows(other)[0]["score"]


def test_predict_accepts_an_empty_label_column_and_a_header_only_file(
    abalone_like_run, tmp_path, capsys
):
    (tmp_path / "empty_label.csv").write_text("sex,length,weight,rings\nM,0.3,0.1,\nF,1.0,0.2,\n")
    code, printed, out = _predict(abalone_like_run, tmp_path / "empty_label.csv", tmp_path, capsys)
    assert code == 0, printed.err
    assert len(_rows(out)) == 2 and "have no label" in printed.out + printed.err
    (tmp_path / "header.csv").write_text("sex,length,weight\n")
    code, printed, out = _predict(abalone_like_run, tmp_path / "header.csv", tmp_path, capsys)
    assert code == 0, printed.err
    assert out.read_text().splitlines()[0].startswith("score") and _rows(out) == []


def test_a_headerless_file_is_told_the_columns_go_by_name(abalone_like_run, tmp_path, capsys):
    (tmp_path / "bare.csv").write_text("M,0.3,0.1\nF,1.0,0.2\n")
    code, printed, _ = _predict(abalone_like_run, tmp_path / "bare.csv", tmp_path, capsys)
    assert code == 2
    assert "no header row" in printed.err and "0-based index" not in printed.err
