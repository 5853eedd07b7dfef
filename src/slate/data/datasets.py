"""Named datasets: where their files live, how they are split, and what the test set is.

``load_dataset(config)`` returns a :class:`Dataset` with dense float32 features and 0/1 labels
(float64 for ``libsvm`` files read with ``--standardize``: they are scaled, then cast, later).

* ``digits`` (the default) ships with scikit-learn: 8x8 digits scaled to [0, 1], classes 0-4
  negative and 5-9 positive, a seeded stratified test split, then 80% of the training positives
  dropped, as the paper does for its image sets.
* ``w7a`` and ``w8a`` come from ``DATA_DIR/<name>/`` (plain or .gz); w8a uses ``w8a.t`` when
  present and otherwise a seeded stratified 25% split, recorded in ``Dataset.test_split``.
* ``libsvm`` and ``csv`` read the user's ``--train`` (and optional ``--test``) files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from slate.config import TrainConfig
from slate.data.imbalance import binarize_classes, drop_positives
from slate.errors import ConfigError, DataError

__all__ = [
    "DATASET_NAMES",
    "Dataset",
    "encode_tables",
    "find_file",
    "load_dataset",
    "read_dtype",
    "split_stratified",
]


@dataclass
class Dataset:
    """A binary task: features ``(n, ...)`` float32 (float64 until scaled, see the module
    docstring) and labels ``(n,)`` int64 in {0, 1}."""

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


def _split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int):
    return split_stratified(x, y, fraction, seed)


def split_stratified(
    x: np.ndarray, y: np.ndarray, fraction: float, seed: int, what: str | None = None
):
    """A seeded stratified split ``(x_train, x_test, y_train, y_test)``, ``fraction`` tested.

    ``what`` names the data in the error raised when a class is too small to split.
    """
    if not 0 < fraction < 1:
        raise ConfigError(f"--test-fraction must lie strictly between 0 and 1, got {fraction}.")
    counts = np.bincount(y.astype(np.int64))
    n_test = math.ceil(fraction * len(y))
    classes = int((counts > 0).sum())
    if counts[counts > 0].min() < 2 or n_test < classes or len(y) - n_test < classes:
        raise DataError(
            f"Cannot split {what + ': ' if what else ''}{len(y)} examples (class counts "
            f"{counts.tolist()}) into a stratified "
            f"{fraction:.0%} test set: each class needs at least two examples and both parts at "
            "least one of each class. Give a larger file, another --test-fraction, or --test FILE."
        )
    return train_test_split(x, y, test_size=fraction, stratify=y, random_state=seed)


def _load_digits(config: TrainConfig) -> Dataset:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, c_tr, c_te = _split(x, digits.target, config.test_fraction, config.split_seed)
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
    x_tr, x_te, y_tr, y_te = _split(x_train, y_train, config.test_fraction, config.split_seed)
    return Dataset(
        name,
        x_tr,
        y_tr,
        x_te,
        y_te,
        f"{name}.t not found: seeded stratified {config.test_fraction:.0%} split of {name} "
        f"(split seed {config.split_seed})",
    )


def _user_files(config: TrainConfig, reader) -> Dataset:
    """Read ``--train`` and, if given, ``--test`` (else split ``--train``)."""
    if not config.train:
        raise ConfigError(
            f"--dataset {config.dataset} needs --train FILE (and optionally --test FILE)."
        )
    x_train, y_train = reader(config.train)
    if not config.test:
        x_train, x_test, y_train, y_test = _split(
            x_train, y_train, config.test_fraction, config.split_seed
        )
        split = f"seeded stratified {config.test_fraction:.0%} split of {config.train}"
        return Dataset(config.dataset, x_train, y_train, x_test, y_test, split)
    x_test, y_test = reader(config.test)
    if config.dataset == "libsvm" and config.n_features is None:
        # Without --n-features each file's width is its own largest index: pad to the wider.
        width = max(x_train.shape[1], x_test.shape[1])
        x_train, x_test = (np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in (x_train, x_test))
    if x_test.shape[1:] != x_train.shape[1:]:
        raise DataError(
            f"--test {config.test} has {x_test.shape[1]} features but --train {config.train} "
            f"has {x_train.shape[1]}; the two files must have the same columns."
        )
    return Dataset(config.dataset, x_train, y_train, x_test, y_test, f"test file {config.test}")


def read_dtype(config: TrainConfig) -> type[np.floating]:
    """float64 when the features are standardised later (:mod:`slate.data.sources`), which
    casts them to float32 after scaling; float32 otherwise."""
    return np.float64 if config.standardize else np.float32


def _load_libsvm(config: TrainConfig) -> Dataset:
    from slate.data.readers.libsvm import read_libsvm_file

    notes: list[str] = []

    def read(path: str):
        read = read_libsvm_file(
            path, n_features=config.n_features, zero_based=config.zero_based,
            dtype=read_dtype(config),
        )  # fmt: skip
        if read.note:
            notes.append(read.note)
        return read.x, read.y

    data = _user_files(config, read)
    data.notes.extend(notes)
    return data


def _load_csv(config: TrainConfig) -> Dataset:
    """Read the training (and test) table, then encode both with the encoder fitted on the
    training rows (:mod:`slate.data.encoding`)."""
    from slate.data.tables import column_choice, read_user_table, split_table

    if not config.train:
        raise ConfigError("--dataset csv needs --train FILE (and optionally --test FILE).")
    column_choice(config)  # a contradictory column flag fails before the file is read
    train = read_user_table(config, config.train)
    if config.test:
        test = read_user_table(config, config.test)
        split = f"test file {config.test}"
    else:
        train, test = split_table(train, config.test_fraction, config.split_seed, config.train)
        split = f"seeded stratified {config.test_fraction:.0%} split of {config.train}"
    return encode_tables(config, train, test, split)


def encode_tables(
    config: TrainConfig, train: Any, test: Any, split: str, held_out: str = "test"
) -> Dataset:
    """The :class:`Dataset` of a training and a held-out table: the encoder (imputation,
    one-hot, scaling) is fitted on ``train`` only and applied to both."""
    from slate.data.encoding import TableEncoder
    from slate.data.tables import column_choice, id_warnings

    choice = column_choice(config)
    standardize = True if config.standardize is None else config.standardize
    encoder = TableEncoder.fit([train], choice, standardize)
    x_train, x_test = encoder.transform(train), encoder.transform(test)
    return Dataset(
        "csv", x_train, train.y, x_test, test.y, split, encoder=encoder,
        notes=id_warnings(train, choice), held_out=held_out,
    )  # fmt: skip


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


_LOADERS = {
    "digits": _load_digits,
    "w7a": lambda config: _load_w(config, "w7a"),
    "w8a": lambda config: _load_w(config, "w8a"),
    **{name: (lambda config, name=name: _load_images(config, name)) for name in IMAGE_SETS},
    "libsvm": _load_libsvm,
    "csv": _load_csv,
}
DATASET_NAMES = tuple(_LOADERS)


def load_dataset(config: TrainConfig) -> Dataset:
    """Load ``config.dataset`` and check that both splits hold both classes."""
    if config.dataset not in _LOADERS:
        raise ConfigError(
            f"Unknown --dataset {config.dataset!r}; expected one of {', '.join(DATASET_NAMES)}."
        )
    data = _LOADERS[config.dataset](config)
    for split, labels in (("training", data.y_train), ("test", data.y_test)):
        if labels.min() == labels.max():
            only = "positive" if labels[0] == 1 else "negative"
            cause = "Check the label column and --positive-label."
            if split == "test" and "split" in data.test_split:
                cause = (
                    f"The test set is a seeded {config.test_fraction:.0%} split (--test-fraction) "
                    f"of {len(data.y_train) + len(labels)} rows ({int(data.y_train.sum())} "
                    "positive among the training rows): use a larger --test-fraction, or give "
                    "--test FILE."
                )
            raise DataError(
                f"The {split} set of {config.dataset} holds only {only} examples "
                f"({len(labels)} rows); AP needs both classes. {cause}"
            )
    return data
