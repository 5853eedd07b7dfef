"""A table under ``--dp-epsilon`` (:mod:`slate.data.encoding`, :mod:`slate.data.dictionary`):
with its ``--schema`` declaring every numeric column's public range (or mean and std) and every
text column's categories, the encoding is fitted on nothing but those public constants. A cell
outside its range is clipped into it at the site, in training and in the saved model; the site
alone says so. Checked against a hand computation, with a ``total`` that fails if anything is
summed; a run on the simulator; and the refusals, named together in one message."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from slate.config import TrainConfig
from slate.data.dictionary import read_dictionary
from slate.data.encoding import ColumnChoice, TableEncoder, fit_features
from slate.data.readers.delimited import read_table
from slate.errors import ConfigError
from slate.training.configuration import resolve_and_check
from tests.sites import slate_here

NUMERIC = ["radius", "texture", "area"]
PLANTED_VALUE, PLANTED_CATEGORY = 4242.5, "planted-zz9"


def write_table(path: Path, rows: np.ndarray, *, plant: bool = False, gaps: bool = True) -> None:
    """Rows of scikit-learn's bundled breast-cancer table (a public table: radius, texture,
    area, a text column ``size`` made from the area, and malignant as the positive label); with
    ``plant`` the first positive row gets area 4242.5 and size ``planted-zz9``."""
    data = load_breast_cancer()
    x, y = data.data[:, [0, 1, 3]], (data.target == 0).astype(int)
    size = np.where(x[:, 2] > 700, "large", np.where(x[:, 2] > 400, "medium", "small"))
    lines = [",".join([*NUMERIC, "size", "label"])]
    planted = False
    for k, i in enumerate(rows):
        cells = [f"{v:g}" for v in x[i]] + [str(size[i]), str(y[i])]
        if gaps and k % 17 == 3:
            cells[1] = ""  # a missing texture
        if plant and not planted and y[i] == 1:
            cells[2], cells[3], planted = f"{PLANTED_VALUE}", PLANTED_CATEGORY, True
        lines.append(",".join(cells))
    path.write_text("\n".join(lines) + "\n")


def write_schema(path: Path, *, ranges: bool = True) -> Path:
    """The schema every site holds: public ranges of the three numeric columns (the table's
    documented value ranges, rounded out), the texture's missing indicator, and ``size``'s
    three categories."""
    spans = {"radius": [6.0, 29.0], "texture": [9.0, 40.0], "area": [140.0, 2510.0]}
    columns = [{"name": n, "type": "numeric", **({"range": spans[n]} if ranges else {})}
               for n in NUMERIC]  # fmt: skip
    columns[1]["missing"] = True
    columns.append({"name": "size", "type": "text", "categories": ["small", "medium", "large"]})
    path.write_text(json.dumps({"slate_schema": 1, "label": {"column": "label", "positive": "1"},
                                "columns": columns}))  # fmt: skip
    return path


def _never_summed(*_):
    raise AssertionError("a statistic of the private rows was summed")


def test_the_private_fit_uses_the_schema_s_public_constants_only(tmp_path):
    """Imputation with the range's middle, scaling onto [-1, 1] by the range, the indicator
    only where declared, categories from the file, and the planted cells clipped: the matrix
    equals the one computed by hand from the constants, and nothing is summed."""
    write_table(tmp_path / "t.csv", np.arange(120), plant=True)
    dictionary = read_dictionary(str(write_schema(tmp_path / "schema.json")))
    read = read_table(str(tmp_path / "t.csv"), label_column="label", positive_label="1",
                      categorical_columns=("size",))  # fmt: skip
    table = dictionary.check_table(read)
    encoder = fit_features([table], choice=ColumnChoice(), standardize=True, total=_never_summed,
                           gather=_never_summed, dictionary=dictionary, private=True)  # fmt: skip
    assert isinstance(encoder, TableEncoder)
    assert encoder.names == [*NUMERIC, "texture_missing", "size=small", "size=medium",
                             "size=large", "size=<missing>", "size=<other>"]  # fmt: skip
    spans = {c.name: c.range for c in dictionary.columns if c.kind == "numeric"}
    got = encoder.transform(table)
    for j, name in enumerate(NUMERIC):
        lo, hi = spans[name]
        cells = np.clip(table.numeric[name], lo, hi)
        centre, half = (lo + hi) / 2, (hi - lo) / 2
        expected = (np.where(np.isnan(cells), centre, cells) - centre) / half
        np.testing.assert_allclose(got[:, j], expected.astype(np.float32), rtol=1e-6)
        assert got[:, j].min() >= -1 and got[:, j].max() <= 1
    np.testing.assert_array_equal(got[:, 3], np.isnan(table.numeric["texture"]))
    planted = int(np.flatnonzero(table.numeric["area"] == PLANTED_VALUE)[0])
    assert got[planted, 2] == 1.0 and got[planted, -1] == 1.0  # clipped; <other>
    assert "4242.5" in (dictionary.clipping_note(table) or "")
    # the saved encoder clips as well: a model meets the planted cell as training did
    again = TableEncoder.from_dict(json.loads(json.dumps(encoder.to_dict())))
    np.testing.assert_array_equal(again.transform(table), got)


def test_without_dp_the_schema_s_ranges_do_not_clip_and_nothing_changes(tmp_path):
    """The same schema without ``private``: the numeric statistics are summed as before, no
    bounds are saved, so model.json's keys are unchanged."""
    write_table(tmp_path / "t.csv", np.arange(120))
    dictionary = read_dictionary(str(write_schema(tmp_path / "schema.json")))
    table = read_table(str(tmp_path / "t.csv"), label_column="label", positive_label="1",
                       categorical_columns=("size",))  # fmt: skip
    encoder = fit_features([table], choice=ColumnChoice(), standardize=True,
                           dictionary=dictionary)  # fmt: skip
    assert "bounds" not in encoder.to_dict() and encoder.bounds == {}
    present = table.numeric["radius"][~np.isnan(table.numeric["radius"])]
    assert encoder.means["radius"] == pytest.approx(present.mean())


def _table_config(tmp_path: Path, **flags) -> TrainConfig:
    write_table(tmp_path / "t.csv", np.arange(200))
    values = dict(dataset="csv", train=str(tmp_path / "t.csv"), dp_epsilon=8.0,
                  schema=str(write_schema(tmp_path / "schema.json")))  # fmt: skip
    return TrainConfig(**{**values, **flags})


def test_the_table_defaults_work_under_dp_and_lr_auto_gives_way(tmp_path):
    """A schema with public constants: no refusal with the defaults (``--lr auto`` and
    ``--standardize`` are a table's); an explicit ``--lr auto`` is refused."""
    resolved = resolve_and_check(_table_config(tmp_path))
    assert resolved.flags.lr == "auto" and resolved.flags.standardize is True
    with pytest.raises(ConfigError, match="--lr auto"):
        resolve_and_check(_table_config(tmp_path, lr="auto"))


def test_incompatible_flags_and_a_schema_without_constants_are_named_together(tmp_path):
    """Three problems, one paragraph naming each: ``--lr auto``, ``--early-stopping`` and the
    numeric columns the schema gives no public constants."""
    config = _table_config(tmp_path, lr="auto", early_stopping=2, validation_fraction=0.2)
    write_schema(tmp_path / "schema.json", ranges=False)
    with pytest.raises(ConfigError) as refused:
        resolve_and_check(config)
    text = str(refused.value)
    assert text.startswith("Refused under --dp-epsilon 8, for 3 reasons: (1) --lr auto")
    assert "(2) --early-stopping" in text and "(3) the schema" in text
    assert "'radius', 'texture', 'area'" in text and "\n" not in text
    # without a schema the table itself is refused, saying what to declare
    with pytest.raises(ConfigError, match=r"without --schema .* 'slate schema' writes one"):
        resolve_and_check(_table_config(tmp_path, schema=None, label_column="label"))


@pytest.mark.processes
def test_a_private_table_trains_on_the_simulator(tmp_path):
    """``slate train`` on the table with its schema under ``--dp-epsilon 8``: it runs with the
    defaults, says that the step size gave way, reports ε, and its model.json clips."""
    write_table(tmp_path / "t.csv", np.arange(0, 569), plant=True)
    write_schema(tmp_path / "schema.json")
    done = slate_here("train", "--dataset", "csv", "--train", "t.csv", "--schema", "schema.json",
                      "--dp-epsilon", "8", "--nodes", "2", "--iterations", "20", "--out", "run",
                      "--no-progress", "--no-plots", "--compile", "off", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert "note: --dp-epsilon: lr 0.01" in output
    assert "4242.5" in output and "clipped" in output  # the site's own note
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 < summary["privacy"]["epsilon"] <= 8.0 and summary["config"]["lr"] == 0.01
    model = json.loads((tmp_path / "run" / "model.json").read_text())
    assert model["preprocessing"][0]["bounds"]["area"] == [140.0, 2510.0]
