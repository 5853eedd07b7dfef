"""Reading a delimited table one block of rows at a time, for scoring files of any size in
bounded memory (``slate predict`` and ``slate evaluate``): :func:`read_table_chunks`, and the
rows it lists instead of stopping (wrong number of cells, a missing label) when asked to go on.

The layout, the cell readers and the checks are :mod:`~slate.data.readers.delimited`'s, so a
chunk holds the same cells as :func:`~slate.data.readers.delimited.read_table` reads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence

import numpy as np

from slate.data.readers.arrow_records import ArrowRows, open_records
from slate.data.readers.blocks import Rows, block_rows, blocks, scan_rows
from slate.data.readers.cells import GrowingArray, LabelReader, make_context
from slate.data.readers.delimited import _check_arguments, _finish, _Layout, _layout, _raw_table
from slate.data.readers.table import BadCell, RawTable

__all__ = ["WHOLE_FILE_BYTES", "read_table_chunks"]

#: The largest file read with pyarrow here: pyarrow holds the whole file, and scoring reads
#: larger files one block at a time with the pure reader, to keep memory bounded.
WHOLE_FILE_BYTES = 256 << 20


def read_table_chunks(
    path: str | os.PathLike[str],
    label_column: str | int | None,
    positive_label: str | None,
    *,
    delimiter: str | None = None,
    encoding: str = "utf-8",
    na_values: Sequence[str] = (),
    categorical_columns: Sequence[str] = (),
    labels: str = "optional",
    missing: str = "allow",
    numeric_columns: Sequence[str] = (),
    keep_going: bool = False,
) -> Iterator[RawTable]:
    """:func:`read_table` one block of rows at a time (about 100 000 cells), for scoring files
    of any size in bounded memory.

    Each chunk is a :class:`RawTable` of its own rows, with its own category codes (an encoder
    matches categories by name) and its own checks; ``first_lines`` are the file's lines. A
    header-only file yields one chunk of 0 rows. Column kinds are decided per chunk: pass the
    text columns a model expects in ``categorical_columns``, and its numeric ones in
    ``numeric_columns``: these are numeric in every chunk, and a cell that is not a number
    (nor in the format the column's other cells show, :mod:`~slate.data.readers.formats`) or
    lies beyond the float32 range is NaN and listed in :attr:`RawTable.bad_cells`, for the
    caller to refuse or skip its row. With ``keep_going`` a row with the wrong number of cells
    is left out of its chunk and listed there too, instead of stopping the reading, and (labels
    required) so is a row whose label cell is missing (its row stays, labelled 0).
    """
    name = os.fspath(path)
    _check_arguments(name, label_column, labels, missing, delimiter, na_values, categorical_columns)
    context = make_context(name, na_values, np.float64)
    with open_records(name, encoding, delimiter, max_bytes=WHOLE_FILE_BYTES) as records:
        layout, pending = _layout(
            records, label_column, positive_label, None, categorical_columns, labels, False,
            context, np.float64, True,
        )  # fmt: skip
        layout.numeric = {str(c) for c in numeric_columns} - layout.forced
        yielded = False
        malformed: list[BadCell] = []
        for lines, rows in blocks(records, pending, block_rows(layout.n_cols)):
            if keep_going:
                lines, rows = _well_formed(lines, rows, layout.n_cols, malformed)
                if not rows:
                    continue
            label_state, features = layout.readers()
            n_rows, line_numbers = scan_rows(
                records, (lines, rows), layout.n_cols, layout.header, layout.label_idx,
                label_state, features, context, single_block=True,
            )  # fmt: skip
            if keep_going and labels != "optional":
                malformed += _unlabelled(layout, label_state, line_numbers)
            result = _finish(
                layout, label_state, features, n_rows, line_numbers, labels, missing, False
            )
            result.delimiter = records.delimiter
            layout.na_seen = {c.name: c.na_seen for c in features}
            yielded = True
            yield _with_malformed(_raw_table(name, result), malformed)
            malformed = []
        if not yielded or malformed:
            label_state, features = layout.readers()
            empty = _finish(layout, label_state, features, 0, GrowingArray(np.int64), labels,
                            missing, False)  # fmt: skip
            empty.delimiter = records.delimiter
            yield _with_malformed(_raw_table(name, empty), malformed)


def _unlabelled(
    layout: _Layout, label_state: LabelReader | None, line_numbers: GrowingArray
) -> list[BadCell]:
    """The rows of a block whose label cell is missing, listed (and no longer a problem of the
    label column: their label reads as negative, for the caller to drop)."""
    if label_state is None or not label_state.missing:
        return []
    codes = label_state.codes.view()
    lines = line_numbers.view()[codes < 0]
    label_state.missing, label_state.first_missing = 0, None
    return [BadCell(int(line), layout.label_name, "", "missing label") for line in lines]


def _well_formed(
    lines: Sequence[int], rows: Rows, n_cols: int, malformed: list[BadCell]
) -> tuple[Sequence[int], Rows]:
    """The rows with ``n_cols`` cells; the others are added to ``malformed``."""
    if isinstance(rows, ArrowRows):
        return lines, rows  # pyarrow reads only files whose rows all have n_cols cells
    if min(map(len, rows), default=n_cols) == max(map(len, rows), default=n_cols) == n_cols:
        return lines, rows
    kept_lines, kept = [], []
    for line, row in zip(lines, rows, strict=True):
        if len(row) == n_cols:
            kept_lines.append(line)
            kept.append(row)
        else:
            malformed.append(BadCell(int(line), None, str(len(row)), f"{n_cols} cells expected"))
    return kept_lines, kept


def _with_malformed(table: RawTable, malformed: list[BadCell]) -> RawTable:
    if not malformed:
        return table
    cells = sorted((*table.bad_cells, *malformed), key=lambda b: b.line)
    return dataclasses.replace(table, bad_cells=tuple(cells))
