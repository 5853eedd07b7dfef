"""Where a run's data comes from, from the file to the parties' tensors: the one data line.

Every run follows the same line, and this module is the only one that walks it:

1. **read** (:mod:`slate.data.readers`, or :mod:`slate.data.datasets` for the named sets);
2. **split** a held-out part where no test file is given (:mod:`slate.data.split`);
3. **agree**, with per-party files, on one schema (:mod:`slate.data.schema`);
4. **fit** the feature transform once, on training rows only
   (:func:`slate.data.encoding.fit_features`, federated through the engine's exchange, which is
   the identity in one process);
5. **cut** the parties (:mod:`slate.data.partition`) into :class:`LocalData`.

Two sources:

* **Partitioned** (the paper's experiments): every process loads the whole dataset, cuts the
  seeded partition and keeps its own parties' rows. The test set is the whole test set, scored
  as one pool.
* **Per-party files** (a deployment): party ``n`` reads only ``--train`` (and ``--test``) with
  ``{rank}`` replaced by ``n``, or, when started alone with ``--rank``, the files on its own
  command line. The parties agree on a schema before anything else, fit with federated
  statistics, and each keeps its own test rows: the test metrics are then federated
  (:mod:`slate.evaluation`). The simulator takes the same files, reading every party's in one
  process.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from torch import Tensor

from slate.config import TrainConfig
from slate.data.datasets import DATASET_NAMES, NAMED_LOADERS, Dataset, read_named_dataset
from slate.data.encoding import fit_features, id_warnings, reduction_notes
from slate.data.options import TableOptions
from slate.data.partition import check_party_counts, make_partition
from slate.data.preprocess import Standardizer
from slate.data.schema import PartyCounts, Schema, check_agreement, check_party_files_counts
from slate.data.split import split_stratified, split_table
from slate.errors import ConfigError, DataError, SlateError

__all__ = [
    "RANK_PLACEHOLDER",
    "Exchange",
    "LocalData",
    "encode_tables",
    "load_dataset",
    "load_local_data",
    "party_path",
    "read_dtype",
    "uses_party_files",
]

RANK_PLACEHOLDER = "{rank}"
PARTY_FILE_FORMATS = ("csv", "libsvm")


class Exchange(Protocol):
    """What setting up per-party data needs from the engine: sums and a gather of small facts."""

    def total(self, value: Tensor) -> Tensor: ...

    def gather_objects(self, items: list[Any]) -> list[Any]: ...


@dataclass
class LocalData:
    """The rows of the parties this process runs, and the test rows it scores.

    Attributes:
        x_train, y_train: the local parties' training rows, concatenated in party order.
        parts: each local party's positions in ``x_train``.
        x_test, y_test: the whole test set (partitioned) or the local parties' own test rows.
        test_parts: each local party's positions in ``x_test`` with per-party files; ``None``
            when the test set is one pool.
        n_train, n_test: row counts over all parties.
        test_split: how the test set was made.
        description: one line for the console.
        preprocessing: the fitted transform, applied to every feature row here.
        notes: warnings for the console (parties short of positives).
        counts: every party's row counts (per-party files only).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    parts: list[np.ndarray]
    x_test: np.ndarray
    y_test: np.ndarray
    test_parts: list[np.ndarray] | None
    n_train: int
    n_test: int
    test_split: str
    description: str
    preprocessing: Standardizer | None = None
    notes: list[str] = field(default_factory=list)
    counts: list[PartyCounts] = field(default_factory=list)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def federated(self) -> bool:
        return self.test_parts is not None

    def describe(self) -> str:
        return self.description


def uses_party_files(config: TrainConfig) -> bool:
    """Whether each party reads its own files (``--party-files``, or ``{rank}`` in a path)."""
    return bool(config.party_files) or any(
        RANK_PLACEHOLDER in (path or "") for path in (config.train, config.test)
    )


def party_path(template: str, rank: int) -> str:
    """``template`` with ``{rank}`` replaced by the party's index."""
    return template.replace(RANK_PLACEHOLDER, str(rank))


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
        return _party_file_data(config, local_parties, exchange)
    return _partitioned_data(config, local_parties, dataset or load_dataset(config))


# --------------------------------------------------------------------------- the whole dataset


def load_dataset(config: TrainConfig) -> Dataset:
    """The whole dataset ``config.dataset`` names, read and split, checked to hold both classes
    in both parts. User tables come encoded, with the encoder fitted on the training part."""
    if config.dataset in NAMED_LOADERS:
        data = read_named_dataset(config)
    elif config.dataset == "libsvm":
        data = _read_libsvm_files(config)
    elif config.dataset == "csv":
        data = _read_csv_files(config)
    else:
        raise ConfigError(
            f"Unknown --dataset {config.dataset!r}; expected one of {', '.join(DATASET_NAMES)}."
        )
    _check_both_classes(data, config)
    return data


def read_dtype(config: TrainConfig) -> type[np.floating]:
    """float64 when the features are standardised later (here), which casts them to float32
    after scaling; float32 otherwise."""
    return np.float64 if config.standardize else np.float32


def _read_libsvm_files(config: TrainConfig) -> Dataset:
    """``--train`` and, if given, ``--test`` (else a held-out split of ``--train``)."""
    from slate.data.readers.libsvm import read_libsvm_file

    _need_train(config)
    notes: list[str] = []

    def read(path: str) -> tuple[np.ndarray, np.ndarray]:
        read = read_libsvm_file(
            path, n_features=config.n_features, zero_based=config.zero_based,
            dtype=read_dtype(config),
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
    else:
        x_test, y_test = read(config.test)
        if config.n_features is None:
            # Without --n-features each file's width is its own largest index: pad to the wider.
            width = max(x_train.shape[1], x_test.shape[1])
            x_train, x_test = (_pad(x, width) for x in (x_train, x_test))
        data = Dataset("libsvm", x_train, y_train, x_test, y_test, f"test file {config.test}")
    data.notes.extend(notes)
    return data


def _read_csv_files(config: TrainConfig) -> Dataset:
    """Read the training (and test) table, split where there is no test table, then encode
    both with the encoder fitted on the training part (:func:`encode_tables`)."""
    _need_train(config)
    options = TableOptions.from_config(config)
    train = options.read(config.train)
    if config.test:
        test = options.read(config.test)
        split = f"test file {config.test}"
    else:
        train, test = split_table(train, config.test_fraction, config.split_seed, config.train)
        split = _held_out_split(config)
    return encode_tables(options, train, test, split)


def encode_tables(
    options: TableOptions, train: Any, test: Any, split: str, held_out: str = "test"
) -> Dataset:
    """The :class:`Dataset` of a training and a held-out table: the encoder (imputation,
    one-hot, scaling) is fitted on ``train`` only and applied to both."""
    encoder = fit_features(
        [train], choice=options.choice, limits=options.limits, standardize=options.standardize
    )
    x_train, x_test = encoder.transform(train), encoder.transform(test)
    notes = _table_notes([train, test], encoder, options)
    return Dataset(
        "csv", x_train, train.y, x_test, test.y, split, encoder=encoder, notes=notes,
        held_out=held_out,
    )  # fmt: skip


def _table_notes(tables: list[Any], encoder: Any, options: TableOptions) -> list[str]:
    """The readers' notes, ID warnings and one-hot reductions of a run's tables, each once."""
    notes = [n for t in tables for n in t.notes]
    ids = [
        w for w in id_warnings(tables[0], options.choice)
        if not any(f"column {c!r}" in w for c in encoder.left_out)
    ]  # fmt: skip
    warned = {c for c in tables[0].columns if any(f"column {c!r}" in w for w in ids)}
    notes += ids + reduction_notes(encoder, tables[0].path, skip=warned)
    return list(dict.fromkeys(notes))


def _need_train(config: TrainConfig) -> None:
    if not config.train:
        raise ConfigError(
            f"--dataset {config.dataset} needs --train FILE (and optionally --test FILE)."
        )


def _held_out_split(config: TrainConfig) -> str:
    return f"seeded stratified {config.test_fraction:.0%} split of {config.train}"


def _check_both_classes(data: Dataset, config: TrainConfig) -> None:
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
    check_party_counts(data.y_train, parts, config.positives, config.batch_size)
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
    )


def _apply(transform: Standardizer, x: np.ndarray) -> np.ndarray:
    return transform.apply(x.reshape(len(x), -1)).reshape(x.shape)


# --------------------------------------------------------------------------- per-party files


@dataclass
class _PartyFiles:
    """One party's own files, read: arrays, its column names, its schema."""

    rank: int
    x_train: np.ndarray | None  # None for CSV until the parties' encoder is fitted
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray
    test_split: str
    schema: Schema
    tables: tuple[Any, Any] | None = None  # CSV: the raw training and test tables


def _party_file_data(config: TrainConfig, local_parties: list[int], exchange) -> LocalData:
    if config.dataset not in PARTY_FILE_FORMATS:
        raise ConfigError(
            f"Per-party files ({RANK_PLACEHOLDER} in --train, or --rank) need --dataset csv or "
            f"libsvm, got --dataset {config.dataset}."
        )
    if not config.train:
        raise ConfigError(f"--dataset {config.dataset} needs --train FILE.")
    options = TableOptions.from_config(config) if config.dataset == "csv" else None
    read, schemas = {}, []
    for rank in local_parties:
        try:
            read[rank] = _read_party(config, options, rank)
            schemas.append(read[rank].schema)
        except SlateError as err:
            schemas.append(Schema(rank=rank, error=str(err)))
    everyone: list[Schema] = exchange.gather_objects(schemas)
    check_agreement(everyone)
    counts = [s.counts for s in everyone]
    notes = check_party_files_counts(counts, config.positives, config.batch_size)
    files = [read[rank] for rank in local_parties]
    if options is not None:
        train = [f.tables[0] for f in files]
    else:
        files = [_pad_to_common_width(f, everyone, config) for f in files]
        train = [f.x_train for f in files]
    transform = fit_features(
        train, choice=options.choice if options else None,
        limits=options.limits if options else None,
        standardize=bool(config.standardize), centre=False,
        total=exchange.total, gather=exchange.gather_objects,
    )  # fmt: skip
    if options is not None:
        notes += [n for f in files for n in _table_notes(list(f.tables), transform, options)]
    files = [_transformed(f, transform) for f in files]
    return _assemble(files, counts, config, transform, notes)


def _transformed(files: _PartyFiles, transform) -> _PartyFiles:
    """The party's training and test rows through the fitted transform (tables are encoded)."""
    if files.tables is not None:
        train, test = files.tables
        return replace(files, x_train=transform.transform(train), x_test=transform.transform(test))
    if transform is None:
        return files
    return replace(
        files, x_train=transform.apply(files.x_train), x_test=transform.apply(files.x_test)
    )


def _read_party(config: TrainConfig, options: TableOptions | None, rank: int) -> _PartyFiles:
    """Read party ``rank``'s files only; a party without a test file holds out a split."""
    train_path = party_path(config.train, rank)
    test_path = party_path(config.test, rank) if config.test else None
    if options is not None:
        return _read_party_csv(config, options, rank, train_path, test_path)
    x_train, y_train, x_test, y_test, schema = _read_party_libsvm(
        config, rank, train_path, test_path
    )
    split = "each party's own test file"
    if x_test is None:
        x_train, x_test, y_train, y_test = split_stratified(
            x_train, y_train, config.test_fraction, config.split_seed,
            f"party {rank}'s {train_path}",
        )  # fmt: skip
        split = HELD_OUT
    counts = PartyCounts(len(y_train), int(y_train.sum()), len(y_test), int(y_test.sum()))
    schema = replace(schema, counts=counts)
    return _PartyFiles(rank, x_train, y_train, x_test, y_test, split, schema)


HELD_OUT = "seeded stratified split of each party's own file (--test-fraction)"


def _read_party_csv(
    config: TrainConfig, options: TableOptions, rank: int, train_path: str, test_path: str | None
) -> _PartyFiles:
    """The party's raw tables (encoded once the parties agree) and its schema."""
    train = options.read(train_path, labels="single_class_ok")
    values = list(train.label_values)
    if test_path is None:
        train, test = split_table(
            train, config.test_fraction, config.split_seed, f"party {rank}'s {train_path}"
        )
        split = HELD_OUT
    else:
        test = options.read(test_path, labels="single_class_ok")
        values += [v for v in test.label_values if v not in values]
        split = "each party's own test file"
    schema = Schema(
        rank=rank, format="csv", n_features=len(train.columns), header=train.header,
        label_column=train.label_name, label_values=tuple(values),
        positive_label=str(options.positive_label).strip(), text_columns=tuple(sorted(train.text)),
        counts=PartyCounts(train.rows, int(train.y.sum()), test.rows, int(test.y.sum())),
    )  # fmt: skip
    return _PartyFiles(rank, None, train.y, None, test.y, split, schema, (train, test))


def _read_party_libsvm(config: TrainConfig, rank: int, train_path: str, test_path: str | None):
    from slate.data.readers.libsvm import read_libsvm

    def read(path: str):
        return read_libsvm(
            path, n_features=config.n_features, zero_based=config.zero_based,
            dtype=read_dtype(config),
        )  # fmt: skip

    x_train, y_train = read(train_path)
    x_test = y_test = None
    width = x_train.shape[1]
    if test_path is not None:
        x_test, y_test = read(test_path)
        width = max(width, x_test.shape[1])
    schema = Schema(rank=rank, format="libsvm", n_features=width)
    return x_train, y_train, x_test, y_test, schema


def _pad_to_common_width(
    files: _PartyFiles, everyone: list[Schema], config: TrainConfig
) -> _PartyFiles:
    """LIBSVM: pad the party's matrices to the largest index over all parties' files."""
    width = config.n_features or max(s.n_features for s in everyone)
    return replace(files, x_train=_pad(files.x_train, width), x_test=_pad(files.x_test, width))


def _pad(x: np.ndarray, width: int) -> np.ndarray:
    return x if x.shape[1] == width else np.pad(x, ((0, 0), (0, width - x.shape[1])))


def _assemble(files, counts, config, transform, notes) -> LocalData:
    x_train = np.concatenate([f.x_train for f in files])
    x_test = np.concatenate([f.x_test for f in files])
    n_train = sum(c.train for c in counts)
    n_test = sum(c.test for c in counts)
    positives = sum(c.train_positives for c in counts)
    test_positives = sum(c.test_positives for c in counts)
    return LocalData(
        x_train=x_train,
        y_train=np.concatenate([f.y_train for f in files]),
        parts=_blocks([len(f.y_train) for f in files]),
        x_test=x_test,
        y_test=np.concatenate([f.y_test for f in files]),
        test_parts=_blocks([len(f.y_test) for f in files]),
        n_train=n_train,
        n_test=n_test,
        test_split=files[0].test_split,
        description=(
            f"{config.dataset}, {len(counts)} parties' own files: {n_train} train "
            f"({positives / max(n_train, 1):.2%} positive), {n_test} test "
            f"({test_positives / max(n_test, 1):.2%} positive); test set: {files[0].test_split}"
        ),
        preprocessing=transform,
        notes=notes,
        counts=counts,
    )


def _blocks(lengths: list[int]) -> list[np.ndarray]:
    offsets = np.cumsum([0, *lengths])
    return [np.arange(offsets[k], offsets[k + 1]) for k in range(len(lengths))]
