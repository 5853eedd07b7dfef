"""Typing a delimited file's cells, column by column: numbers, text codes, missing cells and
labels, with every problem collected for one report."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from slate.errors import DataError

__all__ = [
    "NA_TOKENS",
    "CellContext",
    "ColumnReader",
    "GrowingArray",
    "LabelReader",
    "Problem",
    "coded_distinct",
    "line_breaks",
    "make_context",
    "report_problems",
    "to_float",
]

#: Cells that mean "missing", compared after stripping surrounding spaces and ignoring case.
NA_TOKENS = ("", "NA", "N/A", "NaN", "nan", "?", "null", "NULL", "None")

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_MAX_LISTED = 10
#: A column whose non-missing cells are at least this share numbers, but not all, is an error.
_NUMERIC_SHARE = 0.9
#: Distinct label values remembered (a wrongly chosen label column may hold one per row).
_MAX_LABELS = 10_000
#: Problems described in full in one report; the columns of the rest are only named.
_MAX_DETAILED = 25
_WORD, _NUMBER, _NONFINITE = 0, 1, 2
_UNSEEN = -2
_NAN = "nan"
#: Spellings of missing cells remembered per column for the fast conversion of numeric blocks.
_MAX_NA_SEEN = 4


# ----------------------------------------------------------------------------- the reading


class GrowingArray:
    """A 1-D array that grows by doubling as blocks are appended (like a list, but typed).

    Large buffers are allocated by the system on demand, so the unused tail of the capacity
    costs address space, not memory.
    """

    def __init__(self, dtype: type) -> None:
        self.data = np.empty(0, dtype=dtype)
        self.size = 0

    def append(self, values: np.ndarray | list[int]) -> None:
        end = self.size + len(values)
        if end > len(self.data):
            grown = np.empty(max(end, 2 * len(self.data), 1024), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : end] = values
        self.size = end

    def view(self) -> np.ndarray:
        return self.data[: self.size]

    def take(self, copy: bool = True) -> np.ndarray:
        """The content (an exact-size copy unless ``copy=False``); the buffer is emptied."""
        out = self.data[: self.size]
        if copy and self.size != len(self.data):
            out = out.copy()
        self.data = np.empty(0, dtype=self.data.dtype)  # not a view: that would keep it alive
        self.size = 0
        return out


@dataclass
class Problem:
    """One reason why a file cannot be used; ``line``/``column`` locate it where they can."""

    line: int | None
    column: str | None
    text: str

    def where(self) -> str:
        parts = []
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.column is not None:
            parts.append(f"column {self.column!r}")
        return ", ".join(parts)


@dataclass(frozen=True)
class CellContext:
    """What every column needs to classify its cells."""

    na: frozenset[str]  # missing-value tokens, stripped and casefolded
    numeric_na: np.ndarray  # the values of the tokens that parse as numbers (e.g. -999)
    dtype: type  # dtype of the stored numeric blocks


def make_context(name: str, na_values: Sequence[str], dtype: type) -> CellContext:
    extra = []
    for token in na_values:
        if not isinstance(token, str):
            raise DataError(f"Cannot read {name}: na_values must be strings, got {token!r}.")
        extra.append(token)
    tokens = frozenset(t.strip().casefold() for t in (*NA_TOKENS, *extra))
    numeric = []
    for token in tokens:
        value = to_float(token)
        if value is not None and value == value:
            numeric.append(value)
    return CellContext(tokens, np.array(sorted(numeric), dtype=np.float64), dtype)


# ----------------------------------------------------------------------------- columns


class ColumnReader:
    """One feature column while the file is read: typed blocks plus what the cells were."""

    def __init__(self, name: str, position: int, forced_text: bool, dtype: type) -> None:
        self.name = name
        self.position = position
        self.forced_text = forced_text
        self.kind = "text" if forced_text else "numeric"
        # The numbers (NaN where missing) of a numeric column, the codes of a text column.
        self.store = GrowingArray(np.int32 if forced_text else dtype)
        self.rescan = False  # turned to text after numeric blocks were stored and dropped
        self.missing = 0
        self.first_missing: tuple[int, str] | None = None
        self.na_seen: list[str] = []  # missing cells as written in this column, e.g. ""
        # Non-missing cells: finite float32 numbers, other numbers (inf, 1e39), and words.
        self.numbers = 0
        self.nonfinite = 0
        self.words = 0
        self.first_bad: tuple[int, str] | None = None
        self.examples: list[str] = []
        # A column the caller reads as numbers whatever the file holds (a model's numeric
        # feature): its words are not a problem of the column but of their rows, and its
        # numbers beyond float32 are listed here by (line, cell).
        self.expect_numeric = False
        self.out_of_range: list[tuple[int, str]] = []
        self._restart()

    def _restart(self) -> None:
        self.lookup: dict[str, int] = {}  # cell as written -> code
        self.index: dict[str, int] = {}  # stripped cell -> code
        self.categories: list[str] = []
        self.category_kinds: list[int] = []

    def restart_text(self) -> None:
        """Forget the text codes, to read the column again from its first row."""
        self._restart()
        self.store = GrowingArray(np.int32)
        self.missing = 0
        self.first_missing = None

    def add(self, cells: Sequence[str], lines: Sequence[int], context: CellContext) -> None:
        if self.kind == "numeric":
            values = self._numbers(cells, lines, context)
            if values is not None:
                self.store.append(values)
                return
            self.become_text()
        self.add_text(cells, lines, context)

    def become_text(self) -> None:
        """A word was met: the column is text. Numbers stored before this block lost their
        text, so the column is read again once the whole file has been seen."""
        self.rescan = self.store.size > 0
        self.store = GrowingArray(np.int32)
        self.kind = "text"

    def _numbers(
        self, cells: Sequence[str], lines: Sequence[int], context: CellContext
    ) -> np.ndarray | None:
        """The block as numbers (NaN for missing cells), or None if a cell is a word."""
        try:
            values = np.array(cells, dtype=np.float64)
        except ValueError:
            values = self._numbers_with_missing(cells, context)
        return self.checked_numbers(values, cells, lines, context)

    def checked_numbers(
        self,
        values: np.ndarray | None,
        cells: Sequence[str],
        lines: Sequence[int],
        context: CellContext,
    ) -> np.ndarray | None:
        """The block as numbers, from ``values`` converted in bulk: each entry that is not a
        finite float32 number (NaN where the bulk conversion left a cell out) or that spells a
        missing value is decided from its cell, one at a time; None if a cell is a word.
        ``values=None``: every cell is decided one at a time."""
        if values is None:
            check: Iterable[int] = range(len(cells))
            values = np.empty(len(cells), dtype=np.float64)
        else:
            good = np.abs(values) <= _FLOAT32_MAX  # False for nan and inf too
            if context.numeric_na.size:
                good &= ~np.isin(values, context.numeric_na)
            if good.all():
                self.numbers += len(cells)
                return values.astype(context.dtype, copy=False)
            check = np.flatnonzero(~good).tolist()
        numbers = len(cells)
        missing: list[int] = []
        nonfinite: list[int] = []
        for i in check:
            cell = cells[i]
            numbers -= 1
            if cell.strip().casefold() in context.na:
                values[i] = np.nan
                missing.append(i)
                if cell not in self.na_seen and len(self.na_seen) < _MAX_NA_SEEN:
                    self.na_seen.append(cell)
                continue
            value = to_float(cell)
            if value is None:
                return None
            if abs(value) <= _FLOAT32_MAX:
                values[i] = value
                numbers += 1
            else:
                values[i] = np.nan
                nonfinite.append(i)
        self.numbers += numbers
        if missing:
            self.missing += len(missing)
            if self.first_missing is None:
                self.first_missing = (lines[missing[0]], cells[missing[0]])
        if nonfinite:
            self.nonfinite += len(nonfinite)
            for i in nonfinite:
                self._note_bad(lines[i], cells[i].strip())
                if self.expect_numeric:
                    self.out_of_range.append((lines[i], cells[i].strip()))
        return values.astype(context.dtype, copy=False)

    def _numbers_with_missing(
        self, cells: Sequence[str], context: CellContext
    ) -> np.ndarray | None:
        """The block converted in one call once the missing cells spelt as in earlier blocks
        (most often ``""``) are replaced by ``nan``; None if that is not enough."""
        if not self.na_seen:
            if "" not in context.na:
                return None
            self.na_seen.append("")  # the commonest spelling of a missing cell: try it first
        block = np.array(cells, dtype=object)
        missing = block == self.na_seen[0]
        for spelling in self.na_seen[1:]:
            missing |= block == spelling
        if not missing.any():
            return None
        block[missing] = _NAN
        try:
            return block.astype(np.float64)
        except ValueError:
            return None

    def add_text(self, cells: Sequence[str], lines: Sequence[int], context: CellContext) -> None:
        codes = _coded(self, cells, lines, lambda cell, line: self._new_cell(cell, line, context))
        self.store.append(codes)

    def _new_cell(self, cell: str, line: int, context: CellContext) -> int:
        code = self.lookup.get(cell)
        if code is not None:
            return code
        text = cell.strip()
        if text.casefold() in context.na:
            code = -1
        else:
            code = self.index.get(text)
            if code is None:
                code = len(self.categories)
                self.categories.append(text)
                self.index[text] = code
                kind = _cell_kind(text)
                self.category_kinds.append(kind)
                if kind != _NUMBER:
                    self._note_bad(line, text)
        self.lookup[cell] = code
        return code

    def _note_bad(self, line: int, text: str) -> None:
        if self.first_bad is None:
            self.first_bad = (line, text)
        if len(self.examples) < 3 and text not in self.examples:
            self.examples.append(text)

    def finish_counts(self) -> None:
        """Count the text blocks' numbers and words (the numeric blocks counted as they came)."""
        if self.kind != "text" or self.forced_text:
            return
        codes = self.store.view()
        counts = np.bincount(codes[codes >= 0], minlength=len(self.categories))
        kinds = np.array(self.category_kinds, dtype=np.int64)
        self.numbers += int(counts[kinds == _NUMBER].sum())
        self.nonfinite += int(counts[kinds == _NONFINITE].sum())
        self.words += int(counts[kinds == _WORD].sum())

    def problems(self, strict: bool, missing_is_error: bool) -> list[Problem]:
        """Why the column cannot be used, if it cannot."""
        found = []
        bad = self.words + self.nonfinite
        if not self.forced_text and not self.expect_numeric and bad and self.first_bad is not None:
            line, cell = self.first_bad
            numeric_looking = self.numbers + self.nonfinite
            present = self.numbers + bad
            examples = ", ".join(map(repr, self.examples)) + (", ..." if bad > 3 else "")
            verb = "is" if bad == 1 else "are"
            tally = f"{bad} of its {_count(present, 'non-missing cell')} {verb} not: {examples}"
            if strict:
                what = "a number" if _cell_kind(cell) == _WORD else "a finite float32 number"
                text = (
                    f"cell {cell!r} is not {what} ({tally}). Expected every column except the "
                    "label column to hold finite numeric features."
                )
            elif self.words == 0:
                text = (
                    f"cell {cell!r} is not a finite number within the float32 range (about "
                    f"+-3.4e38); the column has {_count(bad, 'such cell')} ({examples}): fix "
                    "the values, or add them to --na-values to read them as missing."
                )
            elif numeric_looking >= _NUMERIC_SHARE * present:
                share = 100 * numeric_looking // present
                what = "a number" if _cell_kind(cell) == _WORD else "a finite number"
                text = (
                    f"cell {cell!r} is not {what}, but {share}% of the column is numeric "
                    f"({tally}): fix the value, add it to --na-values, or list the column in "
                    "--categorical-columns."
                )
            else:
                text = ""  # a text column
            if text:
                found.append(Problem(line, self.name, text))
        if self.missing and self.first_missing is not None and (strict or missing_is_error):
            line, cell = self.first_missing
            expected = (
                "Expected every feature cell to be a finite number: missing values are not "
                "supported here."
                if strict
                else "Missing values are not allowed here (missing='error'): fill them in or "
                "remove those rows."
            )
            count = _count(self.missing, "missing cell")
            found.append(
                Problem(
                    line,
                    self.name,
                    f"cell {cell!r} marks a missing value ({count} in this column). {expected}",
                )
            )
        return found


class LabelReader:
    """The label column while the file is read: a code per row into the distinct values."""

    def __init__(self, name: str, context: CellContext) -> None:
        self.name = name
        self.context = context
        self.lookup: dict[str, int] = {}
        self.keys: dict[tuple[str, float | str], int] = {}
        self.values: list[str] = []
        self.first_lines: list[int] = []
        self.overflow = False
        self.codes = GrowingArray(np.int32)
        self.missing = 0
        self.first_missing: tuple[int, str] | None = None

    def add(self, cells: Sequence[str], lines: Sequence[int]) -> None:
        self.codes.append(_coded(self, cells, lines, self._new_cell))

    def _new_cell(self, cell: str, line: int) -> int:
        code = self.lookup.get(cell)
        if code is not None:
            return code
        text = cell.strip()
        if text.casefold() in self.context.na:
            code = -1
        else:
            key = _label_key(text)
            code = self.keys.get(key)
            if code is None:
                if len(self.values) >= _MAX_LABELS:
                    self.overflow = True
                    return _MAX_LABELS
                code = len(self.values)
                self.keys[key] = code
                self.values.append(text)
                self.first_lines.append(line)
        if len(self.lookup) < 4 * _MAX_LABELS:
            self.lookup[cell] = code
        return code

    def problems(
        self, positive: str, single_class_ok: bool, first_lines: np.ndarray
    ) -> list[Problem]:
        found = []
        if self.missing and self.first_missing is not None:
            line, cell = self.first_missing
            found.append(
                Problem(
                    line,
                    self.name,
                    f"the label cell {cell!r} is missing ({_count(self.missing, 'row')} without a "
                    "label). "
                    "Every row needs a label: fill them in or remove those rows.",
                )
            )
        listed = ", ".join(repr(v) for v in self.values[:_MAX_LISTED])
        if len(self.values) > _MAX_LISTED or self.overflow:
            more = len(self.values) - _MAX_LISTED
            listed += f" and {'more than ' if self.overflow else ''}{more} more"
        if len(self.values) > 2:
            found.append(
                Problem(
                    self.first_lines[2],
                    self.name,
                    f"labels are not binary: a third distinct value {self.values[2]!r} appears "
                    f"on this line. Distinct labels: {listed}. Expected exactly two label "
                    f"values, one of them the positive label {positive!r}.",
                )
            )
            return found
        one_class_allowed = single_class_ok and len(self.values) == 1
        if not self.values:
            return found
        if _label_key(positive) not in self.keys and not one_class_allowed:
            found.append(
                Problem(
                    None,
                    None,
                    f"the positive label {positive!r} never occurs in column {self.name!r}; "
                    f"labels seen: {listed}. Expected the positive label to be one of them "
                    "(comparison ignores surrounding spaces; numbers compare by value).",
                )
            )
        elif len(self.values) < 2 and not one_class_allowed:
            found.append(
                Problem(
                    None,
                    None,
                    f"every row (lines {int(first_lines[0])} to {int(first_lines[-1])}) has "
                    f"the same label {listed} in column {self.name!r}. Expected two classes, "
                    "positive and negative.",
                )
            )
        return found

    def result(self, positive: str) -> np.ndarray:
        codes = self.codes.take(copy=False)
        positive_code = self.keys.get(_label_key(positive))
        if positive_code is None:
            return np.zeros(codes.shape, dtype=np.int64)
        return (codes == positive_code).astype(np.int64)


def report_problems(name: str, problems: list[Problem]) -> str:
    """One paragraph describing every problem."""
    if len(problems) == 1:
        where = problems[0].where()
        return f"CSV file {name}{', ' + where if where else ''}: {problems[0].text}"
    items = []
    for k, problem in enumerate(problems[:_MAX_DETAILED], start=1):
        where = problem.where()
        items.append(f"({k}) {where + ': ' if where else ''}{problem.text}")
    rest = problems[_MAX_DETAILED:]
    if rest:
        columns = list(dict.fromkeys(p.column or "labels" for p in rest))
        shown = ", ".join(map(repr, columns[:50])) + (" ..." if len(columns) > 50 else "")
        items.append(f"and {len(rest)} more problems, in columns {shown}")
    return (
        f"CSV file {name} cannot be used as it is; {len(problems)} problems were found: "
        + " ".join(items)
    )


# ----------------------------------------------------------------------------- cells and header


def line_breaks(cell: str) -> int:
    """How many line breaks (``\\n``, ``\\r`` or ``\\r\\n``) a quoted cell holds."""
    if "\n" not in cell and "\r" not in cell:
        return 0
    return cell.count("\n") + cell.count("\r") - cell.count("\r\n")


def _count(n: int, noun: str) -> str:
    """``1 cell``, ``2 cells``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def to_float(cell: str) -> float | None:
    """Parse a cell as a float, or return None if it is not a number."""
    try:
        return float(cell)
    except ValueError:
        return None


def _cell_kind(text: str) -> int:
    """Whether a non-missing cell is a word, a finite float32 number, or another number."""
    value = to_float(text)
    if value is None:
        return _WORD
    return _NUMBER if abs(value) <= _FLOAT32_MAX else _NONFINITE


def _label_key(cell: str) -> tuple[str, float | str]:
    """A comparison key for a stripped label cell: numbers compare by value, words as text."""
    value = to_float(cell)
    if value is None or value != value:  # not a number, or nan (which equals nothing)
        return ("text", cell)
    return ("number", value)


def coded_distinct(
    reader: ColumnReader | LabelReader,
    distinct: Sequence[str],
    first: np.ndarray,
    inverse: np.ndarray,
    lines: Sequence[int],
    new_cell: Callable[[str, int], int],
) -> np.ndarray:
    """A block given by its distinct cells as :func:`_coded` codes it: ``distinct[k]`` occurs
    first on row ``first[k]``, and row ``i`` holds ``distinct[inverse[i]]``. New cells are met
    in the order of their first rows, as :func:`_coded` meets them, so the codes, categories
    and counts come out the same; only the distinct cells are looked at in Python."""
    get = reader.lookup.get
    mapping = np.empty(len(distinct), dtype=np.int32)
    for k in np.argsort(first, kind="stable").tolist():
        cell = distinct[k]
        code = get(cell, _UNSEEN)
        mapping[k] = new_cell(cell, int(lines[int(first[k])])) if code == _UNSEEN else code
    codes = mapping[inverse]
    missing = codes == -1
    n_missing = int(missing.sum())
    if n_missing:
        reader.missing += n_missing
        if reader.first_missing is None:
            i = int(np.argmax(missing))
            reader.first_missing = (int(lines[i]), distinct[int(inverse[i])])
    return codes


def _coded(
    reader: ColumnReader | LabelReader,
    cells: Sequence[str],
    lines: Sequence[int],
    new_cell: Callable[[str, int], int],
) -> list[int]:
    """A block of text cells as codes (-1 missing): known cells by ``reader.lookup``, new ones
    by ``new_cell``; the reader's missing count and first missing cell are updated."""
    get = reader.lookup.get
    codes = [get(cell, _UNSEEN) for cell in cells]
    if _UNSEEN in codes:
        for i, code in enumerate(codes):
            if code == _UNSEEN:
                codes[i] = new_cell(cells[i], lines[i])
    n_missing = codes.count(-1)
    if n_missing:
        reader.missing += n_missing
        if reader.first_missing is None:
            i = codes.index(-1)
            reader.first_missing = (lines[i], cells[i])
    return codes
