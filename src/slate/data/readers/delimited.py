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
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from slate.data.readers.arrow_records import ArrowRecords, open_records
from slate.data.readers.blocks import block_rows, rescan_text, scan_rows
from slate.data.readers.cells import (
    _FLOAT32_MAX,
    NA_TOKENS,
    CellContext,
    ColumnReader,
    GrowingArray,
    LabelReader,
    Problem,
    make_context,
    report_problems,
    to_float,
)
from slate.data.readers.formats import FORMATS, parse_disguised_numbers
from slate.data.readers.table import BadCell, CsvTable, RawTable, TextColumn
from slate.data.readers.text_records import (
    WHITESPACE,
    TextRecords,
    check_names,
    describe_named_columns,
    detect_header,
    find_label,
)
from slate.errors import DataError

__all__ = [
    "NA_TOKENS",
    "BadCell",
    "CsvTable",
    "RawTable",
    "TextColumn",
    "read_csv",
    "read_csv_table",
    "read_table",
    "whitespace_hint",
]


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
    return _raw_table(name, result)


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


def _raw_table(name: str, result: _Result) -> RawTable:
    """The :class:`RawTable` of a read: numbers in disguise parsed, notes collected; the
    columns expected numeric (:func:`~slate.data.readers.chunks.read_table_chunks`) made
    numeric, their bad cells listed."""
    numeric: dict[str, np.ndarray] = {}
    text: dict[str, TextColumn] = {}
    notes: list[str] = list(result.notes)
    bad: list[BadCell] = []
    for column in result.features:
        bad += [BadCell(line, column.name, cell, "out of range") for line, cell in
                column.out_of_range]  # fmt: skip
        if column.kind == "numeric":
            numeric[column.name] = column.store.take()
            continue
        codes, categories = column.store.take(), tuple(column.categories)
        parsed = None if column.forced_text else parse_disguised_numbers(categories, codes)
        if parsed is not None:
            numeric[column.name] = parsed[0]
            notes.append(f"note: column {column.name!r} of {name} holds {parsed[3]}")
        elif column.expect_numeric:
            numeric[column.name], wrong = _expected_numbers(categories, codes)
            rows = np.flatnonzero(np.isin(codes, wrong))
            bad += [BadCell(int(result.first_lines[i]), column.name, categories[codes[i]],
                            "not a number") for i in rows]  # fmt: skip
        else:
            text[column.name] = TextColumn(codes, categories)
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
        bad_cells=tuple(sorted(bad, key=lambda b: b.line)),
    )


def _expected_numbers(categories: tuple[str, ...], codes: np.ndarray) -> tuple[np.ndarray, list]:
    """A column read as numbers although some of its cells are not: ``(values, bad codes)``.

    Each distinct cell is read as a number (a finite float32), or in the one format of
    :data:`~slate.data.readers.formats.FORMATS` that reads the most of them (ties: plain
    numbers); a cell read by neither is bad, and its rows get NaN."""
    values = np.full(len(categories) + 1, np.nan)  # the last entry: missing cells (code -1)
    plain = [to_float(c) for c in categories]
    best = [v is not None and abs(v) <= _FLOAT32_MAX for v in plain]
    for parse, _ in FORMATS.values():
        parsed = [parse(c) for c in categories]
        if not any(p is not None and p[1] for p in parsed):
            continue  # no cell shows this format
        if sum(p is not None for p in parsed) > sum(best):
            plain = [None if p is None else p[0] for p in parsed]
            best = [p is not None and abs(p[0]) <= _FLOAT32_MAX for p in parsed]
    wrong = []
    for code, (value, good) in enumerate(zip(plain, best, strict=True)):
        if good:
            values[code] = value
        else:
            wrong.append(code)
    return values[codes], wrong


def whitespace_hint(path: str, delimiter: str | None, columns: Sequence[str]) -> str:
    """A sentence naming ``--delimiter whitespace`` when a file read with another delimiter
    came out as one column whose name holds runs of spaces or tabs (a UCI-style file), else
    ''."""
    if delimiter == WHITESPACE or len(columns) != 1 or len(str(columns[0]).split()) < 2:
        return ""
    return (
        f" {path} looks separated by spaces or tabs (its first row {str(columns[0])[:60]!r} is "
        "read as a single column): read it with --delimiter whitespace."
    )


def _check_arguments(
    name: str, label_column, labels: str, missing: str, delimiter, na_values, categorical_columns
) -> None:
    """Refuse arguments of the wrong form before the file is opened."""
    if labels not in _LABEL_MODES:
        raise DataError(
            f"Cannot read {name}: labels must be one of {_LABEL_MODES}, got {labels!r}."
        )
    if missing not in _MISSING_MODES:
        raise DataError(
            f"Cannot read {name}: missing must be one of {_MISSING_MODES}, got {missing!r}."
        )
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


@dataclass
class _Layout:
    """What the first rows of a file settle: its columns, header, label and column kinds."""

    name: str
    n_cols: int
    header: bool
    names: list[str]
    label_idx: int | None
    positive: str
    forced: set[str]
    context: CellContext
    dtype: type
    numeric: set[str] = field(default_factory=set)  # columns read as numbers whatever they hold
    # Each column's spellings of a missing cell met so far, carried from one piece to the next.
    na_seen: dict[str, list[str]] = field(default_factory=dict)

    @property
    def label_name(self) -> str | None:
        return None if self.label_idx is None else self.names[self.label_idx]

    def readers(self) -> tuple[LabelReader | None, list[ColumnReader]]:
        """Fresh readers for the label and feature columns."""
        label = None if self.label_idx is None else LabelReader(self.label_name or "", self.context)
        features = [
            ColumnReader(n, j, n in self.forced, self.dtype)
            for j, n in enumerate(self.names)
            if j != self.label_idx
        ]
        for column in features:
            column.na_seen = list(self.na_seen.get(column.name, ()))
            column.expect_numeric = column.name in self.numeric
        return label, features


def _layout(
    records: TextRecords | ArrowRecords,
    label_column: str | int | None,
    positive_label: str | None,
    header: bool | None,
    categorical_columns: Sequence[str],
    labels: str,
    strict: bool,
    context: CellContext,
    dtype: type,
    empty_ok: bool,
) -> tuple[_Layout, tuple[Sequence[int], list[list[str]]]]:
    """The file's layout from its first rows, and the data rows read so far."""
    name = records.name
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
            lines, rows = records.block(block_rows(n_cols))
    else:
        names = [f"column {j}" for j in range(n_cols)]
    try:
        label_idx = find_label(name, label_column, names, header, n_cols, labels)
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
        if not strict:
            check_names(name, [n for j, n in enumerate(names) if j != label_idx])
        forced = {str(c).strip() for c in categorical_columns}
        unknown = sorted(forced - set(names))
        if unknown:
            raise DataError(
                f"CSV file {name}: categorical column(s) {', '.join(map(repr, unknown))} not "
                f"found; {describe_named_columns(names, header, n_cols)}."
            )
        if positive_label is None and label_idx is not None:
            raise DataError(
                f"Cannot read {name}: the file has a label column ({label_name!r}) but no "
                "positive label was given."
            )
    except DataError as err:  # a UCI-style file read with another delimiter: name the flag
        hint = whitespace_hint(name, records.delimiter, first) if n_cols == 1 else ""
        if not hint:
            raise
        raise DataError(f"{err}{hint}") from None
    positive = "" if positive_label is None else str(positive_label).strip()
    layout = _Layout(name, n_cols, bool(header), names, label_idx, positive, forced, context, dtype)
    return layout, (lines, rows)


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
    _check_arguments(name, label_column, labels, missing, delimiter, na_values, categorical_columns)
    context = make_context(name, na_values, dtype)
    with open_records(name, encoding, delimiter) as records:
        layout, pending = _layout(
            records, label_column, positive_label, header, categorical_columns, labels, strict,
            context, dtype, empty_ok,
        )  # fmt: skip
        label_state, features = layout.readers()
        n_rows, line_numbers = scan_rows(
            records, pending, layout.n_cols, layout.header, layout.label_idx, label_state,
            features, context,
        )  # fmt: skip
        del pending
        delimiter = records.delimiter
    result = _finish(layout, label_state, features, n_rows, line_numbers, labels, missing, strict)
    rescan = [c for c in features if c.rescan]
    if rescan:
        rescan_text(
            name, encoding, delimiter, layout.header, layout.n_cols, rescan, context, n_rows
        )
    result.delimiter = delimiter
    return result


def _finish(
    layout: _Layout,
    label_state: LabelReader | None,
    features: list[ColumnReader],
    n_rows: int,
    line_numbers: GrowingArray,
    labels: str,
    missing: str,
    strict: bool,
) -> _Result:
    """The rows read, checked: every column's and the label's problems in one DataError."""
    name = layout.name
    label_name = layout.label_name
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
        problems += label_state.problems(layout.positive, one_class_ok, first_lines)
    for column in features:
        column.finish_counts()
        problems += column.problems(strict, missing == "error")
    if problems:
        raise DataError(report_problems(name, problems))
    if label_state is not None:
        y, values = label_state.result(layout.positive), tuple(label_state.values)
    return _Result(
        features, y, label_name, values, tuple(layout.names), layout.header, "", n_rows,
        first_lines, notes,
    )  # fmt: skip
