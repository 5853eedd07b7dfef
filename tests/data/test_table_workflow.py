"""A user's table as it comes (IDs, text categories, missing cells, numbers written as text): no
leak from the held-out split, disguised numbers, capped one-hot columns, ID-like columns named.

References: the encoder fitted on a single file's training part must equal the one fitted on the
same rows given as ``--train``/``--test`` files; parsed values are checked against Python's own
``float`` and ``datetime``.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from slate.config import TrainConfig, resolve_config
from slate.data.encoding import OTHER, CategoryLimits
from slate.data.options import TableOptions
from slate.data.parts import hold_out
from slate.data.readers.delimited import read_table
from slate.data.sources import load_dataset


def _messy(path, rows=400, seed=0):
    """ID, category, percent, thousands, ISO date and label columns."""
    rng = np.random.default_rng(seed)
    lines = ["specimen_id,site,pct,amount,taken,y"]
    for _ in range(rows):
        y = int(rng.random() < 0.2)
        day = dt.date(2020, 1, 1) + dt.timedelta(days=int(rng.integers(0, 900)))
        amount = f'"{int(rng.integers(1000, 900000)):,}"'
        site = "" if rng.random() < 0.05 else rng.choice(["north", "south", "east"])
        lines.append(f"S{rng.integers(0, 10**9)},{site},{rng.normal(30, 5) + 3 * y:.1f}%,"
                     f"{amount},{day.isoformat()},{y}")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def _config(**kw):
    return resolve_config(TrainConfig(dataset="csv", label_column="y", positive_label="1", **kw))


def test_a_single_file_is_split_before_anything_is_fitted(tmp_path):
    _messy(tmp_path / "all.csv")
    single = load_dataset(_config(train=str(tmp_path / "all.csv")))
    # The same rows, written as two files by the same seeded split.
    lines = (tmp_path / "all.csv").read_text().splitlines()
    table = read_table(tmp_path / "all.csv", "y", "1")
    kept, held = hold_out(table.y, 0.25, 0, "x")
    for name, rows in (("tr.csv", np.sort(kept)), ("te.csv", np.sort(held))):
        (tmp_path / name).write_text("\n".join([lines[0]] + [lines[1 + r] for r in rows]) + "\n")
    two = load_dataset(_config(train=str(tmp_path / "tr.csv"), test=str(tmp_path / "te.csv")))
    assert single.encoder.names == two.encoder.names
    assert single.encoder.categories == two.encoder.categories
    assert single.encoder.means == pytest.approx(two.encoder.means, rel=0, abs=0)
    np.testing.assert_array_equal(single.encoder.scaler.mean, two.encoder.scaler.mean)
    np.testing.assert_array_equal(single.x_test, two.x_test)
    # Every held-out ID is unseen in training, and is counted as such.
    assert single.encoder.unseen["specimen_id"] == len(held)
    warnings = [n for n in single.notes if "'specimen_id'" in n]
    assert len(warnings) == 1 and "left out" in warnings[0] and "--drop-columns" in warnings[0]


def test_disguised_numbers_are_read_as_numbers_with_a_note(tmp_path):
    _messy(tmp_path / "all.csv", rows=30)
    table = read_table(tmp_path / "all.csv", "y", "1")
    raw = [line.split(",") for line in (tmp_path / "all.csv").read_text().splitlines()[1:]]
    assert set(table.numeric) == {"pct", "amount", "taken"} and set(table.text) == {
        "specimen_id", "site"}  # fmt: skip
    np.testing.assert_array_equal(table.numeric["pct"], [float(r[2][:-1]) for r in raw])
    amounts = [float(line.split('"')[1].replace(",", "")) for line in
               (tmp_path / "all.csv").read_text().splitlines()[1:]]  # fmt: skip
    np.testing.assert_array_equal(table.numeric["amount"], amounts)
    days = [(dt.date.fromisoformat(r[-2]) - dt.date(1970, 1, 1)).days for r in raw]
    np.testing.assert_array_equal(table.numeric["taken"], days)
    assert len(table.notes) == 3 and all("note: column" in n for n in table.notes)
    forced = read_table(tmp_path / "all.csv", "y", "1", categorical_columns=("pct",))
    assert "pct" in forced.text


def test_category_limits_keep_the_most_frequent_values_and_pool_the_rest():
    counts = {"a": 10, "b": 7, "c": 7, "d": 1, "e": 1, "<missing>": 3}
    assert CategoryLimits(None, 1).keep(counts) == ["a", "b", "c", "d", "e", "<missing>"]
    assert CategoryLimits(3, 1).keep(counts) == ["a", "b", "<missing>", OTHER]
    assert CategoryLimits(None, 5).keep(counts) == ["a", "b", "c", "<missing>", OTHER]
    # More values than the cap, all seen once: none gets an arbitrary column of its own.
    assert CategoryLimits(3, 1).keep({str(k): 1 for k in range(10)}) == [OTHER]


def test_a_column_with_no_repeated_value_is_left_out_and_others_are_capped(tmp_path):
    _messy(tmp_path / "all.csv")
    data = load_dataset(_config(train=str(tmp_path / "all.csv"), max_categories=50))
    assert not any(n.startswith("specimen_id=") for n in data.encoder.names)
    assert data.encoder.left_out == ["specimen_id"]
    capped = load_dataset(_config(train=str(tmp_path / "all.csv"), max_categories=2))
    site = [n for n in capped.encoder.names if n.startswith("site=")]
    assert len(site) == 3 and site[-1] == f"site={OTHER}"  # one value, <missing>, <other>
    assert any("'site'" in n and "--max-categories" in n for n in capped.notes)
    with pytest.raises(Exception, match="--max-categories must be at least 2"):
        TableOptions.from_config(_config(train="x", max_categories=1))
