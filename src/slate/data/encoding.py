r"""From a raw table to the model's features: column selection, imputation, one-hot, scaling.

The delimited-text reader (:mod:`slate.data.readers.delimited`) gives typed columns (numbers with
NaN for missing cells, text as category codes). A :class:`TableEncoder` turns them into a float32
matrix, always the same way for training, test and prediction files:

1. **Selection.** ID columns (``--id-column``) and ``--drop-columns`` are never features;
   ``--feature-columns`` keeps only the columns named. Columns are found by header name, so a
   file with the same columns in another order gives the same matrix.
2. **Numeric columns.** A missing cell takes the training mean of its column. A column with at
   least ``INDICATOR_RATE`` (1%) missing cells in training also gets an indicator column,
   ``<name>_missing``, 1 where the cell was missing.
3. **Text columns** are one-hot encoded: one 0/1 column ``<name>=<category>`` per category seen
   in training, in sorted order, plus ``<name>=<missing>`` when a training cell was missing. A
   category that training never saw encodes as all zeros and is counted.
4. **Scaling** (``--standardize``, the default for CSV): numeric columns are z-scored with the
   training mean and standard deviation; one-hot and indicator columns stay 0/1. Statistics and
   z-scores are computed in float64 from the cells as read; the matrix is cast to float32 last.

With per-party files every statistic is federated: counts and sums are summed over the parties
and the category *names* are united; no row leaves a party.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from slate.data.preprocess import Standardizer
from slate.errors import ConfigError, DataError

__all__ = [
    "INDICATOR_RATE",
    "ColumnChoice",
    "TableEncoder",
    "fit_features",
    "id_warnings",
    "looks_like_id",
]

INDICATOR_RATE = 0.01
MISSING = "<missing>"
FORMAT = 1

Total = Callable[[Tensor], Tensor]
Gather = Callable[[list[Any]], list[Any]]


def _local_total(value: Tensor) -> Tensor:
    return value


def _local_gather(items: list[Any]) -> list[Any]:
    return list(items)


@dataclass(frozen=True)
class ColumnChoice:
    """Which columns are IDs, dropped, or the only features (the user's flags)."""

    id_columns: tuple[str, ...] = ()
    drop_columns: tuple[str, ...] = ()
    feature_columns: tuple[str, ...] = ()

    def features(self, columns: Sequence[str], where: str) -> list[str]:
        """The feature columns of a table with these ``columns``, in file order."""
        named = (*self.id_columns, *self.drop_columns, *self.feature_columns)
        unknown = [c for c in dict.fromkeys(named) if c not in columns]
        if unknown:
            raise DataError(
                f"{where} has no column {', '.join(repr(c) for c in unknown)} (named by "
                f"--id-column, --drop-columns or --feature-columns); its columns are "
                f"{', '.join(repr(c) for c in columns)}."
            )
        skipped = set(self.id_columns) | set(self.drop_columns)
        chosen = [c for c in columns if c not in skipped]
        if self.feature_columns:
            chosen = [c for c in chosen if c in self.feature_columns]
        if not chosen:
            raise ConfigError(f"{where}: no feature column is left after the column flags.")
        return chosen


def looks_like_id(values: np.ndarray) -> bool:
    """All values distinct integers that increase with the line number (a row counter)."""
    if len(values) < 3 or np.isnan(values).any():
        return False
    if not np.array_equal(values, np.round(values)):
        return False
    return bool(np.all(np.diff(values) > 0))


def fit_features(
    train: Sequence[Any],
    *,
    choice: ColumnChoice | None = None,
    standardize: bool,
    centre: bool = True,
    total: Total = _local_total,
    gather: Gather = _local_gather,
) -> TableEncoder | Standardizer | None:
    """The one fit of a run's feature transform, on the training rows of this process's parties.

    ``train`` holds raw tables (``choice`` given: a :class:`TableEncoder`, scaled when
    ``standardize``) or arrays (a :class:`~slate.data.preprocess.Standardizer` when
    ``standardize``, else ``None``; ``centre=False`` only divides, for sparse LIBSVM rows).
    ``total`` and ``gather`` federate the statistics over processes (identity in one process).
    """
    if choice is not None:
        return TableEncoder.fit(train, choice, standardize, total, gather)
    if not standardize:
        return None
    return Standardizer.fit([x.reshape(len(x), -1) for x in train], total, centre=centre)


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


@dataclass
class TableEncoder:
    """The fitted column transform (see the module docstring); saved with the model."""

    numeric: list[str]
    text: list[str]
    means: dict[str, float]
    indicators: list[str]
    categories: dict[str, list[str]]
    choice: ColumnChoice
    scaler: Standardizer | None = None
    imputed: dict[str, int] = field(default_factory=dict)  # training cells filled per column
    unseen: dict[str, int] = field(default_factory=dict)  # unseen categories met since fitting

    # ------------------------------------------------------------------ fitting

    @classmethod
    def fit(
        cls,
        tables: Sequence[Any],
        choice: ColumnChoice,
        standardize: bool,
        total: Total = _local_total,
        gather: Gather = _local_gather,
    ) -> TableEncoder:
        """Fit on the training tables of this process's parties; ``total`` sums a tensor over
        all processes and ``gather`` concatenates every process's list (both identity in one
        process). The column kinds must agree across tables (checked by schema agreement)."""
        first = tables[0]
        features = choice.features(first.columns, first.path)
        numeric = [c for c in features if c in first.numeric]
        text = [c for c in features if c in first.text]
        means, missing_rate, imputed = _numeric_statistics(tables, numeric, total)
        indicators = [c for c in numeric if missing_rate[c] >= INDICATOR_RATE]
        categories = _united_categories(tables, text, gather)
        encoder = cls(numeric, text, means, indicators, categories, choice, imputed=imputed)
        if standardize:
            encoded = [encoder._encode64(t, count_unseen=False) for t in tables]
            scaled = np.zeros(encoder.width, dtype=bool)
            scaled[: len(numeric)] = True
            encoder.scaler = _masked_scaler(encoded, scaled, total)
        return encoder

    # ------------------------------------------------------------------ applying

    @property
    def names(self) -> list[str]:
        """The model's input columns, in order."""
        return (
            list(self.numeric)
            + [f"{c}_missing" for c in self.indicators]
            + [f"{c}={v}" for c in self.text for v in self.categories[c]]
        )

    @property
    def width(self) -> int:
        return len(self.names)

    def encode(self, table: Any, count_unseen: bool = True) -> np.ndarray:
        """The unscaled float32 feature matrix of ``table`` (matched by column name)."""
        return self._encode64(table, count_unseen).astype(np.float32)

    def transform(self, table: Any) -> np.ndarray:
        """The float32 model input of ``table``: the encoding, then the scaling fitted on the
        training data (if any).

        Both are computed in float64 and cast once, at the end: a column of large magnitude
        and small spread (a Unix timestamp, 1.7e9 give or take an hour) would otherwise be
        rounded to float32's spacing of 128 before it is centred, leaving few distinct values.
        """
        x = self._encode64(table)
        return self.scaler.apply(x) if self.scaler is not None else x.astype(np.float32)

    def _encode64(self, table: Any, count_unseen: bool = True) -> np.ndarray:
        """The unscaled feature matrix of ``table`` in float64 (what scaling is fitted on)."""
        self._check_columns(table)
        blocks = [self._numeric_block(table), self._indicator_block(table)]
        blocks += [self._one_hot(table, c, count_unseen) for c in self.text]
        return np.concatenate([b for b in blocks if b.shape[1]], axis=1).astype(np.float64)

    def _check_columns(self, table: Any) -> None:
        needed = [*self.numeric, *self.text]
        missing = [c for c in needed if c not in table.columns]
        if missing:
            raise DataError(
                f"{table.path} lacks the columns {missing} that the model was trained on "
                f"(columns are matched by header name; the training columns were {needed})."
            )
        wrong = [c for c in self.numeric if c not in table.numeric]
        wrong += [c for c in self.text if c not in table.text]
        if wrong:
            kinds = ", ".join(
                f"{c!r} is {'text' if c in table.text else 'numeric'} here but was "
                f"{'numeric' if c in self.numeric else 'text'} in training"
                for c in wrong
            )
            raise DataError(f"{table.path}: {kinds}. Use --categorical-columns to fix a kind.")

    def _numeric_block(self, table: Any) -> np.ndarray:
        if not self.numeric:
            return np.zeros((table.rows, 0))
        out = np.empty((table.rows, len(self.numeric)), dtype=np.float64)
        for j, c in enumerate(self.numeric):
            values = table.numeric[c]
            out[:, j] = np.where(np.isnan(values), self.means[c], values)
        return out

    def _indicator_block(self, table: Any) -> np.ndarray:
        out = np.zeros((table.rows, len(self.indicators)))
        for j, c in enumerate(self.indicators):
            out[:, j] = np.isnan(table.numeric[c])
        return out

    def _one_hot(self, table: Any, column: str, count_unseen: bool) -> np.ndarray:
        known = self.categories[column]
        position = {v: k for k, v in enumerate(known)}
        col = table.text[column]
        lookup = np.array(
            [position.get(v, -1) for v in col.categories] + [position.get(MISSING, -1)],
            dtype=np.int64,
        )
        index = lookup[col.codes]  # code -1 (missing) takes the last entry
        out = np.zeros((table.rows, len(known)))
        hit = index >= 0
        out[np.flatnonzero(hit), index[hit]] = 1.0
        if count_unseen:
            unseen = int((~hit & (col.codes >= 0)).sum())
            if unseen:
                self.unseen[column] = self.unseen.get(column, 0) + unseen
        return out

    # ------------------------------------------------------------------ saving

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "table",
            "format": FORMAT,
            "numeric": self.numeric,
            "text": self.text,
            "means": self.means,
            "indicators": self.indicators,
            "categories": self.categories,
            "id_columns": list(self.choice.id_columns),
            "drop_columns": list(self.choice.drop_columns),
            "feature_columns": list(self.choice.feature_columns),
            "scaler": self.scaler.to_dict() if self.scaler is not None else None,
            "feature_names": self.names,
            "imputed_cells": self.imputed,
        }

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TableEncoder:
        if saved.get("kind") != "table" or saved.get("format") != FORMAT:
            raise DataError(f"Unknown table encoding {saved.get('kind')!r}/{saved.get('format')}.")
        choice = ColumnChoice(
            tuple(saved["id_columns"]),
            tuple(saved["drop_columns"]),
            tuple(saved["feature_columns"]),
        )
        scaler = Standardizer.from_dict(saved["scaler"]) if saved["scaler"] else None
        return cls(
            list(saved["numeric"]),
            list(saved["text"]),
            {k: float(v) for k, v in saved["means"].items()},
            list(saved["indicators"]),
            {k: list(v) for k, v in saved["categories"].items()},
            choice,
            scaler,
            dict(saved.get("imputed_cells", {})),
        )


def _numeric_statistics(tables, numeric: list[str], total: Total):
    """Global mean over non-missing cells, missing rate, and this process's imputed counts."""
    sums = torch.zeros(3, len(numeric), dtype=torch.float64)  # rows, non-missing, sum
    imputed = {}
    for table in tables:
        for j, c in enumerate(numeric):
            values = table.numeric[c]
            present = ~np.isnan(values)
            sums[0, j] += len(values)
            sums[1, j] += present.sum()
            sums[2, j] += values[present].sum()
            imputed[c] = imputed.get(c, 0) + int((~present).sum())
    sums = total(sums)
    means, rate = {}, {}
    for j, c in enumerate(numeric):
        rows, present, added = (float(v) for v in sums[:, j])
        if present == 0:
            raise DataError(f"Column {c!r} holds no value at all in the training data.")
        means[c] = added / present
        rate[c] = 1.0 - present / rows
    return means, rate, {c: n for c, n in imputed.items() if n}


def _united_categories(tables, text: list[str], gather: Gather) -> dict[str, list[str]]:
    """Every column's categories over all parties (names only), sorted; ``<missing>`` last."""
    local = {
        c: sorted(
            {v for t in tables for v in t.text[c].categories}
            | ({MISSING} if any((t.text[c].codes < 0).any() for t in tables) else set())
        )
        for c in text
    }
    everyone = gather([local])
    united = {}
    for c in text:
        names = set().union(*(set(d[c]) for d in everyone))
        united[c] = sorted(names - {MISSING}) + ([MISSING] if MISSING in names else [])
    return united


def _masked_scaler(encoded: list[np.ndarray], scaled: np.ndarray, total: Total) -> Standardizer:
    """z-scoring for the ``scaled`` columns, identity for the others (mean 0, scale 1)."""
    fitted = Standardizer.fit([x[:, scaled] for x in encoded], total)
    mean = np.zeros(len(scaled))
    scale = np.ones(len(scaled))
    mean[scaled], scale[scaled] = fitted.mean, fitted.scale
    return Standardizer(mean, scale)
