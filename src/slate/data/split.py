"""The seeded stratified holdout: one function for every split slate makes.

``slate train`` without ``--test`` holds out a test part of ``--train``; each party without its
own test file holds out part of its own file; ``slate tune`` holds out a validation part. All
three call :func:`holdout_positions`, so the same rows, seed and fraction give the same split
everywhere, and everything fitted afterwards (imputation, categories, scaling) sees only the
training part.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from slate.errors import ConfigError, DataError

__all__ = ["holdout_positions", "split_stratified", "split_table", "take_rows"]

_PART = {"--test-fraction": "test set", "--validation-fraction": "validation set"}


def holdout_positions(
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
    kept, held, _, _ = train_test_split(
        np.arange(len(y)), y, test_size=fraction, stratify=y, random_state=seed
    )
    return kept, held


def split_stratified(
    x: np.ndarray,
    y: np.ndarray,
    fraction: float,
    seed: int,
    what: str | None = None,
    flag: str = "--test-fraction",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, x_test, y_train, y_test)`` of :func:`holdout_positions`' split."""
    kept, held = holdout_positions(y, fraction, seed, what, flag)
    return x[kept], x[held], y[kept], y[held]


def split_table(
    table: Any, fraction: float, seed: int, what: str, flag: str = "--test-fraction"
) -> tuple[Any, Any]:
    """A :class:`~slate.data.readers.table.RawTable` split into a training and a held-out
    table by :func:`holdout_positions`, each keeping its rows in file order."""
    kept, held = holdout_positions(table.y, fraction, seed, what, flag)
    return take_rows(table, np.sort(kept)), take_rows(table, np.sort(held))


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
