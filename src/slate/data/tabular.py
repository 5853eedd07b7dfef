"""Reader for delimited text tables (CSV and friends, plain or gzip-compressed).

One column holds the class label; every other column must be numeric and becomes a float32
feature. The label column may hold any strings; the rows whose label equals ``positive_label``
become class 1, the others class 0.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass

import numpy as np

from slate.data.libsvm import MAX_ELEMENTS, read_text
from slate.errors import DataError

__all__ = ["CsvTable", "read_csv", "read_csv_table"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_MAX_LISTED = 10


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


def read_csv(
    path: str | os.PathLike[str],
    label_column: str | int,
    positive_label: str,
    header: bool | None = None,
    delimiter: str = ",",
) -> tuple[np.ndarray, np.ndarray]:
    """Read a delimited text file with one label column into dense arrays ``(X, y)``.

    The same as :func:`read_csv_table` without the column names.
    """
    table = read_csv_table(path, label_column, positive_label, header, delimiter)
    return table.x, table.y


def read_csv_table(
    path: str | os.PathLike[str],
    label_column: str | int,
    positive_label: str,
    header: bool | None = None,
    delimiter: str = ",",
    single_class_ok: bool = False,
) -> CsvTable:
    """Read a delimited text file with one label column into dense arrays.

    Blank lines are skipped; cells may be quoted as usual for CSV. Label cells are compared with
    ``positive_label`` after stripping surrounding whitespace, and two cells that both parse as
    numbers are equal when their values are equal (``"1"`` equals ``"1.0"``). Exactly two
    distinct label values must occur, one of them ``positive_label``.

    Args:
        path: A plain-text or gzip-compressed (detected by its magic bytes) file.
        label_column: The label column: a header name, or a 0-based column index (an ``int``,
            negative values counting from the end, or a string of digits; such a string is a
            name if the header has a column with exactly that name).
        positive_label: The label value of the positive class.
        header: Whether the first non-blank row is a header. ``None`` auto-detects: the first
            row is a header if any of its cells does not parse as a float. When
            ``label_column`` is an index, the cell in that column is left out of the test,
            because the labels of a file without header may be words such as ``yes``.
        delimiter: The one-character cell separator.
        single_class_ok: accept a file whose rows all carry one label (one site's share of a
            multi-party task may); the caller then checks the labels across files.

    Returns:
        A :class:`CsvTable`: ``x`` is a ``float32`` array of shape ``(n, d)`` holding every
        column but the label column, in file order, and ``y`` an ``int64`` array of shape
        ``(n,)`` with values in ``{0, 1}``; with the column names and label values.

    Raises:
        DataError: If the file cannot be read or decoded, holds no data rows, a row has the
            wrong number of cells, the label column does not exist, a feature cell is not a
            finite number, the labels are not exactly two distinct values, or
            ``positive_label`` never occurs.
    """
    name = os.fspath(path)
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '\r\n"':
        raise DataError(
            f"Cannot read {name}: the delimiter must be a single character other than a quote "
            f"or a line break, got {delimiter!r}."
        )
    if isinstance(label_column, bool) or not isinstance(label_column, (str, int, np.integer)):
        raise DataError(
            f"Cannot read {name}: label_column must be a column name or a 0-based integer "
            f"index, got {label_column!r}."
        )
    positive = str(positive_label).strip()
    rows, lines = _read_rows(name, text=read_text(name), delimiter=delimiter)
    if not rows:
        raise DataError(
            f"CSV file {name} is empty (no non-blank lines). Expected a table with a label "
            "column and at least one numeric feature column."
        )

    n_cols = len(rows[0])
    index_hint = _index_hint(label_column, n_cols)
    if header is None:
        header = any(_to_float(cell) is None for j, cell in enumerate(rows[0]) if j != index_hint)
    if header:
        names = [cell.strip() for cell in rows[0]]
        rows, lines = rows[1:], lines[1:]
    else:
        names = [f"column {j}" for j in range(n_cols)]
    label_idx = _resolve_label_column(name, label_column, names if header else None, n_cols)
    label_name = names[label_idx]

    if not rows:
        raise DataError(
            f"CSV file {name} has a header row but no data rows. Expected at least one row "
            "of data after the header."
        )
    if n_cols < 2:
        raise DataError(
            f"CSV file {name} has a single column ({label_name}), so there is no feature "
            "column besides the labels. Expected at least two columns; check the delimiter "
            f"(currently {delimiter!r})."
        )
    for row, lineno in zip(rows, lines, strict=True):
        if len(row) != n_cols:
            raise DataError(
                f"CSV file {name}, line {lineno}: expected {n_cols} cells (as in the "
                f"{'header' if header else 'first row'}), got {len(row)}. Check for a missing "
                f"or extra delimiter ({delimiter!r}) or an unbalanced quote."
            )
    if len(rows) * (n_cols - 1) > MAX_ELEMENTS:
        raise DataError(
            f"CSV file {name}: {len(rows)} rows x {n_cols - 1} features exceed the limit of "
            f"{MAX_ELEMENTS} matrix elements. Use a smaller file."
        )

    y, label_values = _labels(name, rows, lines, label_idx, label_name, positive, single_class_ok)
    feature_rows = [row[:label_idx] + row[label_idx + 1 :] for row in rows]
    feature_names = names[:label_idx] + names[label_idx + 1 :]
    X = _features(name, feature_rows, lines, feature_names)
    return CsvTable(
        X, y, tuple(feature_names), label_name, tuple(names), label_values, bool(header)
    )


def _read_rows(name: str, text: str, delimiter: str) -> tuple[list[list[str]], list[int]]:
    """Split the text into rows of cells, skipping blank lines, keeping each row's line number."""
    rows: list[list[str]] = []
    lines: list[int] = []
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        for row in reader:
            if len(row) <= 1 and not "".join(row).strip():
                continue
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as exc:
        raise DataError(
            f"CSV file {name}, line {reader.line_num}: the line cannot be parsed as CSV ({exc})."
            " Expected delimiter-separated cells with balanced quotes."
        ) from None
    return rows, lines


def _to_float(cell: str) -> float | None:
    """Parse a cell as a float, or return None if it is not a number."""
    try:
        return float(cell)
    except ValueError:
        return None


def _index_hint(label_column: str | int, n_cols: int) -> int | None:
    """The column index that ``label_column`` denotes if it is read as an index, else None."""
    if isinstance(label_column, str):
        key = label_column.strip()
        if not (key.isascii() and key.isdigit()):
            return None
        index = int(key)
    else:
        index = int(label_column)
    if -n_cols <= index < n_cols:
        return index % n_cols
    return None


def _describe_columns(names: list[str] | None, n_cols: int) -> str:
    """List the available columns for an error message."""
    if names is None:
        return f"the file has no header row, so use a 0-based index from 0 to {n_cols - 1}"
    shown = ", ".join(repr(n) for n in names[:20])
    more = f" and {len(names) - 20} more" if len(names) > 20 else ""
    return f"available columns: {shown}{more} (or a 0-based index from 0 to {n_cols - 1})"


def _resolve_label_column(
    name: str, label_column: str | int, names: list[str] | None, n_cols: int
) -> int:
    """Turn a label column name or index into a 0-based index, or raise a DataError."""
    if isinstance(label_column, str):
        key = label_column.strip()
        if names is not None and key in names:
            if names.count(key) > 1:
                raise DataError(
                    f"CSV file {name}: the header has {names.count(key)} columns named {key!r}, "
                    "so the label column is ambiguous. Rename the duplicates or give the label "
                    "column by its 0-based index."
                )
            return names.index(key)
        if not (key.isascii() and key.isdigit()):
            raise DataError(
                f"CSV file {name}: label column {label_column!r} not found; "
                f"{_describe_columns(names, n_cols)}."
            )
        index = int(key)
    else:
        index = int(label_column)
    if not -n_cols <= index < n_cols:
        raise DataError(
            f"CSV file {name}: label column index {index} is out of range for a file with "
            f"{n_cols} columns; {_describe_columns(names, n_cols)}."
        )
    return index % n_cols


def _label_key(cell: str) -> tuple[str, float | str]:
    """A comparison key for a stripped label cell: numbers compare by value, words as text."""
    value = _to_float(cell)
    if value is None or value != value:  # not a number, or nan (which equals nothing)
        return ("text", cell)
    return ("number", value)


def _labels(
    name: str,
    rows: list[list[str]],
    lines: list[int],
    label_idx: int,
    label_name: str,
    positive: str,
    single_class_ok: bool = False,
) -> tuple[np.ndarray, tuple[str, ...]]:
    """The 0/1 label vector and the distinct label cells; the labels must be binary and
    include ``positive``."""
    cells = [row[label_idx].strip() for row in rows]
    distinct: dict[tuple[str, float | str], tuple[str, int]] = {}
    for cell, lineno in zip(cells, lines, strict=True):
        key = _label_key(cell)
        if key not in distinct:
            distinct[key] = (cell, lineno)
            if len(distinct) > 2:
                break
    listed = ", ".join(repr(cell) for cell, _ in distinct.values())
    if len(distinct) > 2:
        every = list(dict.fromkeys(cells))
        shown = ", ".join(repr(c) for c in every[:_MAX_LISTED])
        more = f" and {len(every) - _MAX_LISTED} more" if len(every) > _MAX_LISTED else ""
        third, third_line = list(distinct.values())[2]
        raise DataError(
            f"CSV file {name}, line {third_line}: labels in column {label_name!r} are not "
            f"binary: a third distinct value {third!r} appears on this line. Distinct labels: "
            f"{shown}{more}. Expected exactly two label values, one of them the positive "
            f"label {positive!r}."
        )
    positive_key = _label_key(positive)
    one_class_allowed = single_class_ok and len(distinct) == 1
    if positive_key not in distinct and not one_class_allowed:
        raise DataError(
            f"CSV file {name}: the positive label {positive!r} never occurs in column "
            f"{label_name!r}; labels seen: {listed}. Expected the positive label to be one of "
            "them (comparison ignores surrounding spaces; numbers compare by value)."
        )
    if len(distinct) < 2 and not one_class_allowed:
        raise DataError(
            f"CSV file {name}: every row (lines {lines[0]} to {lines[-1]}) has the same label "
            f"{listed} in column {label_name!r}. Expected two classes, positive and negative."
        )
    y = np.fromiter(
        (_label_key(cell) == positive_key for cell in cells), dtype=np.int64, count=len(cells)
    )
    return y, tuple(cell for cell, _ in distinct.values())


def _features(
    name: str, feature_rows: list[list[str]], lines: list[int], feature_names: list[str]
) -> np.ndarray:
    """Convert the feature cells to float32, or raise a DataError for the first bad cell."""
    try:
        values = np.array(feature_rows, dtype=np.float64)
        ok = bool((np.abs(values) <= _FLOAT32_MAX).all())  # False for nan and inf too
    except (ValueError, OverflowError):
        ok = False
    if ok:
        return values.astype(np.float32)
    for row, lineno in zip(feature_rows, lines, strict=True):
        for cell, column in zip(row, feature_names, strict=True):
            value = _to_float(cell)
            where = f"CSV file {name}, line {lineno}, column {column!r}"
            if value is None:
                raise DataError(
                    f"{where}: cell {cell!r} is not a number. Expected every column except "
                    "the label column to hold numeric features."
                )
            if not abs(value) <= _FLOAT32_MAX:
                raise DataError(
                    f"{where}: cell {cell!r} is not a finite float32 number. Expected finite "
                    "feature values (missing values such as nan are not supported)."
                )
    raise DataError(  # pragma: no cover - the fast path only fails on a cell caught above
        f"CSV file {name}: the feature cells could not be converted to numbers."
    )
