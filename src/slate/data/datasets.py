"""Named datasets: where their files live, how they are split, and what the test set is.

``read_named_dataset(config)`` returns a :class:`Dataset` with dense float32 features and 0/1
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

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slate.config import TrainConfig
from slate.data.imbalance import binarize_classes, drop_positives
from slate.data.split import split_stratified

__all__ = [
    "DATASET_NAMES",
    "IMAGE_SETS",
    "NAMED_LOADERS",
    "Dataset",
    "find_file",
    "normalise_images",
    "read_named_dataset",
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
        return (
            f"{self.name}: {len(self.y_train)} train ({self.y_train.mean():.2%} positive), "
            f"{len(self.y_test)} {self.held_out} ({self.y_test.mean():.2%} positive); "
            f"{self.held_out} set: {self.test_split}"
        )


def find_file(folder: Path, name: str) -> Path | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _load_digits(config: TrainConfig) -> Dataset:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, c_tr, c_te = split_stratified(
        x, digits.target, config.test_fraction, config.split_seed
    )
    keep = drop_positives(c_tr, 10, keep=0.2, seed=config.split_seed)
    return Dataset(
        "digits",
        x_tr[keep],
        binarize_classes(c_tr[keep], 10),
        x_te,
        binarize_classes(c_te, 10),
        f"seeded stratified {config.test_fraction:.0%} split of sklearn digits "
        f"(split seed {config.split_seed}), training positives reduced to 20%",
    )


def _data_folder(config: TrainConfig, name: str) -> Path:
    from slate.data.download import ensure_files

    root = Path(config.data_dir) if config.data_dir else Path("data")
    return ensure_files(name, root, download=config.download)


def _load_w(config: TrainConfig, name: str) -> Dataset:
    from slate.data.readers.libsvm import read_libsvm

    folder = _data_folder(config, name)
    x_train, y_train = read_libsvm(find_file(folder, name), n_features=300)
    test_path = find_file(folder, f"{name}.t")
    if test_path is not None:
        x_test, y_test = read_libsvm(test_path, n_features=300)
        return Dataset(
            name, x_train, y_train, x_test, y_test, f"official test file {test_path.name}"
        )
    x_tr, x_te, y_tr, y_te = split_stratified(
        x_train, y_train, config.test_fraction, config.split_seed
    )
    return Dataset(
        name,
        x_tr,
        y_tr,
        x_te,
        y_te,
        f"{name}.t not found: seeded stratified {config.test_fraction:.0%} split of {name} "
        f"(split seed {config.split_seed})",
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


def _load_images(config: TrainConfig, name: str) -> Dataset:
    spec = IMAGE_SETS[name]
    root = Path(config.data_dir) if config.data_dir else Path("data")
    folder = _data_folder(config, name) if spec.downloadable else root / name
    x_tr, c_tr, x_te, c_te = _read_images(name, folder)
    keep = drop_positives(c_tr, spec.n_classes, keep=0.2, seed=config.split_seed)
    return Dataset(
        name,
        normalise_images(x_tr[keep], spec.mean, spec.std),
        binarize_classes(c_tr[keep], spec.n_classes),
        normalise_images(x_te, spec.mean, spec.std),
        binarize_classes(c_te, spec.n_classes),
        f"official test set of {name}, unchanged (training positives reduced to 20%, "
        f"seed {config.split_seed})",
    )


NAMED_LOADERS = {
    "digits": _load_digits,
    "w7a": lambda config: _load_w(config, "w7a"),
    "w8a": lambda config: _load_w(config, "w8a"),
    **{name: (lambda config, name=name: _load_images(config, name)) for name in IMAGE_SETS},
}
#: Every ``--dataset``: the named sets above, and the user's own ``libsvm`` or ``csv`` files.
DATASET_NAMES = (*NAMED_LOADERS, "libsvm", "csv")


def read_named_dataset(config: TrainConfig) -> Dataset:
    """The named dataset ``config.dataset``, read and split (module docstring)."""
    return NAMED_LOADERS[config.dataset](config)
