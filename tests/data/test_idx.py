"""Tests for the IDX (MNIST) reader: round trips, every corruption, fuzzing and the real data."""

from __future__ import annotations

import gzip
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slate.data.readers.idx import read_idx, read_mnist_split
from slate.errors import ConfigError, DataError

REAL_MNIST = (Path(__file__).resolve().parents[2].parent / "shared" / "data") / "mnist"


def idx_bytes(array: np.ndarray, code: int) -> bytes:
    """Encode ``array`` in the IDX format by hand (magic, big-endian sizes, big-endian data)."""
    dtype = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[code]
    header = struct.pack(">HBB", 0, code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(dtype).tobytes()


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def small_images(n: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("gz", [False, True])
def test_ubyte_3d_round_trip(tmp_path: Path, gz: bool) -> None:
    images = small_images()
    path = write(tmp_path / "x.idx", idx_bytes(images, 0x08), gz)
    out = read_idx(path)
    assert out.dtype == np.uint8
    assert out.shape == (5, 28, 28)
    np.testing.assert_array_equal(out, images)
    out[0, 0, 0] = 7  # writable


def test_exact_bytes_layout(tmp_path: Path) -> None:
    raw = struct.pack(">HBB", 0, 8, 2) + struct.pack(">II", 2, 3) + bytes([1, 2, 3, 4, 5, 6])
    out = read_idx(write(tmp_path / "m", raw))
    np.testing.assert_array_equal(out, [[1, 2, 3], [4, 5, 6]])


@pytest.mark.parametrize(
    ("code", "dtype", "values"),
    [
        (0x08, np.uint8, [0, 1, 255]),
        (0x09, np.int8, [-128, 0, 127]),
        (0x0B, np.int16, [-32768, 1, 32767]),
        (0x0C, np.int32, [-(2**31), 258, 2**31 - 1]),
        (0x0D, np.float32, [-1.5, 0.0, 3.25]),
        (0x0E, np.float64, [-1e300, 0.1, 2.5]),
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_all_type_codes_big_endian(
    tmp_path: Path, code: int, dtype: type, values: list[float], gz: bool
) -> None:
    array = np.array(values, dtype=dtype)
    path = write(tmp_path / "t.idx", idx_bytes(array, code), gz)
    out = read_idx(path)
    assert out.dtype == np.dtype(dtype)
    assert out.dtype.isnative
    np.testing.assert_array_equal(out, array)


def test_four_dims_and_empty(tmp_path: Path) -> None:
    array = np.arange(2 * 3 * 4 * 5, dtype=np.int32).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(read_idx(write(tmp_path / "a", idx_bytes(array, 0x0C))), array)
    empty = np.zeros((0, 28, 28), dtype=np.uint8)
    assert read_idx(write(tmp_path / "b", idx_bytes(empty, 0x08))).shape == (0, 28, 28)


# ---------------------------------------------------------------- corruptions


def assert_data_error(path: Path, *fragments: str) -> str:
    with pytest.raises(DataError) as info:
        read_idx(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize("gz", [False, True])
def test_wrong_magic(tmp_path: Path, gz: bool) -> None:
    raw = b"\x12\x34\x08\x03" + bytes(100)
    assert_data_error(write(tmp_path / "bad", raw, gz), "magic", "0x12340803", "0x0000")


@pytest.mark.parametrize("gz", [False, True])
def test_unknown_type_code(tmp_path: Path, gz: bool) -> None:
    raw = struct.pack(">HBBI", 0, 0x0A, 1, 3) + bytes(3)
    assert_data_error(write(tmp_path / "bad", raw, gz), "type code 0x0A")


@pytest.mark.parametrize("ndim", [0, 5, 255])
@pytest.mark.parametrize("gz", [False, True])
def test_bad_dimension_count(tmp_path: Path, ndim: int, gz: bool) -> None:
    raw = struct.pack(">HBB", 0, 8, ndim) + struct.pack(f">{ndim}I", *([1] * ndim)) + b"\x00"
    assert_data_error(write(tmp_path / "bad", raw, gz), f"{ndim} dimensions", "1 to 4")


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_data(tmp_path: Path, gz: bool) -> None:
    raw = idx_bytes(small_images(3), 0x08)[:-10]
    assert_data_error(
        write(tmp_path / "short", raw, gz), "truncated", str(3 * 28 * 28), str(3 * 28 * 28 - 10)
    )


@pytest.mark.parametrize("cut", [0, 1, 3, 5, 9])
@pytest.mark.parametrize("gz", [False, True])
def test_truncated_header(tmp_path: Path, cut: int, gz: bool) -> None:
    raw = idx_bytes(small_images(1), 0x08)[:cut]
    assert_data_error(write(tmp_path / "short", raw, gz), "truncated")


@pytest.mark.parametrize("gz", [False, True])
def test_trailing_bytes(tmp_path: Path, gz: bool) -> None:
    raw = idx_bytes(small_images(2), 0x08) + b"garbage"
    assert_data_error(write(tmp_path / "long", raw, gz), "7 trailing bytes")


def test_huge_claim_is_rejected_before_allocating(tmp_path: Path) -> None:
    raw = struct.pack(">HBBIIII", 0, 0x0E, 4, 2**32 - 1, 2**32 - 1, 2**32 - 1, 2**32 - 1)
    for gz in (False, True):
        path = write(tmp_path / f"huge{gz}", raw + bytes(64), gz)
        tracemalloc.start()
        try:
            assert_data_error(path, "truncated")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 2_000_000


def test_gzip_corrupt_stream(tmp_path: Path) -> None:
    packed = bytearray(gzip.compress(idx_bytes(small_images(4), 0x08)))
    packed[len(packed) // 2] ^= 0xFF
    assert_data_error(write(tmp_path / "c.gz", bytes(packed)), "gzip")


def test_gzip_truncated_stream(tmp_path: Path) -> None:
    packed = gzip.compress(idx_bytes(small_images(4), 0x08))
    assert_data_error(write(tmp_path / "c.gz", packed[: len(packed) // 2]), "gzip")


def test_gzip_bad_crc(tmp_path: Path) -> None:
    packed = bytearray(gzip.compress(idx_bytes(small_images(1), 0x08)))
    packed[-8] ^= 0x01  # CRC32 of the trailer
    assert_data_error(write(tmp_path / "c.gz", bytes(packed)), "gzip")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert_data_error(tmp_path / "nope", "does not exist")
    assert_data_error(tmp_path, "cannot be read")


# ---------------------------------------------------------------- MNIST splits


def write_split(
    folder: Path,
    prefix: str,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    gz: bool = False,
    dotted: bool = False,
    image_code: int = 0x08,
    label_code: int = 0x08,
) -> tuple[Path, Path]:
    sep = "." if dotted else "-"
    suffix = ".gz" if gz else ""
    ipath = folder / f"{prefix}-images{sep}idx3-ubyte{suffix}"
    lpath = folder / f"{prefix}-labels{sep}idx1-ubyte{suffix}"
    write(ipath, idx_bytes(images, image_code), gz)
    write(lpath, idx_bytes(labels, label_code), gz)
    return ipath, lpath


@pytest.mark.parametrize(("split", "prefix"), [("train", "train"), ("test", "t10k")])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("dotted", [False, True])
def test_split_round_trip(tmp_path: Path, split: str, prefix: str, gz: bool, dotted: bool) -> None:
    images = small_images(6)
    labels = np.array([0, 9, 3, 3, 1, 7], dtype=np.uint8)
    write_split(tmp_path, prefix, images, labels, gz=gz, dotted=dotted)
    x, y = read_mnist_split(tmp_path, split)  # type: ignore[arg-type]
    assert x.dtype == np.uint8
    assert x.shape == (6, 28, 28)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)


def test_split_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        read_mnist_split(tmp_path, "train")
    message = str(info.value)
    assert str(tmp_path / "train-images-idx3-ubyte.gz") in message
    assert str(tmp_path / "train-images.idx3-ubyte") in message
    assert "--download" in message
    assert "--data-dir" in message
    # images present, labels missing
    write(tmp_path / "t10k-images-idx3-ubyte", idx_bytes(small_images(2), 0x08))
    with pytest.raises(DataError, match="labels") as info:
        read_mnist_split(tmp_path, "test")
    assert str(tmp_path / "t10k-labels-idx1-ubyte") in str(info.value)


def test_split_mismatched_counts(tmp_path: Path) -> None:
    ipath, lpath = write_split(
        tmp_path, "train", small_images(5), np.zeros(4, dtype=np.uint8), gz=True
    )
    with pytest.raises(DataError) as info:
        read_mnist_split(tmp_path, "train")
    message = str(info.value)
    for fragment in (str(ipath), str(lpath), "5 images", "4 labels"):
        assert fragment in message


def test_split_images_not_3d(tmp_path: Path) -> None:
    ipath = tmp_path / "train-images-idx3-ubyte"
    write(ipath, idx_bytes(np.zeros((4, 784), dtype=np.uint8), 0x08))
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(np.zeros(4, dtype=np.uint8), 0x08))
    with pytest.raises(DataError, match="3 dimensions") as info:
        read_mnist_split(tmp_path, "train")
    assert str(ipath) in str(info.value)


def test_split_images_wrong_side(tmp_path: Path) -> None:
    write_split(tmp_path, "train", np.zeros((2, 32, 32), np.uint8), np.zeros(2, np.uint8))
    with pytest.raises(DataError, match=r"\(2, 32, 32\)"):
        read_mnist_split(tmp_path, "train")


def test_split_labels_not_1d(tmp_path: Path) -> None:
    write_split(tmp_path, "train", small_images(2), np.zeros((2, 1), np.uint8))
    with pytest.raises(DataError, match="1 dimension") as info:
        read_mnist_split(tmp_path, "train")
    assert "train-labels-idx1-ubyte" in str(info.value)


def test_split_wrong_dtypes(tmp_path: Path) -> None:
    write_split(tmp_path, "train", small_images(2), np.zeros(2, np.int32), label_code=0x0C)
    with pytest.raises(DataError, match="int32"):
        read_mnist_split(tmp_path, "train")
    folder = tmp_path / "f"
    folder.mkdir()
    write_split(folder, "train", small_images(2).astype(np.float32), np.zeros(2), image_code=0x0D)
    with pytest.raises(DataError, match="float32"):
        read_mnist_split(folder, "train")


def test_split_label_out_of_range(tmp_path: Path) -> None:
    _, lpath = write_split(
        tmp_path, "t10k", small_images(3), np.array([1, 10, 200], dtype=np.uint8)
    )
    with pytest.raises(DataError) as info:
        read_mnist_split(tmp_path, "test")
    message = str(info.value)
    assert str(lpath) in message
    assert "0..9" in message
    assert "10 at index 1" in message


def test_split_bad_split_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="validation"):
        read_mnist_split(tmp_path, "validation")  # type: ignore[arg-type]


# ---------------------------------------------------------------- fuzzing

_BASE = idx_bytes(np.arange(2 * 3 * 4, dtype=np.int16).reshape(2, 3, 4), 0x0B)
_BASE_GZ = gzip.compress(_BASE)
_FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _mutate(base: bytes, data: st.DataObject) -> bytes:
    raw = bytearray(base)
    for _ in range(data.draw(st.integers(0, 4), label="flips")):
        if not raw:
            break
        pos = data.draw(st.integers(0, len(raw) - 1), label="pos")
        raw[pos] = data.draw(st.integers(0, 255), label="byte")
    cut = data.draw(st.integers(0, len(raw) + 8), label="cut")
    raw = raw[:cut] if cut <= len(raw) else raw + bytes(cut - len(raw))
    return bytes(raw)


def _read_bounded(path: Path, limit: int) -> None:
    """Read ``path``; it must give an array or DataError, and allocate at most ``limit`` bytes."""
    tracemalloc.start()
    try:
        try:
            out = read_idx(path)
        except DataError as exc:
            assert str(path) in str(exc)
        else:
            assert isinstance(out, np.ndarray)
            assert 1 <= out.ndim <= 4
            assert out.nbytes <= path.stat().st_size * (1032 if path.suffix == ".gz" else 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, peak


@_FUZZ
@given(data=st.data())
def test_fuzz_plain_mutations(tmp_path: Path, data: st.DataObject) -> None:
    path = write(tmp_path / "fuzz.idx", _mutate(_BASE, data))
    _read_bounded(path, 256 * 1024)


@_FUZZ
@given(data=st.data())
def test_fuzz_gzip_mutations(tmp_path: Path, data: st.DataObject) -> None:
    # Mutate both the compressed stream and the content under a valid stream.
    inner = data.draw(st.booleans(), label="inner")
    raw = gzip.compress(_mutate(_BASE, data)) if inner else _mutate(_BASE_GZ, data)
    path = write(tmp_path / "fuzz.gz", raw)
    _read_bounded(path, 1024 * 1024)


@_FUZZ
@given(raw=st.binary(max_size=200), header=st.booleans())
def test_fuzz_random_bytes(tmp_path: Path, raw: bytes, header: bool) -> None:
    if header and len(raw) >= 2:  # a plausible magic so the size checks are reached
        raw = b"\x00\x00" + bytes([0x08 + raw[0] % 7, 1 + raw[1] % 4]) + raw[2:]
    path = write(tmp_path / "random.idx", raw)
    _read_bounded(path, 256 * 1024)


# ---------------------------------------------------------------- real data


@pytest.mark.skipif(not REAL_MNIST.is_dir(), reason="real MNIST not present")
def test_real_mnist() -> None:
    x_train, y_train = read_mnist_split(REAL_MNIST, "train")
    x_test, y_test = read_mnist_split(REAL_MNIST, "test")
    assert x_train.shape == (60000, 28, 28)
    assert x_test.shape == (10000, 28, 28)
    assert x_train.dtype == x_test.dtype == np.uint8
    assert y_train.dtype == y_test.dtype == np.int64
    assert np.bincount(y_train, minlength=10).tolist() == [
        5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949,
    ]  # fmt: skip
    assert np.bincount(y_test, minlength=10).tolist() == [
        980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009,
    ]  # fmt: skip
    assert x_train.max() == 255
    assert x_train.min() == 0
