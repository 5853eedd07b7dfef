"""The optional fast reader of delimited files: pyarrow parses the cells, slate types them.

:func:`open_records` opens a file with :class:`ArrowRecords` when pyarrow is installed (``pip
install -e ".[fast]"`` in the repository) and the file is one it reads exactly as
:class:`~slate.data.readers.text_records.TextRecords` does; otherwise, and whenever the
environment variable ``SLATE_CSV_READER`` is ``python``, with ``TextRecords``.

Both give the same cells on the same lines, so every rule that turns cells into a table (types,
missing cells, categories, labels, formats, messages) is the same code. pyarrow reads every cell
as a string; only the bulk steps run in pyarrow: splitting the file into cells, converting a
block of plain decimal numbers (``[+-]digits[.digits][e[+-]digits]``, which Python's ``float``
reads to the same value), and finding a text block's distinct cells. Every other cell is decided
by the rules of :mod:`~slate.data.readers.cells`, one at a time.

pyarrow does not say on which line a row starts, nor reject every quoting that Python's ``csv``
rejects. So a file is read with pyarrow only when each of its lines is one record (no blank
line, no line break inside quotes, no lone carriage return), every line holding a quote parses
to the same cells in Python's ``csv``, and it is UTF-8 text (plain or gzip) without NUL bytes
or cells beyond ``csv``'s size limit, separated by one character (not ``whitespace``), with at
least two columns. A file that fails any of these, or that pyarrow cannot parse, is read by
``TextRecords``, which also writes every error message about a malformed file.
"""

from __future__ import annotations

import csv
import gzip
import importlib
import os
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from slate.data.readers.cells import (
    CellContext,
    ColumnReader,
    LabelReader,
    coded_distinct,
)
from slate.data.readers.files import GZIP_MAGIC, open_data_file
from slate.data.readers.text_records import WHITESPACE, TextRecords
from slate.errors import DataError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "READER_VARIABLE",
    "ArrowRecords",
    "ArrowRows",
    "add_column",
    "add_label",
    "add_text",
    "arrow_available",
    "open_records",
]

#: The environment variable that picks the reader: ``auto`` (the default) or ``python``.
READER_VARIABLE = "SLATE_CSV_READER"
_CHOICES = ("auto", "python")
#: A plain decimal number, which pyarrow's cast and Python's ``float`` read to the same double.
_PLAIN_NUMBER = r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_QUOTE, _NEWLINE = 0x22, 0x0A
_UTF8_BOM = b"\xef\xbb\xbf"


def arrow_available() -> bool:
    """Whether pyarrow (with its CSV module) can be imported."""
    try:
        for module in ("pyarrow", "pyarrow.compute", "pyarrow.csv"):
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def _choice() -> str:
    value = os.environ.get(READER_VARIABLE, "").strip().lower() or "auto"
    if value not in _CHOICES:
        raise DataError(
            f"{READER_VARIABLE}={value!r} is not a CSV reader: use 'auto' (pyarrow when it "
            "is installed) or 'python'."
        )
    return value


def open_records(
    name: str, encoding: str, delimiter: str | None, max_bytes: int | None = None
) -> TextRecords | ArrowRecords:
    """The records of a delimited file: :class:`ArrowRecords` when pyarrow is installed, not
    refused by ``SLATE_CSV_READER=python``, and able to read the file exactly as the pure
    reader does (a file larger than ``max_bytes`` is not tried, as pyarrow holds it whole);
    otherwise :class:`~slate.data.readers.text_records.TextRecords`."""
    if _choice() == "auto" and arrow_available():
        records = ArrowRecords.open(name, encoding, delimiter, max_bytes)
        if records is not None:
            return records
    return TextRecords(name, encoding, delimiter)


class ArrowRows:
    """A block of data rows held as columns of pyarrow strings (one per file column)."""

    def __init__(self, columns: list[pa.Array]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns[0]) if self.columns else 0


class ArrowRecords:
    """A delimited file parsed by pyarrow, served as :class:`TextRecords` serves it: the same
    records with the same first lines. :meth:`block` gives lists of cells, :meth:`data_block`
    columns (:class:`ArrowRows`)."""

    def __init__(
        self, name: str, encoding: str, delimiter: str, table: pa.Table, gzipped: bool = False
    ) -> None:
        self.name = name
        self.encoding = encoding
        self.delimiter = delimiter
        self.gzipped = gzipped
        self._table = table
        self._next = 0  # the next row of the table to serve; row k is on line k + 1

    @classmethod
    def open(
        cls, name: str, encoding: str, delimiter: str | None, max_bytes: int | None = None
    ) -> ArrowRecords | None:
        """The file parsed by pyarrow, or None when pyarrow would not read it exactly as the
        pure reader does (the module's docstring says when). The pure reader opens it first:
        it detects the delimiter and raises the errors of a file that cannot be opened."""
        try:
            with TextRecords(name, encoding, delimiter) as pure:
                delimiter = pure.delimiter
                _, first = pure.block(1)
                usable = pure.codec == "utf-8-sig"
        except DataError:
            return None  # the pure reader meets it again, and says so
        if delimiter == WHITESPACE or len(delimiter.encode("utf-8")) != 1:
            return None  # pyarrow splits on one byte
        if not usable or not first or len(first[0]) < 2:
            return None
        with open_data_file(name) as raw:
            if max_bytes is not None and os.fstat(raw.fileno()).st_size > max_bytes:
                return None
            data = raw.read()
        gzipped = data[:2] == GZIP_MAGIC
        if gzipped:
            try:
                data = gzip.decompress(data)  # the bytes the pure reader decodes
            except (OSError, EOFError, zlib.error):
                return None
            if max_bytes is not None and len(data) > max_bytes:
                return None
        table = _parse(data, delimiter, len(first[0]))
        if table is None:
            return None
        return cls(name, encoding, delimiter, table, gzipped)

    def __enter__(self) -> ArrowRecords:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._table = self._table.slice(0, 0)

    def _take(self, size: int) -> tuple[range, pa.Table]:
        start = self._next
        part = self._table.slice(start, size)
        self._next = start + part.num_rows
        return range(start + 1, start + 1 + part.num_rows), part

    def block(self, size: int) -> tuple[Sequence[int], list[list[str]]]:
        """The next ``size`` records as lists of cells, with their lines (empty at the end)."""
        lines, part = self._take(size)
        if not part.num_rows:
            return [], []
        columns = [column.to_pylist() for column in part.columns]
        return lines, [list(row) for row in zip(*columns, strict=True)]

    def data_block(self, size: int) -> tuple[Sequence[int], ArrowRows | list[list[str]]]:
        """The next ``size`` records as columns, with their lines (empty at the end)."""
        lines, part = self._take(size)
        if not part.num_rows:
            return [], []
        return lines, ArrowRows([column.combine_chunks() for column in part.columns])


def _parse(data: bytes, delimiter: str, n_cols: int) -> pa.Table | None:
    """Every line of ``data`` as one row of ``n_cols`` string cells, or None when a line is
    not one record, or pyarrow and Python's ``csv`` would not give the same cells."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pa_csv

    if b"\x00" in data or data.count(b"\r") != data.count(b"\r\n"):
        return None  # csv may refuse NUL bytes; a lone CR ends a line in csv
    try:
        data.decode("utf-8")  # pyarrow's check may differ from Python's on odd bytes
    except UnicodeDecodeError:
        return None
    names = [f"f{j}" for j in range(n_cols)]
    try:
        table = pa_csv.read_csv(
            pa.py_buffer(data),
            read_options=pa_csv.ReadOptions(column_names=names),
            parse_options=pa_csv.ParseOptions(
                delimiter=delimiter, quote_char='"', double_quote=True, escape_char=False,
                newlines_in_values=False, ignore_empty_lines=True,
            ),
            convert_options=pa_csv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=False,
                quoted_strings_can_be_null=False, check_utf8=True,
            ),
        )  # fmt: skip
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        return None
    n_lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    if table.num_columns != n_cols or table.num_rows != n_lines:
        return None  # a blank line, or a record over several lines
    limit = csv.field_size_limit()
    for column in table.columns:
        if len(column) and pc.max(pc.binary_length(column)).as_py() > limit:
            return None  # csv refuses a cell this long (counted in characters, not bytes)
    if b'"' in data and not _well_quoted(data, delimiter):
        return None
    return table


def _well_quoted(data: bytes, delimiter: str) -> bool:
    """Whether every line holding a quote is a record that Python's ``csv`` (strict) accepts:
    each cell unquoted (no delimiter; a quote only after its first character), or quoted whole
    (inner quotes doubled). Such a line has one reading, which pyarrow's and csv's both give;
    pyarrow also accepts lines that csv refuses (``"a"b``), which this leaves to csv. pyarrow
    matches the lines against the pattern (RE2, linear in the text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    buffer = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buffer == _NEWLINE)
    rows = np.searchsorted(ends, np.flatnonzero(buffer == _QUOTE))  # sorted, with repeats
    rows = rows[np.concatenate(([True], rows[1:] != rows[:-1]))]
    first = len(_UTF8_BOM) if data.startswith(_UTF8_BOM) else 0  # csv never sees the mark
    offsets = np.concatenate(([first], ends + 1, [] if data.endswith(b"\n") else [len(data)]))
    lines = pa.LargeStringArray.from_buffers(
        len(offsets) - 1, pa.py_buffer(offsets.astype(np.int64)), pa.py_buffer(data)
    )
    quoted = pc.take(lines, pa.array(rows, type=pa.int64()))
    return bool(pc.all(pc.match_substring_regex(quoted, _record_pattern(delimiter))).as_py())


def _record_pattern(delimiter: str) -> str:
    """The RE2 pattern of a line that is one well-quoted record (see :func:`_well_quoted`)."""
    d = f"\\x{{{ord(delimiter):02x}}}"
    cell = f'(?:"(?:[^"]|"")*"|[^"{d}\\r\\n][^{d}\\r\\n]*|)'
    return f"^{cell}(?:{d}{cell})*\\r?\\n?$"


# ----------------------------------------------------------------------------- typing columns


class _Cells(Sequence[str]):
    """The cells of a pyarrow string array, read one at a time (only where needed)."""

    def __init__(self, array: pa.Array) -> None:
        self._array = array

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, i):  # type: ignore[override]
        return self._array[i].as_py()


def _distinct(array: pa.Array) -> tuple[list[str], np.ndarray, np.ndarray]:
    """A block's distinct cells, the row of each one's first occurrence, and each row's index
    into them."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(array)
    inverse = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    distinct = encoded.dictionary.to_pylist()
    first = np.full(len(distinct), len(inverse), dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(len(inverse), dtype=np.int64))
    return distinct, first, inverse


def add_text(
    column: ColumnReader, array: pa.Array, lines: Sequence[int], context: CellContext
) -> None:
    """:meth:`ColumnReader.add_text` for a block of pyarrow strings."""
    distinct, first, inverse = _distinct(array)
    codes = coded_distinct(
        column, distinct, first, inverse, lines,
        lambda cell, line: column._new_cell(cell, line, context),
    )  # fmt: skip
    column.store.append(codes)


def add_label(label: LabelReader, array: pa.Array, lines: Sequence[int]) -> None:
    """:meth:`LabelReader.add` for a block of pyarrow strings."""
    distinct, first, inverse = _distinct(array)
    label.codes.append(coded_distinct(label, distinct, first, inverse, lines, label._new_cell))


def add_column(
    column: ColumnReader, array: pa.Array, lines: Sequence[int], context: CellContext
) -> None:
    """:meth:`ColumnReader.add` for a block of pyarrow strings: plain decimal numbers are
    converted by pyarrow, every other cell by the column's own rules."""
    if column.kind == "numeric":
        values = _plain_numbers(array)
        checked = column.checked_numbers(values, _Cells(array), lines, context)
        if checked is not None:
            column.store.append(checked)
            return
        column.become_text()
    add_text(column, array, lines, context)


def _plain_numbers(array: pa.Array) -> np.ndarray | None:
    """The block's plain decimal numbers as float64, NaN for its other cells (for
    :meth:`ColumnReader.checked_numbers` to decide); None if pyarrow cannot convert them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    plain = pc.match_substring_regex(array, _PLAIN_NUMBER)
    if not pc.any(plain).as_py():
        return None
    try:
        numbers = pc.cast(pc.if_else(plain, array, pa.scalar(None, pa.string())), pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return numbers.to_numpy(zero_copy_only=False).astype(np.float64, copy=True)
