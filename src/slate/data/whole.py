"""A whole dataset read into one shard: a named dataset, or a user's ``--train`` (and
``--test``) file, LIBSVM or CSV, split where there is no test file, with a validation share of
the training rows where ``--validation-fraction`` asks for one; checked to hold both classes in
both parts. The first step of the data line (:mod:`slate.data.sources`) for every source but
per-party files (:mod:`slate.data.party_files`).
"""

from __future__ import annotations

from slate.data.datasets import NAMED_LOADERS, Dataset, dataset_names, read_named_dataset
from slate.data.options import TableOptions
from slate.data.parts import ArrayPart, Part, PartReader, Shard
from slate.data.spec import DataSpec
from slate.errors import ConfigError, DataError

__all__ = ["preloaded", "read_whole", "validated", "validation_label"]


def read_whole(
    spec: DataSpec, validation: float | None, validation_seed: int
) -> tuple[Shard, TableOptions | None]:
    """The whole dataset's shard, checked to hold both classes, and the table options of a CSV
    file (``None`` otherwise)."""
    options = None
    if spec.dataset in NAMED_LOADERS:
        shard = preloaded(read_named_dataset(spec))
        if validation is not None:
            shard = validated(shard, validation, validation_seed, "the training set")
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


def preloaded(data: Dataset) -> Shard:
    """A dataset read before (by the caller, or to choose N) as the whole dataset's shard."""
    final = data.final_test
    return Shard(
        ArrayPart(data.x_train, data.y_train), ArrayPart(data.x_test, data.y_test),
        data.test_split, data.final_test_split,
        None if final is None else lambda: ArrayPart(*final()),
        name=data.name, notes=list(data.notes), held_out=data.held_out, parts=data.parts,
        transform=data.encoder,
    )  # fmt: skip


def validated(shard: Shard, fraction: float, seed: int, what: str) -> Shard:
    """``shard`` with its held-out rows replaced by a seeded stratified share ``fraction`` of
    its training rows; its test rows (read later, or held out already) are set aside."""
    train, held = shard.train.split(fraction, seed, what, "--validation-fraction")
    test = shard.held
    return Shard(
        train, held, validation_label(fraction, seed), shard.test_split or shard.held_split,
        shard.later or (lambda: test), name=shard.name, notes=list(shard.notes),
        held_out="validation",
    )  # fmt: skip


def validation_label(fraction: float, seed: int) -> str:
    return f"seeded stratified {fraction:.0%} of the training set (seed {seed})"


def _read_libsvm_files(spec: DataSpec, validation: float | None, validation_seed: int) -> Shard:
    """``--train`` and, if given, ``--test`` (else a held-out split of ``--train``); with
    ``validation``, a validation share of the training rows, the test file read later."""
    _need_train(spec)
    notes: list[str] = []
    reader = PartReader.of(spec, None)

    def read(path: str) -> Part:
        part, note = reader.read(path)
        if note:
            notes.extend(note.split("\n"))
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
        shard = validated(shard, validation, validation_seed, "the training set")
    return shard


def _read_csv_files(
    spec: DataSpec, validation: float | None, validation_seed: int
) -> tuple[Shard, TableOptions]:
    """Read the training (and test) table, split where there is no test table; the encoder is
    fitted on the training part afterwards. With ``validation``, the held-out table is a
    validation share of the training table, and the test table is read (a test file) only by
    the shard's ``later``."""
    _need_train(spec)
    options = TableOptions.from_config(spec)
    reader, later, notes = PartReader.of(spec, options), None, []

    def read(path: str) -> Part:
        part, note = reader.read(path)
        notes.extend([note] if note else [])
        return part

    if spec.test:
        test_path = spec.test
        train = read(spec.train)
        held = None if validation is not None else read(test_path)
        if validation is not None:
            later = lambda: read(test_path)  # noqa: E731
        split = f"test file {spec.test}"
    else:
        train, held = read(spec.train).split(spec.test_fraction, spec.split_seed, spec.train)
        split = _held_out_split(spec)
    shard = Shard(train, held, split, split, later, name="csv", notes=notes)
    if validation is not None:
        what = f"{spec.train} (--validation-fraction)"
        shard = validated(shard, validation, validation_seed, what)
    return shard, options


def _braced(text: str) -> str:
    """``text`` with its braces doubled, to stand as itself in a format string."""
    return text.replace("{", "{{").replace("}", "}}")


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
