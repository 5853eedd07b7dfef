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

from slate.data.declared import Declared
from slate.data.encoding import fit_features
from slate.data.local_data import (
    Exchange,
    HeldOut,
    LocalData,
    describe_rows,
    row_blocks,
    stop_on_errors,
)
from slate.data.options import TableOptions
from slate.data.partition import check_party_counts, make_partition
from slate.data.parts import Shard
from slate.data.plausible import SetupBounds, check_plausible
from slate.data.schema import (
    SCHEMA_SHAPE,
    PartyCounts,
    Schema,
    SchemaMismatch,
    check_agreement,
    check_both_test_classes,
    check_party_files_counts,
)
from slate.data.spec import DataSpec
from slate.data.table_notes import table_notes
from slate.errors import ConfigError, DataError, SlateError

__all__ = ["Agreement", "agree", "cut", "local_data"]


@dataclass
class Agreement:
    """What the parties agreed on: the fitted transform (``None``: features as they are), the
    LIBSVM width of per-party files (``None`` otherwise), every party's row counts (per-party
    files), the notes for the console, and every site's declarations (per-party files:
    :mod:`slate.data.declared`), and the sha256 of the ``--schema`` file (``None`` without
    one)."""

    transform: Any
    width: int | None = None
    counts: list[PartyCounts] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    declared: Declared | None = None
    dictionary: str | None = None  # the sha256 of the --schema file, where one was given


def local_data(
    spec: DataSpec,
    shards: list[Shard],
    exchange: Exchange,
    options: TableOptions | None,
    local_parties: list[int],
) -> LocalData:
    """The whole line after reading, for this process's ``local_parties``: :func:`agree`, then
    :func:`cut`."""
    return cut(spec, shards, agree(spec, shards, exchange, options), local_parties, exchange)


def agree(
    spec: DataSpec,
    shards: list[Shard],
    exchange: Exchange | None,
    options: TableOptions | None,
) -> Agreement:
    """Fit the feature transform once, on the training rows of ``shards``; with per-party
    files, first exchange and check the parties' schemas and counts, and fit with statistics
    summed through ``exchange``. ``options`` are the table options where the parts are CSV
    tables, else ``None``; with their dictionary (``--schema``) no category is gathered.

    A whole dataset keeps the transform it came with (a preloaded table), or gets a table's
    encoder (imputation, one-hot, scaling), or the scaling ``--standardize`` asks for (LIBSVM
    rows are sparse: scaled, not centred; so are per-party files' rows).
    """
    whole = shards[0].rank is None
    if whole and shards[0].transform is not None:
        return Agreement(shards[0].transform)
    counts: list[PartyCounts] = []
    notes: list[str] = []
    width, federated, declared = None, {}, None
    standardize = bool(spec.standardize)
    if whole and options is not None:
        standardize = options.standardize
    if not whole:
        shared = exchange.gather_json([s.schema.to_json() for s in shards], SCHEMA_SHAPE, "schema")
        everyone = [Schema.from_json(raw) for raw in shared]
        _check_agreement(everyone, shards)
        counts = [s.counts for s in everyone]
        bounds = SetupBounds.parse(spec.declared_bounds)
        declared = Declared.of(counts, [s.ranges for s in everyone], bounds.scale)
        check_plausible(counts, bounds)
        notes = check_party_files_counts(counts, spec.positives, spec.batch_size)
        width = None if options else (spec.n_features or max(s.n_features for s in everyone))
        federated = {"total": exchange.total, "gather": exchange.gather_json,
                     "declared": declared}  # fmt: skip
    dictionary = options.dictionary if options else None
    transform = fit_features(
        [s.train.pad(width).fit_input for s in shards],
        choice=options.choice if options else None, limits=options.limits if options else None,
        standardize=standardize, centre=whole and spec.dataset != "libsvm",
        dictionary=dictionary, private=spec.dp_epsilon is not None, **federated,
    )  # fmt: skip
    if declared is not None:
        notes += declared.notes  # where this site's clamp of the scaling bound
    if options is not None:
        notes += [
            note
            for s in shards
            for note in table_notes(
                [s.train.fit_input, s.held.fit_input], transform, options.choice
            )
        ]
    digest = dictionary.digest if dictionary is not None else None
    return Agreement(transform, width, counts, notes, declared, digest)


def _check_agreement(everyone: list[Schema], shards: list[Shard]) -> None:
    """:func:`~slate.data.schema.check_agreement`, with this process's own reasons added where
    its parties' files could not be read and only a generic reason was sent (under
    ``--dp-epsilon``: :data:`~slate.data.party_files.PRIVATE_READ_ERROR`)."""
    try:
        check_agreement(everyone)
    except SchemaMismatch as err:
        own = [f"Party {s.rank} (here): {note}" for s in shards if s.train is None
               for note in s.notes]  # fmt: skip
        if not own:
            raise
        raise SchemaMismatch(" ".join([str(err), *own])) from None


def cut(
    spec: DataSpec,
    shards: list[Shard],
    agreement: Agreement,
    local_parties: list[int],
    exchange: Exchange | None,
) -> LocalData:
    """The rows of ``local_parties``, through the agreed transform (module docstring).

    A whole dataset is cut by the seeded partition (``--partition``, or the parts the caller
    chose) and every process keeps its own parties' rows; its held-out rows are one pool. With
    per-party files every local party keeps its own rows and held-out rows, and the parties'
    counts describe the whole run; a party whose files do not fit the agreed transform (a test
    file with a renamed column) stops every party, naming itself.
    """
    final = _final_test(spec, shards, agreement, exchange)
    first = shards[0]
    # rows that came through their transform already (a preloaded table) are used as they are
    apply = None if first.transform is not None else agreement.transform
    if first.rank is None:
        y_train, y_held, parts = first.train.labels, first.held.labels, first.parts
        if parts is None:
            parts = make_partition(
                y_train, spec.nodes, spec.partition, spec.seed, spec.dirichlet_alpha
            )
        elif len(parts) != spec.nodes:
            raise ConfigError(
                f"The data assigns rows to {len(parts)} parties, but --nodes is {spec.nodes}."
            )
        counted = check_party_counts(
            y_train, parts, spec.positives, spec.batch_size, spec.partition
        )
        local = [parts[n] for n in local_parties]
        rows = np.concatenate(local)
        return LocalData(
            x_train=np.ascontiguousarray(first.train.features(apply)[rows]),
            y_train=y_train[rows],
            parts=row_blocks([len(p) for p in local]),
            x_test=first.held.features(apply),
            y_test=y_held,
            test_parts=None,
            n_train=len(y_train),
            n_test=len(y_held),
            test_split=first.held_split,
            description=describe_rows(
                first.name, y_train, y_held, first.held_out, first.held_split
            ),
            preprocessing=agreement.transform,
            notes=[*first.notes, *agreement.notes, *counted],
            held_out=first.held_out,
            final_test=final,
            dictionary=agreement.dictionary,
        )
    features, reports = [], []
    for s in shards:
        try:
            features.append(tuple(
                part.pad(agreement.width).features(apply) for part in (s.train, s.held)
            ))  # fmt: skip
            reports.append((s.rank, None))
        except SlateError as err:
            reports.append((s.rank, str(err)))
    shared = exchange.gather_json(reports, [int, (str, None)], "report on its features", 1 << 20)
    stop_on_errors(shared)
    counts = agreement.counts
    n_train, n_test = sum(c.train for c in counts), sum(c.test for c in counts)
    positives = sum(c.train_positives for c in counts)
    test_positives = sum(c.test_positives for c in counts)
    held = "validation" if spec.validation_fraction is not None else "test"
    return LocalData(
        x_train=np.concatenate([train for train, _ in features]),
        y_train=np.concatenate([s.train.labels for s in shards]),
        parts=row_blocks([len(s.train.labels) for s in shards]),
        x_test=np.concatenate([held for _, held in features]),
        y_test=np.concatenate([s.held.labels for s in shards]),
        test_parts=row_blocks([len(s.held.labels) for s in shards]),
        n_train=n_train,
        n_test=n_test,
        test_split=first.held_split,
        description=(
            f"{spec.dataset}, {len(counts)} parties' own files: {n_train} train "
            f"({positives / max(n_train, 1):.2%} positive), {n_test} {held} "
            f"({test_positives / max(n_test, 1):.2%} positive); {held} set: "
            f"{first.held_split}"
        ),
        preprocessing=agreement.transform,
        notes=agreement.notes,
        own_notes=[note for s in shards for note in s.notes],
        counts=counts,
        declared=agreement.declared,
        held_out=held,
        final_test=final,
        dictionary=agreement.dictionary,
    )


def _final_test(
    spec: DataSpec, shards: list[Shard], agreement: Agreement, exchange: Exchange | None
) -> Callable[[], HeldOut] | None:
    """With ``--validation-fraction`` (or a preloaded dataset's test rows set aside), what
    reads the test rows once training is over, through the agreed transform, as
    :class:`HeldOut`: a whole dataset's test set as one pool, or every local party's own test
    rows, the parties agreeing that their union holds both classes (or all stopping with the
    same message); ``None`` where there are no such rows."""
    first = shards[0]
    whole = first.rank is None
    if (first.later is None) if whole else (spec.validation_fraction is None):
        return None
    apply = None if first.transform is not None else agreement.transform

    def whole_test() -> HeldOut:
        part = first.later()
        x, y = part.features(apply), part.labels
        if y.min() == y.max():
            raise DataError(
                f"The test set holds only {'positive' if y[0] == 1 else 'negative'} examples "
                f"({len(y)} rows); AP needs both classes."
            )
        return HeldOut(x, y, None, len(y), int(y.sum()), first.test_split)

    def parties_test() -> HeldOut:
        tests, reports = [], []
        for s in shards:
            try:
                part = s.later()
                tests.append((part.pad(agreement.width).features(apply), part.labels))
                reports.append((s.rank, len(tests[-1][1]), int(tests[-1][1].sum()), None))
            except SlateError as err:
                reports.append((s.rank, 0, 0, str(err)))
        everyone = exchange.gather_json(
            reports, [int, int, int, (str, None)], "report on its test rows", 1 << 20
        )
        stop_on_errors(everyone)
        rows = [n for _, n, _, _ in everyone]
        positives = [p for _, _, p, _ in everyone]
        check_both_test_classes(rows, positives)
        return HeldOut(
            np.concatenate([x for x, _ in tests]), np.concatenate([y for _, y in tests]),
            row_blocks([len(y) for _, y in tests]), sum(rows), sum(positives), first.test_split,
            [(r, p) for r, p in zip(rows, positives, strict=True)],
        )  # fmt: skip

    return whole_test if whole else parties_test
