"""Reading per-party files: each party reads only its own files, into its own :class:`Shard`.

Called by :func:`slate.data.sources.load_local_data`. Party ``n`` reads ``--train`` (and
``--test``) with ``{rank}`` replaced by ``n``. A party without a test file holds out a seeded
stratified part of its own file (:func:`slate.data.parts.hold_out`), as ``slate train`` does with
one file. The parties then agree on one schema and fit the feature transform once with federated
statistics, and each keeps its own held-out rows, scored with federated metrics
(:mod:`slate.data.line`, :mod:`slate.training.evaluation`).

With ``--validation-fraction F`` each party also holds out a stratified share ``F`` of its own
training rows as validation rows, scored during training; its test rows are read (a test file)
or taken (a held-out split) only by :attr:`LocalData.final_test`, once training is over.
"""

from __future__ import annotations

import dataclasses

from slate.data.declared import public_ranges
from slate.data.options import TableOptions
from slate.data.parts import Part, PartReader, Shard
from slate.data.schema import PartyCounts, Schema
from slate.data.spec import RANK_PLACEHOLDER, DataSpec, party_path
from slate.errors import ConfigError, SlateError

__all__ = ["read_party_files"]

PARTY_FILE_FORMATS = ("csv", "libsvm")
#: What the other sites hear, under ``--dp-epsilon``, of a site whose files cannot be read.
PRIVATE_READ_ERROR = "the reason stays at its site under --dp-epsilon (it may quote a row)"
HELD_OUT = "seeded stratified split of each party's own file (--test-fraction)"
OWN_TEST_FILE = "each party's own test file"


def read_party_files(
    spec: DataSpec, local_parties: list[int]
) -> tuple[list[Shard], TableOptions | None]:
    """Every local party's shard (a party whose files cannot be read gets a shard whose schema
    carries the error, which the parties' agreement reports), and the table options of CSV
    files (``None`` for LIBSVM)."""
    if spec.dataset not in PARTY_FILE_FORMATS:
        raise ConfigError(
            f"Per-party files ({RANK_PLACEHOLDER} in --train, or --rank) need --dataset csv or "
            f"libsvm, got --dataset {spec.dataset}."
        )
    if not spec.train:
        raise ConfigError(f"--dataset {spec.dataset} needs --train FILE.")
    options = TableOptions.from_config(spec) if spec.dataset == "csv" else None
    reader, shards = PartReader.of(spec, options), []
    for rank in local_parties:
        try:
            shards.append(_read_party(spec, reader, rank))
        except SlateError as err:
            if spec.dp_epsilon is None:
                shards.append(Shard(None, None, rank=rank, schema=Schema(rank, error=str(err))))
                continue
            # under --dp-epsilon the reason (a line, a token of a row) stays at this site: the
            # others hear that its files could not be read, and it adds its own reason
            schema = Schema(rank, error=PRIVATE_READ_ERROR)
            shards.append(Shard(None, None, rank=rank, schema=schema, notes=[str(err)]))
    return shards, options


def _read_party(spec: DataSpec, reader: PartReader, rank: int) -> Shard:
    """Read party ``rank``'s files only; a party without a test file holds out a split, and
    with ``--validation-fraction`` a validation share of its training rows."""
    train_path = party_path(spec.train, rank)
    test_path = party_path(spec.test, rank) if spec.test else None
    validating = spec.validation_fraction is not None
    notes: list[str] = []  # this site's own, never sent (the clipping into a public range)

    def read(path: str) -> Part:
        part, note = reader.read(path, labels="single_class_ok")
        if note:
            notes.extend(note.split("\n"))
        return part

    train = read(train_path)
    test_later = None
    if test_path is None:
        train, test = train.split(spec.test_fraction, spec.split_seed,
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
        train, held = train.split(
            spec.validation_fraction, spec.split_seed,
            f"party {rank}'s training rows", "--validation-fraction",
        )  # fmt: skip
        held_split = (
            f"seeded stratified {spec.validation_fraction:.0%} of each party's training rows "
            f"(--validation-fraction, seed {spec.split_seed})"
        )
    y_train, y_held = train.labels, held.labels
    counts = PartyCounts(len(y_train), int(y_train.sum()), len(y_held), int(y_held.sum()))
    options = reader.options
    positive = str(options.positive_label).strip() if options is not None else ""
    schema = train.schema(rank, held, counts, positive)
    if options is not None and options.dictionary is not None:  # compared first by everyone
        dictionary = options.dictionary
        ranges = (dictionary.public_ranges() if spec.dp_epsilon is not None  # nothing own
                  else dictionary.declared_ranges(schema.ranges, train_path))  # fmt: skip
        schema = dataclasses.replace(schema, dictionary=dictionary.digest, ranges=ranges)
    if options is None and spec.public_range is not None:  # public: nothing of the rows
        schema = dataclasses.replace(schema, ranges=public_ranges(spec.public_range))
    if options is None and spec.dp_epsilon is not None and spec.n_features is None:
        notes.append(
            f"note: {train_path}: without --n-features this site sends the largest feature "
            f"index of its files ({schema.n_features}) as its feature count, outside "
            "--dp-epsilon: a row using an index no other row uses would show in it. Give "
            "--n-features (the same at every site) to declare a public width."
        )
    return Shard(
        train, held, held_split, test_split, test_later, rank=rank, schema=schema,
        name=spec.dataset, notes=notes, held_out="validation" if validating else "test",
    )  # fmt: skip
