"""Where a run's data comes from, from the file to the parties' tensors: the one data line.

Every run follows the same line, and this module is the only one that walks it:

1. **read** (:mod:`slate.data.readers`, or :mod:`slate.data.datasets` for the named sets);
2. **split** a held-out part where no test file is given (:mod:`slate.data.split`);
3. **agree**, with per-party files, on one schema (:mod:`slate.data.schema`);
4. **fit** the feature transform once, on training rows only
   (:func:`slate.data.encoding.fit_features`, federated through the engine's exchange, which is
   the identity in one process);
5. **cut** the parties (:mod:`slate.data.partition`) into :class:`LocalData`.

Both entry points, :func:`load_dataset` (the whole dataset) and :func:`load_local_data` (this
process's parties), start here. Two sources:

* **Partitioned** (the paper's experiments): every process loads the whole dataset, cuts the
  seeded partition and keeps its own parties' rows. The test set is the whole test set, scored
  as one pool.
* **Per-party files** (a deployment): party ``n`` reads only ``--train`` (and ``--test``) with
  ``{rank}`` replaced by ``n``, or, when started alone with ``--rank``, the files on its own
  command line (:mod:`slate.data.party_files`). The simulator takes the same files, reading
  every party's in one process.

With ``--validation-fraction F`` a seeded stratified share ``F`` of the training rows is held out
as validation rows (of each party's own rows, with per-party files), scored during training; the
test rows are set aside and read only by :attr:`LocalData.final_test`, once training is over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from slate.config import TrainConfig
from slate.data.datasets import DATASET_NAMES, NAMED_LOADERS, Dataset, read_named_dataset
from slate.data.encoding import fit_features, table_notes
from slate.data.local_data import Exchange, HeldOut, LocalData, uses_party_files
from slate.data.options import TableOptions
from slate.data.partition import check_party_counts, make_partition
from slate.data.party_files import party_file_data
from slate.data.preprocess import Standardizer
from slate.data.split import holdout_positions, split_stratified, split_table
from slate.errors import ConfigError, DataError

__all__ = [
    "MAX_DEFAULT_PARTIES",
    "default_parties",
    "encode_tables",
    "load_dataset",
    "load_local_data",
    "read_dtype",
    "validation_split",
]

MAX_DEFAULT_PARTIES = 20  # the paper's N, and the default for a user's own file


def load_local_data(
    config: TrainConfig,
    local_parties: list[int],
    exchange: Exchange,
    dataset: Dataset | None = None,
) -> LocalData:
    """The data of ``local_parties``, from the source the config names (module docstring)."""
    if uses_party_files(config):
        if dataset is not None:
            raise ConfigError("Per-party files cannot be combined with a preloaded dataset.")
        return party_file_data(config, local_parties, exchange)
    if dataset is None:
        dataset = load_dataset(config, config.validation_fraction, config.split_seed)
    return _partitioned_data(config, local_parties, dataset)


def parties_for_positives(positives: int, b: int) -> int:
    """The default N for a table with ``positives`` training positives: the largest
    ``N <= MAX_DEFAULT_PARTIES`` whose stratified parties each hold at least ``b`` of them
    (at least 1)."""
    return max(1, min(MAX_DEFAULT_PARTIES, positives // b))


def default_parties(config: TrainConfig, resolved: TrainConfig) -> tuple[int, Dataset, str] | None:
    """For a user's own file without ``--nodes``: the largest N <= 20 whose stratified parties
    each hold at least ``b`` training positives, the dataset read to count them, and a note
    saying why; None where the default applies (named datasets, per-party files, a given N).
    ``config`` holds the flags as given, ``resolved`` the same with their defaults filled.
    """
    if config.nodes is not None or config.dataset not in ("csv", "libsvm"):
        return None
    if uses_party_files(config):
        return None
    data = load_dataset(resolved, resolved.validation_fraction, resolved.split_seed)
    positives, b = int(data.y_train.sum()), resolved.positives
    nodes = parties_for_positives(positives, b)
    note = (
        f"note: {positives} training positives allow at most {positives // b} parties of b = "
        f"{b} positives each: running N = {nodes} (not the default {MAX_DEFAULT_PARTIES}); "
        "--nodes N overrides."
    )
    return nodes, data, (note if nodes < MAX_DEFAULT_PARTIES else "")


# --------------------------------------------------------------------------- the whole dataset


def load_dataset(
    config: TrainConfig, validation: float | None = None, validation_seed: int = 0
) -> Dataset:
    """The whole dataset ``config.dataset`` names, read and split, checked to hold both classes
    in both parts. User tables come encoded, with the encoder fitted on the training part.

    With ``validation`` (a fraction) the held-out rows are a seeded stratified share of the
    training rows, and the test rows are set aside (``Dataset.final_test``; a user's test file
    is read only when that is called).
    """
    started = time.perf_counter()
    if config.dataset in NAMED_LOADERS:
        data = read_named_dataset(config)
        if validation is not None:
            data = validation_split(data, validation, validation_seed, keep_test=True)
    elif config.dataset == "libsvm":
        data = _read_libsvm_files(config, validation, validation_seed)
    elif config.dataset == "csv":
        data = _read_csv_files(config, validation, validation_seed)
    else:
        raise ConfigError(
            f"Unknown --dataset {config.dataset!r}; expected one of {', '.join(DATASET_NAMES)}."
        )
    _check_both_classes(data, config)
    data.read_seconds = time.perf_counter() - started
    return data


def validation_split(data: Dataset, fraction: float, seed: int, keep_test: bool = False) -> Dataset:
    """``data`` with its held-out rows replaced by a seeded stratified share ``fraction`` of its
    training rows (:func:`slate.data.split.holdout_positions`); with ``keep_test`` the test rows
    stay available as ``final_test``. Unencoded features only: an encoder fitted before the
    split would have seen the validation rows (CSV tables are split before encoding)."""
    if data.encoder is not None:
        raise ValueError(
            "validation_split needs unencoded features; for a table use tuning_data or "
            "load_dataset(config, validation=...), which split it before encoding."
        )
    kept, held = holdout_positions(
        data.y_train, fraction, seed, "the training set", "--validation-fraction"
    )
    final = data.final_test
    if keep_test and final is None:
        x_test, y_test = data.x_test, data.y_test
        final = lambda: (x_test, y_test)  # noqa: E731
    return Dataset(
        data.name, data.x_train[kept], data.y_train[kept], data.x_train[held],
        data.y_train[held], validation_label(fraction, seed), notes=list(data.notes),
        held_out="validation", parts=None, final_test=final if keep_test else None,
        final_test_split=(data.final_test_split or data.test_split) if keep_test else "",
    )  # fmt: skip


def validation_label(fraction: float, seed: int) -> str:
    return f"seeded stratified {fraction:.0%} of the training set (seed {seed})"


def read_dtype(config: TrainConfig) -> type[np.floating]:
    """float64 when the features are standardised later (here), which casts them to float32
    after scaling; float32 otherwise."""
    return np.float64 if config.standardize else np.float32


def _read_libsvm_files(
    config: TrainConfig, validation: float | None, validation_seed: int
) -> Dataset:
    """``--train`` and, if given, ``--test`` (else a held-out split of ``--train``); with
    ``validation``, a validation share of the training rows, the test file read later."""
    from slate.data.readers.libsvm import read_libsvm_file

    _need_train(config)
    notes: list[str] = []

    def read(path: str) -> tuple[np.ndarray, np.ndarray]:
        read = read_libsvm_file(
            path, n_features=config.n_features, zero_based=config.zero_based,
            dtype=read_dtype(config), positive=config.positive_label,
        )  # fmt: skip
        if read.note:
            notes.append(read.note)
        return read.x, read.y

    x_train, y_train = read(config.train)
    if not config.test:
        x_train, x_test, y_train, y_test = split_stratified(
            x_train, y_train, config.test_fraction, config.split_seed
        )
        data = Dataset("libsvm", x_train, y_train, x_test, y_test, _held_out_split(config))
    elif validation is not None:
        width, test = x_train.shape[1], config.test
        empty = np.zeros((0, width), x_train.dtype)
        data = Dataset(
            "libsvm", x_train, y_train, empty, np.zeros(0, np.int64), f"test file {test}"
        )
        data.final_test = lambda: _to_width(read(test), width, test)
    else:
        x_test, y_test = read(config.test)
        if config.n_features is None:
            # Without --n-features each file's width is its own largest index: pad to the wider.
            width = max(x_train.shape[1], x_test.shape[1])
            x_train, x_test = (_pad(x, width) for x in (x_train, x_test))
        data = Dataset("libsvm", x_train, y_train, x_test, y_test, f"test file {config.test}")
    data.notes.extend(notes)
    if validation is not None:
        data = validation_split(data, validation, validation_seed, keep_test=True)
    return data


def _to_width(read: tuple[np.ndarray, np.ndarray], width: int, path: str):
    """A test file read after training, padded to the training width (never wider)."""
    x, y = read
    if x.shape[1] > width:
        raise DataError(
            f"--test {path} has feature indices up to {x.shape[1]}, beyond the {width} "
            "features of --train; give --n-features."
        )
    return _pad(x, width), y


def _pad(x: np.ndarray, width: int) -> np.ndarray:
    return x if x.shape[1] == width else np.pad(x, ((0, 0), (0, width - x.shape[1])))


def _read_csv_files(config: TrainConfig, validation: float | None, validation_seed: int) -> Dataset:
    """Read the training (and test) table, split where there is no test table, then encode
    both with the encoder fitted on the training part (:func:`encode_tables`). With
    ``validation``, the held-out table is a validation share of the training table, and the
    test table is read (a test file) and encoded only by ``final_test``."""
    _need_train(config)
    options = TableOptions.from_config(config)
    train = options.read(config.train)
    if config.test:
        test_path = config.test
        test = None if validation is not None else options.read(test_path)
        split = f"test file {config.test}"
    else:
        train, test = split_table(train, config.test_fraction, config.split_seed, config.train)
        test_path, split = None, _held_out_split(config)
    if validation is None:
        return encode_tables(options, train, test, split)
    train, held = split_table(
        train, validation, validation_seed, f"{config.train} (--validation-fraction)",
        "--validation-fraction",
    )  # fmt: skip
    data = encode_tables(
        options, train, held, validation_label(validation, validation_seed), "validation"
    )
    later: Callable[[], Any] = (lambda: options.read(test_path)) if test_path else lambda: test
    data.final_test = lambda: _encoded(data.encoder, later())
    data.final_test_split = split
    return data


def _encoded(encoder: Any, table: Any) -> tuple[np.ndarray, np.ndarray]:
    return encoder.transform(table), table.y


def encode_tables(
    options: TableOptions, train: Any, test: Any, split: str, held_out: str = "test"
) -> Dataset:
    """The :class:`Dataset` of a training and a held-out table: the encoder (imputation,
    one-hot, scaling) is fitted on ``train`` only and applied to both."""
    encoder = fit_features(
        [train], choice=options.choice, limits=options.limits, standardize=options.standardize
    )
    x_train, x_test = encoder.transform(train), encoder.transform(test)
    notes = table_notes([train, test], encoder, options.choice)
    return Dataset(
        "csv", x_train, train.y, x_test, test.y, split, encoder=encoder, notes=notes,
        held_out=held_out,
    )  # fmt: skip


def _need_train(config: TrainConfig) -> None:
    if not config.train:
        raise ConfigError(
            f"--dataset {config.dataset} needs --train FILE (and optionally --test FILE)."
        )


def _held_out_split(config: TrainConfig) -> str:
    return f"seeded stratified {config.test_fraction:.0%} split of {config.train}"


def _check_both_classes(data: Dataset, config: TrainConfig) -> None:
    for split, labels in (("training", data.y_train), (data.held_out, data.y_test)):
        if split == "test" and data.final_test is not None and not len(labels):
            continue  # a test file read once training is over, checked then
        if labels.min() == labels.max():
            only = "positive" if labels[0] == 1 else "negative"
            cause = "Check the label column and --positive-label."
            if split == "validation":
                cause = "Use a larger --validation-fraction."
            elif split == "test" and "split" in data.test_split:
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


# --------------------------------------------------------------------------- partitioned


def _partitioned_data(config: TrainConfig, local_parties: list[int], data: Dataset) -> LocalData:
    parts = data.parts
    if parts is None:
        parts = make_partition(
            data.y_train, config.nodes, config.partition, config.seed, config.dirichlet_alpha
        )
    elif len(parts) != config.nodes:
        raise ConfigError(
            f"The data assigns rows to {len(parts)} parties, but --nodes is {config.nodes}."
        )
    check_party_counts(data.y_train, parts, config.positives, config.batch_size, config.partition)
    local = [parts[n] for n in local_parties]
    rows = np.concatenate(local)
    offsets = np.cumsum([0] + [len(p) for p in local])
    x_train, x_test = data.x_train, data.x_test
    transform = data.encoder  # user tables come encoded (and scaled) already
    if transform is None:
        transform = fit_features(
            [x_train], standardize=bool(config.standardize), centre=config.dataset != "libsvm"
        )  # LIBSVM rows are sparse: scale, do not centre
        if transform is not None:
            x_train, x_test = _apply(transform, x_train), _apply(transform, x_test)
    return LocalData(
        x_train=np.ascontiguousarray(x_train[rows]),
        y_train=data.y_train[rows],
        parts=[np.arange(offsets[k], offsets[k + 1]) for k in range(len(local))],
        x_test=x_test,
        y_test=data.y_test,
        test_parts=None,
        n_train=len(data.y_train),
        n_test=len(data.y_test),
        test_split=data.test_split,
        description=data.describe(),
        preprocessing=transform,
        notes=list(data.notes),
        held_out=data.held_out,
        final_test=_final_test(
            data.final_test, None if data.encoder else transform, data.final_test_split
        ),
    )


def _final_test(
    read: Callable[[], tuple[np.ndarray, np.ndarray]] | None, transform: Any, split: str
) -> Callable[[], HeldOut] | None:
    """The whole test set as :class:`HeldOut`, through ``transform`` (a run that validates;
    ``None`` where the test rows come encoded already, as a table's do); ``split`` says how
    its rows were made."""
    if read is None:
        return None

    def final() -> HeldOut:
        x, y = read()
        if transform is not None:
            x = _apply(transform, x)
        if y.min() == y.max():
            raise DataError(
                f"The test set holds only {'positive' if y[0] == 1 else 'negative'} examples "
                f"({len(y)} rows); AP needs both classes."
            )
        return HeldOut(x, y, None, len(y), int(y.sum()), split)

    return final


def _apply(transform: Standardizer, x: np.ndarray) -> np.ndarray:
    return transform.apply(x.reshape(len(x), -1)).reshape(x.shape)
