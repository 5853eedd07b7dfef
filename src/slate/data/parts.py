"""The parts of a dataset before the feature transform, and the one seeded stratified holdout.

A part is LIBSVM or image arrays (:class:`ArrayPart`) or a CSV table (:class:`TablePart`); both
answer the same calls (:class:`Part`): ``labels``, ``split``, ``pad``, ``features``. Every split
slate makes goes through :func:`hold_out`: ``slate train`` without ``--test`` holds out a test
part of ``--train``; each party without its own test file holds out part of its own file;
``--validation-fraction`` and ``slate tune`` hold out a validation part. So the same rows, seed
and fraction give the same split everywhere, and everything fitted afterwards (imputation,
categories, scaling) sees only the training part. A :class:`Shard` holds the parts read for one
party or for a whole dataset.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from slate.data.declared import clip_to_range, value_ranges
from slate.data.schema import PartyCounts, Schema
from slate.errors import ConfigError, DataError

__all__ = ["ArrayPart", "Part", "PartReader", "Shard", "TablePart", "hold_out", "take_rows"]

_PART = {"--test-fraction": "test set", "--validation-fraction": "validation set"}


def hold_out(
    y: np.ndarray,
    fraction: float,
    seed: int,
    what: str | None = None,
    flag: str = "--test-fraction",
) -> tuple[np.ndarray, np.ndarray]:
    """Row positions ``(kept, held_out)`` of a seeded stratified split, ``fraction`` held out.

    The positions come in scikit-learn's shuffled order (``train_test_split`` with
    ``stratify=y`` and ``random_state=seed``). ``what`` names the data in the error raised
    when a class is too small to split, ``flag`` the option that set ``fraction``.
    """
    if not 0 < fraction < 1:
        raise ConfigError(f"{flag} must lie strictly between 0 and 1, got {fraction}.")
    counts = np.bincount(y.astype(np.int64))
    n_held = math.ceil(fraction * len(y))
    classes = int((counts > 0).sum())
    if counts[counts > 0].min() < 2 or n_held < classes or len(y) - n_held < classes:
        raise DataError(
            f"Cannot split {what + ': ' if what else ''}{len(y)} examples (class counts "
            f"{counts.tolist()}) into a stratified "
            f"{fraction:.0%} {_PART[flag]}: each class needs at least two examples and both parts "
            f"at least one of each class. Give a larger file, another {flag}"
            + (", or --test FILE." if flag == "--test-fraction" else ".")
        )
    # scikit-learn is imported on the first split: it takes seconds to load.
    from sklearn.model_selection import train_test_split

    kept, held, _, _ = train_test_split(
        np.arange(len(y)), y, test_size=fraction, stratify=y, random_state=seed
    )
    return kept, held


class Part(Protocol):
    """Rows of a training, held-out or test part before the feature transform: LIBSVM or image
    arrays (:class:`ArrayPart`) or a CSV table (:class:`TablePart`)."""

    @property
    def labels(self) -> np.ndarray: ...

    @property
    def fit_input(self) -> Any: ...

    def split(
        self, fraction: float, seed: int, what: str | None = None, flag: str = "--test-fraction"
    ) -> tuple[Part, Part]: ...

    def pad(self, width: int | None, too_wide: str = "") -> Part: ...

    def features(self, transform: Any) -> np.ndarray: ...

    def schema(self, rank: int, held: Part, counts: PartyCounts, positive_label: str) -> Schema: ...


#: What :meth:`ArrayPart.pad` says of rows wider than the width the parts agreed on.
TOO_WIDE = (
    "A file of this party has feature indices up to {found}, beyond the {width} features that "
    "the parties' training files agreed on; give --n-features."
)


@dataclass(frozen=True)
class ArrayPart:
    """Features ``x (n, ...)`` and labels ``y (n,)`` in {0, 1}."""

    x: np.ndarray
    y: np.ndarray

    @property
    def labels(self) -> np.ndarray:
        return self.y

    @property
    def fit_input(self) -> np.ndarray:
        """What :func:`~slate.data.encoding.fit_features` fits on: the features."""
        return self.x

    def split(
        self, fraction: float, seed: int, what: str | None = None, flag: str = "--test-fraction"
    ) -> tuple[ArrayPart, ArrayPart]:
        """``(kept, held)`` of :func:`hold_out`, each in the split's shuffled order."""
        kept, held = hold_out(self.y, fraction, seed, what, flag)
        return ArrayPart(self.x[kept], self.y[kept]), ArrayPart(self.x[held], self.y[held])

    def pad(self, width: int | None, too_wide: str = TOO_WIDE) -> ArrayPart:
        """The rows with zero features appended up to ``width`` columns (``None``: as they
        are); wider rows raise ``DataError(too_wide)``, formatted with ``found`` and
        ``width``."""
        found = self.x.shape[1]
        if width is None or found == width:
            return self
        if found > width:
            raise DataError(too_wide.format(found=found, width=width))
        return ArrayPart(np.pad(self.x, ((0, 0), (0, width - found))), self.y)

    def features(self, transform: Any) -> np.ndarray:
        """The features through a fitted :class:`~slate.data.preprocess.Standardizer`
        (``None``: as they are), each row flattened for it and given back its shape."""
        if transform is None:
            return self.x
        return transform.apply(self.x.reshape(len(self.x), -1)).reshape(self.x.shape)

    def schema(self, rank: int, held: Part, counts: PartyCounts, positive_label: str) -> Schema:
        """What party ``rank`` says of its LIBSVM files: the widest of its two parts."""
        width = max(self.x.shape[1], held.fit_input.shape[1])
        return Schema(rank=rank, format="libsvm", n_features=width, counts=counts,
                      ranges=value_ranges(features=self.x))  # fmt: skip


@dataclass(frozen=True)
class TablePart:
    """A :class:`~slate.data.readers.table.RawTable`, matched to other tables by column name."""

    table: Any

    @property
    def labels(self) -> np.ndarray:
        return self.table.y

    @property
    def fit_input(self) -> Any:
        """What :func:`~slate.data.encoding.fit_features` fits on: the table."""
        return self.table

    def split(
        self, fraction: float, seed: int, what: str | None = None, flag: str = "--test-fraction"
    ) -> tuple[TablePart, TablePart]:
        """``(kept, held)`` of :func:`hold_out`, each keeping its rows in file order
        (:func:`take_rows`)."""
        kept, held = hold_out(self.table.y, fraction, seed, what, flag)
        return (
            TablePart(take_rows(self.table, np.sort(kept))),
            TablePart(take_rows(self.table, np.sort(held))),
        )

    def pad(self, width: int | None, too_wide: str = "") -> TablePart:
        """The table itself: its columns are matched by name, not position."""
        return self

    def features(self, transform: Any) -> np.ndarray:
        """The table encoded by a fitted :class:`~slate.data.encoding.TableEncoder`."""
        return transform.transform(self.table)

    def schema(self, rank: int, held: Part, counts: PartyCounts, positive_label: str) -> Schema:
        """What party ``rank`` says of its CSV files: columns, label column and label values."""
        train, values = self.table, list(self.table.label_values)
        values += [v for v in held.fit_input.label_values if v not in values]
        return Schema(
            rank=rank, format="csv", n_features=len(train.columns), header=train.header,
            label_column=train.label_name, label_values=tuple(values),
            positive_label=positive_label, text_columns=tuple(sorted(train.text)), counts=counts,
            ranges=value_ranges(numeric=train.numeric),
        )  # fmt: skip


@dataclass(frozen=True)
class PartReader:
    """How this run's files become parts, decided once: CSV tables read with ``options`` (a
    :class:`~slate.data.options.TableOptions`), or, where ``options`` is ``None``, LIBSVM files
    read with the spec's width, index base, dtype and positive label, every value outside the
    public ``feature_range`` (where there is one) clipped into it; with ``drop_wide`` (under
    ``--dp-epsilon``) a value at an index beyond ``n_features`` is dropped, not refused (a
    refusal would tell the other sites that such a row exists), and a table's cells outside
    the ranges of its ``--schema`` are noted (the encoder clips them)."""

    options: Any
    n_features: int | None = None
    zero_based: bool = False
    dtype: Any = np.float32
    positive: str | None = None
    feature_range: tuple[float, float] | None = None
    drop_wide: bool = False

    @classmethod
    def of(cls, spec: Any, options: Any) -> PartReader:
        """The reader of a :class:`~slate.data.spec.DataSpec` (and the table options, if any)."""
        return cls(options, spec.n_features, spec.zero_based, spec.read_dtype, spec.positive_label,
                   spec.public_range, spec.dp_epsilon is not None)  # fmt: skip

    def read(self, path: str, labels: str = "required") -> tuple[Part, str | None]:
        """The part in file ``path`` and the reader's notes, one per line (or ``None``), the
        clipping into the public range among them (this site's alone:
        :func:`~slate.data.declared.clip_to_range`); ``labels`` is as in
        :meth:`~slate.data.options.TableOptions.read` (tables only)."""
        if self.options is not None:
            table = self.options.read(path, labels=labels)
            dictionary = self.options.dictionary
            clipped = dictionary.clipping_note(table) if self.drop_wide and dictionary else None
            return TablePart(table), clipped
        from slate.data.readers.libsvm import read_libsvm_file

        def reading(width: int | None) -> Any:
            return read_libsvm_file(path, n_features=width, zero_based=self.zero_based,
                                    dtype=self.dtype, positive=self.positive)  # fmt: skip

        dropped = None
        if self.drop_wide and self.n_features is not None:
            try:
                read = reading(None)
            except DataError:  # a file without any feature, or a bad token: read as given
                read = reading(self.n_features)
            x, dropped = _to_width(read.x, self.n_features, path)
        else:
            read = reading(self.n_features)
            x = read.x
        clipped = None
        if self.feature_range is not None:
            x, clipped = clip_to_range(x, self.feature_range, path)
        notes = [note for note in (read.note, dropped, clipped) if note]
        return ArrayPart(x, read.y), "\n".join(notes) or None


def _to_width(x: np.ndarray, width: int, path: str) -> tuple[np.ndarray, str | None]:
    """``x`` cut or zero-padded to ``width`` columns, and this site's note on the nonzero values
    cut off (``None``: none was), for its own output only."""
    found = x.shape[1]
    if found <= width:
        return (np.pad(x, ((0, 0), (0, width - found))) if found < width else x), None
    beyond = int(np.count_nonzero(x[:, width:]))
    if beyond == 0:
        return np.ascontiguousarray(x[:, :width]), None
    note = (
        f"note: {path}: {beyond} nonzero value{'s' if beyond != 1 else ''} at feature indices "
        f"beyond --n-features {width} (up to the {found}th feature) dropped. Only this site is "
        "told: nothing about these values is sent."
    )
    return np.ascontiguousarray(x[:, :width]), note


@dataclass
class Shard:
    """Rows read before the feature transform: one party's own files, or (``rank`` ``None``)
    a whole dataset that is cut into parties after the fit.

    Attributes:
        train, held: the training rows and the rows scored during training (test rows, or
            with ``--validation-fraction`` validation rows); ``None`` for a party whose files
            could not be read (its ``schema`` says why).
        held_split: how ``held`` was made; ``test_split``: how the test rows were made.
        later: with ``--validation-fraction``, the test rows, read or taken only when called.
        rank, schema: the party and what it tells the others (per-party files only).
        name, notes, held_out: the dataset's name, warnings for the console, and what ``held``
            is (``"test"`` or ``"validation"``).
        parts: each party's positions in ``train``, where the caller chose them.
        transform: where the rows come through a transform already (a preloaded table), that
            transform; the data line then fits nothing.
    """

    train: Part | None
    held: Part | None
    held_split: str = ""
    test_split: str = ""
    later: Callable[[], Part] | None = None
    rank: int | None = None
    schema: Schema | None = None
    name: str = ""
    notes: list[str] = field(default_factory=list)
    held_out: str = "test"
    parts: list[np.ndarray] | None = None
    transform: Any = None


def take_rows(table: Any, rows: np.ndarray) -> Any:
    """The table restricted to ``rows`` (positions), as if only those rows had been read.

    A text column keeps only the categories that occur in these rows (in order of first
    appearance), and the missing counts are those of these rows: an encoder fitted on a
    training part then never sees a category that occurs only in the held-out part.
    """
    text = {c: _text_rows(col, rows) for c, col in table.text.items()}
    numeric = {c: v[rows] for c, v in table.numeric.items()}
    missing = {c: int(np.isnan(v).sum()) for c, v in numeric.items()}
    missing.update({c: int((col.codes < 0).sum()) for c, col in text.items()})
    return dataclasses.replace(
        table,
        numeric=numeric,
        text=text,
        y=None if table.y is None else table.y[rows],
        rows=len(rows),
        first_lines=table.first_lines[rows],
        missing={c: missing[c] for c in table.missing if c in missing},
    )


def _text_rows(column: Any, rows: np.ndarray) -> Any:
    """A text column's ``rows``, its categories renumbered to those present."""
    codes = column.codes[rows]
    present = codes[codes >= 0]
    used, first = np.unique(present, return_index=True)
    order = used[np.argsort(first)]  # the present codes in order of first appearance
    renumber = np.full(len(column.categories) + 1, -1, dtype=codes.dtype)
    renumber[order] = np.arange(len(order), dtype=codes.dtype)
    return dataclasses.replace(
        column,
        codes=renumber[codes],  # code -1 takes the last entry, -1
        categories=tuple(column.categories[k] for k in order),
    )
