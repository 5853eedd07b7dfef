"""Readers for the IDX format used by MNIST and Fashion-MNIST.

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of dimensions),
then one big-endian ``uint32`` size per dimension, then the data, big-endian, in C order. The
files are distributed gzip-compressed; both plain and gzip files are read (gzip is recognised by
its magic bytes ``1f 8b``, not by the file name).

Every problem with a file is raised as :class:`~slate.errors.DataError`. Nothing is allocated
from the sizes a header claims: a plain file's size is compared with the claim before its data
is read, and a gzip stream is decompressed in bounded chunks, so a corrupt header can never make
the reader allocate more than the file actually holds.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np

from slate.errors import ConfigError, DataError

__all__ = ["IDX_DTYPES", "read_idx", "read_mnist_split"]

#: IDX type code -> big-endian numpy dtype of the stored values.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_TYPE_NAMES = {
    0x08: "unsigned byte",
    0x09: "signed byte",
    0x0B: "int16",
    0x0C: "int32",
    0x0D: "float32",
    0x0E: "float64",
}

_GZIP_MAGIC = b"\x1f\x8b"
_MAX_DIMS = 4
_CHUNK = 1 << 16  # bytes read from a gzip stream at a time

_KNOWN_CODES = ", ".join(f"0x{code:02X} ({name})" for code, name in _TYPE_NAMES.items())

_MNIST_PREFIX = {"train": "train", "test": "t10k"}
_MNIST_SIDE = 28
_NUM_CLASSES = 10


def _read_bounded(stream: BinaryIO, size: int, path: Path, what: str) -> bytes:
    """Read exactly ``size`` bytes in bounded chunks.

    Args:
        stream: The (possibly decompressing) stream to read from.
        size: How many bytes the header says follow.
        path: The file, for error messages.
        what: What is being read (e.g. ``"the dimension sizes"``), for error messages.

    Returns:
        The bytes read; shorter than ``size`` only if the stream ended early, in which case a
        :class:`DataError` is raised instead.

    Raises:
        DataError: If the stream ends before ``size`` bytes were read.
    """
    chunks: list[bytes] = []
    got = 0
    while got < size:
        chunk = stream.read(min(_CHUNK, size - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if got < size:
        raise DataError(
            f"IDX file {path} is truncated: the header says {what} take {size} bytes, "
            f"but only {got} bytes follow. Delete the file and download it again."
        )
    return b"".join(chunks)


def _parse_idx(stream: BinaryIO, path: Path, plain_size: int | None) -> np.ndarray:
    """Parse an IDX stream (already decompressed if it was gzip).

    Args:
        stream: A binary stream positioned at the IDX magic number.
        path: The file, for error messages.
        plain_size: The total byte count of an uncompressed file, used to reject a header that
            claims more data than the file holds before anything is read; ``None`` for gzip.

    Returns:
        The array, in native byte order, with the shape given by the header.

    Raises:
        DataError: On any malformed header, truncated data or trailing bytes.
    """
    head = stream.read(4)
    if len(head) < 4:
        raise DataError(
            f"IDX file {path} is truncated: it holds {len(head)} bytes, fewer than the "
            "4-byte magic number (0x0000, a type code, a dimension count). "
            "Delete the file and download it again."
        )
    zero, code, ndim = struct.unpack(">HBB", head)
    if zero != 0:
        raise DataError(
            f"IDX file {path} has a wrong magic number: found bytes 0x{head.hex().upper()}, "
            "expected 0x0000 followed by a type code (0x08 for unsigned bytes) and a dimension "
            "count. The file is not an IDX file (or is compressed with something other than "
            "gzip)."
        )
    if code not in IDX_DTYPES:
        raise DataError(
            f"IDX file {path} has an unknown type code 0x{code:02X} in its magic number "
            f"0x{head.hex().upper()}; expected one of {_KNOWN_CODES}."
        )
    if ndim == 0 or ndim > _MAX_DIMS:
        raise DataError(
            f"IDX file {path} declares {ndim} dimensions in its magic number "
            f"0x{head.hex().upper()}; expected 1 to {_MAX_DIMS}."
        )
    dims_raw = _read_bounded(stream, 4 * ndim, path, f"the {ndim} dimension sizes")
    dims = struct.unpack(f">{ndim}I", dims_raw)
    dtype = IDX_DTYPES[code]
    count = 1
    for d in dims:
        count *= d
    data_size = count * dtype.itemsize
    header_size = 4 + 4 * ndim
    shape_text = " x ".join(str(d) for d in dims)
    if plain_size is not None and header_size + data_size != plain_size:
        found = plain_size - header_size
        if found < data_size:
            raise DataError(
                f"IDX file {path} is truncated: its header declares shape {shape_text} of "
                f"{_TYPE_NAMES[code]} values, which needs {data_size} data bytes, but only "
                f"{found} bytes follow the header. Delete the file and download it again."
            )
        raise DataError(
            f"IDX file {path} has {found - data_size} trailing bytes: its header declares "
            f"shape {shape_text} of {_TYPE_NAMES[code]} values, which needs {data_size} data "
            f"bytes, but {found} bytes follow the header. The file is corrupt."
        )
    data = _read_bounded(stream, data_size, path, f"shape {shape_text} of {_TYPE_NAMES[code]}")
    extra = stream.read(1)
    if extra:
        # Count the rest without keeping it, bounded per read.
        n_extra = len(extra)
        while chunk := stream.read(_CHUNK):
            n_extra += len(chunk)
        raise DataError(
            f"IDX file {path} has {n_extra} trailing bytes: its header declares shape "
            f"{shape_text} of {_TYPE_NAMES[code]} values, which needs {data_size} data bytes, "
            f"but {data_size + n_extra} bytes follow the header. The file is corrupt."
        )
    array = np.frombuffer(data, dtype=dtype).reshape(dims)
    # astype makes a writable, native-endian copy.
    return array.astype(dtype.newbyteorder("="))


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (plain or gzip-compressed) into a numpy array.

    Args:
        path: The file to read. Gzip compression is detected from the magic bytes ``1f 8b``.

    Returns:
        A writable array in native byte order whose shape is the header's dimension sizes and
        whose dtype is given by the type code (0x08 -> ``uint8``, 0x09 -> ``int8``, 0x0B ->
        ``int16``, 0x0C -> ``int32``, 0x0D -> ``float32``, 0x0E -> ``float64``).

    Raises:
        DataError: If the file cannot be opened, has a wrong magic number, an unknown type code,
            zero or more than four dimensions, is truncated, has trailing bytes, or is a corrupt
            gzip stream.
    """
    path = Path(path)
    try:
        with open(path, "rb") as raw:
            start = raw.read(2)
            raw.seek(0)
            if start == _GZIP_MAGIC:
                with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                    return _parse_idx(stream, path, None)
            size = os.fstat(raw.fileno()).st_size
            return _parse_idx(raw, path, size)
    except DataError:
        raise
    except FileNotFoundError as exc:
        raise DataError(f"IDX file {path} does not exist.") from exc
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise DataError(
            f"IDX file {path} is a corrupt or truncated gzip stream ({exc}). "
            "Delete the file and download it again."
        ) from exc
    except OSError as exc:
        raise DataError(f"IDX file {path} cannot be read: {exc}.") from exc


def _find_mnist_file(folder: Path, prefix: str, kind: str, idx: int) -> Path:
    """Locate one MNIST file under its usual names.

    Args:
        folder: The dataset folder.
        prefix: ``"train"`` or ``"t10k"``.
        kind: ``"images"`` or ``"labels"``.
        idx: The dimension count in the name (3 for images, 1 for labels).

    Returns:
        The first existing candidate among ``{prefix}-{kind}-idx{idx}-ubyte``,
        ``{prefix}-{kind}.idx{idx}-ubyte`` and their ``.gz`` versions.

    Raises:
        DataError: If none exists, naming every candidate.
    """
    names = [f"{prefix}-{kind}-idx{idx}-ubyte", f"{prefix}-{kind}.idx{idx}-ubyte"]
    candidates = [folder / n for name in names for n in (name, name + ".gz")]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    listed = ", ".join(str(c) for c in candidates)
    raise DataError(
        f"The MNIST {kind} file is missing: none of {listed} exists. Pass --download to fetch "
        "the dataset, or --data-dir to point at the folder that holds it."
    )


def read_mnist_split(
    folder: str | os.PathLike[str], split: Literal["train", "test"]
) -> tuple[np.ndarray, np.ndarray]:
    """Read one split of MNIST (or Fashion-MNIST, which uses the same file names).

    Looks for ``train-images-idx3-ubyte`` / ``train-labels-idx1-ubyte`` (``t10k-...`` for the
    test split), also under the dotted names ``train-images.idx3-ubyte`` and with a ``.gz``
    suffix.

    Args:
        folder: The folder holding the IDX files.
        split: ``"train"`` or ``"test"``.

    Returns:
        ``(images, labels)``: ``uint8`` images of shape ``(n, 28, 28)`` and ``int64`` labels of
        shape ``(n,)`` with values in 0..9.

    Raises:
        ConfigError: If ``split`` is not ``"train"`` or ``"test"``.
        DataError: If a file is missing or malformed, the images are not 3-D unsigned bytes of
            28 x 28, the labels are not 1-D unsigned bytes in 0..9, or the counts differ.
    """
    if split not in _MNIST_PREFIX:
        raise ConfigError(f"Unknown MNIST split {split!r}; expected 'train' or 'test'.")
    folder = Path(folder)
    prefix = _MNIST_PREFIX[split]
    images_path = _find_mnist_file(folder, prefix, "images", 3)
    labels_path = _find_mnist_file(folder, prefix, "labels", 1)
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.dtype != np.uint8:
        raise DataError(
            f"MNIST images file {images_path} holds {images.dtype} values; expected unsigned "
            "bytes (IDX type code 0x08)."
        )
    if images.ndim != 3 or images.shape[1:] != (_MNIST_SIDE, _MNIST_SIDE):
        raise DataError(
            f"MNIST images file {images_path} has shape {images.shape}; expected 3 dimensions "
            f"(n, {_MNIST_SIDE}, {_MNIST_SIDE})."
        )
    if labels.dtype != np.uint8:
        raise DataError(
            f"MNIST labels file {labels_path} holds {labels.dtype} values; expected unsigned "
            "bytes (IDX type code 0x08)."
        )
    if labels.ndim != 1:
        raise DataError(
            f"MNIST labels file {labels_path} has shape {labels.shape}; expected 1 dimension."
        )
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"MNIST {split} files disagree on the number of examples: {images_path} holds "
            f"{images.shape[0]} images but {labels_path} holds {labels.shape[0]} labels."
        )
    bad = np.flatnonzero(labels >= _NUM_CLASSES)
    if bad.size:
        first = int(bad[0])
        raise DataError(
            f"MNIST labels file {labels_path} has {bad.size} labels outside 0..9; the first is "
            f"{int(labels[first])} at index {first}."
        )
    return images, labels.astype(np.int64)
