"""Reader for the binary version of CIFAR-10.

The binary distribution (``cifar-10-binary.tar.gz``, extracting to ``cifar-10-batches-bin/``)
holds ``data_batch_1.bin`` .. ``data_batch_5.bin`` and ``test_batch.bin``. Each file is a
sequence of 3073-byte records: one label byte (0..9), then 3072 pixel bytes, channel-major
(the 32 x 32 red plane, then green, then blue, each row-major). The pickle ("python") version
is never read: unpickling a downloaded file can execute arbitrary code.

Every problem with a file is raised as :class:`~slate.errors.DataError`. A file's size is
checked before its contents are read, so nothing is allocated beyond what the file holds.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from slate.errors import DataError

__all__ = [
    "CIFAR_RECORD_BYTES",
    "CIFAR_TEST_FILE",
    "CIFAR_TRAIN_FILES",
    "read_cifar10_binary",
    "read_cifar_file",
]

_SIDE = 32
_CHANNELS = 3
_NUM_CLASSES = 10
#: Bytes per record: one label byte and 3 x 32 x 32 pixel bytes.
CIFAR_RECORD_BYTES = 1 + _CHANNELS * _SIDE * _SIDE
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch.bin"
_SUBFOLDER = "cifar-10-batches-bin"


def read_cifar_file(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch file.

    Any whole, non-zero number of records is accepted (the real files hold 10000).

    Args:
        path: The ``.bin`` file.

    Returns:
        ``(images, labels)``: ``uint8`` images of shape ``(n, 3, 32, 32)`` (channels R, G, B)
        and ``int64`` labels of shape ``(n,)`` with values in 0..9.

    Raises:
        DataError: If the file is missing, unreadable, empty, not a whole number of 3073-byte
            records, or holds a label byte above 9.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0 or size % CIFAR_RECORD_BYTES:
                raise DataError(
                    f"CIFAR-10 file {path} is truncated or corrupt: its length is {size} bytes, "
                    f"which is not a whole, non-zero number of {CIFAR_RECORD_BYTES}-byte records "
                    f"(1 label byte + {CIFAR_RECORD_BYTES - 1} pixel bytes; the real files are "
                    f"{10000 * CIFAR_RECORD_BYTES} bytes). Delete it and download it again."
                )
            data = fh.read(size + 1)
    except DataError:
        raise
    except FileNotFoundError as exc:
        raise DataError(
            f"CIFAR-10 file {path} does not exist. Pass --download to fetch the binary "
            "version of CIFAR-10, or --data-dir to point at the folder that holds it."
        ) from exc
    except OSError as exc:
        raise DataError(f"CIFAR-10 file {path} cannot be read: {exc}.") from exc
    if len(data) != size:
        raise DataError(
            f"CIFAR-10 file {path} changed while it was read: its length was {size} bytes but "
            f"{len(data)} bytes were read."
        )
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, CIFAR_RECORD_BYTES)
    labels = records[:, 0]
    bad = np.flatnonzero(labels >= _NUM_CLASSES)
    if bad.size:
        first = int(bad[0])
        raise DataError(
            f"CIFAR-10 file {path} has {bad.size} label bytes outside 0..9; the first is "
            f"{int(labels[first])} in record {first} (byte offset "
            f"{first * CIFAR_RECORD_BYTES}). The file is corrupt or not a CIFAR-10 batch."
        )
    images = records[:, 1:].reshape(-1, _CHANNELS, _SIDE, _SIDE).copy()
    return images, labels.astype(np.int64)


def _resolve_folder(folder: Path) -> Path:
    """Return the folder that directly holds the batch files.

    Args:
        folder: The folder given by the user: either the one holding the ``.bin`` files or its
            parent holding ``cifar-10-batches-bin/``.

    Returns:
        The folder to read the batch files from.
    """
    if not (folder / CIFAR_TEST_FILE).exists() and (folder / _SUBFOLDER).is_dir():
        return folder / _SUBFOLDER
    return folder


def read_cifar10_binary(
    folder: str | os.PathLike[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read the binary version of CIFAR-10.

    Args:
        folder: The folder holding ``data_batch_1.bin`` .. ``data_batch_5.bin`` and
            ``test_batch.bin``, or its parent holding ``cifar-10-batches-bin/``.

    Returns:
        ``(train_images, train_labels, test_images, test_labels)``: ``uint8`` images of shape
        ``(n, 3, 32, 32)`` and ``int64`` labels of shape ``(n,)``; the training set is the five
        data batches in order (50000 examples in the real data, 10000 in the test set).

    Raises:
        DataError: If a file is missing or malformed (see :func:`read_cifar_file`).
    """
    folder = _resolve_folder(Path(folder))
    paths = [folder / name for name in (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE)]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        listed = ", ".join(str(p) for p in missing)
        hint = ""
        if (folder / "data_batch_1").exists() or (folder / "cifar-10-batches-py").exists():
            hint = (
                " The folder seems to hold the pickle (python) version, which slate never "
                "reads; it needs the binary version (cifar-10-binary.tar.gz)."
            )
        raise DataError(
            f"CIFAR-10 is incomplete in {folder}: missing {listed}.{hint} Pass --download to "
            "fetch the binary version of CIFAR-10, or --data-dir to point at the folder that "
            "holds it."
        )
    train = [read_cifar_file(p) for p in paths[:-1]]
    test_images, test_labels = read_cifar_file(paths[-1])
    train_images = np.concatenate([images for images, _ in train])
    train_labels = np.concatenate([labels for _, labels in train])
    return train_images, train_labels, test_images, test_labels
