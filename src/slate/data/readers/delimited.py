"""Reader for delimited text tables (CSV and friends, plain or gzip-compressed).

:func:`read_table` reads a table as it comes: one optional label column, numeric columns (missing
cells become NaN), and text columns (categories or identifiers, coded as integers). It streams
the file in blocks of rows, so memory stays close to the size of the typed result, and it reports
every unusable column at once in one :class:`~slate.errors.DataError`.

:func:`read_csv_table` and :func:`read_csv` are the strict readers used by ``--dataset csv``: every
column but the label must be numeric and complete, and the features come back as one ``float32``
matrix.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from slate.data.readers.cells import (
    NA_TOKENS,
    CellContext,
    ColumnReader,
    GrowingArray,
    LabelReader,
    Problem,
    make_context,
    report_problems,
)
from slate.data.readers.files import MAX_ELEMENTS
from slate.data.readers.formats import parse_disguised_numbers
from slate.data.readers.records import WHITESPACE, Records, detect_header
from slate.data.readers.table import CsvTable, RawTable, TextColumn
from slate.errors import DataError

__all__ = [
    "NA_TOKENS",
    "CsvTable",
    "RawTable",
    "TextColumn",
    "read_csv",
    "read_csv_table",
    "read_table",
]


#: Cells per block of rows read at once (bounds the Python objects alive at any time).
_BLOCK_CELLS = 100_000
_MIN_BLOCK_ROWS = 64
#: Rows looked at, after the first, to decide whether the first row is a header.
_HEADER_SAMPLE = 50
_LABEL_MODES = ("required", "optional", "single_class_ok")
_MISSING_MODES = ("allow", "error")


# ----------------------------------------------------------------------------- public readers


def read_table(
    path: str | os.PathLike[str],
    label_column: str | int | None,
    positive_label: str | None,
    *,
    header: bool | None = None,
    delimiter: str | None = None,
    encoding: str = "utf-8",
    na_values: Sequence[str] = (),
    categorical_columns: Sequence[str] = (),
    labels: str = "required",
    missing: str = "allow",
    empty_ok: bool = False,
) -> RawTable:
    """Read a delimited text file as it comes: numeric and text columns, missing cells, labels.

    A column is numeric when every non-missing cell is a finite number (within the float32
    range, as features end up float32); otherwise it is a text column, coded as integers. A
    column whose non-missing cells are at least 90% numbers but not all is taken for dirty
    numeric data and reported, not read as text; the columns in ``categorical_columns`` are
    always text. Cells equal to one of :data:`NA_TOKENS` or ``na_values`` (after stripping
    spaces, ignoring case) are missing: NaN in a numeric column, code ``-1`` in a text column.

    Label cells are compared with ``positive_label`` after stripping spaces; two cells that both
    parse as numbers are equal when their values are (``"1"`` equals ``"1.0"``). Exactly two
    distinct labels must occur, one of them ``positive_label`` (one label is enough with
    ``labels="single_class_ok"``), and no label cell may be missing.

    The file is streamed in blocks of rows; nothing but the typed columns is kept. When the file
    cannot be used, one :class:`DataError` lists every problem (each unusable column with its
    first bad line and value, missing or extra labels); only a malformed row (wrong number of
    cells, broken quoting, undecodable bytes) stops the reading at once, naming its line.

    Args:
        path: A plain-text or gzip-compressed (detected by its magic bytes) file.
        label_column: The label column: a header name, or a 0-based column index (an ``int``,
            negative values counting from the end, or a string of digits; such a string is a
            name if the header has a column with exactly that name). ``None``: no label column
            (only with ``labels="optional"``).
        positive_label: The label value of the positive class (needed when there are labels).
        header: Whether the first non-blank row is a header. ``None`` auto-detects: the first
            row is a header if it holds the ``label_column`` name, or a word above a column of
            numbers; a first row holding a number (outside the label column) is data; a first
            row of words only is a header unless one of its words occurs again in its column.
        delimiter: The one-character cell separator, or ``"whitespace"`` for cells separated by
            runs of spaces and tabs (unquoted). ``None`` detects it among ``,`` ``;`` and
            tab from the first lines (the one that occurs, the same number of times on every
            line, most often; ``,`` if none occurs); :attr:`RawTable.delimiter` says which.
        encoding: The text encoding (``utf-8`` by default, a leading byte-order mark dropped;
            ``latin-1`` reads any byte).
        na_values: Further cells that mean "missing", added to :data:`NA_TOKENS`.
        categorical_columns: Columns read as text even if every cell is a number (codes such as
            ``1``/``2``/``3``). Each must name a column of the file.
        labels: ``"required"``: the label column must exist; ``"single_class_ok"``: as
            required, but a file whose rows all carry one label is accepted (one party's share
            may); ``"optional"``: a label column name that the header lacks (or
            ``label_column=None``) gives ``y=None`` and every column is a feature, and a label
            column that is present is read as with ``"single_class_ok"`` (a file to score may
            hold one class).
        empty_ok: a header row without data rows gives a table of 0 rows (a request to score
            may hold none), instead of an error.
        missing: ``"allow"`` or ``"error"`` (every missing feature cell is a problem).

    Returns:
        A :class:`RawTable`.

    Raises:
        DataError: If the file cannot be read or decoded, holds no data rows, a row has the
            wrong number of cells or broken quoting, the label column or a categorical column
            does not exist, two feature columns share a name, or any column or label problem
            described above occurs (all of them in one message).
    """
    name = os.fspath(path)
    if labels not in _LABEL_MODES:
        raise DataError(
            f"Cannot read {name}: labels must be one of {_LABEL_MODES}, got {labels!r}."
        )
    if missing not in _MISSING_MODES:
        raise DataError(
            f"Cannot read {name}: missing must be one of {_MISSING_MODES}, got {missing!r}."
        )
    result = _read(
        name,
        label_column,
        positive_label,
        header=header,
        delimiter=delimiter,
        encoding=encoding,
        na_values=na_values,
        categorical_columns=categorical_columns,
        labels=labels,
        missing=missing,
        strict=False,
        dtype=np.float64,
        empty_ok=empty_ok,
    )
    numeric: dict[str, np.ndarray] = {}
    text: dict[str, TextColumn] = {}
    notes: list[str] = list(result.notes)
    for column in result.features:
        if column.kind == "numeric":
            numeric[column.name] = column.store.take()
            continue
        codes, categories = column.store.take(), tuple(column.categories)
        parsed = None if column.forced_text else parse_disguised_numbers(categories, codes)
        if parsed is None:
            text[column.name] = TextColumn(codes, categories)
        else:
            numeric[column.name] = parsed[0]
            notes.append(f"note: column {column.name!r} of {name} holds {parsed[3]}")
    return RawTable(
        path=name,
        columns=tuple(c.name for c in result.features),
        numeric=numeric,
        text=text,
        y=result.y,
        label_name=result.label_name,
        label_values=result.label_values,
        header=result.header,
        has_header=result.has_header,
        delimiter=result.delimiter,
        rows=result.rows,
        first_lines=result.first_lines,
        missing={c.name: c.missing for c in result.features},
        notes=tuple(notes),
    )


def read_csv(
    path: str | os.PathLike[str],
    label_column: str | int,
    positive_label: str,
    header: bool | None = None,
    delimiter: str | None = ",",
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
    delimiter: str | None = ",",
    single_class_ok: bool = False,
) -> CsvTable:
    """Read a delimited text file with one label column and numeric features into dense arrays.

    The strict form of :func:`read_table`: every column except the label column must hold a
    finite float32 number in every cell (a missing cell, see :data:`NA_TOKENS`, is a problem),
    and the features come back as one ``float32`` matrix. Blank lines are skipped; cells may be
    quoted as usual for CSV. Labels are compared as in :func:`read_table`. Every problem
    column is listed in one :class:`DataError`.

    Args:
        path: A plain-text or gzip-compressed (detected by its magic bytes) file.
        label_column: The label column: a header name, or a 0-based column index (an ``int``,
            negative values counting from the end, or a string of digits; such a string is a
            name if the header has a column with exactly that name).
        positive_label: The label value of the positive class.
        header: Whether the first non-blank row is a header; ``None`` auto-detects (see
            :func:`read_table`). When ``label_column`` is an index, the cell in that column is
            left out of the test, because the labels of a file without header may be words
            such as ``yes``.
        delimiter: The one-character cell separator; ``None`` detects it (see
            :func:`read_table`).
        single_class_ok: accept a file whose rows all carry one label (one site's share of a
            multi-party task may); the caller then checks the labels across files.

    Returns:
        A :class:`CsvTable`: ``x`` is a C-contiguous ``float32`` array of shape ``(n, d)``
        holding every column but the label column, in file order, and ``y`` an ``int64`` array
        of shape ``(n,)`` with values in ``{0, 1}``; with the column names and label values.

    Raises:
        DataError: If the file cannot be read or decoded, holds no data rows, a row has the
            wrong number of cells, the label column does not exist, a feature cell is missing
            or not a finite float32 number, the labels are not exactly two distinct values, a
            label is missing, or ``positive_label`` never occurs.
    """
    result = _read(
        os.fspath(path),
        label_column,
        positive_label,
        header=header,
        delimiter=delimiter,
        encoding="utf-8",
        na_values=(),
        categorical_columns=(),
        labels="single_class_ok" if single_class_ok else "required",
        missing="error",
        strict=True,
        dtype=np.float32,
    )
    assert result.y is not None and result.label_name is not None
    features = result.features
    x = np.empty((result.rows, len(features)), dtype=np.float32)
    for j, column in enumerate(features):  # each column's buffer is freed once copied
        x[:, j] = column.store.take(copy=False)
    return CsvTable(
        x,
        result.y,
        tuple(c.name for c in features),
        result.label_name,
        result.header,
        result.label_values,
        result.has_header,
    )


@dataclass
class _Result:
    features: list[ColumnReader]
    y: np.ndarray | None
    label_name: str | None
    label_values: tuple[str, ...]
    header: tuple[str, ...]
    has_header: bool
    delimiter: str
    rows: int
    first_lines: np.ndarray
    notes: list[str]


def _read(
    name: str,
    label_column: str | int | None,
    positive_label: str | None,
    *,
    header: bool | None,
    delimiter: str | None,
    encoding: str,
    na_values: Sequence[str],
    categorical_columns: Sequence[str],
    labels: str,
    missing: str,
    strict: bool,
    dtype: type,
    empty_ok: bool = False,
) -> _Result:
    """Read the file into typed blocks per column, or raise one DataError listing every problem."""
    if delimiter not in (None, WHITESPACE) and (
        not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '\r\n"'
    ):
        raise DataError(
            f"Cannot read {name}: the delimiter must be a single character other than a quote "
            f"or a line break, {WHITESPACE!r} (runs of spaces and tabs, as in many UCI files), "
            f"or None to detect it; got {delimiter!r}."
        )
    if label_column is None:
        if labels != "optional":
            raise DataError(
                f"Cannot read {name}: no label column given. Name the label column (a header "
                "name or 0-based index), or read the file with optional labels."
            )
    elif isinstance(label_column, bool) or not isinstance(label_column, (str, int, np.integer)):
        raise DataError(
            f"Cannot read {name}: label_column must be a column name or a 0-based integer "
            f"index, got {label_column!r}."
        )
    if isinstance(na_values, str) or isinstance(categorical_columns, str):
        raise DataError(
            f"Cannot read {name}: na_values and categorical_columns must be sequences of "
            "strings, not a single string."
        )
    context = make_context(name, na_values, dtype)
    forced = {str(c).strip() for c in categorical_columns}

    with Records(name, encoding, delimiter) as records:
        lines, rows = records.block(_HEADER_SAMPLE + 1)
        if not rows:
            raise DataError(
                f"CSV file {name} is empty (no non-blank lines). Expected a table with a label "
                "column and at least one feature column."
            )
        first = rows[0]
        n_cols = len(first)
        if header is None:
            header = detect_header(first, rows[1:], label_column, context)
        if header:
            names = [cell.strip() or f"column {j}" for j, cell in enumerate(first)]
            lines, rows = lines[1:], rows[1:]
            if not rows:
                lines, rows = records.block(_block_rows(n_cols))
        else:
            names = [f"column {j}" for j in range(n_cols)]
        label_idx = _find_label(name, label_column, names, header, n_cols, labels)
        label_name = None if label_idx is None else names[label_idx]
        if not rows and not empty_ok:
            raise DataError(
                f"CSV file {name} has a header row but no data rows. Expected at least one row "
                "of data after the header."
            )
        if label_idx is not None and n_cols < 2:
            raise DataError(
                f"CSV file {name} has a single column ({label_name}), so there is no feature "
                "column besides the labels. Expected at least two columns; check the delimiter "
                f"(currently {records.delimiter!r})."
            )
        feature_names = [n for j, n in enumerate(names) if j != label_idx]
        if not strict:
            _check_names(name, feature_names)
        unknown = sorted(forced - set(names))
        if unknown:
            raise DataError(
                f"CSV file {name}: categorical column(s) {', '.join(map(repr, unknown))} not "
                f"found; {_describe_named_columns(names, header, n_cols)}."
            )
        if positive_label is None and label_idx is not None:
            raise DataError(
                f"Cannot read {name}: the file has a label column ({label_name!r}) but no "
                "positive label was given."
            )
        positive = "" if positive_label is None else str(positive_label).strip()
        label_state = None if label_idx is None else LabelReader(label_name or "", context)
        features = [
            ColumnReader(n, j, n in forced, dtype) for j, n in enumerate(names) if j != label_idx
        ]
        n_rows, line_numbers = _scan(
            records, (lines, rows), n_cols, header, label_idx, label_state, features, context
        )
        del lines, rows
        delimiter = records.delimiter

    first_lines = line_numbers.take()
    problems: list[Problem] = []
    y = None
    values: tuple[str, ...] = ()
    notes: list[str] = []
    if label_state is not None and labels == "optional" and label_state.missing:
        notes.append(
            f"note: {label_state.missing} of {n_rows} rows of {name} have no label in column "
            f"{label_name!r}; the labels are ignored (no metrics are computed)"
        )
        label_state = label_name = None
    if label_state is not None:
        one_class_ok = labels in ("single_class_ok", "optional")
        problems += label_state.problems(positive, one_class_ok, first_lines)
    for column in features:
        column.finish_counts()
        problems += column.problems(strict, missing == "error")
    if problems:
        raise DataError(report_problems(name, problems))
    if label_state is not None:
        y, values = label_state.result(positive), tuple(label_state.values)
    rescan = [c for c in features if c.rescan]
    if rescan:
        _rescan(name, encoding, delimiter, header, n_cols, rescan, context, n_rows)
    return _Result(
        features, y, label_name, values, tuple(names), bool(header), delimiter, n_rows,
        first_lines, notes,
    )  # fmt: skip


def _scan(
    records: Records,
    pending: tuple[Sequence[int], list[list[str]]],
    n_cols: int,
    header: bool,
    label_idx: int | None,
    label_state: LabelReader | None,
    features: list[ColumnReader],
    context: CellContext,
) -> tuple[int, GrowingArray]:
    """Read every data row, block by block, into the label and feature columns."""
    name = records.name
    per_block = _block_rows(n_cols)
    n_rows = 0
    line_numbers = GrowingArray(np.int64)
    for lines, rows in _blocks(records, pending, per_block):
        _check_widths(name, rows, lines, n_cols, header, records.delimiter)
        n_rows += len(rows)
        if n_rows * len(features) > MAX_ELEMENTS:
            raise DataError(
                f"CSV file {name}: more than {n_rows - len(rows)} rows x {len(features)} "
                f"features exceed the limit of {MAX_ELEMENTS} matrix elements. Use a smaller "
                "file."
            )
        columns = list(zip(*rows, strict=True))
        line_numbers.append(_as_array(lines))
        if label_state is not None and label_idx is not None:
            label_state.add(columns[label_idx], lines)
        for column in features:
            column.add(columns[column.position], lines, context)
        del columns
    return n_rows, line_numbers


def _rescan(
    name: str,
    encoding: str,
    delimiter: str,
    header: bool,
    n_cols: int,
    columns: list[ColumnReader],
    context: CellContext,
    n_rows: int,
) -> None:
    """Read the text codes of columns that turned out to be text after blocks of numbers."""
    for column in columns:
        column.restart_text()
    seen = 0
    with Records(name, encoding, delimiter) as records:
        per_block = _block_rows(n_cols)
        start_lines, start_rows = records.block(per_block)
        if header:
            start_lines, start_rows = start_lines[1:], start_rows[1:]
        for lines, rows in _blocks(records, (start_lines, start_rows), per_block):
            _check_widths(name, rows, lines, n_cols, header, delimiter)
            seen += len(rows)
            for column in columns:
                column.add_text([row[column.position] for row in rows], lines, context)
    if seen != n_rows:
        raise DataError(
            f"CSV file {name} changed while it was read ({n_rows} data rows, then {seen}). "
            "Read it again once it is complete."
        )


def _blocks(
    records: Records, pending: tuple[Sequence[int], list[list[str]]], size: int
) -> Iterator[tuple[Sequence[int], list[list[str]]]]:
    """The rows already read (in blocks of ``size``), then the rest of the file's."""
    lines, rows = pending
    for start in range(0, len(rows), size):
        yield lines[start : start + size], rows[start : start + size]
    while True:
        lines, rows = records.block(size)
        if not rows:
            return
        yield lines, rows


def _block_rows(n_cols: int) -> int:
    """Rows per block: about :data:`_BLOCK_CELLS` cells."""
    return max(_MIN_BLOCK_ROWS, _BLOCK_CELLS // n_cols)


def _as_array(lines: Sequence[int]) -> np.ndarray:
    if isinstance(lines, range):
        return np.arange(lines.start, lines.stop, dtype=np.int64)
    return np.array(lines, dtype=np.int64)


def _check_widths(
    name: str, rows: list[list[str]], lines: Sequence[int], n_cols: int, header: bool, delim: str
) -> None:
    """Raise a DataError for the first row whose number of cells differs from ``n_cols``."""
    if min(map(len, rows)) == max(map(len, rows)) == n_cols:
        return
    for row, line in zip(rows, lines, strict=True):
        if len(row) != n_cols:
            raise DataError(
                f"CSV file {name}, line {line}: expected {n_cols} cells (as in the "
                f"{'header' if header else 'first row'}), got {len(row)}. Check for a missing "
                f"or extra delimiter ({delim!r}) or an unbalanced quote."
            )


def _check_names(name: str, feature_names: list[str]) -> None:
    """Feature columns are looked up by name, so two of them may not share one."""
    seen: dict[str, int] = {}
    for position, column in enumerate(feature_names):
        if column in seen:
            raise DataError(
                f"CSV file {name}: the header names two feature columns {column!r} (columns "
                f"{seen[column] + 1} and {position + 1} of the features). Rename one of them."
            )
        seen[column] = position


def _describe_columns(names: list[str] | None, n_cols: int) -> str:
    """List the available columns for an error message."""
    if names is None:
        return f"the file has no header row, so use a 0-based index from 0 to {n_cols - 1}"
    shown = ", ".join(repr(n) for n in names[:20])
    more = f" and {len(names) - 20} more" if len(names) > 20 else ""
    return f"available columns: {shown}{more} (or a 0-based index from 0 to {n_cols - 1})"


def _describe_named_columns(names: list[str], header: bool, n_cols: int) -> str:
    """List the columns for an error about columns matched by name (not by index)."""
    if header:
        return _describe_columns(names, n_cols)
    return (
        f"the file has no header row, so its columns are named 'column 0' to "
        f"'column {n_cols - 1}'; columns are matched by the header names of the training file"
    )


def _find_label(
    name: str,
    label_column: str | int | None,
    names: list[str],
    header: bool,
    n_cols: int,
    labels: str,
) -> int | None:
    """The label column's index; None when it is absent and labels are optional."""
    if label_column is None:
        return None
    if labels == "optional" and isinstance(label_column, str):
        key = label_column.strip()
        if (key not in names or not header) and not (key.isascii() and key.isdigit()):
            return None  # a named label column the file does not have: no labels
    return _resolve_label_column(name, label_column, names if header else None, n_cols)


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
