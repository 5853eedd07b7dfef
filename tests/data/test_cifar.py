"""Tests for the CIFAR-10 binary reader: exact record layout, every corruption, fuzzing."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slate.data.readers.cifar import read_cifar10_binary, read_cifar_file
from slate.errors import DataError

RECORD = 3073
TRAIN_NAMES = [f"data_batch_{i}.bin" for i in range(1, 6)]


def cifar_bytes(images: np.ndarray, labels: np.ndarray) -> bytes:
    """Encode records by hand: 1 label byte, then R plane, G plane, B plane (each row-major)."""
    out = bytearray()
    for image, label in zip(images, labels, strict=True):
        out.append(int(label))
        for channel in range(3):
            for row in range(32):
                out += bytes(int(v) for v in image[channel, row])
    return bytes(out)


def random_batch(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).astype(np.int64)
    return images, labels


def write_dataset(folder: Path, sizes: tuple[int, ...] = (2, 1, 3, 1, 2, 2)) -> list[tuple]:
    folder.mkdir(parents=True, exist_ok=True)
    batches = []
    for seed, (name, n) in enumerate(zip([*TRAIN_NAMES, "test_batch.bin"], sizes, strict=True)):
        images, labels = random_batch(n, seed)
        (folder / name).write_bytes(cifar_bytes(images, labels))
        batches.append((images, labels))
    return batches


def test_record_layout_is_exact(tmp_path: Path) -> None:
    raw = bytearray([3])
    raw += bytes([10] * 1024) + bytes([20] * 1024) + bytes([30] * 1024)
    raw += bytes([9]) + bytes(range(256)) * 12
    path = tmp_path / "b.bin"
    path.write_bytes(bytes(raw))
    images, labels = read_cifar_file(path)
    assert images.shape == (2, 3, 32, 32)
    assert images.dtype == np.uint8
    assert labels.dtype == np.int64
    assert labels.tolist() == [3, 9]
    assert (images[0, 0] == 10).all()
    assert (images[0, 1] == 20).all()
    assert (images[0, 2] == 30).all()
    # record 2: pixel k of the 3072 is k % 256, channel-major then row-major
    flat = np.arange(3072) % 256
    np.testing.assert_array_equal(images[1], flat.reshape(3, 32, 32))
    assert images[1, 0, 255 // 32, 255 % 32] == 255  # row 7, column 31
    assert images[1, 1, 0, 0] == 1024 % 256
    images[0, 0, 0, 0] = 1  # writable


def test_random_round_trip(tmp_path: Path) -> None:
    images, labels = random_batch(7, 42)
    path = tmp_path / "r.bin"
    path.write_bytes(cifar_bytes(images, labels))
    out_images, out_labels = read_cifar_file(path)
    np.testing.assert_array_equal(out_images, images)
    np.testing.assert_array_equal(out_labels, labels)


@pytest.mark.parametrize("nested", [False, True])
def test_full_dataset_round_trip(tmp_path: Path, nested: bool) -> None:
    folder = tmp_path / "cifar-10-batches-bin" if nested else tmp_path
    batches = write_dataset(folder)
    train_x, train_y, test_x, test_y = read_cifar10_binary(tmp_path)
    assert train_x.shape == (2 + 1 + 3 + 1 + 2, 3, 32, 32)
    assert train_x.dtype == test_x.dtype == np.uint8
    assert train_y.dtype == test_y.dtype == np.int64
    np.testing.assert_array_equal(train_x, np.concatenate([b[0] for b in batches[:5]]))
    np.testing.assert_array_equal(train_y, np.concatenate([b[1] for b in batches[:5]]))
    np.testing.assert_array_equal(test_x, batches[5][0])
    np.testing.assert_array_equal(test_y, batches[5][1])


@pytest.mark.parametrize("extra", [-1, 1, 3072, -3072])
def test_not_a_multiple_of_record(tmp_path: Path, extra: int) -> None:
    images, labels = random_batch(2, 0)
    raw = cifar_bytes(images, labels)
    raw = raw[:extra] if extra < 0 else raw + bytes(extra)
    path = tmp_path / "t.bin"
    path.write_bytes(raw)
    with pytest.raises(DataError) as info:
        read_cifar_file(path)
    message = str(info.value)
    assert str(path) in message
    assert "truncated" in message
    assert str(len(raw)) in message
    assert "3073" in message


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "e.bin"
    path.write_bytes(b"")
    with pytest.raises(DataError, match="0 bytes"):
        read_cifar_file(path)


def test_label_byte_out_of_range(tmp_path: Path) -> None:
    images, labels = random_batch(4, 1)
    raw = bytearray(cifar_bytes(images, labels))
    raw[2 * RECORD] = 200
    path = tmp_path / "l.bin"
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError) as info:
        read_cifar_file(path)
    message = str(info.value)
    assert str(path) in message
    assert "200 in record 2" in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--download") as info:
        read_cifar_file(tmp_path / "data_batch_1.bin")
    assert str(tmp_path / "data_batch_1.bin") in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot be read"):
        read_cifar_file(tmp_path)


@pytest.mark.parametrize("name", [*TRAIN_NAMES, "test_batch.bin"])
def test_dataset_missing_one_file(tmp_path: Path, name: str) -> None:
    write_dataset(tmp_path)
    (tmp_path / name).unlink()
    with pytest.raises(DataError) as info:
        read_cifar10_binary(tmp_path)
    message = str(info.value)
    assert str(tmp_path / name) in message
    assert "--download" in message


def test_dataset_pickle_version_hint(tmp_path: Path) -> None:
    (tmp_path / "data_batch_1").write_bytes(b"\x80\x04not read")
    with pytest.raises(DataError, match="pickle"):
        read_cifar10_binary(tmp_path)


def test_dataset_corrupt_batch_is_named(tmp_path: Path) -> None:
    write_dataset(tmp_path)
    bad = tmp_path / "data_batch_4.bin"
    bad.write_bytes(bad.read_bytes()[:-5])
    with pytest.raises(DataError) as info:
        read_cifar10_binary(tmp_path)
    assert str(bad) in str(info.value)


# ---------------------------------------------------------------- fuzzing

_BASE = cifar_bytes(*random_batch(2, 7))
_FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _read_bounded(path: Path) -> None:
    """Read ``path``: an array pair or DataError, allocating at most a few times its size."""
    size = path.stat().st_size
    tracemalloc.start()
    try:
        try:
            images, labels = read_cifar_file(path)
        except DataError as exc:
            assert str(path) in str(exc)
        else:
            assert images.shape == (size // RECORD, 3, 32, 32)
            assert labels.shape == (size // RECORD,)
            assert labels.max() <= 9
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 4 * size + 64 * 1024, peak


@_FUZZ
@given(data=st.data())
def test_fuzz_mutations(tmp_path: Path, data: st.DataObject) -> None:
    raw = bytearray(_BASE)
    for _ in range(data.draw(st.integers(0, 4), label="flips")):
        pos = data.draw(st.sampled_from([0, RECORD, *range(0, len(raw), 97)]), label="pos")
        raw[pos] = data.draw(st.integers(0, 255), label="byte")
    cut = data.draw(st.integers(0, len(raw) + RECORD), label="cut")
    raw = raw[:cut] if cut <= len(raw) else raw + bytes(cut - len(raw))
    path = tmp_path / "fuzz.bin"
    path.write_bytes(bytes(raw))
    _read_bounded(path)


@_FUZZ
@given(raw=st.binary(max_size=2 * RECORD + 10), whole=st.booleans())
def test_fuzz_random_bytes(tmp_path: Path, raw: bytes, whole: bool) -> None:
    if whole:  # trim to whole records so the label check is reached
        raw = raw[: len(raw) // RECORD * RECORD] or bytes(RECORD)
    path = tmp_path / "random.bin"
    path.write_bytes(raw)
    _read_bounded(path)
