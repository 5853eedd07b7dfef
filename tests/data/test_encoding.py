"""The table encoder against hand computations: imputation, indicators, one-hot, scaling."""

from __future__ import annotations

import numpy as np
import pytest

from slate.data.encoding import ColumnChoice, TableEncoder
from slate.data.readers.delimited import RawTable
from slate.data.table_notes import looks_like_id
from slate.errors import ConfigError, DataError


def table(path: str = "t.csv", y=None, **columns) -> RawTable:
    """Numbers (NaN = missing) or lists of strings (None = missing) per column."""
    return RawTable.from_columns(path, y, **columns)


NAN = float("nan")


def test_numeric_missing_cells_take_the_training_mean_and_get_an_indicator():
    train = table(age=[20.0, NAN, 40.0, 60.0], income=[1.0, 2.0, 3.0, 4.0])
    encoder = TableEncoder.fit([train], ColumnChoice(), standardize=False)
    assert encoder.names == ["age", "income", "age_missing"]
    x = encoder.transform(train)
    np.testing.assert_allclose(x[:, 0], [20, 40, 40, 60])
    np.testing.assert_allclose(x[:, 2], [0, 1, 0, 0])
    assert encoder.imputed == {"age": 1}


def test_no_indicator_below_one_percent_missing():
    values = np.arange(200, dtype=float)
    values[7] = NAN  # 0.5% missing
    encoder = TableEncoder.fit([table(a=values)], ColumnChoice(), standardize=False)
    assert encoder.names == ["a"]
    assert encoder.transform(table(a=values))[7, 0] == pytest.approx(np.nanmean(values))


def test_text_columns_are_one_hot_with_a_missing_category_and_unseen_as_zeros():
    train = table(sex=["M", "F", None, "M"], x=[1.0, 2.0, 3.0, 4.0])
    encoder = TableEncoder.fit([train], ColumnChoice(), standardize=False)
    assert encoder.names == ["x", "sex=F", "sex=M", "sex=<missing>"]
    np.testing.assert_array_equal(
        encoder.transform(train)[:, 1:], [[0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 1, 0]]
    )
    test = table(sex=["X", "F", None], x=[1.0, 1.0, 1.0])
    np.testing.assert_array_equal(encoder.transform(test)[:, 1:], [[0, 0, 0], [1, 0, 0], [0, 0, 1]])
    assert encoder.unseen == {"sex": 1}


def test_scaling_z_scores_numeric_columns_only():
    train = table(a=[1.0, 2.0, 3.0, 6.0], c=["u", "v", "u", "u"])
    encoder = TableEncoder.fit([train], ColumnChoice(), standardize=True)
    x = encoder.transform(train)
    a = np.array([1.0, 2.0, 3.0, 6.0])
    np.testing.assert_allclose(x[:, 0], (a - a.mean()) / a.std(), rtol=1e-6)
    np.testing.assert_array_equal(x[:, 1:], [[1, 0], [0, 1], [1, 0], [1, 0]])


def test_parties_fit_the_same_encoder_as_their_pooled_rows():
    rng = np.random.default_rng(0)
    a = rng.normal(50, 10, 90)
    a[rng.random(90) < 0.1] = NAN
    colours = [str(c) for c in rng.choice(["red", "green", "blue"], 90)]
    colours[5] = None
    colours[70] = "violet"  # only party 2 has it
    parts = [slice(0, 30), slice(30, 60), slice(60, 90)]
    tables = [table(a=a[p], colour=colours[p]) for p in parts]
    pooled = table(a=a, colour=colours)
    federated = TableEncoder.fit(tables, ColumnChoice(), standardize=True)
    central = TableEncoder.fit([pooled], ColumnChoice(), standardize=True)
    assert federated.names == central.names
    assert "colour=violet" in federated.names
    np.testing.assert_allclose(federated.means["a"], np.nanmean(a), rtol=1e-12)
    np.testing.assert_allclose(federated.scaler.mean, central.scaler.mean, rtol=1e-12)
    np.testing.assert_allclose(federated.scaler.scale, central.scaler.scale, rtol=1e-12)
    np.testing.assert_allclose(
        np.concatenate([federated.transform(t) for t in tables]), central.transform(pooled)
    )


def test_columns_are_matched_by_name_not_position():
    train = table(a=[1.0, 2.0, 5.0], b=["x", "y", "x"])
    encoder = TableEncoder.fit([train], ColumnChoice(), standardize=True)
    reordered = table(b=["x", "y", "x"], a=[1.0, 2.0, 5.0])
    np.testing.assert_array_equal(encoder.transform(reordered), encoder.transform(train))
    with pytest.raises(DataError, match=r"lacks the columns \['b'\]"):
        encoder.transform(table(a=[1.0]))
    with pytest.raises(DataError, match="'a' is text here but was numeric in training"):
        encoder.transform(table(a=["1"], b=["x"]))


def test_id_and_dropped_columns_are_never_features():
    train = table(pid=[10.0, 11.0, 12.0], junk=[1.0, 1.0, 2.0], a=[1.0, 3.0, 2.0])
    choice = ColumnChoice(id_columns=("pid",), drop_columns=("junk",))
    assert TableEncoder.fit([train], choice, standardize=False).names == ["a"]
    only = ColumnChoice(feature_columns=("junk",))
    assert TableEncoder.fit([train], only, standardize=False).names == ["junk"]
    with pytest.raises(DataError, match="has no column 'nope'"):
        TableEncoder.fit([train], ColumnChoice(id_columns=("nope",)), standardize=False)
    with pytest.raises(ConfigError, match="no feature column is left"):
        ColumnChoice(drop_columns=("pid", "junk", "a")).features(train.columns, "t.csv")


def test_round_trip_through_its_dict_gives_the_same_features():
    train = table(a=[1.0, NAN, 3.0, 9.0], s=["p", "q", None, "p"])
    encoder = TableEncoder.fit([train], ColumnChoice(id_columns=()), standardize=True)
    again = TableEncoder.from_dict(encoder.to_dict())
    np.testing.assert_array_equal(again.transform(train), encoder.transform(train))
    assert again.to_dict() == encoder.to_dict()


def test_looks_like_id():
    assert looks_like_id(np.array([1.0, 2.0, 5.0, 9.0]))
    assert not looks_like_id(np.array([1.0, 2.0, 2.0, 9.0]))
    assert not looks_like_id(np.array([1.5, 2.0, 3.0]))
    assert not looks_like_id(np.array([3.0, 2.0, 1.0]))


def _timestamp_csv(path, rows: int, seed: int) -> np.ndarray:
    """Write a CSV with a Unix-timestamp column (1.7e9 + U(0, 3600) s, written with all its
    digits), a small column and a label; return the timestamps as float64."""
    rng = np.random.default_rng(seed)
    stamps = 1.7e9 + rng.uniform(0, 3600, rows)
    small = rng.normal(0, 1, rows)
    labels = np.arange(rows) % 4 == 0
    lines = ["ts,small,y"] + [
        f"{float(t)!r},{float(s)!r},{int(y)}" for t, s, y in zip(stamps, small, labels, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return stamps


def test_large_offset_columns_are_centred_in_float64_before_the_float32_cast(tmp_path):
    """Read through ``--dataset csv``: the z-scores equal numpy's float64 ones. Rounding the
    timestamps to float32 first (spacing 128 at 1.7e9) left 29 distinct values of 200, with
    z-scores off by up to 0.06."""
    from slate.config import TrainConfig
    from slate.data.sources import load_dataset

    stamps = _timestamp_csv(tmp_path / "train.csv", 200, seed=0)
    test_stamps = _timestamp_csv(tmp_path / "test.csv", 50, seed=1)
    config = TrainConfig(
        dataset="csv", train=str(tmp_path / "train.csv"), test=str(tmp_path / "test.csv"),
        label_column="y", positive_label="1",
    )  # fmt: skip
    data = load_dataset(config)
    mean, std = stamps.mean(), stamps.std()
    assert data.encoder.names[0] == "ts"
    assert data.x_train.dtype == np.float32
    assert len(np.unique(data.x_train[:, 0])) == len(np.unique(stamps))
    np.testing.assert_allclose(data.x_train[:, 0], (stamps - mean) / std, rtol=0, atol=1e-6)
    np.testing.assert_allclose(data.x_test[:, 0], (test_stamps - mean) / std, rtol=0, atol=1e-6)
