"""Tests of the named datasets against independent constructions from the raw files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits, load_svmlight_file
from sklearn.model_selection import train_test_split

from slate.config import TrainConfig
from slate.data.datasets import dataset_names
from slate.data.readers.idx import read_mnist_split
from slate.data.sources import load_dataset
from slate.errors import ConfigError, DataError, SlateError

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_w7a = pytest.mark.skipif(
    not (SHARED / "w7a" / "w7a.gz").is_file(), reason="w7a not in ../shared/data"
)
needs_w8a = pytest.mark.skipif(
    not (SHARED / "w8a" / "w8a.gz").is_file(), reason="w8a not in ../shared/data"
)
needs_mnist = pytest.mark.skipif(
    not (SHARED / "mnist" / "train-images-idx3-ubyte.gz").is_file(),
    reason="MNIST not in ../shared/data",
)


def _rows(x: np.ndarray) -> list[bytes]:
    flat = np.ascontiguousarray(x.reshape(len(x), -1))
    return [row.tobytes() for row in flat]


# --------------------------------------------------------------------------------------------
# digits
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_reference():
    raw = load_digits()
    x = (raw.data / 16.0).astype(np.float32)
    return train_test_split(x, raw.target, test_size=0.25, stratify=raw.target, random_state=0)


def test_digits_matches_independent_construction(digits_reference) -> None:
    x_tr, x_te, c_tr, c_te = digits_reference
    data = load_dataset(TrainConfig())
    assert data.name == "digits"
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert data.input_shape == (64,)

    # test set untouched, classes 5-9 positive
    np.testing.assert_array_equal(data.x_test, x_te)
    np.testing.assert_array_equal(data.y_test, (c_te >= 5).astype(np.int64))

    # training negatives: exactly the split's classes 0-4, in order
    np.testing.assert_array_equal(data.x_train[data.y_train == 0], x_tr[c_tr < 5])

    # training positives: per class int(0.2 * count), distinct rows of that class
    class_of = dict(zip(_rows(x_tr), c_tr.tolist(), strict=True))
    assert len(class_of) == len(x_tr)  # digits rows are unique, so rows identify examples
    kept = _rows(data.x_train[data.y_train == 1])
    assert len(set(kept)) == len(kept)
    kept_classes = np.array([class_of[r] for r in kept])
    assert (kept_classes >= 5).all()
    for cls in range(5, 10):
        assert (kept_classes == cls).sum() == int(0.2 * (c_tr == cls).sum())

    assert data.x_train.min() >= 0 and data.x_train.max() <= 1
    assert data.x_test.min() >= 0 and data.x_test.max() <= 1
    assert "stratified" in data.test_split and "25%" in data.test_split


def test_digits_is_deterministic_and_split_seed_matters() -> None:
    a = load_dataset(TrainConfig())
    b = load_dataset(TrainConfig())
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    c = load_dataset(TrainConfig(split_seed=1))
    assert not np.array_equal(a.x_test, c.x_test)


# --------------------------------------------------------------------------------------------
# w7a / w8a
# --------------------------------------------------------------------------------------------


@needs_w7a
def test_w7a_official_files() -> None:
    data = load_dataset(TrainConfig(dataset="w7a", data_dir=str(SHARED)))
    assert data.x_train.shape == (24692, 300)
    assert data.x_test.shape == (25057, 300)
    assert "w7a.t" in data.test_split and "official" in data.test_split
    x_ref, y_ref = load_svmlight_file(str(SHARED / "w7a" / "w7a.gz"), n_features=300)
    np.testing.assert_array_equal(data.x_train, x_ref.toarray().astype(np.float32))
    np.testing.assert_array_equal(data.y_train, (y_ref > 0).astype(np.int64))
    assert abs(data.y_train.mean() - 0.0300) < 5e-4
    assert abs(data.y_test.mean() - 0.0295) < 5e-4
    assert set(np.unique(data.x_train)) <= {0.0, 1.0}


@pytest.fixture(scope="module")
def w8a():
    return load_dataset(TrainConfig(dataset="w8a", data_dir=str(SHARED)))


@needs_w8a
def test_w8a_seeded_stratified_split(w8a) -> None:
    assert not (SHARED / "w8a" / "w8a.t").exists() and not (SHARED / "w8a" / "w8a.t.gz").exists()
    assert "w8a.t" in w8a.test_split and "not found" in w8a.test_split
    assert "stratified" in w8a.test_split and "25%" in w8a.test_split
    assert len(w8a.y_train) + len(w8a.y_test) == 49749
    assert w8a.x_train.shape[1] == w8a.x_test.shape[1] == 300
    assert abs(len(w8a.y_test) - 0.25 * 49749) <= 1
    assert abs(w8a.y_train.mean() - w8a.y_test.mean()) < 0.002
    # The split keeps every line: totals equal the file's
    x_ref, y_ref = load_svmlight_file(str(SHARED / "w8a" / "w8a.gz"), n_features=300)
    assert int(w8a.y_train.sum() + w8a.y_test.sum()) == int((y_ref > 0).sum())
    assert float(w8a.x_train.sum() + w8a.x_test.sum()) == float(x_ref.sum())


@needs_w8a
def test_w8a_split_is_deterministic(w8a) -> None:
    again = load_dataset(TrainConfig(dataset="w8a", data_dir=str(SHARED)))
    np.testing.assert_array_equal(again.x_test, w8a.x_test)
    np.testing.assert_array_equal(again.y_train, w8a.y_train)


# --------------------------------------------------------------------------------------------
# MNIST
# --------------------------------------------------------------------------------------------

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_POSITIVES = [892, 958, 1028, 974, 1009]


@needs_mnist
def test_mnist_imbalanced_construction() -> None:
    folder = SHARED / "mnist"
    raw_tr, cls_tr = read_mnist_split(folder, "train")
    raw_te, cls_te = read_mnist_split(folder, "test")
    assert np.bincount(cls_tr).tolist() == MNIST_TRAIN_COUNTS

    data = load_dataset(TrainConfig(dataset="mnist", data_dir=str(folder.parent)))
    assert data.x_train.dtype == np.float32
    assert data.input_shape == (1, 28, 28)

    # test set: the untouched 10000 images
    assert data.x_test.shape == (10000, 1, 28, 28)
    assert int(data.y_test.sum()) == sum(MNIST_TEST_POSITIVES) == 4861
    np.testing.assert_array_equal(data.y_test, (cls_te >= 5).astype(np.int64))
    expected = (raw_te[:, None].astype(np.float32) / 255.0 - 0.1307) / 0.3081
    np.testing.assert_allclose(data.x_test, expected, rtol=0, atol=1e-5)
    i, r, c = 17, 14, 15
    assert data.x_test[i, 0, r, c] == pytest.approx((raw_te[i, r, c] / 255 - 0.1307) / 0.3081)
    assert data.x_test[0, 0, 0, 0] == pytest.approx(-0.1307 / 0.3081)

    # training set: negatives all kept, each positive class cut to int(0.2 * count)
    negatives = sum(MNIST_TRAIN_COUNTS[:5])
    kept_pos = [int(0.2 * k) for k in MNIST_TRAIN_COUNTS[5:]]
    assert kept_pos == [1084, 1183, 1253, 1170, 1189]
    assert int((data.y_train == 0).sum()) == negatives == 30596
    assert int(data.y_train.sum()) == sum(kept_pos)

    # recover each training image's raw bytes and class from the official file
    pixels = np.rint((data.x_train[:, 0] * 0.3081 + 0.1307) * 255).astype(np.uint8)
    class_of = dict(zip(_rows(raw_tr), cls_tr.tolist(), strict=True))
    classes = np.array([class_of[row] for row in _rows(pixels)])
    assert np.array_equal(classes >= 5, data.y_train == 1)
    assert np.bincount(classes, minlength=10).tolist() == MNIST_TRAIN_COUNTS[:5] + kept_pos
    assert len(set(_rows(pixels))) == len(pixels)  # no image twice


# --------------------------------------------------------------------------------------------
# user files: libsvm and csv
# --------------------------------------------------------------------------------------------


def _libsvm_text(rng: np.random.Generator, n: int, d: int) -> tuple[str, np.ndarray, np.ndarray]:
    """A random LIBSVM file and its dense content; column d occurs so the width is d."""
    x = np.zeros((n, d), dtype=np.float32)
    y = (np.arange(n) % 4 == 0).astype(np.int64)
    lines = []
    for i in range(n):
        cols = rng.choice(d, size=int(rng.integers(1, d + 1)), replace=False)
        cols = np.union1d(cols, [d - 1]) if i == 0 else np.sort(cols)
        vals = rng.integers(1, 100, size=cols.size) / 100
        x[i, cols] = vals
        tokens = " ".join(f"{j + 1}:{v:g}" for j, v in zip(cols, vals, strict=True))
        lines.append(f"{'+1' if y[i] else '-1'} {tokens}")
    return "\n".join(lines) + "\n", x, y


def test_libsvm_without_test_file(tmp_path: Path) -> None:
    text, x, y = _libsvm_text(np.random.default_rng(0), 80, 6)
    path = tmp_path / "train.svm"
    path.write_text(text)
    data = load_dataset(TrainConfig(dataset="libsvm", train=str(path)))
    assert len(data.y_train) + len(data.y_test) == 80
    assert len(data.y_test) == 20
    assert data.y_test.mean() == pytest.approx(y.mean())  # stratified
    assert str(path) in data.test_split and "stratified" in data.test_split
    # every row of the split is a row of the file, and none is lost
    file_rows = sorted(_rows(np.column_stack([x, y]).astype(np.float32)))
    split = np.vstack(
        [
            np.column_stack([data.x_train, data.y_train]),
            np.column_stack([data.x_test, data.y_test]),
        ]
    ).astype(np.float32)
    assert sorted(_rows(split)) == file_rows


def test_libsvm_with_test_file_and_padding(tmp_path: Path) -> None:
    train = tmp_path / "a.svm"
    test = tmp_path / "b.svm.gz"
    train.write_text("+1 1:0.5 3:1\n-1 2:0.25\n-1 1:1\n+1 3:0.75\n")
    test.write_bytes(gzip.compress(b"-1 5:0.5\n+1 1:0.125 4:1\n-1 2:1\n"))
    data = load_dataset(TrainConfig(dataset="libsvm", train=str(train), test=str(test)))
    assert data.x_train.shape == (4, 5) and data.x_test.shape == (3, 5)
    np.testing.assert_array_equal(
        data.x_train,
        np.array(
            [[0.5, 0, 1, 0, 0], [0, 0.25, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0.75, 0, 0]],
            dtype=np.float32,
        ),
    )
    np.testing.assert_array_equal(
        data.x_test,
        np.array([[0, 0, 0, 0, 0.5], [0.125, 0, 0, 1, 0], [0, 1, 0, 0, 0]], dtype=np.float32),
    )
    np.testing.assert_array_equal(data.y_train, [1, 0, 0, 1])
    np.testing.assert_array_equal(data.y_test, [0, 1, 0])
    assert str(test) in data.test_split

    # and the other way round: the test file is the narrower one
    swapped = load_dataset(TrainConfig(dataset="libsvm", train=str(test), test=str(train)))
    assert swapped.x_train.shape == (3, 5) and swapped.x_test.shape == (4, 5)


def test_libsvm_n_features_fixes_width(tmp_path: Path) -> None:
    train = tmp_path / "a.svm"
    train.write_text("+1 1:0.5\n-1 2:0.25\n+1 1:1\n-1 2:1\n")
    data = load_dataset(
        TrainConfig(dataset="libsvm", train=str(train), test=str(train), n_features=7)
    )
    assert data.x_train.shape == (4, 7) and data.x_test.shape == (4, 7)


def _write_csv(path: Path, rows: list[tuple[float, float, str]]) -> None:
    path.write_text("f1,label,f2\n" + "".join(f"{a},{lab},{b}\n" for a, b, lab in rows))


def test_csv_with_and_without_test_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rows = [
        (float(rng.integers(100)), float(rng.integers(100)), "yes" if i % 5 == 0 else "no")
        for i in range(60)
    ]
    train = tmp_path / "train.csv"
    _write_csv(train, rows)
    expected_x = np.array([[a, b] for a, b, _ in rows], dtype=np.float32)
    expected_y = np.array([lab == "yes" for _, _, lab in rows], dtype=np.int64)

    # Raw values here (CSV is standardised by default: see tests/data/test_encoding.py).
    config = TrainConfig(
        dataset="csv", train=str(train), label_column="label", positive_label="yes",
        standardize=False,
    )  # fmt: skip
    data = load_dataset(config)
    assert data.input_shape == (2,)
    assert len(data.y_train) == 45 and len(data.y_test) == 15
    assert data.y_test.sum() == 3  # stratified: 12 positives * 25%
    assert "stratified" in data.test_split
    both = np.vstack(
        [np.column_stack([data.x_train, data.y_train]), np.column_stack([data.x_test, data.y_test])]
    )
    reference = np.column_stack([expected_x, expected_y])
    assert sorted(_rows(both.astype(np.float32))) == sorted(_rows(reference.astype(np.float32)))

    test = tmp_path / "test.csv"
    _write_csv(test, [(1.0, 2.0, "yes"), (3.0, 4.0, "no"), (5.0, 6.0, "no")])
    config.test = str(test)
    data = load_dataset(config)
    np.testing.assert_array_equal(data.x_train, expected_x)
    np.testing.assert_array_equal(data.y_train, expected_y)
    np.testing.assert_array_equal(data.x_test, [[1, 2], [3, 4], [5, 6]])
    np.testing.assert_array_equal(data.y_test, [1, 0, 0])
    assert str(test) in data.test_split


def test_csv_test_file_with_other_columns(tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    _write_csv(train, [(1, 2, "a"), (3, 4, "b")] * 4)
    test = tmp_path / "test.csv"
    test.write_text("f1,label\n1,a\n2,b\n")
    config = TrainConfig(
        dataset="csv", train=str(train), test=str(test), label_column="label", positive_label="a"
    )
    # Columns are matched by name: the test file lacks f2.
    with pytest.raises(DataError, match=r"lacks the columns \['f2'\]"):
        load_dataset(config)


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------


def test_unknown_dataset_lists_names() -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset(TrainConfig(dataset="imagenet-21k"))
    message = str(info.value)
    assert "imagenet-21k" in message and "--dataset" in message
    for name in ("digits", "w7a", "w8a", "mnist", "libsvm", "csv"):
        assert name in message
    assert set(dataset_names()) >= {"digits", "w7a", "w8a", "mnist", "libsvm", "csv"}


def test_csv_needs_label_column(tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    _write_csv(train, [(1, 2, "a"), (3, 4, "b")] * 4)
    with pytest.raises(ConfigError, match="--label-column"):
        load_dataset(TrainConfig(dataset="csv", train=str(train), positive_label="a"))
    with pytest.raises(ConfigError, match="--positive-label"):
        load_dataset(TrainConfig(dataset="csv", train=str(train), label_column="label"))


@pytest.mark.parametrize("name", ["libsvm", "csv"])
def test_user_dataset_needs_train(name: str) -> None:
    with pytest.raises(ConfigError, match="--train"):
        load_dataset(TrainConfig(dataset=name, label_column="y", positive_label="1"))


def test_test_split_with_one_class(tmp_path: Path) -> None:
    train = tmp_path / "a.svm"
    test = tmp_path / "b.svm"
    train.write_text("+1 1:0.5\n-1 2:0.25\n+1 1:1\n-1 2:1\n")
    test.write_text("-1 1:0.5\n-1 2:0.25\n")
    with pytest.raises(DataError) as info:
        load_dataset(TrainConfig(dataset="libsvm", train=str(train), test=str(test)))
    message = str(info.value)
    assert "test set" in message and "negative" in message


def test_training_split_with_one_class(tmp_path: Path) -> None:
    train = tmp_path / "a.svm"
    test = tmp_path / "b.svm"
    train.write_text("+1 1:0.5\n+1 2:0.25\n")
    test.write_text("-1 1:0.5\n+1 2:0.25\n")
    with pytest.raises(DataError, match=r"training set.*only positive"):
        load_dataset(TrainConfig(dataset="libsvm", train=str(train), test=str(test)))


def test_bad_test_fraction(tmp_path: Path) -> None:
    train = tmp_path / "a.svm"
    train.write_text("+1 1:0.5\n-1 2:0.25\n" * 10)
    with pytest.raises(ConfigError, match="--test-fraction"):
        load_dataset(TrainConfig(dataset="libsvm", train=str(train), test_fraction=1.5))


@pytest.mark.parametrize(
    ("content", "fraction"),
    [("+1 1:0.5\n" + "-1 2:0.25\n" * 20, 0.25), ("+1 1:0.5\n-1 2:0.25\n" * 10, 0.05)],
    ids=["one-positive", "tiny-test-share"],
)
def test_split_too_small_is_a_user_error(tmp_path: Path, content: str, fraction: float) -> None:
    train = tmp_path / "a.svm"
    train.write_text(content)
    with pytest.raises(SlateError):
        load_dataset(TrainConfig(dataset="libsvm", train=str(train), test_fraction=fraction))
