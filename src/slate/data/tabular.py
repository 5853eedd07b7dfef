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

import codecs
import csv
import gzip
import io
import itertools
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slate.data.libsvm import MAX_ELEMENTS, open_data_file
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

#: Cells that mean "missing", compared after stripping surrounding spaces and ignoring case.
NA_TOKENS = ("", "NA", "N/A", "NaN", "nan", "?", "null", "NULL", "None")

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_LISTED = 10
#: A column whose non-missing cells are at least this share numbers, but not all, is an error.
_NUMERIC_SHARE = 0.9
#: Cells per block of rows read at once (bounds the Python objects alive at any time).
_BLOCK_CELLS = 100_000
_MIN_BLOCK_ROWS = 64
#: Rows looked at, after the first, to decide whether the first row is a header.
_HEADER_SAMPLE = 50
#: Text read ahead, at most, to detect the delimiter.
_SNIFF_CHARS = 65_536
_DELIMITERS = (",", ";", "\t")
#: Distinct label values remembered (a wrongly chosen label column may hold one per row).
_MAX_LABELS = 10_000
#: Problems described in full in one report; the columns of the rest are only named.
_MAX_DETAILED = 25
_LABEL_MODES = ("required", "optional", "single_class_ok")
_MISSING_MODES = ("allow", "error")
_WORD, _NUMBER, _NONFINITE = 0, 1, 2
_UNSEEN = -2
_NAN = "nan"
#: Spellings of missing cells remembered per column for the fast conversion of numeric blocks.
_MAX_NA_SEEN = 4


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
        delimiter: The one-character cell separator. ``None`` detects it among ``,`` ``;`` and
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
    )
    numeric: dict[str, np.ndarray] = {}
    text: dict[str, TextColumn] = {}
    for column in result.features:
        if column.kind == "numeric":
            numeric[column.name] = column.store.take()
        else:
            text[column.name] = TextColumn(column.store.take(), tuple(column.categories))
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


# ----------------------------------------------------------------------------- the reading


class _Growing:
    """A 1-D array that grows by doubling as blocks are appended (like a list, but typed).

    Large buffers are allocated by the system on demand, so the unused tail of the capacity
    costs address space, not memory.
    """

    def __init__(self, dtype: type) -> None:
        self.data = np.empty(0, dtype=dtype)
        self.size = 0

    def append(self, values: np.ndarray | list[int]) -> None:
        end = self.size + len(values)
        if end > len(self.data):
            grown = np.empty(max(end, 2 * len(self.data), 1024), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : end] = values
        self.size = end

    def view(self) -> np.ndarray:
        return self.data[: self.size]

    def take(self, copy: bool = True) -> np.ndarray:
        """The content (an exact-size copy unless ``copy=False``); the buffer is emptied."""
        out = self.data[: self.size]
        if copy and self.size != len(self.data):
            out = out.copy()
        self.data = np.empty(0, dtype=self.data.dtype)  # not a view: that would keep it alive
        self.size = 0
        return out


@dataclass
class _Result:
    features: list[_Column]
    y: np.ndarray | None
    label_name: str | None
    label_values: tuple[str, ...]
    header: tuple[str, ...]
    has_header: bool
    delimiter: str
    rows: int
    first_lines: np.ndarray


@dataclass
class _Problem:
    """One reason why a file cannot be used; ``line``/``column`` locate it where they can."""

    line: int | None
    column: str | None
    text: str

    def where(self) -> str:
        parts = []
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.column is not None:
            parts.append(f"column {self.column!r}")
        return ", ".join(parts)


@dataclass(frozen=True)
class _Context:
    """What every column needs to classify its cells."""

    na: frozenset[str]  # missing-value tokens, stripped and casefolded
    numeric_na: np.ndarray  # the values of the tokens that parse as numbers (e.g. -999)
    dtype: type  # dtype of the stored numeric blocks


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
) -> _Result:
    """Read the file into typed blocks per column, or raise one DataError listing every problem."""
    if delimiter is not None and (
        not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '\r\n"'
    ):
        raise DataError(
            f"Cannot read {name}: the delimiter must be a single character other than a quote "
            f"or a line break (or None to detect it), got {delimiter!r}."
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
    context = _make_context(name, na_values, dtype)
    forced = {str(c).strip() for c in categorical_columns}

    with _Records(name, encoding, delimiter) as records:
        lines, rows = records.block(_HEADER_SAMPLE + 1)
        if not rows:
            raise DataError(
                f"CSV file {name} is empty (no non-blank lines). Expected a table with a label "
                "column and at least one feature column."
            )
        first = rows[0]
        n_cols = len(first)
        if header is None:
            header = _detect_header(first, rows[1:], label_column, context)
        if header:
            names = [cell.strip() or f"column {j}" for j, cell in enumerate(first)]
            lines, rows = lines[1:], rows[1:]
            if not rows:
                lines, rows = records.block(_block_rows(n_cols))
        else:
            names = [f"column {j}" for j in range(n_cols)]
        label_idx = _find_label(name, label_column, names, header, n_cols, labels)
        label_name = None if label_idx is None else names[label_idx]
        if not rows:
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
                f"found; {_describe_columns(names if header else None, n_cols)}."
            )
        if positive_label is None and label_idx is not None:
            raise DataError(
                f"Cannot read {name}: the file has a label column ({label_name!r}) but no "
                "positive label was given."
            )
        positive = "" if positive_label is None else str(positive_label).strip()
        label_state = None if label_idx is None else _Labels(label_name or "", context)
        features = [
            _Column(n, j, n in forced, dtype) for j, n in enumerate(names) if j != label_idx
        ]
        n_rows, line_numbers = _scan(
            records, (lines, rows), n_cols, header, label_idx, label_state, features, context
        )
        del lines, rows
        delimiter = records.delimiter

    first_lines = line_numbers.take()
    problems: list[_Problem] = []
    y = None
    values: tuple[str, ...] = ()
    if label_state is not None:
        one_class_ok = labels in ("single_class_ok", "optional")
        problems += label_state.problems(positive, one_class_ok, first_lines)
    for column in features:
        column.finish_counts()
        problems += column.problems(strict, missing == "error")
    if problems:
        raise DataError(_report(name, problems))
    if label_state is not None:
        y, values = label_state.result(positive), tuple(label_state.values)
    rescan = [c for c in features if c.rescan]
    if rescan:
        _rescan(name, encoding, delimiter, header, n_cols, rescan, context, n_rows)
    return _Result(
        features, y, label_name, values, tuple(names), bool(header), delimiter, n_rows,
        first_lines,
    )  # fmt: skip


def _scan(
    records: _Records,
    pending: tuple[Sequence[int], list[list[str]]],
    n_cols: int,
    header: bool,
    label_idx: int | None,
    label_state: _Labels | None,
    features: list[_Column],
    context: _Context,
) -> tuple[int, _Growing]:
    """Read every data row, block by block, into the label and feature columns."""
    name = records.name
    per_block = _block_rows(n_cols)
    n_rows = 0
    line_numbers = _Growing(np.int64)
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
    columns: list[_Column],
    context: _Context,
    n_rows: int,
) -> None:
    """Read the text codes of columns that turned out to be text after blocks of numbers."""
    for column in columns:
        column.restart_text()
    seen = 0
    with _Records(name, encoding, delimiter) as records:
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
    records: _Records, pending: tuple[Sequence[int], list[list[str]]], size: int
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


def _make_context(name: str, na_values: Sequence[str], dtype: type) -> _Context:
    extra = []
    for token in na_values:
        if not isinstance(token, str):
            raise DataError(f"Cannot read {name}: na_values must be strings, got {token!r}.")
        extra.append(token)
    tokens = frozenset(t.strip().casefold() for t in (*NA_TOKENS, *extra))
    numeric = []
    for token in tokens:
        value = _to_float(token)
        if value is not None and value == value:
            numeric.append(value)
    return _Context(tokens, np.array(sorted(numeric), dtype=np.float64), dtype)


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


# ----------------------------------------------------------------------------- columns


class _Column:
    """One feature column while the file is read: typed blocks plus what the cells were."""

    def __init__(self, name: str, position: int, forced_text: bool, dtype: type) -> None:
        self.name = name
        self.position = position
        self.forced_text = forced_text
        self.kind = "text" if forced_text else "numeric"
        # The numbers (NaN where missing) of a numeric column, the codes of a text column.
        self.store = _Growing(np.int32 if forced_text else dtype)
        self.rescan = False  # turned to text after numeric blocks were stored and dropped
        self.missing = 0
        self.first_missing: tuple[int, str] | None = None
        self.na_seen: list[str] = []  # missing cells as written in this column, e.g. ""
        # Non-missing cells: finite float32 numbers, other numbers (inf, 1e39), and words.
        self.numbers = 0
        self.nonfinite = 0
        self.words = 0
        self.first_bad: tuple[int, str] | None = None
        self.examples: list[str] = []
        self._restart()

    def _restart(self) -> None:
        self.lookup: dict[str, int] = {}  # cell as written -> code
        self.index: dict[str, int] = {}  # stripped cell -> code
        self.categories: list[str] = []
        self.category_kinds: list[int] = []

    def restart_text(self) -> None:
        """Forget the text codes, to read the column again from its first row."""
        self._restart()
        self.store = _Growing(np.int32)
        self.missing = 0
        self.first_missing = None

    def add(self, cells: Sequence[str], lines: Sequence[int], context: _Context) -> None:
        if self.kind == "numeric":
            values = self._numbers(cells, lines, context)
            if values is not None:
                self.store.append(values)
                return
            # A word: the column is text. Numbers stored before this block lost their text,
            # so the column is read again once the whole file has been seen.
            self.rescan = self.store.size > 0
            self.store = _Growing(np.int32)
            self.kind = "text"
        self.add_text(cells, lines, context)

    def _numbers(
        self, cells: Sequence[str], lines: Sequence[int], context: _Context
    ) -> np.ndarray | None:
        """The block as numbers (NaN for missing cells), or None if a cell is a word."""
        try:
            values = np.array(cells, dtype=np.float64)
        except ValueError:
            values = self._numbers_with_missing(cells)
        if values is None:
            check: Iterable[int] = range(len(cells))
            values = np.empty(len(cells), dtype=np.float64)
        else:
            good = np.abs(values) <= _FLOAT32_MAX  # False for nan and inf too
            if context.numeric_na.size:
                good &= ~np.isin(values, context.numeric_na)
            if good.all():
                self.numbers += len(cells)
                return values.astype(context.dtype, copy=False)
            check = np.flatnonzero(~good).tolist()
        numbers = len(cells)
        missing: list[int] = []
        nonfinite: list[int] = []
        for i in check:
            cell = cells[i]
            numbers -= 1
            if cell.strip().casefold() in context.na:
                values[i] = np.nan
                missing.append(i)
                if cell not in self.na_seen and len(self.na_seen) < _MAX_NA_SEEN:
                    self.na_seen.append(cell)
                continue
            value = _to_float(cell)
            if value is None:
                return None
            if abs(value) <= _FLOAT32_MAX:
                values[i] = value
                numbers += 1
            else:
                values[i] = np.nan
                nonfinite.append(i)
        self.numbers += numbers
        if missing:
            self.missing += len(missing)
            if self.first_missing is None:
                self.first_missing = (lines[missing[0]], cells[missing[0]])
        if nonfinite:
            self.nonfinite += len(nonfinite)
            for i in nonfinite:
                self._note_bad(lines[i], cells[i].strip())
        return values.astype(context.dtype, copy=False)

    def _numbers_with_missing(self, cells: Sequence[str]) -> np.ndarray | None:
        """The block converted in one call once the missing cells spelt as in earlier blocks
        (most often ``""``) are replaced by ``nan``; None if that is not enough."""
        if not self.na_seen:
            return None
        block = np.array(cells, dtype=object)
        missing = block == self.na_seen[0]
        for spelling in self.na_seen[1:]:
            missing |= block == spelling
        if not missing.any():
            return None
        block[missing] = _NAN
        try:
            return block.astype(np.float64)
        except ValueError:
            return None

    def add_text(self, cells: Sequence[str], lines: Sequence[int], context: _Context) -> None:
        get = self.lookup.get
        codes = [get(cell, _UNSEEN) for cell in cells]
        if _UNSEEN in codes:
            for i, code in enumerate(codes):
                if code == _UNSEEN:
                    codes[i] = self._new_cell(cells[i], lines[i], context)
        n_missing = codes.count(-1)
        if n_missing:
            self.missing += n_missing
            if self.first_missing is None:
                i = codes.index(-1)
                self.first_missing = (lines[i], cells[i])
        self.store.append(codes)

    def _new_cell(self, cell: str, line: int, context: _Context) -> int:
        code = self.lookup.get(cell)
        if code is not None:
            return code
        text = cell.strip()
        if text.casefold() in context.na:
            code = -1
        else:
            code = self.index.get(text)
            if code is None:
                code = len(self.categories)
                self.categories.append(text)
                self.index[text] = code
                kind = _cell_kind(text)
                self.category_kinds.append(kind)
                if kind != _NUMBER:
                    self._note_bad(line, text)
        self.lookup[cell] = code
        return code

    def _note_bad(self, line: int, text: str) -> None:
        if self.first_bad is None:
            self.first_bad = (line, text)
        if len(self.examples) < 3 and text not in self.examples:
            self.examples.append(text)

    def finish_counts(self) -> None:
        """Count the text blocks' numbers and words (the numeric blocks counted as they came)."""
        if self.kind != "text" or self.forced_text:
            return
        codes = self.store.view()
        counts = np.bincount(codes[codes >= 0], minlength=len(self.categories))
        kinds = np.array(self.category_kinds, dtype=np.int64)
        self.numbers += int(counts[kinds == _NUMBER].sum())
        self.nonfinite += int(counts[kinds == _NONFINITE].sum())
        self.words += int(counts[kinds == _WORD].sum())

    def problems(self, strict: bool, missing_is_error: bool) -> list[_Problem]:
        """Why the column cannot be used, if it cannot."""
        found = []
        bad = self.words + self.nonfinite
        if not self.forced_text and bad and self.first_bad is not None:
            line, cell = self.first_bad
            numeric_looking = self.numbers + self.nonfinite
            present = self.numbers + bad
            examples = ", ".join(map(repr, self.examples)) + (", ..." if bad > 3 else "")
            verb = "is" if bad == 1 else "are"
            tally = f"{bad} of its {_count(present, 'non-missing cell')} {verb} not: {examples}"
            if strict:
                what = "a number" if _cell_kind(cell) == _WORD else "a finite float32 number"
                text = (
                    f"cell {cell!r} is not {what} ({tally}). Expected every column except the "
                    "label column to hold finite numeric features."
                )
            elif self.words == 0:
                text = (
                    f"cell {cell!r} is not a finite number within the float32 range (about "
                    f"+-3.4e38); the column has {_count(bad, 'such cell')} ({examples}): fix "
                    "the values, or add them to --na-values to read them as missing."
                )
            elif numeric_looking >= _NUMERIC_SHARE * present:
                share = 100 * numeric_looking // present
                what = "a number" if _cell_kind(cell) == _WORD else "a finite number"
                text = (
                    f"cell {cell!r} is not {what}, but {share}% of the column is numeric "
                    f"({tally}): fix the value, add it to --na-values, or list the column in "
                    "--categorical-columns."
                )
            else:
                text = ""  # a text column
            if text:
                found.append(_Problem(line, self.name, text))
        if self.missing and self.first_missing is not None and (strict or missing_is_error):
            line, cell = self.first_missing
            expected = (
                "Expected every feature cell to be a finite number: missing values are not "
                "supported here."
                if strict
                else "Missing values are not allowed here (missing='error'): fill them in or "
                "remove those rows."
            )
            count = _count(self.missing, "missing cell")
            found.append(
                _Problem(
                    line,
                    self.name,
                    f"cell {cell!r} marks a missing value ({count} in this column). {expected}",
                )
            )
        return found


class _Labels:
    """The label column while the file is read: a code per row into the distinct values."""

    def __init__(self, name: str, context: _Context) -> None:
        self.name = name
        self.context = context
        self.lookup: dict[str, int] = {}
        self.keys: dict[tuple[str, float | str], int] = {}
        self.values: list[str] = []
        self.first_lines: list[int] = []
        self.overflow = False
        self.codes = _Growing(np.int32)
        self.missing = 0
        self.first_missing: tuple[int, str] | None = None

    def add(self, cells: Sequence[str], lines: Sequence[int]) -> None:
        get = self.lookup.get
        codes = [get(cell, _UNSEEN) for cell in cells]
        if _UNSEEN in codes:
            for i, code in enumerate(codes):
                if code == _UNSEEN:
                    codes[i] = self._new_cell(cells[i], lines[i])
        n_missing = codes.count(-1)
        if n_missing:
            self.missing += n_missing
            if self.first_missing is None:
                i = codes.index(-1)
                self.first_missing = (lines[i], cells[i])
        self.codes.append(codes)

    def _new_cell(self, cell: str, line: int) -> int:
        code = self.lookup.get(cell)
        if code is not None:
            return code
        text = cell.strip()
        if text.casefold() in self.context.na:
            code = -1
        else:
            key = _label_key(text)
            code = self.keys.get(key)
            if code is None:
                if len(self.values) >= _MAX_LABELS:
                    self.overflow = True
                    return _MAX_LABELS
                code = len(self.values)
                self.keys[key] = code
                self.values.append(text)
                self.first_lines.append(line)
        if len(self.lookup) < 4 * _MAX_LABELS:
            self.lookup[cell] = code
        return code

    def problems(
        self, positive: str, single_class_ok: bool, first_lines: np.ndarray
    ) -> list[_Problem]:
        found = []
        if self.missing and self.first_missing is not None:
            line, cell = self.first_missing
            found.append(
                _Problem(
                    line,
                    self.name,
                    f"the label cell {cell!r} is missing ({_count(self.missing, 'row')} without a "
                    "label). "
                    "Every row needs a label: fill them in or remove those rows.",
                )
            )
        listed = ", ".join(repr(v) for v in self.values[:_MAX_LISTED])
        if len(self.values) > _MAX_LISTED or self.overflow:
            more = len(self.values) - _MAX_LISTED
            listed += f" and {'more than ' if self.overflow else ''}{more} more"
        if len(self.values) > 2:
            found.append(
                _Problem(
                    self.first_lines[2],
                    self.name,
                    f"labels are not binary: a third distinct value {self.values[2]!r} appears "
                    f"on this line. Distinct labels: {listed}. Expected exactly two label "
                    f"values, one of them the positive label {positive!r}.",
                )
            )
            return found
        one_class_allowed = single_class_ok and len(self.values) == 1
        if not self.values:
            return found
        if _label_key(positive) not in self.keys and not one_class_allowed:
            found.append(
                _Problem(
                    None,
                    None,
                    f"the positive label {positive!r} never occurs in column {self.name!r}; "
                    f"labels seen: {listed}. Expected the positive label to be one of them "
                    "(comparison ignores surrounding spaces; numbers compare by value).",
                )
            )
        elif len(self.values) < 2 and not one_class_allowed:
            found.append(
                _Problem(
                    None,
                    None,
                    f"every row (lines {int(first_lines[0])} to {int(first_lines[-1])}) has "
                    f"the same label {listed} in column {self.name!r}. Expected two classes, "
                    "positive and negative.",
                )
            )
        return found

    def result(self, positive: str) -> np.ndarray:
        codes = self.codes.take(copy=False)
        positive_code = self.keys.get(_label_key(positive))
        if positive_code is None:
            return np.zeros(codes.shape, dtype=np.int64)
        return (codes == positive_code).astype(np.int64)


def _report(name: str, problems: list[_Problem]) -> str:
    """One paragraph describing every problem."""
    if len(problems) == 1:
        where = problems[0].where()
        return f"CSV file {name}{', ' + where if where else ''}: {problems[0].text}"
    items = []
    for k, problem in enumerate(problems[:_MAX_DETAILED], start=1):
        where = problem.where()
        items.append(f"({k}) {where + ': ' if where else ''}{problem.text}")
    rest = problems[_MAX_DETAILED:]
    if rest:
        columns = list(dict.fromkeys(p.column or "labels" for p in rest))
        shown = ", ".join(map(repr, columns[:50])) + (" ..." if len(columns) > 50 else "")
        items.append(f"and {len(rest)} more problems, in columns {shown}")
    return (
        f"CSV file {name} cannot be used as it is; {len(problems)} problems were found: "
        + " ".join(items)
    )


# ----------------------------------------------------------------------------- the file


class _Records:
    """The non-blank records of a delimited text file, read in blocks with their first lines.

    The file may be plain or gzip (recognised by its magic bytes). With ``delimiter=None`` the
    delimiter is detected from the first lines, which are read ahead and then parsed as usual.
    Every failure to read, decompress, decode or parse becomes a DataError naming the line.
    """

    def __init__(self, name: str, encoding: str, delimiter: str | None) -> None:
        self.name = name
        self.encoding = encoding
        try:
            info = codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise DataError(
                f"Cannot read {name}: unknown text encoding {encoding!r}. Use a Python codec "
                "name such as utf-8, latin-1 or cp1252."
            ) from None
        self.codec = "utf-8-sig" if info.name == "utf-8" else info.name
        self._raw = open_data_file(name)  # closed by close()
        self._text: io.TextIOWrapper | None = None
        self.gzipped = False
        head: list[str] = []
        try:
            self.gzipped = self._raw.peek(2)[:2] == _GZIP_MAGIC
            binary = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.gzipped else self._raw
            self._text = io.TextIOWrapper(binary, encoding=self.codec, newline="")
            if delimiter is None:
                size, complete = 0, False
                while size < _SNIFF_CHARS and len(head) < 2 * _HEADER_SAMPLE:
                    line = self._text.readline()
                    if not line:
                        complete = True
                        break
                    head.append(line)
                    size += len(line)
                delimiter = _sniff_delimiter(head, complete)
        except (UnicodeDecodeError, OSError, EOFError, zlib.error) as exc:
            self.close()
            raise self._failure(exc, None) from None
        self.delimiter: str = delimiter
        self._reader = csv.reader(
            itertools.chain(head, self._text), delimiter=delimiter, strict=True
        )

    def __enter__(self) -> _Records:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._text is not None:
            self._text.close()
        self._raw.close()

    def block(self, size: int) -> tuple[Sequence[int], list[list[str]]]:
        """The non-blank records among the next ``size`` (more if all are blank), with the line
        on which each starts; empty lists at the end of the file."""
        reader = self._reader
        while True:
            before = reader.line_num
            try:
                rows = list(itertools.islice(reader, size))
            except csv.Error as exc:
                raise DataError(
                    f"CSV file {self.name}, line {reader.line_num}: the line cannot be parsed as "
                    f"CSV ({exc}). Expected delimiter-separated cells ({self.delimiter!r}) with "
                    "balanced quotes."
                ) from None
            except (UnicodeDecodeError, OSError, EOFError, zlib.error) as exc:
                raise self._failure(exc, reader.line_num + 1) from None
            if not rows:
                return [], []
            if reader.line_num - before == len(rows) and min(map(len, rows)) > 1:
                return range(before + 1, before + 1 + len(rows)), rows  # one line per record
            lines: list[int] = []
            kept: list[list[str]] = []
            line = before
            for row in rows:  # blank lines, or cells holding line breaks
                first = line + 1
                line = first + sum(map(_line_breaks, row))
                if len(row) <= 1 and (not row or not row[0].strip()):
                    continue
                lines.append(first)
                kept.append(row)
            if kept:
                return lines, kept

    def _failure(self, exc: BaseException, line: int | None) -> DataError:
        if not isinstance(exc, UnicodeDecodeError):
            if self.gzipped:
                return DataError(
                    f"Data file {self.name} starts with the gzip signature (bytes 1f 8b) but "
                    f"cannot be decompressed ({exc}); the file is probably truncated or "
                    "corrupt. Download it again or replace it with an intact copy."
                )
            return DataError(f"Cannot read data file {self.name}: {exc}.")
        label = "UTF-8" if self.codec == "utf-8-sig" else self.encoding
        found = _decode_position(self.name, self.gzipped, self.codec)
        hint = (
            "If it was saved in another encoding (spreadsheets on Windows often write cp1252), "
            "pass it, e.g. --encoding latin-1."
        )
        if found is None:
            where, detail = (f", line {line}" if line else ""), f"({exc.reason})"
        else:
            position, found_line, byte = found
            where = f", line {found_line}"
            detail = f"(byte 0x{byte:02x} at byte offset {position} cannot be decoded)"
            if position <= 1 and byte in (0xFE, 0xFF):
                hint = "It starts like UTF-16 text: pass --encoding utf-16."
        return DataError(
            f"CSV file {self.name}{where}: the file is not valid {label} text {detail}. {hint}"
        )


def _decode_position(name: str, gzipped: bool, codec: str) -> tuple[int, int, int] | None:
    """Where the file stops decoding: byte offset (of the decompressed text), line and byte."""
    decoder = codecs.getincrementaldecoder("utf-8" if codec == "utf-8-sig" else codec)()
    offset = newlines = 0
    try:
        with open(name, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
            while block := stream.read(1 << 20):
                state = decoder.getstate()
                pending = len(state[0]) if isinstance(state[0], bytes) else 0
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as exc:
                    inside = max(0, exc.start - pending)
                    line = newlines + block.count(b"\n", 0, inside) + 1
                    return offset - pending + exc.start, line, exc.object[exc.start]
                offset += len(block)
                newlines += block.count(b"\n")
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as exc:
                return offset - len(exc.object) + exc.start, newlines + 1, exc.object[exc.start]
    except (OSError, EOFError, zlib.error):
        return None
    return None


def _sniff_delimiter(lines: list[str], complete: bool) -> str:
    """The delimiter among ``, ; tab`` that the first records use, ``,`` if none."""
    records: list[dict[str, int]] = []
    current = dict.fromkeys(_DELIMITERS, 0)
    quoted = nonblank = False
    for char in "".join(lines):
        if char == '"':
            quoted = not quoted
            nonblank = True
        elif quoted:
            continue
        elif char in "\r\n":
            if nonblank:
                records.append(current)
            current, nonblank = dict.fromkeys(_DELIMITERS, 0), False
        elif char in current:
            current[char] += 1
            nonblank = True
        elif not char.isspace():
            nonblank = True
    if nonblank:
        records.append(current)
    if not complete and len(records) > 1:
        records.pop()  # possibly cut short by the read-ahead limit
    if not records:
        return ","
    first = records[0]
    used = [d for d in _DELIMITERS if first[d] > 0]
    if not used:
        return ","
    consistent = [d for d in used if all(r[d] == first[d] for r in records)]
    return max(consistent or used, key=lambda d: first[d])


# ----------------------------------------------------------------------------- cells and header


def _line_breaks(cell: str) -> int:
    """How many line breaks (``\\n``, ``\\r`` or ``\\r\\n``) a quoted cell holds."""
    if "\n" not in cell and "\r" not in cell:
        return 0
    return cell.count("\n") + cell.count("\r") - cell.count("\r\n")


def _count(n: int, noun: str) -> str:
    """``1 cell``, ``2 cells``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _to_float(cell: str) -> float | None:
    """Parse a cell as a float, or return None if it is not a number."""
    try:
        return float(cell)
    except ValueError:
        return None


def _cell_kind(text: str) -> int:
    """Whether a non-missing cell is a word, a finite float32 number, or another number."""
    value = _to_float(text)
    if value is None:
        return _WORD
    return _NUMBER if abs(value) <= _FLOAT32_MAX else _NONFINITE


def _detect_header(
    first: list[str], sample: list[list[str]], label_column: str | int | None, context: _Context
) -> bool:
    """Whether the first row is a header (see :func:`read_table`)."""
    stripped = [cell.strip() for cell in first]
    hint = None if label_column is None else _index_hint(label_column, len(first))
    if isinstance(label_column, str) and hint is None and label_column.strip() in stripped:
        return True

    def kind(cell: str) -> int | None:  # None: missing
        text = cell.strip()
        if text.casefold() in context.na:
            return None
        return _WORD if _to_float(text) is None else _NUMBER

    words = [j for j, cell in enumerate(first) if j != hint and kind(cell) == _WORD]
    if not words:
        return False
    for j in words:
        below = {kind(row[j]) for row in sample if len(row) > j}
        if _NUMBER in below and _WORD not in below:
            return True  # a name above a column of numbers
    if any(kind(cell) == _NUMBER for j, cell in enumerate(first) if j != hint):
        return False
    return not any(row[j].strip() == stripped[j] for j in words for row in sample if len(row) > j)


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
    if labels == "optional" and header and isinstance(label_column, str):
        key = label_column.strip()
        if key not in names and not (key.isascii() and key.isdigit()):
            return None
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


def _label_key(cell: str) -> tuple[str, float | str]:
    """A comparison key for a stripped label cell: numbers compare by value, words as text."""
    value = _to_float(cell)
    if value is None or value != value:  # not a number, or nan (which equals nothing)
        return ("text", cell)
    return ("number", value)
