"""``slate tune`` scores the features ``slate train`` would build, on a validation split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slate.config import TrainConfig, resolve_config
from slate.data.sources import load_dataset, load_local_data
from slate.engines.simulator import SimulatorEngine
from slate.training.tune import tune, tuning_data, validation_split


def _write_table(path: Path, rows: int = 300, seed: int = 0) -> list[str]:
    """A table with an ID, raw scales (1e3 to 1e6), missing cells and a text column; returns
    its lines, the header first."""
    rng = np.random.default_rng(seed)
    income = np.exp(rng.uniform(np.log(1e3), np.log(1e6), rows))
    age = rng.uniform(20, 90, rows)
    city = rng.choice(["lyon", "nice", "paris"], rows, p=[0.2, 0.3, 0.5])
    label = np.where(0.05 * (age - 55) + rng.normal(0, 1, rows) > 0.8, "pos", "neg")
    lines = ["pid,income,age,city,y"]
    for k in range(rows):
        cell = "" if k % 17 == 3 else f"{income[k]:.2f}"
        lines.append(f"{1000 + k},{cell},{age[k]:.1f},{city[k]},{label[k]}")
    path.write_text("\n".join(lines) + "\n")
    return lines


def _config(tmp_path: Path, **extra) -> TrainConfig:
    values = dict(
        dataset="csv", train=str(tmp_path / "all.csv"), label_column="y", positive_label="pos",
        id_columns=("pid",), nodes=2, batch_size=8, positives=2, iterations=4,
        eval_every=2, party_ap=False,
    )  # fmt: skip
    return resolve_config(TrainConfig(**{**values, **extra}))


def _write_rows(lines: list[str], pids: np.ndarray, path: Path) -> None:
    """The header and the lines whose ID is in ``pids``, in file order."""
    wanted = {str(int(p)) for p in pids}
    path.write_text("\n".join([lines[0], *[ln for ln in lines[1:] if ln.split(",")[0] in wanted]]))


@pytest.mark.parametrize("with_test_file", [False, True])
def test_tune_features_equal_trains_on_the_same_rows(tmp_path, with_test_file):
    """Tune's tuning and validation rows, written out as --train and --test files and loaded
    the way ``slate train`` loads them, give the same feature matrices (to 1e-6)."""
    lines = _write_table(tmp_path / "all.csv")
    extra = {}
    if with_test_file:
        _write_table(tmp_path / "test.csv", rows=50, seed=1)
        extra = {"test": str(tmp_path / "test.csv")}
    config = _config(tmp_path, **extra)
    data = tuning_data(config, 0.25, seed=3)
    assert data.held_out == "validation"
    assert data.encoder is not None  # the run must not z-score it again

    fit_ids, val_ids = _split_ids(config, data)
    _write_rows(lines, fit_ids, tmp_path / "fit.csv")
    _write_rows(lines, val_ids, tmp_path / "val.csv")
    reference_config = _config(
        tmp_path, train=str(tmp_path / "fit.csv"), test=str(tmp_path / "val.csv")
    )
    reference = load_dataset(reference_config)
    assert reference.encoder.names == data.encoder.names
    np.testing.assert_allclose(data.x_train, reference.x_train, rtol=0, atol=1e-6)
    np.testing.assert_allclose(data.x_test, reference.x_test, rtol=0, atol=1e-6)

    # What the run trains and scores on: the same, not standardised a second time.
    engine = SimulatorEngine(config.nodes)
    tuned = load_local_data(config, list(range(config.nodes)), engine, data)
    trained = load_local_data(reference_config, list(range(config.nodes)), engine)
    np.testing.assert_allclose(tuned.x_train, trained.x_train, rtol=0, atol=1e-6)
    np.testing.assert_allclose(tuned.x_test, trained.x_test, rtol=0, atol=1e-6)
    one_hot = [k for k, name in enumerate(data.encoder.names) if "=" in name]
    assert set(np.unique(tuned.x_train[:, one_hot])) <= {0.0, 1.0}


def _split_ids(config: TrainConfig, data) -> tuple[np.ndarray, np.ndarray]:
    """The IDs of tune's tuning and validation rows: the same seeded splits of the table (its
    ID column is read but never a feature), checked against tune's labels."""
    from slate.data.options import TableOptions
    from slate.data.parts import TablePart

    table = TablePart(TableOptions.from_config(config).read(config.train))
    if not config.test:
        table, _ = table.split(config.test_fraction, config.split_seed, config.train)
    tuning, validation = (part.table for part in table.split(0.25, 3, "t"))
    assert np.array_equal(tuning.y, data.y_train) and np.array_equal(validation.y, data.y_test)
    return tuning.numeric["pid"], validation.numeric["pid"]


def test_the_validation_split_is_labelled_validation(tmp_path):
    _write_table(tmp_path / "all.csv")
    data = tuning_data(_config(tmp_path), 0.25, seed=3)
    line = data.describe()
    assert "validation set: seeded stratified 25% of the training set (seed 3)" in line
    assert "test" not in line.replace(str(tmp_path), "")
    digits = validation_split(load_dataset(resolve_config(TrainConfig())), 0.2, seed=0)
    assert "validation set:" in digits.describe() and " test" not in digits.describe()


def test_an_encoded_table_is_not_split_after_encoding(tmp_path):
    _write_table(tmp_path / "all.csv")
    with pytest.raises(ValueError, match="tuning_data"):
        validation_split(load_dataset(_config(tmp_path)), 0.25, seed=3)


def test_tune_reports_the_validation_split(tmp_path):
    _write_table(tmp_path / "all.csv")
    lines: list[str] = []
    report = tune(_config(tmp_path), {"lr": (0.01,)}, 0.25, log=lines.append)
    assert report["validation"] == "seeded stratified 25% of the training set (seed 0)"
    assert "validation set:" in lines[0] and "test set" not in lines[0]
