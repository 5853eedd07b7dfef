"""The typed tables the delimited-text reader returns: :class:`RawTable` (columns as they
come) and :class:`CsvTable` (strict numeric features)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BadCell",
    "CsvTable",
    "RawTable",
    "TextColumn",
]


@dataclass(frozen=True)
class TextColumn:
    """A text (categorical or identifier) column read by :func:`read_table`.

    Attributes:
        codes: ``int32`` array with one entry per row: the index of the cell in ``categories``,
            or ``-1`` for a missing cell.
        categories: the distinct non-missing cells, stripped of surrounding spaces, in order of
            first appearance.
    """

    codes: np.ndarray
    categories: tuple[str, ...]


@dataclass(frozen=True)
class BadCell:
    """A row that cannot be scored, found by :func:`read_table_chunks` when asked to go on.

    Attributes:
        line: the file line on which the row starts.
        column: the column of the bad cell, or None when the row itself is malformed.
        value: the cell as written (stripped), or the row's cell count for a malformed row.
        reason: what is wrong, in a few words (``"not a number"``).
    """

    line: int
    column: str | None
    value: str
    reason: str


@dataclass(frozen=True)
class RawTable:
    """A delimited text file read by :func:`read_table`, column by column, before preprocessing.

    Attributes:
        path: the file read.
        columns: every column except the label column, in file order (header names, or
            ``column j`` for a file without a header; ``j`` is the 0-based position in the file).
        numeric: ``float64`` array per numeric column; NaN marks a missing cell.
        text: :class:`TextColumn` per text column.
        y: ``int64`` labels in {0, 1}, or None when the label column is absent and labels were
            optional.
        label_name: the label column's name, or None when it is absent.
        label_values: the distinct label cells as written (stripped), in order of first
            appearance.
        header: the whole header, label column included, in file order.
        has_header: whether the first row was a header.
        delimiter: the delimiter used (detected or given).
        rows: the number of data rows.
        first_lines: ``int64``, the file line on which each data row starts (for messages).
        missing: per column of ``columns``, how many cells were missing.
        notes: what the reader did that the user should know (a text column read as numbers,
            :mod:`slate.data.readers.formats`).
        bad_cells: rows that cannot be scored (:class:`BadCell`), by line; only from
            :func:`~slate.data.readers.chunks.read_table_chunks` with ``numeric_columns``
            or ``keep_going``. A row with a bad cell is in the table (that cell NaN); a
            malformed row is not.
    """

    path: str
    columns: tuple[str, ...]
    numeric: dict[str, np.ndarray]
    text: dict[str, TextColumn]
    y: np.ndarray | None
    label_name: str | None
    label_values: tuple[str, ...]
    header: tuple[str, ...]
    has_header: bool
    delimiter: str
    rows: int
    first_lines: np.ndarray
    missing: dict[str, int]
    notes: tuple[str, ...] = ()
    bad_cells: tuple[BadCell, ...] = ()

    @classmethod
    def from_columns(
        cls, path: str = "<memory>", y: Sequence[int] | None = None, **columns: Sequence[Any]
    ) -> RawTable:
        """A table from Python values, one sequence per column, e.g. to encode in-memory rows.

        A column of strings (``None`` for a missing cell) is text; any other column is numeric
        (``nan`` for a missing cell). ``y`` holds optional 0/1 labels.
        """
        numeric: dict[str, np.ndarray] = {}
        text: dict[str, TextColumn] = {}
        rows = len(next(iter(columns.values()), ()))
        for name, values in columns.items():
            if len(values) != rows:
                raise ValueError(f"column {name!r} has {len(values)} values, expected {rows}")
            if all(v is None or isinstance(v, str) for v in values):
                categories = tuple(dict.fromkeys(v for v in values if v is not None))
                lookup = {v: k for k, v in enumerate(categories)}
                codes = np.array([-1 if v is None else lookup[v] for v in values], np.int32)
                text[name] = TextColumn(codes, categories)
            else:
                numeric[name] = np.asarray(values, dtype=np.float64)
        missing = {c: int(np.isnan(v).sum()) for c, v in numeric.items()}
        missing.update({c: int((t.codes < 0).sum()) for c, t in text.items()})
        return cls(
            path=path, columns=tuple(columns), numeric=numeric, text=text,
            y=None if y is None else np.asarray(y, dtype=np.int64), label_name=None,
            label_values=(), header=tuple(columns), has_header=True, delimiter=",", rows=rows,
            first_lines=np.arange(2, rows + 2, dtype=np.int64), missing=missing,
        )  # fmt: skip


@dataclass(frozen=True)
class CsvTable:
    """A CSV file read by :func:`read_csv_table`: features, 0/1 labels, and what they were.

    Attributes:
        x: ``float32`` features ``(n, d)``, the columns in file order without the label column.
        y: ``int64`` labels ``(n,)`` in {0, 1}.
        feature_names: the feature columns' header names (``column j`` without a header).
        label_name: the label column's name.
        columns: the whole header, label column included, in file order.
        label_values: the distinct label cells as written, in order of first appearance.
        has_header: whether the first row was a header.
    """

    x: np.ndarray
    y: np.ndarray
    feature_names: tuple[str, ...]
    label_name: str
    columns: tuple[str, ...]
    label_values: tuple[str, ...]
    has_header: bool
