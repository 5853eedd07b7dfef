"""The data line for per-party files: each party reads only its own files.

Called by :func:`slate.data.sources.load_local_data`. Party ``n`` reads ``--train`` (and
``--test``) with ``{rank}`` replaced by ``n``. A party without a test file holds out a seeded
stratified part of its own file (:mod:`slate.data.split`), as ``slate train`` does with one file.
The parties then agree on one schema (:mod:`slate.data.schema`), fit the feature transform once
with federated statistics (:func:`slate.data.encoding.fit_features`), and keep their own
held-out rows, scored with federated metrics (:mod:`slate.training.evaluation`).

With ``--validation-fraction F`` each party also holds out a stratified share ``F`` of its own
training rows as validation rows, scored during training; its test rows are read (a test file)
or taken (a held-out split) only by :attr:`LocalData.final_test`, once training is over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from slate.config import TrainConfig
from slate.data.encoding import fit_features, table_notes
from slate.data.local_data import (
    RANK_PLACEHOLDER,
    Exchange,
    HeldOut,
    LocalData,
    party_path,
    row_blocks,
)
from slate.data.options import TableOptions
from slate.data.schema import (
    SCHEMA_SHAPE,
    PartyCounts,
    Schema,
    check_agreement,
    check_both_test_classes,
    check_party_files_counts,
)
from slate.data.split import split_stratified, split_table
from slate.errors import ConfigError, DataError, SlateError

__all__ = ["party_file_data"]

PARTY_FILE_FORMATS = ("csv", "libsvm")
HELD_OUT = "seeded stratified split of each party's own file (--test-fraction)"
OWN_TEST_FILE = "each party's own test file"

#: A part of a party's rows before the transform: a RawTable (CSV) or ``(x, y)`` (LIBSVM).
Part = Any


@dataclass
class _PartyFiles:
    """One party's own rows, read: training, held-out (test or validation), its schema, and,
    when validating, how to get its test rows at the end."""

    rank: int
    train: Part
    held: Part
    held_split: str
    test_split: str  # how the test rows were made (held_split describes the validation rows)
    schema: Schema
    test_later: Callable[[], Part] | None = None


def party_file_data(
    config: TrainConfig,
    local_parties: list[int],
    exchange: Exchange,
) -> LocalData:
    """The data of ``local_parties``, each from its own files (module docstring)."""
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
    shared = exchange.gather_json([s.to_json() for s in schemas], SCHEMA_SHAPE, "schema")
    everyone = [Schema.from_json(raw) for raw in shared]
    check_agreement(everyone)
    counts = [s.counts for s in everyone]
    notes = check_party_files_counts(counts, config.positives, config.batch_size)
    files = [read[rank] for rank in local_parties]
    width = None if options else (config.n_features or max(s.n_features for s in everyone))
    transform = fit_features(
        [_padded(f.train, width) for f in files], choice=options.choice if options else None,
        limits=options.limits if options else None,
        standardize=bool(config.standardize), centre=False,
        total=exchange.total, gather=exchange.gather_json,
    )  # fmt: skip
    if options is not None:
        notes += [
            n for f in files for n in table_notes([f.train, f.held], transform, options.choice)
        ]
    data = _assemble(files, counts, config, transform, width, notes, exchange)
    if config.validation_fraction is not None:
        data.final_test = lambda: _final_test(files, transform, width, exchange)
    return data


def _features(part: Part, transform: Any, width: int | None) -> np.ndarray:
    """A part's rows through the fitted transform (a table is encoded)."""
    if width is None:
        return transform.transform(part)
    x = _padded(part, width)
    return x if transform is None else transform.apply(x)


def _labels(part: Part) -> np.ndarray:
    return part.y if width_free(part) else part[1]


def width_free(part: Part) -> bool:
    """Whether ``part`` is a table (matched by column name) rather than LIBSVM arrays."""
    return not isinstance(part, tuple)


def _padded(part: Part, width: int | None) -> Any:
    """LIBSVM: the features padded to the largest index over all parties' files."""
    if width is None:
        return part
    x = part[0]
    if x.shape[1] > width:
        raise DataError(
            f"A file of this party has feature indices up to {x.shape[1]}, beyond the "
            f"{width} features that the parties' training files agreed on; give --n-features."
        )
    return x if x.shape[1] == width else np.pad(x, ((0, 0), (0, width - x.shape[1])))


def _read_party(config: TrainConfig, options: TableOptions | None, rank: int) -> _PartyFiles:
    """Read party ``rank``'s files only; a party without a test file holds out a split, and
    with ``--validation-fraction`` a validation share of its training rows."""
    train_path = party_path(config.train, rank)
    test_path = party_path(config.test, rank) if config.test else None
    validating = config.validation_fraction is not None

    def read(path: str) -> Part:
        if options is not None:
            return options.read(path, labels="single_class_ok")
        return _read_libsvm(config, path)

    train = read(train_path)
    test_later = None
    if test_path is None:
        train, test = _split(train, config.test_fraction, config.split_seed,
                             f"party {rank}'s {train_path}", "--test-fraction")  # fmt: skip
        held, held_split = test, HELD_OUT
        if validating:
            test_later = lambda: test  # noqa: E731  (kept aside, scored once at the end)
    elif validating:
        held, held_split = None, OWN_TEST_FILE
        test_later = lambda: read(test_path)  # noqa: E731  (read once training is over)
    else:
        held, held_split = read(test_path), OWN_TEST_FILE
    test_split = held_split
    if validating:
        train, held = _split(
            train, config.validation_fraction, config.split_seed,
            f"party {rank}'s training rows", "--validation-fraction",
        )  # fmt: skip
        held_split = (
            f"seeded stratified {config.validation_fraction:.0%} of each party's training rows "
            f"(--validation-fraction, seed {config.split_seed})"
        )
    schema = _schema(rank, options, train, held)
    return _PartyFiles(rank, train, held, held_split, test_split, schema, test_later)


def _split(part: Part, fraction: float, seed: int, what: str, flag: str) -> tuple[Part, Part]:
    if width_free(part):
        return split_table(part, fraction, seed, what, flag)
    x_kept, x_held, y_kept, y_held = split_stratified(part[0], part[1], fraction, seed, what, flag)
    return (x_kept, y_kept), (x_held, y_held)


def _schema(rank: int, options: TableOptions | None, train: Part, held: Part) -> Schema:
    y_train, y_held = _labels(train), _labels(held)
    counts = PartyCounts(len(y_train), int(y_train.sum()), len(y_held), int(y_held.sum()))
    if options is None:
        width = max(train[0].shape[1], held[0].shape[1])
        return Schema(rank=rank, format="libsvm", n_features=width, counts=counts)
    values = list(train.label_values)
    values += [v for v in held.label_values if v not in values]
    return Schema(
        rank=rank, format="csv", n_features=len(train.columns), header=train.header,
        label_column=train.label_name, label_values=tuple(values),
        positive_label=str(options.positive_label).strip(), text_columns=tuple(sorted(train.text)),
        counts=counts,
    )  # fmt: skip


def _read_libsvm(config: TrainConfig, path: str) -> tuple[np.ndarray, np.ndarray]:
    from slate.data.readers.libsvm import read_libsvm

    # float64 when standardised (scaled, then cast to float32), float32 otherwise
    dtype = np.float64 if config.standardize else np.float32
    return read_libsvm(path, n_features=config.n_features, zero_based=config.zero_based,
                       dtype=dtype, positive=config.positive_label)  # fmt: skip


def _transform_all(files, transform, width, exchange: Exchange) -> list[tuple[Any, Any]]:
    """Every local party's training and held-out features; a party whose files do not fit the
    agreed transform (a test file with a renamed column) stops every party, naming itself."""
    features, reports = [], []
    for f in files:
        try:
            features.append((_features(f.train, transform, width),
                             _features(f.held, transform, width)))  # fmt: skip
            reports.append((f.rank, None))
        except SlateError as err:
            reports.append((f.rank, str(err)))
    shared = exchange.gather_json(reports, [int, (str, None)], "report on its features", 1 << 20)
    failed = [(rank, error) for rank, error in shared if error]
    if failed:
        raise DataError(" ".join(f"Party {rank}: {error}" for rank, error in failed))
    return features


def _assemble(files, counts, config, transform, width, notes, exchange) -> LocalData:
    features = _transform_all(files, transform, width, exchange)
    n_train = sum(c.train for c in counts)
    n_test = sum(c.test for c in counts)
    positives = sum(c.train_positives for c in counts)
    test_positives = sum(c.test_positives for c in counts)
    held = "validation" if config.validation_fraction is not None else "test"
    return LocalData(
        x_train=np.concatenate([train for train, _ in features]),
        y_train=np.concatenate([_labels(f.train) for f in files]),
        parts=row_blocks([len(_labels(f.train)) for f in files]),
        x_test=np.concatenate([held for _, held in features]),
        y_test=np.concatenate([_labels(f.held) for f in files]),
        test_parts=row_blocks([len(_labels(f.held)) for f in files]),
        n_train=n_train,
        n_test=n_test,
        test_split=files[0].held_split,
        description=(
            f"{config.dataset}, {len(counts)} parties' own files: {n_train} train "
            f"({positives / max(n_train, 1):.2%} positive), {n_test} {held} "
            f"({test_positives / max(n_test, 1):.2%} positive); {held} set: "
            f"{files[0].held_split}"
        ),
        preprocessing=transform,
        notes=notes,
        counts=counts,
        held_out=held,
    )


def _final_test(
    files: list[_PartyFiles], transform: Any, width: int | None, exchange: Exchange
) -> HeldOut:
    """Every local party's test rows, read and transformed now; the parties agree that the
    union holds both classes (or all stop with the same message)."""
    tests, reports = [], []
    for f in files:
        try:
            part = f.test_later()
            tests.append((_features(part, transform, width), _labels(part)))
            reports.append((f.rank, len(tests[-1][1]), int(tests[-1][1].sum()), None))
        except SlateError as err:
            reports.append((f.rank, 0, 0, str(err)))
    everyone = exchange.gather_json(
        reports, [int, int, int, (str, None)], "report on its test rows", 1 << 20
    )
    failed = [(rank, error) for rank, _, _, error in everyone if error is not None]
    if failed:
        raise DataError(" ".join(f"Party {rank}: {error}" for rank, error in failed))
    rows = [n for _, n, _, _ in everyone]
    positives = [p for _, _, p, _ in everyone]
    check_both_test_classes(rows, positives)
    return HeldOut(
        np.concatenate([x for x, _ in tests]), np.concatenate([y for _, y in tests]),
        row_blocks([len(y) for _, y in tests]), sum(rows), sum(positives), files[0].test_split,
    )  # fmt: skip
