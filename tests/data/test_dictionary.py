"""``--schema FILE``, a declared data dictionary (slate.data.dictionary): the encoding from the
file, no category gathered, unlisted values, bad files, and sites with different files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from slate.config import TrainConfig
from slate.data.dictionary import read_dictionary
from slate.data.schema import Schema, SchemaMismatch, check_agreement
from slate.data.sources import load_local_data
from slate.engines.simulator import SimulatorEngine
from slate.errors import DataError
from slate.training.agreement import RunMismatch, check_same_run, run_fingerprint
from slate.training.configuration import resolve_and_check
from slate.training.loop import train
from tests.sites import finish, free_port, slate_here, start_party

COLOURS = ("red", "green", "blue")
SIZES = ("S", "M", "L", "XL")


def write_sites(root: Path, parties: int = 3, rows: int = 60, odd: str | None = None) -> None:
    """Party n's ``root/n/train.csv`` and ``test.csv``: a numeric ``a``, text ``colour`` and
    ``size``, label ``y``; with ``odd``, party 2's 6th training row and 4th test row hold that
    colour."""
    rng = np.random.default_rng(7)
    for n in range(parties):
        for split, count in (("train", rows), ("test", rows // 2)):
            path = root / str(n) / f"{split}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = ["a,colour,size,y"]
            for i in range(count):
                colour = COLOURS[(i + n) % 3]
                if odd and n == 2 and i == (5 if split == "train" else 3):
                    colour = odd
                size = SIZES[(i * 7 + n) % 4]
                y = int(i % 4 == 0 or (colour == "red" and i % 3 == 0))
                lines.append(f"{rng.normal() * 10 + 3:.5f},{colour},{size},{y}")
            path.write_text("\n".join(lines) + "\n")


def write_schema(path: Path, **changes) -> Path:
    """A dictionary of :func:`write_sites`' files; ``changes`` replace top-level keys or, as
    ``colour=dict(...)``, keys of that column."""
    columns = {
        "a": {"name": "a", "type": "numeric"},
        "colour": {"name": "colour", "type": "text", "categories": ["red", "green", "blue"]},
        "size": {"name": "size", "type": "text", "categories": list(SIZES)},
    }
    for name in list(changes):
        if name in columns:
            columns[name].update(changes.pop(name))
    content = {"slate_schema": 1, "label": {"column": "y", "positive": "1"},
               "columns": list(columns.values()), **changes}  # fmt: skip
    path.write_text(json.dumps(content, indent=1))
    return path


def config(root: Path, schema: Path | None, **extra) -> TrainConfig:
    values = dict(
        dataset="csv", train=str(root / "{rank}" / "train.csv"),
        test=str(root / "{rank}" / "test.csv"), label_column="y", positive_label="1",
        schema=None if schema is None else str(schema), nodes=3, iterations=30,
        batch_size=10, positives=2, lr=0.1,
    )  # fmt: skip
    return TrainConfig(**{**values, **extra})


class Counting(SimulatorEngine):
    """The simulator with every set-up exchange recorded by what it says it sends."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.gathered: list[str] = []
        self.summed: list[str] = []

    def gather_json(self, items, shape, what, *limit):
        self.gathered.append(what)
        return super().gather_json(items, shape, what, *limit)

    def total(self, value, what=""):
        self.summed.append(what)
        return super().total(value, what)


def cells(path: Path, column: str) -> list[str]:
    with open(path, newline="") as f:
        return [row[column] for row in csv.DictReader(f)]


def test_the_schema_s_categories_define_the_one_hot_columns_in_its_order(tmp_path):
    write_sites(tmp_path)
    schema = write_schema(tmp_path / "schema.json", colour={"categories": ["red", "blue", "green"],
                          "missing": False}, size={"other": False})  # fmt: skip
    data = load_local_data(config(tmp_path, schema), [0, 1, 2], SimulatorEngine(3))
    encoder = data.preprocessing
    assert encoder.names == ["a", "colour=red", "colour=blue", "colour=green", "colour=<other>",
                             "size=S", "size=M", "size=L", "size=XL", "size=<missing>"]  # fmt: skip
    assert data.dictionary == read_dictionary(str(schema)).digest
    # each row's 1s are where its cells say, from the file read independently
    for n, rows in enumerate(data.parts):
        x = data.x_train[rows]
        colours = cells(tmp_path / str(n) / "train.csv", "colour")
        sizes = cells(tmp_path / str(n) / "train.csv", "size")
        expected = np.zeros((len(colours), 9), dtype=np.float32)
        for i, (c, s) in enumerate(zip(colours, sizes, strict=True)):
            expected[i, ["red", "blue", "green"].index(c)] = 1
            expected[i, 4 + SIZES.index(s)] = 1
        np.testing.assert_array_equal(x[:, 1:], expected)


def test_a_run_with_a_schema_gathers_no_category_and_without_one_it_does(tmp_path):
    write_sites(tmp_path)
    schema = write_schema(tmp_path / "schema.json")
    with_schema, without = Counting(3), Counting(3)
    load_local_data(config(tmp_path, schema), [0, 1, 2], with_schema)
    load_local_data(config(tmp_path, None), [0, 1, 2], without)
    assert "count of categories" in without.gathered  # (the test can see a gather of them)
    assert with_schema.gathered == ["schema", "report on its features"]
    assert not [w for w in with_schema.gathered + with_schema.summed if "categor" in w]


def test_declared_means_and_stds_impute_and_scale_with_nothing_summed(tmp_path):
    write_sites(tmp_path)
    schema = write_schema(tmp_path / "schema.json", a={"mean": 2.5, "std": 4.0})
    engine = Counting(3)
    data = load_local_data(config(tmp_path, schema, standardize=True), [0, 1, 2], engine)
    assert engine.summed == []  # nothing that depends on the rows is summed for the encoding
    assert engine.gathered == ["schema", "report on its features"]
    assert data.preprocessing.scaler.mean[0] == 2.5 and data.preprocessing.scaler.scale[0] == 4.0
    raw = np.array([float(v) for v in cells(tmp_path / "0" / "train.csv", "a")])
    np.testing.assert_allclose(data.x_train[data.parts[0], 0], (raw - 2.5) / 4.0, rtol=1e-6)


def test_an_unlisted_value_goes_to_other_with_a_warning_naming_the_column_and_count(tmp_path):
    write_sites(tmp_path, odd="violet")
    schema = write_schema(tmp_path / "schema.json")
    data = load_local_data(config(tmp_path, schema), [0, 1, 2], SimulatorEngine(3))
    warned = [n for n in data.notes if "'violet'" in n]
    assert len(warned) == 2, data.notes  # the training file and the test file, each once
    train_note = next(n for n in warned if "2/train.csv" in n)
    assert "1 cell of column 'colour' holds 1 value that the schema does not list" in train_note
    assert "encoded as <other>" in train_note and str(schema) in train_note
    names = data.preprocessing.names
    row = data.x_train[data.parts[2][5]]
    assert row[names.index("colour=<other>")] == 1
    assert row[[names.index(f"colour={c}") for c in COLOURS]].sum() == 0


def test_an_unlisted_value_is_refused_where_the_column_has_no_other(tmp_path):
    write_sites(tmp_path, odd="violet")
    schema = write_schema(tmp_path / "schema.json", colour={"other": False})
    with pytest.raises(DataError) as caught:
        load_local_data(config(tmp_path, schema), [0, 1, 2], SimulatorEngine(3))
    message = str(caught.value)
    assert "party 2" in message.lower() and "2/train.csv" in message
    assert "1 cell of column 'colour' holds 1 value" in message and '"other": false' in message


def test_a_schema_listing_the_union_trains_the_same_model_bit_for_bit(tmp_path):
    """A schema of every column in file order, the text columns' categories the sorted union,
    no <missing> or <other> (the data has neither): the same encoding as without a schema, so
    the same model.pt, compared bit for bit."""
    write_sites(tmp_path)
    schema = write_schema(
        tmp_path / "schema.json",
        colour={"categories": sorted(COLOURS), "missing": False, "other": False},
        size={"categories": sorted(SIZES), "missing": False, "other": False},
    )
    models = []
    for name, given in (("with", schema), ("without", None)):
        out = tmp_path / name
        train(resolve_and_check(config(tmp_path, given, out=str(out), standardize=True)),
              progress=False, figures=False, log=lambda _: None)  # fmt: skip
        models.append(torch.load(out / "model.pt", weights_only=True))
    assert models[0].keys() == models[1].keys()
    for key in models[0]:
        assert torch.equal(models[0][key], models[1][key]), key


def declared_ranges(root: Path, schema: Path | None) -> list[dict]:
    """What each of the three sites declares of its value ranges (the ``schema`` exchange)."""
    data = load_local_data(config(root, schema, standardize=True), [0, 1, 2], SimulatorEngine(3))
    return [dict(r) for r in data.declared.ranges]


def test_a_schema_range_is_declared_in_place_of_each_site_s_own(tmp_path):
    write_sites(tmp_path)
    own = [[float(v) for v in cells(tmp_path / str(n) / "train.csv", "a")] for n in range(3)]
    without = declared_ranges(tmp_path, write_schema(tmp_path / "plain.json"))
    assert without == [{"a": [min(v), max(v)]} for v in own]  # the control: each site's own
    ranged = write_schema(tmp_path / "ranged.json", a={"range": [-60, 60]})
    assert declared_ranges(tmp_path, ranged) == [{"a": [-60.0, 60.0]}] * 3
    stats = write_schema(tmp_path / "stats.json", a={"mean": 3.0, "std": 10.0})
    assert declared_ranges(tmp_path, stats) == [{}] * 3  # not summed: nothing to declare


def test_a_cell_outside_the_schema_range_stops_its_site_naming_file_column_and_value(tmp_path):
    write_sites(tmp_path)
    largest = max(float(v) for v in cells(tmp_path / "1" / "train.csv", "a"))
    lo = min(float(v) for n in range(3) for v in cells(tmp_path / str(n) / "train.csv", "a"))
    schema = write_schema(tmp_path / "schema.json", a={"range": [lo, largest - 0.5]})
    done = slate_here("train", "--dataset", "csv", "--train", tmp_path / "{rank}" / "train.csv",
                      "--test", tmp_path / "{rank}" / "test.csv", "--schema", schema,
                      "--nodes", "3", "--iterations", "5", "--no-progress",
                      "--out", tmp_path / "run")  # fmt: skip
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert f"{largest:g}" in message and "column 'a'" in message and str(schema) in message
    assert str(tmp_path / "1" / "train.csv") in message and "Party 1 " in message


def test_slate_schema_writes_a_site_s_dictionary_that_trains(tmp_path):
    write_sites(tmp_path)
    out = tmp_path / "schema.json"
    done = slate_here("schema", "--train", tmp_path / "0" / "train.csv", "--label-column", "y",
                      "--positive-label", "1", "--statistics", "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())
    a = np.array([float(v) for v in cells(tmp_path / "0" / "train.csv", "a")])
    assert written["label"] == {"column": "y", "positive": "1"}
    assert [c["name"] for c in written["columns"]] == ["a", "colour", "size"]
    numeric, colour, size = written["columns"]
    assert numeric["mean"] == pytest.approx(a.mean(), rel=1e-12)
    assert numeric["std"] == pytest.approx(a.std(), rel=1e-12)
    assert numeric["range"] == [a.min(), a.max()]
    assert colour["categories"] == sorted(set(cells(tmp_path / "0" / "train.csv", "colour")))
    assert size["categories"] == sorted(SIZES)
    again = slate_here("schema", "--train", tmp_path / "0" / "train.csv", "--label-column", "y",
                       "--positive-label", "1", "--out", out)  # fmt: skip
    assert again.returncode == 2 and "never overwrites" in again.stderr
    # the label comes from the schema where the flags leave it out
    run = slate_here("train", "--dataset", "csv", "--train", tmp_path / "{rank}" / "train.csv",
                     "--schema", out, "--nodes", "3", "--iterations", "10", "--lr", "0.1",
                     "--batch-size", "10", "--positives", "2", "--out", tmp_path / "run",
                     "--no-progress", "--no-plots")  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["label_column"] == "y" and summary["config"]["positive_label"] == "1"
    model = json.loads((tmp_path / "run" / "model.json").read_text())
    assert model["input"]["label_column"] == "y"


BAD = {
    "a missing file": (None, "does not exist"),
    "bad JSON": ('{"slate_schema": 1, "label": ', "is not valid JSON"),
    "an unknown type": ({"columns": [{"name": "a", "type": "number"}]},
                        "columns[0] ('a').type must be 'numeric' or 'text', got 'number'"),
    "no label": ({"label": None}, "'label' must be an object"),
    "a label without its positive value": ({"label": {"column": "y"}},
                                           "'label.positive' must be a non-empty string"),
    "a range with lo above hi": ({"columns": [{"name": "a", "type": "numeric", "range": [2, 1]}]},
                                 "columns[0] ('a').range must be [lo, hi]"),
    "a text column without categories": (
        {"columns": [{"name": "colour", "type": "text"}]},
        "columns[0] ('colour').categories must be a non-empty list",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_schema_file_exits_2_with_one_paragraph_naming_the_file_and_the_key(tmp_path, case):
    write_sites(tmp_path, parties=1)
    content, expected = BAD[case]
    path = tmp_path / "schema.json"
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        base = json.loads(write_schema(path).read_text())
        path.write_text(json.dumps({k: v for k, v in {**base, **content}.items()
                                    if v is not None}))  # fmt: skip
    done = slate_here("train", "--dataset", "csv", "--train", tmp_path / "0" / "train.csv",
                      "--schema", path, "--nodes", "1", "--no-progress")  # fmt: skip
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip()
    assert message.startswith("slate: error: ") and "\n" not in message, message
    assert str(path) in message and expected in message, message
    assert "Traceback" not in done.stderr


def test_a_label_flag_other_than_the_schema_s_is_refused(tmp_path):
    write_sites(tmp_path, parties=1)
    schema = write_schema(tmp_path / "schema.json")
    done = slate_here("train", "--dataset", "csv", "--train", tmp_path / "0" / "train.csv",
                      "--schema", schema, "--label-column", "a", "--positive-label", "1",
                      "--nodes", "1", "--no-progress")  # fmt: skip
    assert done.returncode == 2
    assert "--label-column 'a' differs from the schema file" in done.stderr


def test_sites_with_different_schema_files_are_named_in_the_schema_and_the_run_settings():
    """Compared first, in the schemas every site sends (before any sum), and again in the run
    settings before step 1."""
    counts = {"format": "csv", "header": ("a", "y"), "label_column": "y",
              "label_values": ("0", "1"), "positive_label": "1"}  # fmt: skip
    schemas = [Schema(rank=r, dictionary=digest, **counts)
               for r, digest in enumerate(["ab" * 32, "ab" * 32, "cd" * 32])]  # fmt: skip
    with pytest.raises(SchemaMismatch, match=r"party 2's --schema file has sha256 cdcdcd"):
        check_agreement(schemas)
    check_agreement(schemas[:2])
    flags = resolve_and_check(TrainConfig(dataset="digits", nodes=3)).flags
    prints = [(r, run_fingerprint(flags, None, None, d))
              for r, d in enumerate(["ab" * 32, "ab" * 32, None])]  # fmt: skip
    with pytest.raises(RunMismatch, match=r"party 2 has --schema None where party 0 has 'sha256"):
        check_same_run(prints)
    check_same_run(prints[:2])


@pytest.mark.processes
def test_two_sites_with_different_schema_files_stop_before_step_1_naming_the_site(tmp_path):
    for r in range(2):
        site = tmp_path / f"site{r}"
        write_sites(site, parties=1, rows=40)
        write_schema(
            site / "schema.json",
            colour={"categories": ["red", "green", "blue", *(["violet"] if r else [])]},
        )
    flags = ["--nodes", "2", "--dataset", "csv", "--train", "0/train.csv", "--test",
             "0/test.csv", "--schema", "schema.json", "--iterations", "5", "--lr", "0.1",
             "--batch-size", "10", "--positives", "2", "--out", "run", "--no-progress",
             "--timeout", "60"]  # fmt: skip
    port = free_port()
    outputs = finish([start_party(tmp_path, r, port, *flags) for r in range(2)], timeout=120)
    for code, text in outputs:
        assert code == 2, text
        assert "party 1's --schema file has sha256" in text, text
        assert "Traceback" not in text
    assert not (tmp_path / "site0" / "run" / "model.pt").exists()
