"""Where a run's data comes from, from the file to the parties' tensors: the one data line.

Every run follows the same line:

1. **read** into shards (:class:`~slate.data.parts.Shard`): a whole dataset (the named sets of
   :mod:`slate.data.datasets`, a user's ``--train``/``--test`` file, or a preloaded
   :class:`Dataset`) is one shard; per-party files are one shard per party
   (:mod:`slate.data.party_files`). A held-out part is split off where no test file is given
   (:func:`slate.data.parts.hold_out`);
2. **agree** on one transform and fit it, the only fit, on training rows only
   (:func:`slate.data.line.agree`: with per-party files through the engine's exchange, after the
   parties' schemas were compared);
3. **cut** the shards into the rows of this process's parties (:func:`slate.data.line.cut`), a
   :class:`LocalData`.

Both entry points, :func:`load_dataset` (the whole dataset) and :func:`load_local_data` (this
process's parties), start here, and take a :class:`~slate.data.spec.DataSpec` (a run passes its
data section; a caller holding only a configuration may pass that, and the spec is built here).
Two sources:

* **Partitioned** (the paper's experiments): every process loads the whole dataset, cuts the
  seeded partition and keeps its own parties' rows. The test set is the whole test set, scored
  as one pool.
* **Per-party files** (a deployment): party ``n`` reads only ``--train`` (and ``--test``) with
  ``{rank}`` replaced by ``n``, or, when started alone with ``--rank``, the files on its own
  command line. The simulator takes the same files, reading every party's in one process.

With ``--validation-fraction F`` a seeded stratified share ``F`` of the training rows is held out
as validation rows (of each party's own rows, with per-party files), scored during training; the
test rows are set aside and read only by :attr:`LocalData.final_test`, once training is over.
"""

from __future__ import annotations

import time
from typing import Any

from slate.data.datasets import NAMED_LOADERS, Dataset, dataset_names, read_named_dataset
from slate.data.line import agree, local_data
from slate.data.local_data import Exchange, LocalData
from slate.data.options import TableOptions
from slate.data.parts import ArrayPart, Part, PartReader, Shard
from slate.data.party_files import read_party_files
from slate.data.spec import DataSpec
from slate.errors import ConfigError, DataError

__all__ = [
    "MAX_DEFAULT_PARTIES",
    "default_parties",
    "load_dataset",
    "load_local_data",
    "validation_split",
]

MAX_DEFAULT_PARTIES = 20  # the paper's N, and the default for a user's own file


def load_local_data(
    source: DataSpec | Any,
    local_parties: list[int],
    exchange: Exchange,
    dataset: Dataset | None = None,
) -> LocalData:
    """The data of ``local_parties``, from the source the spec names, or from ``dataset`` read
    before (module docstring). ``source`` is a :class:`DataSpec` or a configuration."""
    spec = _spec(source)
    if spec.per_party:
        if dataset is not None:
            raise ConfigError("Per-party files cannot be combined with a preloaded dataset.")
        shards, options = read_party_files(spec, local_parties)
    elif dataset is None:
        shard, options = _read_whole(spec, spec.validation_fraction, spec.split_seed)
        shards = [shard]
    else:
        shards, options = [_preloaded(dataset)], None
    return local_data(spec, shards, exchange, options, local_parties)


def _spec(source: DataSpec | Any) -> DataSpec:
    """``source`` itself when it is a spec (a run's data section), else the spec built from
    that configuration (:meth:`DataSpec.of`)."""
    return source if isinstance(source, DataSpec) else DataSpec.of(source)


def parties_for_positives(positives: int, b: int) -> int:
    """The default N for a table with ``positives`` training positives: the largest
    ``N <= MAX_DEFAULT_PARTIES`` whose stratified parties each hold at least ``b`` of them
    (at least 1)."""
    return max(1, min(MAX_DEFAULT_PARTIES, positives // b))


def default_parties(spec: DataSpec, given: int | None = None) -> tuple[int, Dataset, str] | None:
    """For a user's own file (``spec``, the run's data section) without ``--nodes`` (``given``:
    the N given, or None): the largest N <= 20 whose stratified parties each hold at least ``b``
    training positives, the dataset read to count them, and a note saying why; None where the
    default applies (named datasets, per-party files, a given N)."""
    if given is not None or spec.dataset not in ("csv", "libsvm") or spec.per_party:
        return None
    data = load_dataset(spec, spec.validation_fraction, spec.split_seed)
    positives, b = int(data.y_train.sum()), spec.positives
    nodes = parties_for_positives(positives, b)
    note = (
        f"note: {positives} training positives allow at most {positives // b} parties of b = "
        f"{b} positives each: running N = {nodes} (not the default {MAX_DEFAULT_PARTIES}); "
        "--nodes N overrides."
    )
    return nodes, data, (note if nodes < MAX_DEFAULT_PARTIES else "")


# --------------------------------------------------------------------------- the whole dataset


def load_dataset(
    source: DataSpec | Any, validation: float | None = None, validation_seed: int = 0
) -> Dataset:
    """The whole dataset the spec (or configuration) ``source`` names, read and split, checked
    to hold both classes in both parts. User tables come encoded, with the encoder fitted on the
    training part (:func:`slate.data.line.agree`); arrays come as read, before any scaling.

    With ``validation`` (a fraction) the held-out rows are a seeded stratified share of the
    training rows, and the test rows are set aside (``Dataset.final_test``; a user's test file
    is read only when that is called).
    """
    started = time.perf_counter()
    spec = _spec(source)
    shard, options = _read_whole(spec, validation, validation_seed)
    encoder, notes = None, list(shard.notes)
    if options is not None:  # a table becomes features only through its encoder
        agreement = agree(spec, [shard], None, options)
        encoder, notes = agreement.transform, notes + agreement.notes
    later = shard.later
    data = Dataset(
        shard.name, shard.train.features(encoder), shard.train.labels,
        shard.held.features(encoder), shard.held.labels, shard.held_split, encoder=encoder,
        notes=notes, held_out=shard.held_out,
        final_test=None if later is None else lambda: _rows(later(), encoder),
        final_test_split=shard.test_split if later is not None else "",
    )  # fmt: skip
    data.read_seconds = time.perf_counter() - started
    return data


def _rows(part: Part, encoder: Any) -> tuple[Any, Any]:
    return part.features(encoder), part.labels


def validation_split(data: Dataset, fraction: float, seed: int, keep_test: bool = False) -> Dataset:
    """``data`` with its held-out rows replaced by a seeded stratified share ``fraction`` of its
    training rows (:func:`slate.data.parts.hold_out`); with ``keep_test`` the test rows stay
    available as ``final_test``. Unencoded features only: an encoder fitted before the split
    would have seen the validation rows (CSV tables are split before encoding)."""
    if data.encoder is not None:
        raise ValueError(
            "validation_split needs unencoded features; for a table use tuning_data or "
            "load_dataset(config, validation=...), which split it before encoding."
        )
    shard = _validated(_preloaded(data), fraction, seed, "the training set")
    final = None
    if keep_test:
        later = shard.later
        final = lambda: _rows(later(), None)  # noqa: E731
    return Dataset(
        data.name, shard.train.x, shard.train.y, shard.held.x, shard.held.y, shard.held_split,
        notes=list(data.notes), held_out="validation", parts=None, final_test=final,
        final_test_split=shard.test_split if keep_test else "",
    )  # fmt: skip


def validation_label(fraction: float, seed: int) -> str:
    return f"seeded stratified {fraction:.0%} of the training set (seed {seed})"


def _preloaded(data: Dataset) -> Shard:
    """A dataset read before (by the caller, or to choose N) as the whole dataset's shard."""
    final = data.final_test
    return Shard(
        ArrayPart(data.x_train, data.y_train), ArrayPart(data.x_test, data.y_test),
        data.test_split, data.final_test_split,
        None if final is None else lambda: ArrayPart(*final()),
        name=data.name, notes=list(data.notes), held_out=data.held_out, parts=data.parts,
        transform=data.encoder,
    )  # fmt: skip


def _read_whole(
    spec: DataSpec, validation: float | None, validation_seed: int
) -> tuple[Shard, TableOptions | None]:
    """The whole dataset's shard, checked to hold both classes, and the table options of a CSV
    file (``None`` otherwise)."""
    options = None
    if spec.dataset in NAMED_LOADERS:
        shard = _preloaded(read_named_dataset(spec))
        if validation is not None:
            shard = _validated(shard, validation, validation_seed, "the training set")
    elif spec.dataset == "libsvm":
        shard = _read_libsvm_files(spec, validation, validation_seed)
    elif spec.dataset == "csv":
        shard, options = _read_csv_files(spec, validation, validation_seed)
    else:
        raise ConfigError(
            f"Unknown --dataset {spec.dataset!r}; expected one of {', '.join(dataset_names())}."
        )
    _check_both_classes(shard, spec)
    return shard, options


def _validated(shard: Shard, fraction: float, seed: int, what: str) -> Shard:
    """``shard`` with its held-out rows replaced by a seeded stratified share ``fraction`` of
    its training rows; its test rows (read later, or held out already) are set aside."""
    train, held = shard.train.split(fraction, seed, what, "--validation-fraction")
    test = shard.held
    return Shard(
        train, held, validation_label(fraction, seed), shard.test_split or shard.held_split,
        shard.later or (lambda: test), name=shard.name, notes=list(shard.notes),
        held_out="validation",
    )  # fmt: skip


def _read_libsvm_files(spec: DataSpec, validation: float | None, validation_seed: int) -> Shard:
    """``--train`` and, if given, ``--test`` (else a held-out split of ``--train``); with
    ``validation``, a validation share of the training rows, the test file read later."""
    _need_train(spec)
    notes: list[str] = []
    reader = PartReader.of(spec, None)

    def read(path: str) -> Part:
        part, note = reader.read(path)
        if note:
            notes.append(note)
        return part

    train, later = read(spec.train), None
    if not spec.test:
        train, held = train.split(spec.test_fraction, spec.split_seed)
        split = _held_out_split(spec)
    elif validation is not None:
        width, test, held = train.x.shape[1], spec.test, None
        too_wide = _braced(f"--test {test}") + (
            " has feature indices up to {found}, beyond the {width} features of --train; give "
            "--n-features."
        )
        later = lambda: read(test).pad(width, too_wide)  # noqa: E731  (read after training)
        split = f"test file {test}"
    else:
        held = read(spec.test)
        if spec.n_features is None:
            # Without --n-features each file's width is its own largest index: pad to the wider.
            width = max(train.x.shape[1], held.x.shape[1])
            train, held = train.pad(width), held.pad(width)
        split = f"test file {spec.test}"
    shard = Shard(train, held, split, split, later, name="libsvm", notes=list(notes))
    if validation is not None:
        shard = _validated(shard, validation, validation_seed, "the training set")
    return shard


def _braced(text: str) -> str:
    """``text`` with its braces doubled, to stand as itself in a format string."""
    return text.replace("{", "{{").replace("}", "}}")


def _read_csv_files(
    spec: DataSpec, validation: float | None, validation_seed: int
) -> tuple[Shard, TableOptions]:
    """Read the training (and test) table, split where there is no test table; the encoder is
    fitted on the training part afterwards. With ``validation``, the held-out table is a
    validation share of the training table, and the test table is read (a test file) only by
    the shard's ``later``."""
    _need_train(spec)
    options = TableOptions.from_config(spec)
    reader, later = PartReader.of(spec, options), None
    if spec.test:
        test_path = spec.test
        train = reader.read(spec.train)[0]
        held = None if validation is not None else reader.read(test_path)[0]
        if validation is not None:
            later = lambda: reader.read(test_path)[0]  # noqa: E731
        split = f"test file {spec.test}"
    else:
        train, held = reader.read(spec.train)[0].split(
            spec.test_fraction, spec.split_seed, spec.train
        )
        split = _held_out_split(spec)
    shard = Shard(train, held, split, split, later, name="csv")
    if validation is not None:
        what = f"{spec.train} (--validation-fraction)"
        shard = _validated(shard, validation, validation_seed, what)
    return shard, options


def _need_train(spec: DataSpec) -> None:
    if not spec.train:
        raise ConfigError(
            f"--dataset {spec.dataset} needs --train FILE (and optionally --test FILE)."
        )


def _held_out_split(spec: DataSpec) -> str:
    return f"seeded stratified {spec.test_fraction:.0%} split of {spec.train}"


def _check_both_classes(shard: Shard, spec: DataSpec) -> None:
    y_train = shard.train.labels
    for split, labels in (("training", y_train), (shard.held_out, shard.held.labels)):
        if labels.min() == labels.max():
            only = "positive" if labels[0] == 1 else "negative"
            cause = "Check the label column and --positive-label."
            if split == "validation":
                cause = "Use a larger --validation-fraction."
            elif split == "test" and "split" in shard.held_split:
                cause = (
                    f"The test set is a seeded {spec.test_fraction:.0%} split (--test-fraction) "
                    f"of {len(y_train) + len(labels)} rows ({int(y_train.sum())} "
                    "positive among the training rows): use a larger --test-fraction, or give "
                    "--test FILE."
                )
            raise DataError(
                f"The {split} set of {spec.dataset} holds only {only} examples "
                f"({len(labels)} rows); AP needs both classes. {cause}"
            )
