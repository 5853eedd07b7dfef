"""Reading a delimited file's data rows block by block into the typed column readers.

A block holds about :data:`_BLOCK_CELLS` cells, so the Python objects alive at any time stay
bounded whatever the file's size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from slate.data.readers.arrow_records import (
    ArrowRecords,
    ArrowRows,
    add_column,
    add_label,
    add_text,
    open_records,
)
from slate.data.readers.cells import CellContext, ColumnReader, GrowingArray, LabelReader
from slate.data.readers.files import MAX_ELEMENTS
from slate.data.readers.text_records import TextRecords
from slate.errors import DataError

__all__ = ["Rows", "block_rows", "blocks", "check_widths", "rescan_text", "scan_rows"]

#: Rows of a block: lists of cells, or columns of pyarrow strings.
Rows = list[list[str]] | ArrowRows

#: Cells per block of rows read at once (bounds the Python objects alive at any time).
_BLOCK_CELLS = 100_000
_MIN_BLOCK_ROWS = 64


def scan_rows(
    records: TextRecords | ArrowRecords,
    pending: tuple[Sequence[int], Rows],
    n_cols: int,
    header: bool,
    label_idx: int | None,
    label_state: LabelReader | None,
    features: list[ColumnReader],
    context: CellContext,
    single_block: bool = False,
) -> tuple[int, GrowingArray]:
    """Read every data row, block by block, into the label and feature columns (only the
    ``pending`` rows with ``single_block``)."""
    name = records.name
    per_block = block_rows(n_cols)
    n_rows = 0
    line_numbers = GrowingArray(np.int64)
    chunks = [pending] if single_block else blocks(records, pending, per_block)
    for lines, rows in chunks:
        check_widths(name, rows, lines, n_cols, header, records.delimiter)
        n_rows += len(rows)
        if n_rows * len(features) > MAX_ELEMENTS:
            raise DataError(
                f"CSV file {name}: more than {n_rows - len(rows)} rows x {len(features)} "
                f"features exceed the limit of {MAX_ELEMENTS} matrix elements. Use a smaller "
                "file."
            )
        line_numbers.append(_as_array(lines))
        if isinstance(rows, ArrowRows):
            if label_state is not None and label_idx is not None:
                add_label(label_state, rows.columns[label_idx], lines)
            for column in features:
                add_column(column, rows.columns[column.position], lines, context)
            continue
        columns = list(zip(*rows, strict=True))
        if label_state is not None and label_idx is not None:
            label_state.add(columns[label_idx], lines)
        for column in features:
            column.add(columns[column.position], lines, context)
        del columns
    return n_rows, line_numbers


def rescan_text(
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
    with open_records(name, encoding, delimiter) as records:
        per_block = block_rows(n_cols)
        start_lines, start_rows = records.block(per_block)
        if header:
            start_lines, start_rows = start_lines[1:], start_rows[1:]
        for lines, rows in blocks(records, (start_lines, start_rows), per_block):
            check_widths(name, rows, lines, n_cols, header, delimiter)
            seen += len(rows)
            for column in columns:
                if isinstance(rows, ArrowRows):
                    add_text(column, rows.columns[column.position], lines, context)
                else:
                    column.add_text([row[column.position] for row in rows], lines, context)
    if seen != n_rows:
        raise DataError(
            f"CSV file {name} changed while it was read ({n_rows} data rows, then {seen}). "
            "Read it again once it is complete."
        )


def blocks(
    records: TextRecords | ArrowRecords, pending: tuple[Sequence[int], list[list[str]]], size: int
) -> Iterator[tuple[Sequence[int], Rows]]:
    """The rows already read (in blocks of ``size``), then the rest of the file's (as columns
    when pyarrow reads the file)."""
    lines, rows = pending
    for start in range(0, len(rows), size):
        yield lines[start : start + size], rows[start : start + size]
    while True:
        next_lines, next_rows = records.data_block(size)
        if not len(next_rows):
            return
        yield next_lines, next_rows


def block_rows(n_cols: int) -> int:
    """Rows per block: about :data:`_BLOCK_CELLS` cells."""
    return max(_MIN_BLOCK_ROWS, _BLOCK_CELLS // n_cols)


def _as_array(lines: Sequence[int]) -> np.ndarray:
    if isinstance(lines, range):
        return np.arange(lines.start, lines.stop, dtype=np.int64)
    return np.array(lines, dtype=np.int64)


def check_widths(
    name: str, rows: Rows, lines: Sequence[int], n_cols: int, header: bool, delim: str
) -> None:
    """Raise a DataError for the first row whose number of cells differs from ``n_cols``
    (pyarrow's rows have as many cells as the first row: it reads no other file)."""
    if isinstance(rows, ArrowRows):
        if len(rows.columns) == n_cols:
            return
        raise DataError(f"CSV file {name} changed while it was read. Read it again.")
    if min(map(len, rows)) == max(map(len, rows)) == n_cols:
        return
    for row, line in zip(rows, lines, strict=True):
        if len(row) != n_cols:
            raise DataError(
                f"CSV file {name}, line {line}: expected {n_cols} cells (as in the "
                f"{'header' if header else 'first row'}), got {len(row)}. Check for a missing "
                f"or extra delimiter ({delim!r}) or an unbalanced quote."
            )
