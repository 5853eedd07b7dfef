"""Schema agreement between parties that each read their own files.

Before the first step, every party sends the others a :class:`Schema`: its file format, its
feature count or CSV column names (in order), its label column, the label values it saw, its
row and positive counts, and the sha256 of its ``--schema`` file (a declared data dictionary,
:mod:`slate.data.dictionary`), compared first. No row, label or score leaves a party. Every
party then runs the same :func:`check_agreement` on the same list, so either all go on or all
stop with the same message, which names the party and the difference, for example ``party 2's
column 5 is 'Age', party 0's is 'age'``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from slate.data.partition import check_run_positives, without_positives_note
from slate.errors import DataError, by_party_text, parties_text, per_party_text
from slate.security.messages import ListOf, MapOf

__all__ = [
    "RANGE_SHAPE",
    "SCHEMA_SHAPE",
    "PartyCounts",
    "Schema",
    "SchemaMismatch",
    "check_agreement",
    "column_order",
]

#: A party's declared value ranges on the wire (:mod:`slate.data.declared`): column -> [lo, hi]
#: or null.
RANGE_SHAPE = MapOf(([float, float], None), 1_000_000)

#: What a party's schema looks like on the wire (:mod:`slate.security.messages`).
SCHEMA_SHAPE = {
    "rank": int, "format": str, "n_features": int, "header": ListOf(str, 1_000_000),
    "label_column": str, "label_values": ListOf(str, 1_000_000), "positive_label": str,
    "text_columns": ListOf(str, 1_000_000), "error": (str, None),
    "counts": {"train": int, "train_positives": int, "test": int, "test_positives": int},
    "ranges": RANGE_SHAPE, "dictionary": str,
}  # fmt: skip


class SchemaMismatch(DataError):
    """The parties' files do not describe the same task (columns, labels or format)."""


@dataclass(frozen=True)
class PartyCounts:
    """A party's row counts: the only facts about its data besides the schema it shares."""

    train: int = 0
    train_positives: int = 0
    test: int = 0
    test_positives: int = 0

    @property
    def train_negatives(self) -> int:
        return self.train - self.train_positives


@dataclass(frozen=True)
class Schema:
    """What one party says about its files (see the module docstring).

    Attributes:
        rank: the party.
        format: ``csv`` or ``libsvm``.
        n_features: the party's own feature count (LIBSVM: its largest index over its files).
        header: CSV: the whole header row, label column included, in file order.
        label_column: CSV: the label column's name.
        label_values: CSV: the distinct label cells of the party's files.
        positive_label: CSV: the positive label the party was given.
        text_columns: CSV: the columns that hold text (one-hot encoded), sorted.
        counts: the party's row counts (declared: :mod:`slate.data.declared`).
        ranges: the party's declared value ranges (:func:`slate.data.declared.value_ranges`).
        dictionary: the sha256 of the party's ``--schema`` file, ``""`` without one.
        error: why the party could not read its own files (then nothing else is set).
    """

    rank: int
    format: str = ""
    n_features: int = 0
    header: tuple[str, ...] = ()
    label_column: str = ""
    label_values: tuple[str, ...] = ()
    positive_label: str = ""
    text_columns: tuple[str, ...] = ()
    counts: PartyCounts = field(default_factory=PartyCounts)
    ranges: dict[str, list[float] | None] = field(default_factory=dict)
    dictionary: str = ""
    error: str | None = None

    @property
    def feature_columns(self) -> tuple[str, ...]:
        return tuple(name for name in self.header if name != self.label_column)

    def to_json(self) -> dict[str, Any]:
        """The schema as sent to the other parties (:data:`SCHEMA_SHAPE`)."""
        return asdict(self)

    @staticmethod
    def from_json(raw: dict[str, Any]) -> Schema:
        """A schema received as JSON that was checked against :data:`SCHEMA_SHAPE`."""
        return Schema(
            rank=raw["rank"], format=raw["format"], n_features=raw["n_features"],
            header=tuple(raw["header"]), label_column=raw["label_column"],
            label_values=tuple(raw["label_values"]), positive_label=raw["positive_label"],
            text_columns=tuple(raw["text_columns"]), counts=PartyCounts(**raw["counts"]),
            ranges=dict(raw["ranges"]), dictionary=raw["dictionary"], error=raw["error"],
        )  # fmt: skip


def check_agreement(schemas: list[Schema]) -> None:
    """Raise :class:`SchemaMismatch` unless every party's schema agrees with party 0's."""
    failed = [s for s in schemas if s.error is not None]
    if failed:
        raise SchemaMismatch(
            by_party_text(
                ((s.rank, str(s.error)) for s in failed),
                (" could not read its data", " could not read their data"),
            )
            + " Nothing was trained."
        )
    reference = schemas[0]
    for schema in schemas[1:]:
        problem = _difference(reference, schema)
        if problem:
            raise SchemaMismatch(
                f"The parties' data do not agree: {problem}. Every party must give files with "
                "the same columns (names; their order may differ) and the same label values. "
                "Nothing was trained and no model was written."
            )
    if reference.format == "csv":
        _check_labels(schemas)


def _difference(ref: Schema, other: Schema) -> str | None:
    r, n = ref.rank, other.rank
    if other.dictionary != ref.dictionary:
        return (
            f"party {n}'s --schema file {_dictionary(other)}, party {r}'s {_dictionary(ref)} "
            "(every site must hold the same data dictionary, byte for byte)"
        )
    if other.format != ref.format:
        return f"party {n} reads {other.format} files, party {r} reads {ref.format} files"
    if ref.format != "csv":
        return None
    if other.label_column != ref.label_column:
        return (
            f"party {n}'s label column is {other.label_column!r}, party {r}'s is "
            f"{ref.label_column!r}"
        )
    if other.positive_label != ref.positive_label:
        return (
            f"party {n}'s positive label is {other.positive_label!r}, party {r}'s is "
            f"{ref.positive_label!r}"
        )
    return _column_difference(ref, other) or _kind_difference(ref, other)


def _dictionary(schema: Schema) -> str:
    return f"has sha256 {schema.dictionary[:16]}..." if schema.dictionary else "is not given"


def _kind_difference(ref: Schema, other: Schema) -> str | None:
    """A column that holds text at one party and numbers at the other."""
    for column in ref.feature_columns:
        here, there = column in ref.text_columns, column in other.text_columns
        if here != there:
            kind = {True: "text", False: "numbers"}
            return (
                f"party {other.rank}'s column {column!r} holds {kind[there]}, party "
                f"{ref.rank}'s holds {kind[here]} (list it in --categorical-columns on every "
                "party to treat it as categories everywhere)"
            )
    return None


def _column_difference(ref: Schema, other: Schema) -> str | None:
    mine, theirs = ref.feature_columns, other.feature_columns
    missing = [c for c in mine if c not in theirs]
    extra = [c for c in theirs if c not in mine]
    if not missing and not extra:
        duplicates = sorted({c for c in theirs if theirs.count(c) > 1})
        if duplicates or len(mine) != len(theirs):
            return f"party {other.rank}'s header repeats the columns {duplicates}"
        return None
    if len(missing) == 1 and len(extra) == 1:
        position = other.header.index(extra[0]) + 1
        ref_position = ref.header.index(missing[0]) + 1
        where = "" if position == ref_position else f" (its column {ref_position})"
        return (
            f"party {other.rank}'s column {position} is {extra[0]!r}, party {ref.rank}'s is "
            f"{missing[0]!r}{where}"
        )
    parts = []
    if missing:
        parts.append(f"party {other.rank} lacks the columns {missing} that party {ref.rank} has")
    if extra:
        parts.append(f"party {other.rank} has the columns {extra} that party {ref.rank} lacks")
    return "; ".join(parts)


def _label_key(cell: str) -> tuple[str, float | str]:
    try:
        value = float(cell)
    except ValueError:
        return ("text", cell)
    return ("text", cell) if value != value else ("number", value)


def _check_labels(schemas: list[Schema]) -> None:
    """Together the parties' labels must be exactly two values, one of them the positive."""
    seen: dict[tuple, tuple[str, int]] = {}
    for schema in schemas:
        for value in schema.label_values:
            key = _label_key(value)
            if key not in seen:
                seen[key] = (value, schema.rank)
    positive = schemas[0].positive_label
    listed = ", ".join(f"{v!r} (first at party {rank})" for v, rank in seen.values())
    if len(seen) > 2:
        raise SchemaMismatch(
            f"The parties' label columns hold more than two values together: {listed}. Every "
            f"party must use the same two labels, one of them --positive-label {positive!r}. "
            "Nothing was trained."
        )
    if _label_key(positive) not in seen:
        raise SchemaMismatch(
            f"No party's data holds the positive label {positive!r}; labels seen: {listed}. "
            "Nothing was trained."
        )


def column_order(names: tuple[str, ...], reference: tuple[str, ...], where: str) -> list[int]:
    """Positions in ``names`` of the ``reference`` columns, matched by name.

    Raises a :class:`~slate.errors.DataError` that names the missing and the extra columns
    when the two sets of names differ.
    """
    missing = [c for c in reference if c not in names]
    extra = [c for c in names if c not in reference]
    if missing or extra:
        parts = [f"lacks the columns {missing}"] if missing else []
        parts += [f"has the columns {extra} that are not in the training data"] if extra else []
        raise DataError(
            f"{where} {' and '.join(parts)}. Its columns are matched to the training file's by "
            "header name, so both must have the same names."
        )
    return [names.index(c) for c in reference]


def check_party_files_counts(
    counts: list[PartyCounts], positives: int, batch_size: int
) -> list[str]:
    """Stop when no party holds a positive, or a party lacks the negatives its batches draw
    (``m - b`` of them, all ``m`` at a party without positives); note the parties without
    positives (they join, :func:`slate.data.partition.without_positives_note`) and warn about
    those short of ``b``."""
    check_run_positives([c.train_positives for c in counts])
    empty = [
        n
        for n, c in enumerate(counts)
        if c.train_negatives == 0 and (batch_size > positives or c.train_positives == 0)
    ]
    if empty:
        raise DataError(
            f"No negative training example at {parties_text(empty)}, but each batch needs "
            f"m - b = {batch_size - positives} negatives, and all m = {batch_size} at a party "
            "without positives."
        )
    check_both_test_classes([c.test for c in counts], [c.test_positives for c in counts])
    none = [n for n, c in enumerate(counts) if c.train_positives == 0]
    short: dict[int, list[int]] = {}  # positives held -> the parties holding that many
    for n, c in enumerate(counts):
        if 0 < c.train_positives < positives:
            short.setdefault(c.train_positives, []).append(n)
    return ([without_positives_note(none)] if none else []) + [
        f"warning: {parties_text(ranks)} hold{'s' if len(ranks) == 1 else ''} {k} positive "
        f"training example{'s' if k != 1 else ''}, fewer than b = {positives}: "
        f"{'its' if len(ranks) == 1 else 'their'} batches draw them with replacement, so "
        "they repeat within a batch."
        for k, ranks in sorted(short.items())
    ]


def check_both_test_classes(rows: list[int], positives: list[int], what: str = "test") -> None:
    """The parties' held-out rows together must hold both classes (AP needs both)."""
    if sum(positives) == 0 or sum(positives) == sum(rows):
        only = "negative" if sum(positives) == 0 else "positive"
        raise DataError(
            f"All parties' {what} rows together are {only}: AP needs both classes. "
            f"{what.capitalize()} rows per party: {per_party_text(rows)}. Positives per party: "
            f"{per_party_text(positives)}."
        )
