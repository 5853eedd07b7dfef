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

Under ``--dp-epsilon`` (``private``) a table needs its ``--schema`` (:mod:`slate.data.dictionary`)
and nothing is fitted on its rows: a numeric column is imputed with its declared ``mean`` (else
the middle of its declared ``range``) and scaled with its declared ``mean`` and ``std`` (else
its ``range`` to [-1, 1]); a cell outside the declared ``range`` is clipped into it, at the site,
in training and in every later use of the model (``bounds``); an indicator column only where
the schema says ``"missing": true``. Nothing is summed or gathered (docs/privacy.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from slate.data.declared import Declared
from slate.data.dictionary import DataDictionary
from slate.data.preprocess import Standardizer
from slate.errors import ConfigError, DataError
from slate.security.messages import MapOf

__all__ = [
    "INDICATOR_RATE",
    "CategoryLimits",
    "ColumnChoice",
    "TableEncoder",
    "fit_features",
]

INDICATOR_RATE = 0.01
MISSING = "<missing>"
OTHER = "<other>"
DEFAULT_MAX_CATEGORIES = 50
FORMAT = 1

Total = Callable[..., Tensor]  # (value, what) -> the value summed over all processes
Gather = Callable[[list[Any], Any, str], list[Any]]  # items, their shape, what they are


def _local_total(value: Tensor, what: str = "") -> Tensor:
    del what
    return value


def _local_gather(items: list[Any], shape: Any = None, what: str = "") -> list[Any]:
    del shape, what
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


@dataclass(frozen=True)
class CategoryLimits:
    """How many one-hot columns a text column may get (scikit-learn's ``OneHotEncoder`` names).

    Attributes:
        max_categories: at most this many columns per text column, ``<other>`` included; the
            most frequent values keep their own column.
        min_frequency: a value seen in fewer training rows goes to ``<other>``. When a column
            has more values than ``max_categories``, a value seen once never gets a column of
            its own (it would be an arbitrary pick among ties).
    """

    max_categories: int | None = DEFAULT_MAX_CATEGORIES
    min_frequency: int = 1

    def keep(self, counts: dict[str, int]) -> list[str]:
        """The column names for a text column with these training ``counts``: the kept values
        sorted, then ``<missing>`` and ``<other>`` where they apply."""
        values = {v: n for v, n in counts.items() if v != MISSING}
        kept = [v for v, n in values.items() if n >= self.min_frequency]
        if self.max_categories is not None and len(kept) > self.max_categories:
            ranked = sorted((v for v in kept if values[v] > 1), key=lambda v: (-values[v], v))
            kept = ranked[: self.max_categories - 1]
        names = sorted(kept) + ([MISSING] if MISSING in counts else [])
        return names + ([OTHER] if len(kept) < len(values) else [])


def fit_features(
    train: Sequence[Any],
    *,
    choice: ColumnChoice | None = None,
    limits: CategoryLimits | None = None,
    standardize: bool,
    centre: bool = True,
    total: Total = _local_total,
    gather: Gather = _local_gather,
    declared: Declared | None = None,
    dictionary: DataDictionary | None = None,
    private: bool = False,
) -> TableEncoder | Standardizer | None:
    """The one fit of a run's feature transform, on the training rows of this process's parties.

    ``train`` holds raw tables (``choice`` given: a :class:`TableEncoder`, scaled when
    ``standardize``) or arrays (a :class:`~slate.data.preprocess.Standardizer` when
    ``standardize``, else ``None``; ``centre=False`` only divides, for sparse LIBSVM rows).
    ``total`` and ``gather`` federate the statistics over processes (identity in one process);
    with the sites' ``declared`` facts every federated sum is checked against them
    (:mod:`slate.data.declared`). With a ``dictionary`` (``--schema``) a table's categories,
    and the statistics it declares, come from it: nothing is gathered
    (:mod:`slate.data.dictionary`); ``private`` (``--dp-epsilon``): only the dictionary's public
    constants (module docstring).
    """
    if choice is not None:
        if dictionary is not None:
            return TableEncoder.fit_declared(
                train, choice, standardize, dictionary, total, declared, private
            )
        return TableEncoder.fit(train, choice, standardize, total, gather, limits, declared)
    if not standardize:
        return None
    rows = [x.reshape(len(x), -1) for x in train]
    return Standardizer.fit(rows, total, centre=centre, declared=declared)


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
    # In memory only: every training category, and (rows, values, columns) of reduced columns.
    seen: dict[str, set[str]] = field(default_factory=dict, repr=False)
    reduced: dict[str, tuple[int, int, int]] = field(default_factory=dict, repr=False)
    left_out: list[str] = field(default_factory=list)  # text columns without any kept value
    bounds: dict[str, list[float]] = field(default_factory=dict)  # clipped into, before all else

    # ------------------------------------------------------------------ fitting

    @classmethod
    def fit(
        cls,
        tables: Sequence[Any],
        choice: ColumnChoice,
        standardize: bool,
        total: Total = _local_total,
        gather: Gather = _local_gather,
        limits: CategoryLimits | None = None,
        declared: Declared | None = None,
    ) -> TableEncoder:
        """Fit on the training tables of this process's parties; ``total`` sums a tensor over
        all processes and ``gather`` concatenates every process's list (both identity in one
        process). The column kinds must agree across tables (checked by schema agreement).
        ``limits`` caps the one-hot columns per text column (:class:`CategoryLimits`);
        ``declared``: the sites' declarations the federated sums are checked against."""
        first = tables[0]
        features = choice.features(first.columns, first.path)
        numeric = [c for c in features if c in first.numeric]
        text = [c for c in features if c in first.text]
        sums, imputed = _numeric_sums(tables, numeric, total)
        counts = _united_category_counts(tables, text, gather)
        if declared is not None:  # the totals against what the sites declared, before any use
            declared.check_table(sums, numeric, counts)
        means, missing_rate = _numeric_statistics(sums, numeric)
        indicators = [c for c in numeric if missing_rate[c] >= INDICATOR_RATE]
        limits = limits or CategoryLimits()
        categories = {c: limits.keep(counts[c]) for c in text}
        reduced = {
            c: (sum(counts[c].values()), len(counts[c]), len(categories[c])) for c in text
            if len(categories[c]) < len(counts[c]) or OTHER in categories[c]
        }  # fmt: skip
        # A column reduced to <other> alone is the same in every row: it carries nothing.
        left_out = [c for c in text if categories[c] == [OTHER]]
        text = [c for c in text if c not in left_out]
        categories = {c: categories[c] for c in text}
        encoder = cls(numeric, text, means, indicators, categories, choice, imputed=imputed)
        encoder.seen = {c: set(counts[c]) for c in (*text, *left_out)}
        encoder.reduced = {c: (*reduced[c][:2], 0 if c in left_out else reduced[c][2])
                           for c in reduced}  # fmt: skip
        encoder.left_out = left_out
        if standardize:  # only the numeric columns are scaled: fit on them alone
            blocks = [encoder._numeric_block(t) for t in tables]
            encoder.scaler = _masked_scaler(blocks, encoder.width, total, declared, numeric)
        return encoder

    @classmethod
    def fit_declared(
        cls,
        tables: Sequence[Any],
        choice: ColumnChoice,
        standardize: bool,
        dictionary: DataDictionary,
        total: Total = _local_total,
        declared: Declared | None = None,
        private: bool = False,
    ) -> TableEncoder:
        """The fit with a declared data dictionary (``--schema``, :mod:`slate.data.dictionary`):
        the features are the dictionary's columns in its order (less ``--id-column`` and
        ``--drop-columns``, within ``--feature-columns``); a text column's one-hot columns are
        its declared categories, then ``<missing>`` and ``<other>`` where declared, and no
        category name or count is sent anywhere. A numeric column with a declared mean and
        std is imputed and scaled with them; the others' statistics are summed through
        ``total`` as in :meth:`fit` (nothing is summed when every column declares them).
        ``private`` (``--dp-epsilon``): nothing is summed; every numeric column is imputed,
        scaled and clipped with the dictionary's public constants alone (module docstring)."""
        first = tables[0]
        chosen = set(choice.features(first.columns, first.path))  # the flags checked
        features = [c for c in dictionary.names if c in chosen]
        if not features:
            raise ConfigError(
                f"{first.path}: no column of the schema {dictionary.path} is left as a feature "
                "after the column flags."
            )
        columns = {c.name: c for c in dictionary.columns}
        numeric = [c for c in features if columns[c].kind == "numeric"]
        text = [c for c in features if columns[c].kind == "text"]
        summed = [] if private else [c for c in numeric if columns[c].mean is None]
        imputed = _imputed_cells(tables, numeric)
        means = {c: columns[c].public_centre(dictionary.path) for c in numeric if c not in summed}
        rate: dict[str, float] = {}
        if summed:
            sums, _ = _numeric_sums(tables, summed, total)
            if declared is not None:
                declared.check_table(sums, summed, {})
            summed_means, rate = _numeric_statistics(sums, summed)
            means.update(summed_means)
        means = {c: means[c] for c in numeric}
        indicators = [
            c for c in numeric
            if (columns[c].missing if columns[c].missing is not None
                else rate.get(c, 0.0) >= INDICATOR_RATE)
        ]  # fmt: skip
        categories = {c: columns[c].one_hot for c in text}
        encoder = cls(numeric, text, means, indicators, categories, choice, imputed=imputed)
        encoder.seen = {c: set(columns[c].categories) for c in text}
        if private:  # a cell outside its public range is clipped into it, here and at predict
            encoder.bounds = {c: list(columns[c].range) for c in numeric if columns[c].range}
        if standardize:
            blocks = [encoder._numeric_block(t) for t in tables]
            mean, scale = np.zeros(encoder.width), np.ones(encoder.width)
            if summed:
                at = [numeric.index(c) for c in summed]
                fitted = Standardizer.fit([b[:, at] for b in blocks], total, declared=declared,
                                          columns=summed)  # fmt: skip
                mean[at], scale[at] = fitted.mean, fitted.scale
            for j, c in enumerate(numeric):
                if c not in summed:
                    mean[j], scale[j] = means[c], columns[c].public_scale()
            encoder.scaler = Standardizer(mean, scale)
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
        return self._fill(table, scale=False, count_unseen=count_unseen)

    def transform(self, table: Any) -> np.ndarray:
        """The float32 model input of ``table``: the encoding, then the scaling fitted on the
        training data (if any).

        Built in one pass into the float32 output: each numeric column is imputed and scaled
        in float64 and cast once, at the end (a column of large magnitude and small spread, a
        Unix timestamp 1.7e9 give or take an hour, would otherwise be rounded to float32's
        spacing of 128 before it is centred, leaving few distinct values); indicator and
        one-hot columns are written as 0/1 directly.
        """
        return self._fill(table, scale=self.scaler is not None, count_unseen=True)

    def _fill(self, table: Any, scale: bool, count_unseen: bool) -> np.ndarray:
        self._check_columns(table)
        out = np.zeros((table.rows, self.width), dtype=np.float32)
        for j, c in enumerate(self.numeric):
            values = self._bounded(table, c)
            column = np.where(np.isnan(values), self.means[c], values)
            if scale:
                column = (column - self.scaler.mean[j]) / self.scaler.scale[j]
            out[:, j] = column
        start = len(self.numeric)
        for j, c in enumerate(self.indicators):
            out[:, start + j] = np.isnan(table.numeric[c])
        start += len(self.indicators)
        for c in self.text:
            rows, columns = self._one_hot_positions(table, c, count_unseen)
            out[rows, start + columns] = 1.0
            start += len(self.categories[c])
        for c in self.left_out:  # not a feature, but its unseen values are still reported
            if count_unseen and c in self.seen and c in table.text:
                self._count_unseen(c, table.text[c], table.text[c].codes >= 0)
        return out

    def _check_columns(self, table: Any) -> None:
        needed = [*self.numeric, *self.text]
        missing = [c for c in needed if c not in table.columns]
        if missing:
            headerless = "" if table.has_header else "; this file has no header row"
            raise DataError(
                f"{table.path} lacks the columns {missing} that the model was trained on "
                f"(columns are matched by header name{headerless}; the training columns were "
                f"{needed})."
            )
        wrong = [c for c in self.numeric if c not in table.numeric]
        wrong += [c for c in self.text if c not in table.text]
        if wrong:
            kinds = ", ".join(
                f"{c!r} is {'text' if c in table.text else 'numeric'} here but was "
                f"{'numeric' if c in self.numeric else 'text'} in training"
                for c in wrong
            )
            raise DataError(
                f"{table.path}: {kinds}. The kinds are fixed in training (where "
                "--categorical-columns makes a column text): give this column's cells in the "
                "training kind."
            )

    def _numeric_block(self, table: Any) -> np.ndarray:
        if not self.numeric:
            return np.zeros((table.rows, 0))
        out = np.empty((table.rows, len(self.numeric)), dtype=np.float64)
        for j, c in enumerate(self.numeric):
            values = self._bounded(table, c)
            out[:, j] = np.where(np.isnan(values), self.means[c], values)
        return out

    def _bounded(self, table: Any, column: str) -> np.ndarray:
        """``column``'s cells, clipped into its public range where the fit set one (missing
        cells stay NaN)."""
        values = table.numeric[column]
        span = self.bounds.get(column)
        return values if span is None else np.clip(values, span[0], span[1])

    def _one_hot_positions(
        self, table: Any, column: str, count_unseen: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``table`` and their one-hot column (within ``column``'s block) that are
        1: a category's own column, ``<other>`` for a value without one (where ``<other>``
        exists), ``<missing>`` for a missing cell (where training had one); else no 1."""
        known = self.categories[column]
        position = {v: k for k, v in enumerate(known)}
        col = table.text[column]
        lookup = np.array(
            [position.get(v, -1) for v in col.categories] + [position.get(MISSING, -1)],
            dtype=np.int64,
        )
        index = lookup[col.codes]  # code -1 (missing) takes the last entry
        present = col.codes >= 0
        other = position.get(OTHER)
        if other is not None:  # a value without a column of its own is <other>
            index[(index < 0) & present] = other
        if count_unseen:
            self._count_unseen(column, col, present)
        hit = np.flatnonzero(index >= 0)
        return hit, index[hit]

    def _count_unseen(self, column: str, col: Any, present: np.ndarray) -> None:
        """Count the cells whose value training never saw (without the training set of
        values, after loading a model: the cells whose value has no column of its own)."""
        seen = self.seen.get(column) or set(self.categories[column]) - {OTHER}
        new = np.array([v not in seen for v in col.categories] + [False], dtype=bool)
        unseen = int((new[col.codes] & present).sum())
        if unseen:
            self.unseen[column] = self.unseen.get(column, 0) + unseen

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
            "left_out": self.left_out,
            **({"bounds": self.bounds} if self.bounds else {}),
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
            left_out=list(saved.get("left_out", [])),
            bounds={k: [float(v[0]), float(v[1])] for k, v in saved.get("bounds", {}).items()},
        )


def _numeric_sums(tables, numeric: list[str], total: Total) -> tuple[Tensor, dict[str, int]]:
    """Per numeric column the rows, non-missing cells and sum of values over all processes
    (one column each), and this process's imputed (missing) cells per column."""
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
    return total(sums, "column statistics"), {c: n for c, n in imputed.items() if n}


def _imputed_cells(tables, numeric: list[str]) -> dict[str, int]:
    """This process's missing (imputed) cells per numeric column, where there are any."""
    imputed = {c: sum(int(np.isnan(t.numeric[c]).sum()) for t in tables) for c in numeric}
    return {c: n for c, n in imputed.items() if n}


def _numeric_statistics(sums: Tensor, numeric: list[str]):
    """Global mean over non-missing cells and missing rate per column, from the summed
    :func:`_numeric_sums`."""
    means, rate = {}, {}
    for j, c in enumerate(numeric):
        rows, present, added = (float(v) for v in sums[:, j])
        if present == 0:
            raise DataError(f"Column {c!r} holds no value at all in the training data.")
        means[c] = added / present
        rate[c] = 1.0 - present / rows
    return means, rate


def _united_category_counts(tables, text: list[str], gather: Gather) -> dict[str, dict[str, int]]:
    """Every column's training rows per category over all parties (names and counts only);
    missing cells count under ``<missing>``."""
    local: dict[str, dict[str, int]] = {}
    for c in text:
        counts: dict[str, int] = {}
        for t in tables:
            col = t.text[c]
            per_code = np.bincount(col.codes + 1, minlength=len(col.categories) + 1)
            for name, n in zip((MISSING, *col.categories), per_code.tolist(), strict=True):
                if n:
                    counts[name] = counts.get(name, 0) + n
        local[c] = counts
    united: dict[str, dict[str, int]] = {c: {} for c in text}
    for party in gather([local], MapOf(MapOf(int)), "count of categories"):
        for c in text:
            for name, n in party[c].items():
                united[c][name] = united[c].get(name, 0) + n
    return united


def _masked_scaler(
    numeric: list[np.ndarray], width: int, total: Total, declared: Declared | None,
    columns: list[str],
) -> Standardizer:  # fmt: skip
    """z-scoring for the first ``numeric`` columns (fitted on them; named ``columns`` in the
    sites' declarations), identity for the other ``width - n`` columns (mean 0, scale 1)."""
    fitted = Standardizer.fit(numeric, total, declared=declared, columns=columns)
    n = numeric[0].shape[1]
    mean = np.zeros(width)
    scale = np.ones(width)
    mean[:n], scale[:n] = fitted.mean, fitted.scale
    return Standardizer(mean, scale)
