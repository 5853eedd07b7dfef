"""Per-party files: schema agreement, alignment, counts checks, and the simulator on them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from slate.config import TrainConfig
from slate.data.local_data import party_path, uses_party_files
from slate.data.schema import Schema, SchemaMismatch, check_agreement, column_order
from slate.data.sources import load_local_data
from slate.engines.simulator import SimulatorEngine
from slate.errors import DataError
from slate.training.loop import train


def write_csv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def make_sites(root, parties=3, rows=120, seed=0, header=("a", "b", "c", "y")):
    """Site n gets sites/n/train.csv and sites/n/test.csv; returns the pooled arrays."""
    rng = np.random.default_rng(seed)
    pooled = {"train": [], "test": []}
    for n in range(parties):
        for split, count in (("train", rows), ("test", rows // 2)):
            x = rng.normal(size=(count, 3)) * [1.0, 100.0, 0.01] + [0.0, 1e3, 5.0]
            y = (x[:, 0] + rng.normal(size=count) > 1.2).astype(int)
            y[:2] = [1, 0]
            write_csv(root / str(n) / f"{split}.csv", header, np.column_stack([x, y]))
            pooled[split].append((x, y))
    return pooled


def csv_config(root, **extra) -> TrainConfig:
    values = dict(
        dataset="csv", train=str(root / "{rank}" / "train.csv"),
        test=str(root / "{rank}" / "test.csv"), label_column="y", positive_label="1",
        nodes=3, iterations=30, batch_size=10, positives=2,
    )  # fmt: skip
    return TrainConfig(**{**values, **extra})


def test_rank_placeholder_selects_party_files():
    assert party_path("sites/{rank}/x.csv", 12) == "sites/12/x.csv"
    assert uses_party_files(TrainConfig(train="a/{rank}.svm"))
    assert uses_party_files(TrainConfig(train="a.svm", party_files=True))
    assert not uses_party_files(TrainConfig(train="a.svm"))


def test_each_party_holds_its_own_rows_standardised_with_pooled_statistics(tmp_path):
    pooled = make_sites(tmp_path)
    data = load_local_data(csv_config(tmp_path, standardize=True), [0, 1, 2], SimulatorEngine(3))
    # The cells are read as float64 and scaled before the float32 cast: pool them as written.
    x_all = np.concatenate([x for x, _ in pooled["train"]])
    mean, std = x_all.mean(0), x_all.std(0)
    assert data.federated and data.n_train == 360 and data.n_test == 180
    np.testing.assert_allclose(data.preprocessing.scaler.mean, mean, rtol=1e-9)
    np.testing.assert_allclose(data.preprocessing.scaler.scale, std, rtol=1e-9)
    for n, rows in enumerate(data.parts):
        own = pooled["train"][n][0]
        np.testing.assert_allclose(data.x_train[rows], (own - mean) / std, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(data.y_train[rows], pooled["train"][n][1])
    for n, rows in enumerate(data.test_parts):
        np.testing.assert_array_equal(data.y_test[rows], pooled["test"][n][1])


def test_columns_in_another_order_are_matched_by_name(tmp_path):
    make_sites(tmp_path, parties=3)
    # Party 1's files list the same columns in another order.
    for split in ("train", "test"):
        path = tmp_path / "1" / f"{split}.csv"
        lines = [row.split(",") for row in path.read_text().split()]
        path.write_text("\n".join(",".join([r[2], r[3], r[0], r[1]]) for r in lines) + "\n")
    reordered = load_local_data(csv_config(tmp_path), [0, 1, 2], SimulatorEngine(3))
    make_sites(tmp_path, parties=3)
    ordered = load_local_data(csv_config(tmp_path), [0, 1, 2], SimulatorEngine(3))
    np.testing.assert_array_equal(reordered.x_train, ordered.x_train)
    np.testing.assert_array_equal(reordered.x_test, ordered.x_test)


def test_renamed_column_names_the_party_and_the_column(tmp_path):
    make_sites(tmp_path)
    make_sites(tmp_path / "bad", parties=1, header=("a", "B", "c", "y"))
    (tmp_path / "2").rename(tmp_path / "old2")
    (tmp_path / "bad" / "0").rename(tmp_path / "2")
    with pytest.raises(SchemaMismatch, match=r"party 2's column 2 is 'B', party 0's is 'b'"):
        load_local_data(csv_config(tmp_path), [0, 1, 2], SimulatorEngine(3))


def test_every_party_that_cannot_read_its_files_is_named(tmp_path):
    make_sites(tmp_path)
    (tmp_path / "1" / "train.csv").unlink()
    with pytest.raises(SchemaMismatch, match=r"Party 1 could not read its data.*train\.csv"):
        load_local_data(csv_config(tmp_path), [0, 1, 2], SimulatorEngine(3))


def test_label_values_must_agree_across_parties():
    a = Schema(rank=0, format="csv", header=("x", "y"), label_column="y",
               label_values=("0", "1"), positive_label="1")  # fmt: skip
    b = Schema(rank=1, format="csv", header=("x", "y"), label_column="y",
               label_values=("neg", "pos"), positive_label="1")  # fmt: skip
    with pytest.raises(SchemaMismatch, match=r"'neg' \(first at party 1\)"):
        check_agreement([a, b])
    # One party with a single class is fine when the union is two values.
    c = Schema(rank=1, format="csv", header=("y", "x"), label_column="y",
               label_values=("0.0",), positive_label="1")  # fmt: skip
    check_agreement([a, c])


def test_test_file_columns_are_matched_by_name_or_refused():
    assert column_order(("b", "a"), ("a", "b"), "--test t.csv") == [1, 0]
    with pytest.raises(DataError, match=r"--test t\.csv lacks the columns \['b'\]"):
        column_order(("a", "c"), ("a", "b"), "--test t.csv")


def test_libsvm_parties_agree_on_the_largest_index(tmp_path):
    for n, top in enumerate((3, 7)):
        (tmp_path / str(n)).mkdir()
        lines = [f"{(-1) ** k} 1:{k} {top}:1" for k in range(12)]
        (tmp_path / str(n) / "train.svm").write_text("\n".join(lines) + "\n")
    config = TrainConfig(dataset="libsvm", train=str(tmp_path / "{rank}" / "train.svm"),
                         nodes=2, batch_size=4, positives=1, test_fraction=0.3)  # fmt: skip
    data = load_local_data(config, [0, 1], SimulatorEngine(2))
    assert data.x_train.shape[1] == 7 and data.x_test.shape[1] == 7
    # Party 0 held out a stratified 30% of its own file; nothing of party 1's.
    assert [len(p) for p in data.test_parts] == [4, 4]


def _write_timestamps_svm(path, rows: int, seed: int) -> np.ndarray:
    """A LIBSVM file whose feature 1 is a Unix timestamp (1.7e9 + U(0, 3600) s, all digits
    written) and feature 2 a small number; returns the features as float64."""
    rng = np.random.default_rng(seed)
    x = np.column_stack([1.7e9 + rng.uniform(0, 3600, rows), rng.normal(0, 1, rows)])
    lines = [
        f"{1 if k % 4 == 0 else -1} 1:{float(a)!r} 2:{float(b)!r}" for k, (a, b) in enumerate(x)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return x


@pytest.mark.parametrize("party_files", [False, True])
def test_libsvm_features_are_scaled_in_float64_before_the_float32_cast(tmp_path, party_files):
    """LIBSVM rows are divided by the standard deviation: of the values as written (numpy
    float64), not of their float32 roundings (spacing 128 at 1.7e9: the std was 6e-4 off)."""
    where = "{rank}/" if party_files else ""
    parts = [0, 1] if party_files else [""]
    x = np.concatenate(
        [_write_timestamps_svm(tmp_path / str(p) / "train.svm", 200, seed=7 + k)
         for k, p in enumerate(parts)]
    )  # fmt: skip
    for k, p in enumerate(parts):
        _write_timestamps_svm(tmp_path / str(p) / "test.svm", 40, seed=17 + k)
    config = TrainConfig(
        dataset="libsvm", train=str(tmp_path / f"{where}train.svm"),
        test=str(tmp_path / f"{where}test.svm"), standardize=True, nodes=2, batch_size=8,
        positives=2,
    )  # fmt: skip
    data = load_local_data(config, [0, 1], SimulatorEngine(2))
    assert data.x_train.dtype == np.float32 and data.x_test.dtype == np.float32
    expected = x / x.std(0)  # LIBSVM data is scaled, not centred
    if not party_files:  # the partitioned rows: each party's share of the one file, in order
        from slate.data.partition import make_partition

        labels = (np.arange(len(x)) % 4 == 0).astype(np.int64)
        shares = make_partition(labels, 2, config.partition, config.seed, config.dirichlet_alpha)
        expected = expected[np.concatenate(shares)]
    np.testing.assert_allclose(data.x_train, expected, rtol=1e-6)


def test_party_without_positives_joins_with_a_note(tmp_path):
    make_sites(tmp_path)
    path = tmp_path / "1" / "train.csv"
    lines = path.read_text().split()
    path.write_text("\n".join([lines[0]] + [r for r in lines[1:] if r.endswith(",0.0")]) + "\n")
    data = load_local_data(csv_config(tmp_path), [0, 1, 2], SimulatorEngine(3))
    assert len(data.notes) == 1 and data.notes[0].startswith(
        "note: party 1 holds no positive training row and joins the run"
    ), data.notes
    assert int(data.y_train[data.parts[1]].sum()) == 0 and len(data.parts[1]) > 0


def test_party_short_of_b_positives_trains_with_a_warning(tmp_path):
    make_sites(tmp_path)
    path = tmp_path / "2" / "train.csv"
    lines = path.read_text().split()
    positives = [r for r in lines[1:] if r.endswith(",1.0")]
    rest = [r for r in lines[1:] if not r.endswith(",1.0")]
    path.write_text("\n".join([lines[0], positives[0], *rest]) + "\n")
    data = load_local_data(csv_config(tmp_path, positives=3), [0, 1, 2], SimulatorEngine(3))
    assert data.notes == [
        "warning: party 2 holds 1 positive training example, fewer than b = 3: its batches "
        "draw them with replacement, so they repeat within a batch."
    ]


def test_simulator_on_party_files_reports_federated_metrics(tmp_path):
    pooled = make_sites(tmp_path)
    out = tmp_path / "run"
    summary = train(csv_config(tmp_path, out=str(out), standardize=True),
                    progress=False, figures=False, log=lambda _: None).summary  # fmt: skip
    assert summary["evaluation"] == "federated"
    assert set(summary["party_test_ap"]) == {"0", "1", "2"}
    assert summary["preprocessing"]["kind"] == "table"
    assert summary["n_test"] == 180
    written = json.loads((out / "summary.json").read_text())
    assert written["test_ap"] == summary["test_ap"]
    # The federated AP is within its bound of the AP of the pooled raw scores.
    import torch

    from slate.models import build_model

    model = build_model("mlp", (3,), hidden=28, seed=0)
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    mean = np.asarray(summary["preprocessing"]["scaler"]["mean"])
    scale = np.asarray(summary["preprocessing"]["scaler"]["scale"])
    x = np.concatenate([x for x, _ in pooled["test"]])
    y = np.concatenate([y for _, y in pooled["test"]])
    with torch.no_grad():
        logits = model(torch.from_numpy(((x - mean) / scale).astype(np.float32))).reshape(-1)
    raw = average_precision_score(y, logits.numpy())
    assert abs(raw - summary["test_ap"]) <= summary["test_ap_error_bound"] + 1e-9


def test_a_federated_run_with_its_scores_in_the_end_bins_warns_once(tmp_path):
    """Raw features of scale 1e6 (no --standardize) put the test logits far beyond +-20: the
    run prints the end-bin warning once and records it in summary.json."""
    rng = np.random.default_rng(5)
    for n in range(3):
        for split, count in (("train", 60), ("test", 40)):
            x = rng.normal(size=(count, 3)) * 1e6
            y = (x[:, 0] > 0).astype(int)
            write_csv(tmp_path / str(n) / f"{split}.csv", ("a", "b", "c", "y"),
                      np.column_stack([x, y]))  # fmt: skip
    out = tmp_path / "run"
    lines: list[str] = []
    summary = train(csv_config(tmp_path, out=str(out), standardize=False, iterations=10),
                    progress=False, figures=False, log=lines.append).summary  # fmt: skip
    import torch

    from slate.models import build_model

    model = build_model("mlp", (3,), hidden=28, seed=0)
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    x = np.concatenate([np.loadtxt(tmp_path / str(n) / "test.csv", delimiter=",", skiprows=1)
                        for n in range(3)])  # fmt: skip
    with torch.no_grad():
        logits = model(torch.from_numpy(x[:, :3].astype(np.float32))).reshape(-1).numpy()
    share = float((np.abs(logits) >= 20).mean())  # numpy's count of the end bins' rows
    assert share > 0.01
    warning = summary["evaluation_warning"]
    assert warning.startswith(f"warning: {share:.1%} of the test scores")
    assert [line for line in lines if "end bins" in line] == [warning]
    assert json.loads((out / "summary.json").read_text())["evaluation_warning"] == warning
