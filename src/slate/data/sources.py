"""Where a run's data comes from: one dataset cut into partitions, or one set of files per party.

The choice is made once, where the run is set up (:func:`load_local_data`); the training loop only
sees :class:`LocalData`, the rows of the parties this process runs.

* **Partitioned** (the paper's experiments): every process loads the whole dataset, cuts the
  seeded partition and keeps its own parties' rows. The test set is the whole test set, scored
  as one pool.
* **Per-party files** (a deployment): party ``n`` reads only ``--train`` (and ``--test``) with
  ``{rank}`` replaced by ``n``, or, when started alone with ``--rank``, the files on its own
  command line. The parties agree on a schema (:mod:`slate.data.schema`) before anything else,
  standardise with federated statistics (:mod:`slate.data.preprocess`), and each keeps its own
  test rows: the test metrics are then federated (:mod:`slate.evaluation`). The simulator takes
  the same files, reading every party's in one process.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from torch import Tensor

from slate.config import TrainConfig
from slate.data.datasets import Dataset, load_dataset, read_dtype, split_stratified
from slate.data.encoding import TableEncoder
from slate.data.partition import check_party_counts, make_partition
from slate.data.preprocess import Standardizer
from slate.data.schema import PartyCounts, Schema, check_agreement
from slate.data.tables import column_choice, id_warnings, read_user_table, split_table
from slate.errors import ConfigError, DataError, SlateError

__all__ = [
    "RANK_PLACEHOLDER",
    "Exchange",
    "LocalData",
    "load_local_data",
    "party_path",
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
    if config.standardize and transform is None:
        centre = config.dataset != "libsvm"  # LIBSVM rows are sparse: scale, do not centre
        transform = Standardizer.fit([x_train.reshape(len(x_train), -1)], centre=centre)
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
    read, schemas = {}, []
    for rank in local_parties:
        try:
            read[rank] = _read_party(config, rank)
            schemas.append(read[rank].schema)
        except SlateError as err:
            schemas.append(Schema(rank=rank, error=str(err)))
    everyone: list[Schema] = exchange.gather_objects(schemas)
    check_agreement(everyone)
    counts = [s.counts for s in everyone]
    notes = _check_counts(counts, config)
    files = [read[rank] for rank in local_parties]
    if config.dataset == "csv":
        transform, files = _encode_tables(files, config, exchange)
        notes += [w for f in files for w in id_warnings(f.tables[0], column_choice(config))]
        return _assemble(files, counts, config, transform, notes)
    files = [_pad_to_common_width(f, everyone, config) for f in files]
    transform = None
    if config.standardize:
        transform = Standardizer.fit([f.x_train for f in files], exchange.total, centre=False)
        files = [
            replace(f, x_train=transform.apply(f.x_train), x_test=transform.apply(f.x_test))
            for f in files
        ]
    return _assemble(files, counts, config, transform, notes)


def _encode_tables(files: list[_PartyFiles], config: TrainConfig, exchange):
    """Fit one encoder on every party's training table (federated sums and category names),
    then encode each party's training and test tables with it."""
    encoder = TableEncoder.fit(
        [f.tables[0] for f in files], column_choice(config), bool(config.standardize),
        exchange.total, exchange.gather_objects,
    )  # fmt: skip
    encoded = [
        replace(f, x_train=encoder.transform(f.tables[0]), x_test=encoder.transform(f.tables[1]))
        for f in files
    ]
    return encoder, encoded


def _read_party(config: TrainConfig, rank: int) -> _PartyFiles:
    """Read party ``rank``'s files only; a party without a test file holds out a split."""
    train_path = party_path(config.train, rank)
    test_path = party_path(config.test, rank) if config.test else None
    if config.dataset == "csv":
        return _read_party_csv(config, rank, train_path, test_path)
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


def _read_party_csv(config: TrainConfig, rank: int, train_path: str, test_path: str | None):
    """The party's raw tables (encoded once the parties agree) and its schema."""
    column_choice(config)  # a contradictory column flag fails here, on every party alike
    train = read_user_table(config, train_path, labels="single_class_ok")
    values = list(train.label_values)
    if test_path is None:
        train, test = split_table(
            train, config.test_fraction, config.split_seed, f"party {rank}'s {train_path}"
        )
        split = HELD_OUT
    else:
        test = read_user_table(config, test_path, labels="single_class_ok")
        values += [v for v in test.label_values if v not in values]
        split = "each party's own test file"
    schema = Schema(
        rank=rank, format="csv", n_features=len(train.columns), header=train.header,
        label_column=train.label_name, label_values=tuple(values),
        positive_label=str(config.positive_label).strip(), text_columns=tuple(sorted(train.text)),
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


def _check_counts(counts: list[PartyCounts], config: TrainConfig) -> list[str]:
    """Stop on parties without positives or negatives; warn about those short of ``b``."""
    none = [n for n, c in enumerate(counts) if c.train_positives == 0]
    if none:
        raise DataError(
            f"Parties {none} hold no positive training example. Every party needs at least one "
            "positive: the AP objective is an average over each batch's positives. Leave those "
            "parties out of the run (fewer --nodes), or give them data with positives."
        )
    if config.batch_size > config.positives:
        empty = [n for n, c in enumerate(counts) if c.train_negatives == 0]
        if empty:
            raise DataError(
                f"Parties {empty} hold no negative training example, but each batch needs "
                f"m - b = {config.batch_size - config.positives} negatives."
            )
    test_pos = sum(c.test_positives for c in counts)
    test_all = sum(c.test for c in counts)
    if test_pos == 0 or test_pos == test_all:
        only = "negative" if test_pos == 0 else "positive"
        raise DataError(
            f"All parties' test rows together are {only}: AP needs both classes. Test rows per "
            f"party: {[c.test for c in counts]}, positives: {[c.test_positives for c in counts]}."
        )
    short = [
        (n, c.train_positives) for n, c in enumerate(counts) if c.train_positives < config.positives
    ]
    return [
        f"warning: party {n} holds {k} positive training example{'s' if k != 1 else ''}, "
        f"fewer than b = {config.positives}: its batches draw them with replacement, so "
        "they repeat within a batch."
        for n, k in short
    ]


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
