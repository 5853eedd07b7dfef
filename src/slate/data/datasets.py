"""Named datasets: where their files live, how they are split, and what the test set is.

``read_named_dataset(spec)`` returns a :class:`Dataset` with dense float32 features and 0/1
labels.

* ``digits`` (the default) ships with scikit-learn: 8x8 digits scaled to [0, 1], classes 0-4
  negative and 5-9 positive, a seeded stratified test split, then 80% of the training positives
  dropped, as the paper does for its image sets.
* ``w7a`` and ``w8a`` come from ``DATA_DIR/<name>/`` (plain or .gz); w8a uses ``w8a.t`` when
  present and otherwise a seeded stratified 25% split, recorded in ``Dataset.test_split``.

The user's own ``libsvm`` and ``csv`` files are read by :mod:`slate.data.sources`, which is also
where every dataset is fitted and cut into parties.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slate.data.imbalance import binarize_classes, drop_positives
from slate.data.local_data import describe_rows
from slate.data.parts import ArrayPart
from slate.data.spec import DataSpec

__all__ = [
    "IMAGE_SETS",
    "NAMED_LOADERS",
    "Dataset",
    "dataset_names",
    "find_file",
    "normalise_images",
    "read_named_dataset",
    "register_dataset",
    "unregister_dataset",
]


@dataclass
class Dataset:
    """A binary task: features ``(n, ...)`` float32 (float64 for LIBSVM files that
    :mod:`slate.data.sources` scales, then casts) and labels ``(n,)`` int64 in {0, 1}."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    test_split: str
    encoder: Any = None  # a fitted slate.data.encoding.TableEncoder for user tables
    notes: list[str] = field(default_factory=list)  # warnings for the console
    held_out: str = "test"  # what the held-out rows are: "test", or tune's "validation"
    parts: list[np.ndarray] | None = None  # each party's training rows; None: --partition cuts
    # With --validation-fraction: the test rows (x, y), read and transformed only when called.
    final_test: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None
    final_test_split: str = ""  # how the rows of final_test were made
    read_seconds: float = 0.0  # wall time load_dataset took to read, split and encode it

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def describe(self) -> str:
        return describe_rows(self.name, self.y_train, self.y_test, self.held_out, self.test_split)


def find_file(folder: Path, name: str) -> Path | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: the 1 797 8x8 images as rows scaled to [0, 1] (float32) and their
    classes 0-9, read once per process (``load_digits`` parses a gzip CSV, about 0.1 s of CPU
    each time). Read-only: every use indexes copies out of them."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    target = np.array(digits.target)
    for array in (x, target):
        array.setflags(write=False)
    return x, target


def _load_digits(spec: DataSpec) -> Dataset:
    x, target = digits_arrays()
    train, test = ArrayPart(x, target).split(spec.test_fraction, spec.split_seed)
    x_tr, x_te, c_tr, c_te = train.x, test.x, train.y, test.y
    keep = drop_positives(c_tr, 10, keep=0.2, seed=spec.split_seed)
    return Dataset(
        "digits",
        x_tr[keep],
        binarize_classes(c_tr[keep], 10),
        x_te,
        binarize_classes(c_te, 10),
        f"seeded stratified {spec.test_fraction:.0%} split of sklearn digits "
        f"(split seed {spec.split_seed}), training positives reduced to 20%",
    )


def _data_folder(spec: DataSpec, name: str) -> Path:
    from slate.data.download import ensure_files

    root = Path(spec.data_dir) if spec.data_dir else Path("data")
    return ensure_files(name, root, download=spec.download)


def _load_w(spec: DataSpec, name: str) -> Dataset:
    from slate.data.readers.libsvm import read_libsvm

    folder = _data_folder(spec, name)
    x_train, y_train = read_libsvm(find_file(folder, name), n_features=300)
    test_path = find_file(folder, f"{name}.t")
    if test_path is not None:
        x_test, y_test = read_libsvm(test_path, n_features=300)
        return Dataset(
            name, x_train, y_train, x_test, y_test, f"official test file {test_path.name}"
        )
    train, test = ArrayPart(x_train, y_train).split(spec.test_fraction, spec.split_seed)
    x_tr, x_te, y_tr, y_te = train.x, test.x, train.y, test.y
    return Dataset(
        name,
        x_tr,
        y_tr,
        x_te,
        y_te,
        f"{name}.t not found: seeded stratified {spec.test_fraction:.0%} split of {name} "
        f"(split seed {spec.split_seed})",
    )


@dataclass(frozen=True)
class ImageSet:
    """How one image benchmark is read, binarised and normalised (REFERENCE.md, Data)."""

    n_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    downloadable: bool = True


IMAGE_SETS = {
    "mnist": ImageSet(10, (0.1307,), (0.3081,)),
    "fashion-mnist": ImageSet(10, (0.2860,), (0.3529,)),
    "cifar10": ImageSet(10, (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    "tiny-imagenet": ImageSet(
        200, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), downloadable=False
    ),
}


def normalise_images(
    images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]
) -> np.ndarray:
    """uint8 ``(n, C, H, W)`` to float32 ``(x / 255 - mean_c) / std_c``, once, on load."""
    out = images.astype(np.float32) / np.float32(255.0)
    out -= np.asarray(mean, dtype=np.float32)[None, :, None, None]
    out /= np.asarray(std, dtype=np.float32)[None, :, None, None]
    return out


def _read_images(name: str, folder: Path):
    if name in ("mnist", "fashion-mnist"):
        from slate.data.readers.idx import read_mnist_split

        x_tr, y_tr = read_mnist_split(folder, "train")
        x_te, y_te = read_mnist_split(folder, "test")
        return x_tr[:, None], y_tr, x_te[:, None], y_te
    if name == "cifar10":
        from slate.data.readers.cifar import read_cifar10_binary

        return read_cifar10_binary(folder)
    from slate.data.readers.tinyimagenet import read_tiny_imagenet

    return read_tiny_imagenet(folder)[:4]


def _load_images(spec: DataSpec, name: str) -> Dataset:
    image = IMAGE_SETS[name]
    root = Path(spec.data_dir) if spec.data_dir else Path("data")
    folder = _data_folder(spec, name) if image.downloadable else root / name
    x_tr, c_tr, x_te, c_te = _read_images(name, folder)
    keep = drop_positives(c_tr, image.n_classes, keep=0.2, seed=spec.split_seed)
    return Dataset(
        name,
        normalise_images(x_tr[keep], image.mean, image.std),
        binarize_classes(c_tr[keep], image.n_classes),
        normalise_images(x_te, image.mean, image.std),
        binarize_classes(c_te, image.n_classes),
        f"official test set of {name}, unchanged (training positives reduced to 20%, "
        f"seed {spec.split_seed})",
    )


#: The named datasets: ``--dataset NAME`` -> its loader, ``loader(spec) -> Dataset``.
NAMED_LOADERS: dict[str, Callable[[DataSpec], Dataset]] = {
    "digits": _load_digits,
    "w7a": lambda spec: _load_w(spec, "w7a"),
    "w8a": lambda spec: _load_w(spec, "w8a"),
    **{name: (lambda spec, name=name: _load_images(spec, name)) for name in IMAGE_SETS},
}
_BUILT_IN = frozenset(NAMED_LOADERS)
_USER_FILES = ("libsvm", "csv")


def dataset_names() -> tuple[str, ...]:
    """Every ``--dataset``: the named sets (registered ones included), and the user's own
    ``libsvm`` or ``csv`` files."""
    return (*NAMED_LOADERS, *_USER_FILES)


def register_dataset(name: str, loader: Callable[[DataSpec], Dataset]) -> None:
    """Add ``loader`` to :data:`NAMED_LOADERS` as ``--dataset NAME``, for this process.

    ``loader(spec)`` gets the run's :class:`~slate.data.spec.DataSpec` (``data_dir``,
    ``test_fraction``, ``split_seed``, ...) and returns a :class:`Dataset`: float32 features,
    int64 labels in {0, 1}, a training and a test part; the line after it (validation split,
    standardisation, partition, sampler) is the one every named dataset takes. A name taken
    already (or ``libsvm``/``csv``) is a ``ValueError``."""
    if not name or name in NAMED_LOADERS or name in _USER_FILES:
        raise ValueError(f"--dataset {name!r} is taken or empty; choose another name")
    if not callable(loader):
        raise TypeError(f"register_dataset takes a callable loader(spec), got {loader!r}")
    NAMED_LOADERS[name] = loader


def unregister_dataset(name: str) -> None:
    """Remove the loader :func:`register_dataset` added as ``name``; the built-in datasets stay
    (a ``ValueError``), an unknown name is a ``KeyError``."""
    if name in _BUILT_IN:
        raise ValueError(f"--dataset {name} is built in and cannot be unregistered")
    if name not in NAMED_LOADERS:
        raise KeyError(f"no dataset named {name!r} is registered")
    del NAMED_LOADERS[name]


def read_named_dataset(spec: DataSpec) -> Dataset:
    """The named dataset ``spec.dataset``, read and split (module docstring)."""
    return NAMED_LOADERS[spec.dataset](spec)
