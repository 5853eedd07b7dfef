"""User tables (``--dataset csv``) read with the run's options, split, and checked for IDs.

The reading itself is :func:`slate.data.readers.delimited.read_table`; the transform into
features is :class:`slate.data.encoding.TableEncoder`. This module holds what both the one-file path
(:mod:`slate.data.datasets`) and the per-party path (:mod:`slate.data.sources`) share.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from slate.config import TrainConfig
from slate.data.encoding import ColumnChoice, looks_like_id
from slate.errors import ConfigError

__all__ = ["column_choice", "id_warnings", "read_user_table", "split_table", "take_rows"]


def column_choice(config: TrainConfig) -> ColumnChoice:
    """The column flags of ``config``; a column may not be named by two of them."""
    choice = ColumnChoice(
        tuple(config.id_columns), tuple(config.drop_columns), tuple(config.feature_columns)
    )
    clash = (set(choice.id_columns) | set(choice.drop_columns)) & set(choice.feature_columns)
    if clash:
        raise ConfigError(
            f"Columns {sorted(clash)} are named by --feature-columns and also by --id-column or "
            "--drop-columns; a column is either a feature or not."
        )
    if config.label_column in (*choice.id_columns, *choice.drop_columns, *choice.feature_columns):
        raise ConfigError(
            f"The label column {config.label_column!r} cannot also be an ID, dropped or a feature."
        )
    return choice


def read_user_table(config: TrainConfig, path: str, labels: str = "required") -> Any:
    """Read ``path`` with the run's CSV options (label column, delimiter, encoding, NA, kinds)."""
    from slate.data.readers.delimited import read_table

    if config.label_column is None or config.positive_label is None:
        raise ConfigError("--dataset csv needs --label-column C and --positive-label V.")
    return read_table(
        path,
        config.label_column,
        config.positive_label,
        delimiter=config.delimiter,
        encoding=config.encoding,
        na_values=tuple(config.na_values),
        categorical_columns=tuple(config.categorical_columns),
        labels=labels,
        missing="error" if config.missing == "error" else "allow",
    )


def take_rows(table: Any, rows: np.ndarray) -> Any:
    """The table restricted to ``rows`` (positions), every column and the labels with it."""
    return dataclasses.replace(
        table,
        numeric={c: v[rows] for c, v in table.numeric.items()},
        text={c: dataclasses.replace(t, codes=t.codes[rows]) for c, t in table.text.items()},
        y=None if table.y is None else table.y[rows],
        rows=len(rows),
        first_lines=table.first_lines[rows],
    )


def split_table(table: Any, fraction: float, seed: int, what: str) -> tuple[Any, Any]:
    """A seeded stratified split of the table's rows into training and test tables."""
    from slate.data.datasets import split_stratified

    positions = np.arange(table.rows)
    train_rows, test_rows, _, _ = split_stratified(positions, table.y, fraction, seed, what)
    return take_rows(table, np.sort(train_rows)), take_rows(table, np.sort(test_rows))


def id_warnings(table: Any, choice: ColumnChoice) -> list[str]:
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
