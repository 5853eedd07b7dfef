"""The data line after reading: the parties agree on one feature transform (the only fit), then
the shards are cut into the rows of this process's parties (:class:`LocalData`).

Both sources end here (:mod:`slate.data.sources` reads them into :class:`Shard` s):

* a **whole dataset** (one shard, ``rank`` ``None``): the transform is fitted on its training
  rows, and the seeded partition (``--partition``, or the parts the caller chose) gives every
  party its rows; the test set is the whole test set, scored as one pool;
* **per-party files** (one shard per local party): the parties exchange their schemas
  (:mod:`slate.data.schema`), fit the transform with federated statistics through the engine's
  exchange, and each keeps its own rows and held-out rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slate.data.encoding import fit_features, table_notes
from slate.data.local_data import Exchange, HeldOut, LocalData, describe_rows, row_blocks
from slate.data.options import TableOptions
from slate.data.partition import check_party_counts, make_partition
from slate.data.parts import Part, Shard
from slate.data.schema import (
    SCHEMA_SHAPE,
    PartyCounts,
    Schema,
    check_agreement,
    check_both_test_classes,
    check_party_files_counts,
)
from slate.data.spec import DataSpec
from slate.errors import ConfigError, DataError, SlateError

__all__ = ["Agreement", "agree", "cut"]


@dataclass
class Agreement:
    """What the parties agreed on: the fitted transform (``None``: features as they are), the
    LIBSVM width of per-party files (``None`` otherwise), every party's row counts (per-party
    files) and the notes for the console."""

    transform: Any
    width: int | None = None
    counts: list[PartyCounts] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def agree(
    spec: DataSpec,
    shards: list[Shard],
    exchange: Exchange | None,
    options: TableOptions | None,
) -> Agreement:
    """Fit the feature transform once, on the training rows of ``shards``; with per-party
    files, first exchange and check the parties' schemas and counts. ``options`` are the table
    options where the parts are CSV tables, else ``None``."""
    if shards[0].rank is None:
        return _agree_whole(spec, shards[0], options)
    shared = exchange.gather_json([s.schema.to_json() for s in shards], SCHEMA_SHAPE, "schema")
    everyone = [Schema.from_json(raw) for raw in shared]
    check_agreement(everyone)
    counts = [s.counts for s in everyone]
    notes = check_party_files_counts(counts, spec.positives, spec.batch_size)
    width = None if options else (spec.n_features or max(s.n_features for s in everyone))
    transform = fit_features(
        [s.train.pad(width).fit_input for s in shards],
        choice=options.choice if options else None, limits=options.limits if options else None,
        standardize=bool(spec.standardize), centre=False,
        total=exchange.total, gather=exchange.gather_json,
    )  # fmt: skip
    if options is not None:
        notes += [n for s in shards for n in _table_notes(s, transform, options)]
    return Agreement(transform, width, counts, notes)


def _agree_whole(spec: DataSpec, shard: Shard, options: TableOptions | None) -> Agreement:
    """A whole dataset's transform: the one it came with, a table's encoder (imputation,
    one-hot, scaling), or the scaling ``--standardize`` asks for (LIBSVM rows are sparse:
    scaled, not centred)."""
    if shard.transform is not None:
        return Agreement(shard.transform)
    if options is not None:
        encoder = fit_features(
            [shard.train.fit_input], choice=options.choice, limits=options.limits,
            standardize=options.standardize,
        )  # fmt: skip
        return Agreement(encoder, notes=_table_notes(shard, encoder, options))
    transform = fit_features(
        [shard.train.fit_input], standardize=bool(spec.standardize),
        centre=spec.dataset != "libsvm",
    )  # fmt: skip
    return Agreement(transform)


def _table_notes(shard: Shard, encoder: Any, options: TableOptions) -> list[str]:
    return table_notes([shard.train.fit_input, shard.held.fit_input], encoder, options.choice)


def cut(
    spec: DataSpec,
    shards: list[Shard],
    agreement: Agreement,
    local_parties: list[int],
    exchange: Exchange | None,
) -> LocalData:
    """The rows of ``local_parties``, through the agreed transform (module docstring)."""
    if shards[0].rank is None:
        return _cut_whole(spec, shards[0], agreement, local_parties)
    return _cut_party_files(spec, shards, agreement, exchange)


def _cut_whole(
    spec: DataSpec, shard: Shard, agreement: Agreement, local_parties: list[int]
) -> LocalData:
    """Cut the seeded partition (or the caller's parts) and keep the local parties' rows."""
    y_train, parts = shard.train.labels, shard.parts
    if parts is None:
        parts = make_partition(y_train, spec.nodes, spec.partition, spec.seed, spec.dirichlet_alpha)
    elif len(parts) != spec.nodes:
        raise ConfigError(
            f"The data assigns rows to {len(parts)} parties, but --nodes is {spec.nodes}."
        )
    check_party_counts(y_train, parts, spec.positives, spec.batch_size, spec.partition)
    local = [parts[n] for n in local_parties]
    rows = np.concatenate(local)
    # rows that came through their transform already (a preloaded table) are used as they are
    apply = None if shard.transform is not None else agreement.transform
    x_train = shard.train.features(apply)
    held = shard.held.labels
    return LocalData(
        x_train=np.ascontiguousarray(x_train[rows]),
        y_train=y_train[rows],
        parts=row_blocks([len(p) for p in local]),
        x_test=shard.held.features(apply),
        y_test=held,
        test_parts=None,
        n_train=len(y_train),
        n_test=len(held),
        test_split=shard.held_split,
        description=describe_rows(shard.name, y_train, held, shard.held_out, shard.held_split),
        preprocessing=agreement.transform,
        notes=[*shard.notes, *agreement.notes],
        held_out=shard.held_out,
        final_test=_final_test_whole(shard.later, apply, shard.test_split),
    )


def _final_test_whole(
    later: Callable[[], Part] | None, transform: Any, split: str
) -> Callable[[], HeldOut] | None:
    """The whole test set as :class:`HeldOut`, through ``transform``; ``split`` says how its
    rows were made."""
    if later is None:
        return None

    def final() -> HeldOut:
        part = later()
        x, y = part.features(transform), part.labels
        if y.min() == y.max():
            raise DataError(
                f"The test set holds only {'positive' if y[0] == 1 else 'negative'} examples "
                f"({len(y)} rows); AP needs both classes."
            )
        return HeldOut(x, y, None, len(y), int(y.sum()), split)

    return final


def _cut_party_files(
    spec: DataSpec, shards: list[Shard], agreement: Agreement, exchange: Exchange
) -> LocalData:
    """Every local party keeps its own rows; the parties' counts describe the whole run."""
    features = _transform_all(shards, agreement, exchange)
    counts = agreement.counts
    n_train = sum(c.train for c in counts)
    n_test = sum(c.test for c in counts)
    positives = sum(c.train_positives for c in counts)
    test_positives = sum(c.test_positives for c in counts)
    held = "validation" if spec.validation_fraction is not None else "test"
    split = shards[0].held_split
    data = LocalData(
        x_train=np.concatenate([train for train, _ in features]),
        y_train=np.concatenate([s.train.labels for s in shards]),
        parts=row_blocks([len(s.train.labels) for s in shards]),
        x_test=np.concatenate([held for _, held in features]),
        y_test=np.concatenate([s.held.labels for s in shards]),
        test_parts=row_blocks([len(s.held.labels) for s in shards]),
        n_train=n_train,
        n_test=n_test,
        test_split=split,
        description=(
            f"{spec.dataset}, {len(counts)} parties' own files: {n_train} train "
            f"({positives / max(n_train, 1):.2%} positive), {n_test} {held} "
            f"({test_positives / max(n_test, 1):.2%} positive); {held} set: {split}"
        ),
        preprocessing=agreement.transform,
        notes=agreement.notes,
        counts=counts,
        held_out=held,
    )
    if spec.validation_fraction is not None:
        data.final_test = lambda: _final_test_parties(shards, agreement, exchange)
    return data


def _transform_all(
    shards: list[Shard], agreement: Agreement, exchange: Exchange
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every local party's training and held-out features; a party whose files do not fit the
    agreed transform (a test file with a renamed column) stops every party, naming itself."""
    features, reports = [], []
    for s in shards:
        try:
            features.append((_features(s.train, agreement), _features(s.held, agreement)))
            reports.append((s.rank, None))
        except SlateError as err:
            reports.append((s.rank, str(err)))
    shared = exchange.gather_json(reports, [int, (str, None)], "report on its features", 1 << 20)
    _stop_on(shared)
    return features


def _features(part: Part, agreement: Agreement) -> np.ndarray:
    """A party's part padded to the agreed LIBSVM width, through the agreed transform."""
    return part.pad(agreement.width).features(agreement.transform)


def _stop_on(reports: list[list[Any]]) -> None:
    """Stop every party, naming those whose report (its last field) is an error."""
    failed = [(report[0], report[-1]) for report in reports if report[-1] is not None]
    if failed:
        raise DataError(" ".join(f"Party {rank}: {error}" for rank, error in failed))


def _final_test_parties(shards: list[Shard], agreement: Agreement, exchange: Exchange) -> HeldOut:
    """Every local party's test rows, read and transformed now; the parties agree that the
    union holds both classes (or all stop with the same message)."""
    tests, reports = [], []
    for s in shards:
        try:
            part = s.later()
            tests.append((_features(part, agreement), part.labels))
            reports.append((s.rank, len(tests[-1][1]), int(tests[-1][1].sum()), None))
        except SlateError as err:
            reports.append((s.rank, 0, 0, str(err)))
    everyone = exchange.gather_json(
        reports, [int, int, int, (str, None)], "report on its test rows", 1 << 20
    )
    _stop_on(everyone)
    rows = [n for _, n, _, _ in everyone]
    positives = [p for _, _, p, _ in everyone]
    check_both_test_classes(rows, positives)
    return HeldOut(
        np.concatenate([x for x, _ in tests]), np.concatenate([y for _, y in tests]),
        row_blocks([len(y) for _, y in tests]), sum(rows), sum(positives), shards[0].test_split,
    )  # fmt: skip
