r"""What every site declares at set-up, and the sums checked against it.

A site on the roster can lie in what it adds to a sum: a row count a billion times too large, a
squared sum that silences a feature, a made-up category, a planted evaluation count. The sum
alone hides who added what (secure sums will hide it by design), so slate checks each sum
against what it must equal or where it must lie, from facts every site declared before any sum:

* **Row counts per class** (train and test: :class:`~slate.data.schema.PartyCounts`), in each
  site's schema. They are public by design: every site receives every site's.
* **Value ranges**: per numeric CSV column, the range the ``--schema`` file declares for it, or
  else the smallest and largest value of the site's training rows (``[lo, hi]``, ``None`` when
  the column is empty there); for LIBSVM rows one range over all features: the public
  ``--feature-range`` (under ``--dp-epsilon`` by default ``[-1, 1]``), whose outliers each
  site clips into it (:func:`clip_to_range`), or else the rows' own, zero included (missing
  features are zeros). A site's own range depends on its rows: under ``--dp-epsilon`` only
  public ranges are declared (docs/privacy.md).

Every site receives the same declarations, or the run stops: each declaration's digest is part
of the run settings that every site compares before step 1
(:func:`slate.training.agreement.run_fingerprint`), so a site that sent different declarations
to different sites is named. The checks, on totals alone:

* a sum of rows equals the declared rows: the rows of the column statistics and of the
  standardisation sums, and per text column the category counts (every row counts once, a
  missing cell under ``<missing>``), summed over the sites' declared training rows;
* a column's non-missing cells are at most its rows;
* a mean lies in the union of the declared ranges of its column, and a variance lies in
  :math:`[0, (hi - lo)^2 / 4]` (Popoviciu's inequality: no values inside :math:`[lo, hi]` are
  spread more);
* an evaluation's summed counts per class equal the declared test rows of that class (of the
  sites still in the run), and no count is negative.

A check that fails stops the run with :class:`DeclarationBroken`: one paragraph naming the sum,
what it should be and what it is, and saying that a participant lied (a sum cannot tell who).
A declaration that cannot be true (more positives than rows, a range with ``lo > hi``) names
its site. What the checks cannot catch: a liar that keeps every sum within bounds (it moves its
own rows' share only), or that declares a wider range than its data holds.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slate.data.schema import PartyCounts
from slate.errors import DataError

__all__ = [
    "ALL_FEATURES",
    "DeclarationBroken",
    "Declared",
    "clip_to_range",
    "evaluation_count_problem",
    "public_ranges",
    "value_ranges",
]

ALL_FEATURES = ""  # the range key of LIBSVM rows: one range over every feature
RELATIVE_SLACK = 1e-9  # float64 rounding allowed in a mean or variance check


class DeclarationBroken(DataError):
    """A sum does not match what the sites declared: a participant lied."""


def value_ranges(
    numeric: dict[str, np.ndarray] | None = None, features: np.ndarray | None = None
) -> dict[str, list[float] | None]:
    """A site's declared ranges: per numeric column (NaN cells left out), or for ``features``
    one range over all of them, zero included."""
    if features is not None:
        if features.size == 0:
            return {ALL_FEATURES: [0.0, 0.0]}
        return {ALL_FEATURES: [min(float(features.min()), 0.0), max(float(features.max()), 0.0)]}
    ranges: dict[str, list[float] | None] = {}
    for column, values in (numeric or {}).items():
        present = values[~np.isnan(values)]
        ranges[column] = [float(present.min()), float(present.max())] if present.size else None
    return ranges


def public_ranges(span: Sequence[float]) -> dict[str, list[float] | None]:
    """What a site declares of its LIBSVM rows under a public range (``--feature-range``, or
    under ``--dp-epsilon`` its default): that range, over every feature, and nothing of its
    own rows."""
    lo, hi = span
    return {ALL_FEATURES: [float(lo), float(hi)]}


def clip_to_range(
    x: np.ndarray, span: Sequence[float], where: str
) -> tuple[np.ndarray, str | None]:
    """``x`` with every value outside the public range ``span`` clipped into it, and this
    site's note saying how many values were clipped and how far they lay (``None``: none was).

    The note is for the site's own output only: a refusal, or anything sent about these
    values, would tell the other sites that such a row exists (docs/privacy.md). ``where``
    names the file."""
    lo, hi = (float(v) for v in span)
    with np.errstate(invalid="ignore"):
        outside = (x < lo) | (x > hi)
    count = int(outside.sum())
    if count == 0:
        return x, None
    values = x[outside]
    low, high = float(values.min()), float(values.max())
    found = f"{low:g}" if low == high else f"from {low:g} to {high:g}"
    note = (
        f"note: {where}: {count} feature value{'s' if count != 1 else ''} ({found}) outside "
        f"the public range [{lo:g}, {hi:g}] (--feature-range) clipped into it. Only this site "
        "is told: nothing about these values is sent."
    )
    return np.clip(x, lo, hi).astype(x.dtype, copy=False), note


@dataclass(frozen=True)
class Declared:
    """Every site's declarations, by rank (module docstring)."""

    counts: tuple[PartyCounts, ...]
    ranges: tuple[dict[str, list[float] | None], ...]
    # this site's clamp of the federated scaling (slate.data.plausible.bound_moments), and the
    # notes of where it bound, for this site's own output
    scale_bound: float | None = None
    notes: list[str] = field(default_factory=list, compare=False)

    @classmethod
    def of(
        cls,
        counts: Sequence[PartyCounts],
        ranges: Sequence[dict[str, Any]],
        scale_bound: float | None = None,
    ) -> Declared:
        """The declarations received, checked one by one: a declaration that cannot be true
        names its site. ``scale_bound``: this site's clamp of the federated scaling."""
        for rank, (c, r) in enumerate(zip(counts, ranges, strict=True)):
            problem = _impossible(c, r)
            if problem:
                raise DeclarationBroken(
                    f"Party {rank} declared {problem}: no data can give that, so party {rank} "
                    "lied or runs modified code. Nothing was trained; remove it from the "
                    "roster or ask its site to run the same slate."
                )
        return cls(tuple(counts), tuple(dict(r) for r in ranges), scale_bound)

    def digests(self) -> list[str]:
        """Per rank, the sha256 of its declaration (compared by every site before step 1)."""
        out = []
        for c, r in zip(self.counts, self.ranges, strict=True):
            text = json.dumps([c.train, c.train_positives, c.test, c.test_positives, r],
                              sort_keys=True, allow_nan=True)  # fmt: skip
            out.append(hashlib.sha256(text.encode()).hexdigest()[:32])
        return out

    def train_rows(self) -> int:
        return sum(c.train for c in self.counts)

    def test_rows(self, members: Iterable[int]) -> tuple[int, int]:
        """``(negatives, positives)`` of the test rows the sites ``members`` declared."""
        kept = [self.counts[m] for m in members]
        positives = sum(c.test_positives for c in kept)
        return sum(c.test for c in kept) - positives, positives

    def column_range(self, column: str) -> tuple[float, float] | None:
        """The union of the declared ranges of ``column`` (``None``: nobody declared one)."""
        found = [r[column] for r in self.ranges if r.get(column) is not None]
        if not found:
            return None
        return min(lo for lo, _ in found), max(hi for _, hi in found)

    # ------------------------------------------------------------------ checks

    def check_table(
        self,
        sums: Any,
        columns: Sequence[str],
        counts: dict[str, dict[str, int]],
    ) -> None:
        """A table's set-up totals against the declarations: per numeric column of ``columns``
        the summed rows, non-missing cells and mean (``sums``: rows, non-missing cells and
        value sums, one column each), and every text column's category ``counts``."""
        if columns:
            for rows in sums[0].tolist():
                self.check_rows(rows, "rows of the column statistics")
            self.check_present(sums[1].tolist(), columns)
            present = sums[1].clamp(min=1)
            self.check_means((sums[2] / present).tolist(), columns, "imputation sums")
        self.check_category_counts(counts)

    def check_rows(self, found: float, what: str) -> None:
        """``found``, a sum of training rows, must equal the declared training rows."""
        expected = self.train_rows()
        if found != expected:
            _broken(what, f"{_number(found)} rows", f"the {expected} training rows the sites "
                    "declared")  # fmt: skip

    def check_present(self, present: Sequence[float], columns: Sequence[str]) -> None:
        """A column's non-missing cells are at most the declared rows."""
        rows = self.train_rows()
        for column, n in zip(columns, present, strict=True):
            if not 0 <= n <= rows:
                _broken(f"non-missing cells of column {column!r}", _number(n),
                        f"between 0 and the {rows} training rows the sites declared")  # fmt: skip

    def check_means(self, means: Sequence[float], columns: Sequence[str], what: str) -> None:
        """Each mean lies within its column's declared range."""
        lo, hi = self._bounds(columns)
        mean = np.asarray(means, dtype=np.float64)
        slack = RELATIVE_SLACK * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi)))
        with np.errstate(invalid="ignore"):
            bad = ~((lo - slack <= mean) & (mean <= hi + slack))
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            _broken(f"{what} of {_column(columns[k])}", f"a mean of {mean[k]:.6g}",
                    f"inside the range [{lo[k]:.6g}, {hi[k]:.6g}] the sites declared")  # fmt: skip

    def check_variances(self, variances: Sequence[float], columns: Sequence[str]) -> None:
        """Each variance lies in :math:`[0, (hi - lo)^2 / 4]` of its column's range."""
        lo, hi = self._bounds(columns)
        variance = np.asarray(variances, dtype=np.float64)
        most = (hi - lo) ** 2 / 4
        slack = RELATIVE_SLACK * np.maximum(1.0, most)
        with np.errstate(invalid="ignore"):
            bad = ~((-slack <= variance) & (variance <= most + slack))
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            _broken(f"standardisation sums of {_column(columns[k])}",
                    f"a variance of {variance[k]:.6g}",
                    f"between 0 and {most[k]:.6g}, (hi - lo)^2 / 4 for the range "
                    f"[{lo[k]:.6g}, {hi[k]:.6g}] the sites declared")  # fmt: skip

    def _bounds(self, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per column, the declared range's ends (an undeclared column: unbounded)."""
        spans = {c: self.column_range(c) for c in set(columns)}
        ends = [spans[c] or (-math.inf, math.inf) for c in columns]
        return (np.array([lo for lo, _ in ends], dtype=np.float64),
                np.array([hi for _, hi in ends], dtype=np.float64))  # fmt: skip

    def check_category_counts(self, counts: dict[str, dict[str, int]]) -> None:
        """Per text column the category counts add up to the declared training rows (a
        missing cell counts under ``<missing>``), and none is negative."""
        rows = self.train_rows()
        for column, named in counts.items():
            negative = [name for name, n in named.items() if n < 0]
            total = sum(named.values())
            if negative or total != rows:
                found = (f"a negative count for {negative[0]!r}" if negative
                         else f"{total} rows over {len(named)} categories")  # fmt: skip
                _broken(f"category counts of column {column!r}", found,
                        f"the {rows} training rows the sites declared")  # fmt: skip


def evaluation_count_problem(counts: Any, negatives: int, positives: int) -> str | None:
    """Why summed evaluation counts ``(2, rows)`` (negatives, positives) cannot come from the
    declared test rows, or ``None`` when they can."""
    table = np.asarray(counts, dtype=np.float64)
    if (table < 0).any():
        return "a negative count in the summed evaluation counts"
    found = (float(table[0].sum()), float(table[1].sum()))
    if found != (float(negatives), float(positives)):
        return (
            f"the summed evaluation counts hold {_number(found[1])} positive and "
            f"{_number(found[0])} negative test rows, but the sites in the run declared "
            f"{positives} and {negatives}"
        )
    return None


def _impossible(counts: PartyCounts, ranges: dict[str, Any]) -> str:
    c = counts
    if min(c.train, c.train_positives, c.test, c.test_positives) < 0:
        return "a negative row count"
    if c.train_positives > c.train or c.test_positives > c.test:
        return (f"more positives than rows ({c.train_positives} of {c.train} training rows, "
                f"{c.test_positives} of {c.test} test rows)")  # fmt: skip
    for column, span in ranges.items():
        if span is None:
            continue
        lo, hi = span
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            return f"the range [{lo}, {hi}] for {_column(column)}"
    return ""


def _column(column: str) -> str:
    return "every feature" if column == ALL_FEATURES else f"column {column!r}"


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value) < 1e15 else f"{value:.3g}"


def _broken(what: str, found: str, expected: str) -> None:
    raise DeclarationBroken(
        f"The {what} summed over the sites give {found}, where they must be {expected}: a "
        "participant lied in what it added (or runs modified code). A sum does not show who; "
        "every site stops here, nothing was trained, and nothing it sent was used. Compare the "
        "sites' slate versions, and remove a site you do not trust from the roster."
    )
