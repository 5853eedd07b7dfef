"""What a run's tables make a site say about their columns: row-ID-like columns, and text columns
whose values did not all get a one-hot column (:class:`~slate.data.encoding.TableEncoder`'s
``reduced`` and ``left_out``). Every note stays at the site that read the table."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["id_warnings", "looks_like_id", "reduction_notes", "table_notes"]

ID_LIKE_SHARE = 0.9  # a text column with distinct values in at least this share of rows ...
ID_LIKE_MIN_ROWS = 20  # ... of at least this many rows looks like an ID or free text


def looks_like_id(values: np.ndarray) -> bool:
    """All values distinct integers that increase with the line number (a row counter)."""
    if len(values) < 3 or np.isnan(values).any():
        return False
    if not np.array_equal(values, np.round(values)):
        return False
    return bool(np.all(np.diff(values) > 0))


def id_warnings(table: Any, choice: Any) -> list[str]:
    """Warnings for feature columns that look like row IDs (distinct, increasing with the line
    number, integer or text)."""
    declared = set(choice.id_columns) | set(choice.drop_columns)
    if choice.feature_columns:
        declared |= set(table.columns) - set(choice.feature_columns)
    suspects = [
        c for c, values in table.numeric.items() if c not in declared and looks_like_id(values)
    ]
    suspects += [
        c
        for c, col in table.text.items()
        if c not in declared
        and table.rows >= 3
        and len(col.categories) == table.rows
        and np.array_equal(col.codes, np.arange(table.rows))
    ]
    return [
        f"warning: column {c!r} of {table.path} looks like a row ID (every value distinct, "
        "increasing with the line number) but is used as a feature; declare it with "
        f"--id-column {c} (or --drop-columns {c})."
        for c in suspects
    ]


def reduction_notes(encoder: Any, path: str, skip: set[str] = frozenset()) -> list[str]:
    """One line per text column whose values did not all get a one-hot column: an ID-like or
    free-text column (nearly every value distinct) is a warning naming the flag that drops it."""
    notes = []
    for c, (rows, values, columns) in encoder.reduced.items():
        if c in skip:
            continue
        if columns == 0:
            notes.append(
                f"warning: column {c!r} of {path} looks like an ID or free text ({values} "
                f"distinct values in {rows} training rows, none frequent enough for a column of "
                f"its own): it is left out. Declare it with --id-column {c} to carry it into "
                f"predictions, or --drop-columns {c}."
            )
        elif values >= ID_LIKE_SHARE * rows and rows >= ID_LIKE_MIN_ROWS:
            notes.append(
                f"warning: column {c!r} of {path} looks like an ID or free text ({values} "
                f"distinct values in {rows} training rows); it is encoded as {columns} column"
                f"{'s' if columns != 1 else ''} (the rest <other>). Drop it with --drop-columns "
                f"{c} (or --id-column {c} to carry it into predictions)."
            )
        else:
            notes.append(
                f"note: column {c!r} of {path} has {values} distinct values; the most frequent "
                f"get {columns} one-hot columns and the rest share <other> (--max-categories, "
                "--min-frequency)."
            )
    return notes


def table_notes(tables: list[Any], encoder: Any, choice: Any) -> list[str]:
    """The readers' notes, ID warnings and one-hot reductions of a run's tables, each once."""
    notes = [n for t in tables for n in t.notes]
    ids = [
        w for w in id_warnings(tables[0], choice)
        if not any(f"column {c!r}" in w for c in encoder.left_out)
    ]  # fmt: skip
    warned = {c for c in tables[0].columns if any(f"column {c!r}" in w for w in ids)}
    notes += ids + reduction_notes(encoder, tables[0].path, skip=warned)
    return list(dict.fromkeys(notes))
