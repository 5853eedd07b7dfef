r"""A declared data dictionary (``--schema FILE``): the table's columns, kinds and categories,
held by every site, so that the encoding needs nothing from anyone's rows.

Without it, the sites learn a table's one-hot columns from each other's rows: every site sends
every other site the names and counts of the categories of its text columns
(:func:`slate.data.encoding.fit_features`). With ``--schema FILE``, the category vocabularies
come from the file: **no category name or count is sent**, and a numeric column whose mean and
standard deviation the file declares is imputed and scaled with them, without any sum. The
file is JSON (``docs/data.md`` has an example)::

    {
      "slate_schema": 1,
      "label": {"column": "income", "positive": ">50K"},
      "columns": [
        {"name": "age", "type": "numeric", "mean": 38.6, "std": 13.6},
        {"name": "hours", "type": "numeric"},
        {"name": "workclass", "type": "text", "categories": ["Private", "State-gov"],
         "missing": true, "other": true}
      ]
    }

The rules:

* ``columns`` lists the feature columns, in the order of the model's input; a file column it
  does not list (the label aside) is not a feature. ``--id-column``, ``--drop-columns`` and
  ``--feature-columns`` still apply to the listed ones. Every listed column must be in every
  file, of its kind: a ``text`` column is read as text even if its cells are numbers (zip
  codes), a ``numeric`` column whose cells are not numbers is refused.
* A ``text`` column is one-hot encoded into its ``categories`` in the file's order, then
  ``<missing>`` (``"missing"``, default ``true``) and ``<other>`` (``"other"``, default
  ``true``). A cell whose value is not listed goes to ``<other>``, and the site warns, naming
  the file, the column, the number of cells and up to three of the values (the warning stays at
  that site). With ``"other": false`` such a cell is refused instead, as is a missing cell with
  ``"missing": false``: the site stops with one paragraph naming the file, the column and the
  count, before anything is sent. ``--max-categories`` and ``--min-frequency`` do not apply: the
  file's list is the vocabulary.
* A ``numeric`` column may declare ``mean`` and ``std`` (both or neither, ``std >= 0``): a missing
  cell takes ``mean``, and ``--standardize`` z-scores with ``mean`` and ``std`` (a ``std`` of 0
  divides by 1). Without them, the column's statistics are summed over the sites as without a
  schema (under a roster, sums that reveal only their total). ``"missing": true`` adds the
  indicator column ``<name>_missing``; without the key, a column with summed statistics gets it
  when at least 1% of the training cells are missing (as without a schema), a column with
  declared statistics never.
* A ``numeric`` column may declare ``range`` (``[lo, hi]``): the values every site's training
  cells lie in. A site declares it in place of its own smallest and largest values, so that
  the checks of summed statistics (:mod:`slate.data.declared`) need nothing from its rows; a
  site whose cells leave the range stops before anything is sent, with one paragraph naming
  the file, the column and the value. A column with summed statistics and no ``range`` is
  declared with the site's own range (which every site then receives); a column with declared
  ``mean`` and ``std`` is not summed and declares none.
* ``label``: the label column and the positive label, used where ``--label-column`` and
  ``--positive-label`` are not given (given, they must be the same).

* Under ``--dp-epsilon`` nothing is fitted on the rows: every numeric feature column needs a
  ``range`` or ``mean`` and ``std`` (:meth:`DictionaryColumn.public_centre`,
  :meth:`~DictionaryColumn.public_scale`), a site declares the file's ranges only
  (:meth:`DataDictionary.public_ranges`), and a cell outside its ``range`` is clipped into it,
  with a note at that site only (:meth:`DataDictionary.clipping_note`).

Every site must hold the same file, byte for byte: its sha256 is part of each site's schema,
compared first, before any other exchange, and of the run settings compared before step 1
(:mod:`slate.training.agreement`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from slate.errors import ConfigError, DataError

__all__ = [
    "FORMAT_KEY",
    "DataDictionary",
    "DictionaryColumn",
    "SchemaFileError",
    "dictionary_of",
    "label_flags",
    "read_dictionary",
]

FORMAT_KEY = "slate_schema"
FORMAT = 1
MISSING = "<missing>"  # slate.data.encoding's names of the extra one-hot columns
OTHER = "<other>"
KINDS = ("numeric", "text")
EXAMPLES = 3  # values named in a warning about unlisted categories
_TOP_KEYS = {FORMAT_KEY, "label", "columns", "description"}
_COLUMN_KEYS = {
    "numeric": {"name", "type", "mean", "std", "range", "missing", "description"},
    "text": {"name", "type", "categories", "missing", "other", "description"},
}


class SchemaFileError(ConfigError):
    """A ``--schema`` file that cannot be read, or does not describe a table as documented."""


@dataclass(frozen=True)
class DictionaryColumn:
    """One declared feature column (module docstring).

    Attributes:
        name: the column's header name.
        kind: ``numeric`` or ``text``.
        categories: text: the one-hot columns' values, in order.
        missing: text: a ``<missing>`` column (else a missing cell is refused); numeric: the
            indicator column ``<name>_missing`` (``None``: the 1% rule on summed statistics).
        other: text: an ``<other>`` column for unlisted values (else they are refused).
        mean, std: numeric: the declared statistics (``None``: summed over the sites).
        range: numeric: the declared ``(lo, hi)`` of every site's cells (``None``: each site
            declares its own).
    """

    name: str
    kind: str
    categories: tuple[str, ...] = ()
    missing: bool | None = None
    other: bool = True
    mean: float | None = None
    std: float | None = None
    range: tuple[float, float] | None = None

    @property
    def one_hot(self) -> list[str]:
        """A text column's one-hot values: its categories, then ``<missing>``, ``<other>``."""
        return [*self.categories, *([MISSING] if self.missing else []),
                *([OTHER] if self.other else [])]  # fmt: skip

    @property
    def public(self) -> bool:
        """Whether a numeric column's imputation and scaling can come from the file alone (a
        declared ``mean`` and ``std``, or a ``range``): what ``--dp-epsilon`` needs."""
        return self.mean is not None or self.range is not None

    def public_centre(self, path: str) -> float:
        """A numeric column's imputed value and centre from the file alone: its ``mean``, else
        the middle of its ``range``; ``path`` names the file where it has neither."""
        if self.mean is not None:
            return self.mean
        if self.range is None:
            raise SchemaFileError(
                f'{path}: column {self.name!r} declares neither "mean" and "std" nor '
                '"range": under --dp-epsilon its missing cells and scale must come from the '
                "schema file, never from the rows."
            )
        return (self.range[0] + self.range[1]) / 2

    def public_scale(self) -> float:
        """A numeric column's scale from the file alone: its ``std`` (1 for a ``std`` of 0),
        else half the width of its ``range`` (so that the range maps onto [-1, 1])."""
        if self.mean is not None:
            return float(self.std) if self.std else 1.0
        lo, hi = self.range or (-1.0, 1.0)
        return (hi - lo) / 2 if hi > lo else 1.0


@dataclass(frozen=True)
class DataDictionary:
    """A ``--schema`` file, read and checked (:func:`read_dictionary`).

    Attributes:
        path: the file as given.
        digest: the sha256 of its bytes (hex), compared by every site.
        label_column, positive_label: the label.
        columns: the feature columns, in order.
    """

    path: str
    digest: str
    label_column: str
    positive_label: str
    columns: tuple[DictionaryColumn, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def text_columns(self) -> list[str]:
        return [c.name for c in self.columns if c.kind == "text"]

    def declared_ranges(
        self, own: dict[str, list[float] | None], path: str
    ) -> dict[str, list[float] | None]:
        """What a site declares of its numeric columns (``own``: its ranges, from the training
        file ``path``): a listed column's ``range`` where it has one (``own`` must lie in it,
        else :class:`~slate.errors.DataError`), none where its statistics are declared (it is
        not summed), the site's own otherwise; columns the dictionary does not list are not
        features and declare nothing."""
        listed = {c.name: c for c in self.columns if c.kind == "numeric"}
        out: dict[str, list[float] | None] = {}
        for name, span in own.items():
            column = listed.get(name)
            if column is None or column.mean is not None:
                continue
            if column.range is None:
                out[name] = span
                continue
            lo, hi = column.range
            if span is not None and (span[0] < lo or span[1] > hi):
                value = span[0] if span[0] < lo else span[1]
                raise DataError(
                    f"{path}: column {name!r} holds {value:g}, outside the range [{lo:g}, "
                    f"{hi:g}] that the schema file {self.path} declares for it. Correct the "
                    "cell, or widen the range in the schema file every site holds."
                )
            out[name] = [lo, hi]
        return out

    def public_ranges(self) -> dict[str, list[float] | None]:
        """What a site declares of its numeric columns under ``--dp-epsilon``: the file's
        ``range`` where it has one, nothing of its own rows (its cells outside are clipped
        into it: :meth:`clipping_note`)."""
        return {c.name: list(c.range) for c in self.columns if c.kind == "numeric" and c.range}

    def clipping_note(self, table: Any) -> str | None:
        """This site's own note on the cells of ``table`` outside their column's declared
        ``range``, which ``--dp-epsilon`` clips into it (``None``: none was). Never sent: a
        refusal, or anything sent about them, would tell the other sites such a row exists."""
        found = []
        for column in self.columns:
            if column.kind != "numeric" or column.range is None:
                continue
            values = table.numeric.get(column.name)
            if values is None:
                continue
            lo, hi = column.range
            with np.errstate(invalid="ignore"):
                outside = values[(values < lo) | (values > hi)]
            if outside.size:
                found.append(
                    f"{outside.size} in {column.name!r} (from {outside.min():g} to "
                    f"{outside.max():g}, into [{lo:g}, {hi:g}])"
                )
        if not found:
            return None
        return (
            f"note: {table.path}: cells outside the range the schema {self.path} declares were "
            f"clipped into it: {'; '.join(found)}. Only this site is told: nothing about these "
            "cells is sent."
        )

    def without_public_constants(self, features: Any = None) -> list[str]:
        """The numeric columns (among ``features``, ``None``: all) that declare neither
        ``mean`` and ``std`` nor ``range``: under ``--dp-epsilon`` they have nothing to be
        imputed and scaled with."""
        return [c.name for c in self.columns if c.kind == "numeric" and not c.public
                and (features is None or c.name in features)]  # fmt: skip

    def column(self, name: str) -> DictionaryColumn:
        return next(c for c in self.columns if c.name == name)

    def check_table(self, table: Any) -> Any:
        """``table`` (a :class:`~slate.data.readers.table.RawTable`) against this dictionary:
        every listed column present and of its kind, no refused cell. Returns the table with a
        warning in its notes per text column holding values that go to ``<other>``; raises a
        :class:`~slate.errors.DataError` naming the file, the schema and the column."""
        where = f"{table.path} (read with --schema {self.path})"
        absent = [c for c in self.names if c not in table.columns]
        if absent:
            raise DataError(
                f"{where} has no column {', '.join(map(repr, absent))}, which the schema lists; "
                f"its columns are {', '.join(map(repr, table.columns))}. Every site's files "
                "must hold every column of the schema (by header name)."
            )
        for column in self.columns:
            if column.kind == "numeric" and column.name in table.text:
                examples = ", ".join(map(repr, table.text[column.name].categories[:EXAMPLES]))
                raise DataError(
                    f"{where}: column {column.name!r} holds text ({examples}), but the schema "
                    "declares it numeric. Fix the cells, or declare the column as text with "
                    "its categories."
                )
        notes = list(table.notes)
        for column in self.columns:
            if column.kind == "text":
                note = self._unlisted(table, column, where)
                if note:
                    notes.append(note)
        return replace(table, notes=tuple(notes))

    def _unlisted(self, table: Any, column: DictionaryColumn, where: str) -> str | None:
        """The warning about ``column``'s cells whose value is not listed (``None``: none), or
        the refusal of such cells and of missing cells the column does not allow."""
        col = table.text[column.name]
        listed = set(column.categories)
        unlisted = np.array([v not in listed for v in col.categories] + [False], dtype=bool)
        counts = np.bincount(col.codes + 1, minlength=len(col.categories) + 1)
        missing = int(counts[0])
        if missing and not column.missing:
            raise DataError(
                f"{where}: column {column.name!r} has {missing} missing cell"
                f"{'s' if missing != 1 else ''}, but the schema gives it no <missing> category "
                '("missing": false). Fill them, or set "missing": true in the schema (on '
                "every site: it changes the file's sha256)."
            )
        values = [v for v, new in zip(col.categories, unlisted[:-1], strict=True) if new]
        if not values:
            return None
        cells = int(sum(counts[k + 1] for k, new in enumerate(unlisted[:-1]) if new))
        shown = ", ".join(map(repr, values[:EXAMPLES])) + (", ..." if len(values) > EXAMPLES
                                                           else "")  # fmt: skip
        what = (f"{cells} cell{'s' if cells != 1 else ''} of column {column.name!r} "
                f"hold{'s' if cells == 1 else ''} {len(values)} value"
                f"{'s' if len(values) != 1 else ''} that the schema does not list "
                f"({shown})")  # fmt: skip
        if not column.other:
            raise DataError(
                f'{where}: {what}, and the column has no <other> category ("other": false). '
                'Correct the cells, or add the values to the column\'s "categories" (on every '
                "site: it changes the file's sha256)."
            )
        return (
            f"warning: {where}: {what}; {'it is' if cells == 1 else 'they are'} encoded as <other>."
        )


def read_dictionary(path: str) -> DataDictionary:
    """The ``--schema`` file at ``path``, checked (module docstring); a
    :class:`SchemaFileError` names the file and the key."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise SchemaFileError(
            f"The schema file {path} (--schema) does not exist. Give the data dictionary every "
            "site holds (docs/data.md; 'slate schema' writes one from a file)."
        ) from None
    except OSError as err:
        raise SchemaFileError(
            f"Cannot read the schema file {path} (--schema): {err.strerror or err}."
        ) from None
    try:
        content = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise SchemaFileError(
            f"The schema file {path} (--schema) is not UTF-8 text (byte {err.start}); it must "
            "be a JSON object (docs/data.md)."
        ) from None
    except json.JSONDecodeError as err:
        raise SchemaFileError(
            f"The schema file {path} (--schema) is not valid JSON: {err.msg} at line "
            f"{err.lineno} column {err.colno}. It must be one JSON object (docs/data.md)."
        ) from None
    return _parse(path, hashlib.sha256(raw).hexdigest(), content)


def _parse(path: str, digest: str, content: Any) -> DataDictionary:
    def bad(key: str, problem: str) -> SchemaFileError:
        return SchemaFileError(
            f"The schema file {path} (--schema): {key} {problem}. See docs/data.md for the "
            "format; every site must hold the same file."
        )

    if not isinstance(content, dict):
        raise bad("the top level", f"must be a JSON object, not {_kind(content)}")
    unknown = sorted(set(content) - _TOP_KEYS)
    if unknown:
        raise bad(f"the key {unknown[0]!r}", f"is not known (known: {sorted(_TOP_KEYS)})")
    if content.get(FORMAT_KEY) != FORMAT:
        raise bad(f"{FORMAT_KEY!r}", f"must be {FORMAT}, got {content.get(FORMAT_KEY)!r}")
    label = content.get("label")
    if not isinstance(label, dict):
        raise bad("'label'", "must be an object {\"column\": NAME, \"positive\": VALUE}; it is "
                  + ("missing" if label is None else _kind(label)))  # fmt: skip
    for key in ("column", "positive"):
        if not isinstance(label.get(key), str) or not label[key].strip():
            raise bad(
                f"'label.{key}'",
                "must be a non-empty string"
                + ("; it is missing" if key not in label else f", got {label[key]!r}"),
            )
    extra = sorted(set(label) - {"column", "positive"})
    if extra:
        raise bad(f"'label.{extra[0]}'", "is not known (known: 'column', 'positive')")
    columns = content.get("columns")
    if not isinstance(columns, list) or not columns:
        raise bad("'columns'", "must be a non-empty list of column objects; it is "
                  + ("missing" if columns is None else _kind(columns)))  # fmt: skip
    parsed: list[DictionaryColumn] = []
    for k, entry in enumerate(columns):
        parsed.append(_column(entry, f"columns[{k}]", bad))
    names = [c.name for c in parsed]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise bad("'columns'", f"name the column {repeated[0]!r} more than once")
    if label["column"].strip() in names:
        raise bad("'columns'", f"list the label column {label['column']!r} as a feature")
    return DataDictionary(path, digest, label["column"].strip(), label["positive"].strip(),
                          tuple(parsed))  # fmt: skip


def _column(entry: Any, key: str, bad: Any) -> DictionaryColumn:
    if not isinstance(entry, dict):
        raise bad(key, f"must be an object with 'name' and 'type', not {_kind(entry)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise bad(f"{key}.name", "must be the column's header name, a non-empty string; it is "
                  + ("missing" if name is None else repr(name)))  # fmt: skip
    key = f"{key} ({name!r})"
    kind = entry.get("type")
    if kind not in KINDS:
        raise bad(f"{key}.type", f"must be 'numeric' or 'text', got {kind!r}")
    unknown = sorted(set(entry) - _COLUMN_KEYS[kind])
    if unknown:
        raise bad(f"{key}.{unknown[0]}", f"is not known for a {kind} column (known: "
                  f"{sorted(_COLUMN_KEYS[kind])})")  # fmt: skip
    missing = entry.get("missing")
    if missing is not None and not isinstance(missing, bool):
        raise bad(f"{key}.missing", f"must be true or false, got {missing!r}")
    if kind == "text":
        categories = entry.get("categories")
        if not isinstance(categories, list) or not categories:
            raise bad(f"{key}.categories", "must be a non-empty list of strings; it is "
                      + ("missing" if categories is None else _kind(categories)))  # fmt: skip
        for value in categories:
            if not isinstance(value, str) or not value.strip() or value != value.strip():
                raise bad(f"{key}.categories", "must hold non-empty strings without surrounding "
                          f"spaces (cells are read stripped), got {value!r}")  # fmt: skip
            if value in (MISSING, OTHER):
                raise bad(f"{key}.categories", f"must not list {value!r}: use \"missing\" and "
                          "\"other\" (true or false)")  # fmt: skip
        if len(set(categories)) < len(categories):
            twice = next(v for v in categories if categories.count(v) > 1)
            raise bad(f"{key}.categories", f"list {twice!r} more than once")
        other = entry.get("other", True)
        if not isinstance(other, bool):
            raise bad(f"{key}.other", f"must be true or false, got {other!r}")
        return DictionaryColumn(name.strip(), kind, tuple(categories),
                                True if missing is None else missing, other)  # fmt: skip
    stats = {s: entry.get(s) for s in ("mean", "std")}
    given = [s for s, v in stats.items() if v is not None]
    if len(given) == 1:
        other_key = "std" if given[0] == "mean" else "mean"
        raise bad(f"{key}.{other_key}", f"must be given with {given[0]!r} (both or neither)")
    for s, v in stats.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v)):  # fmt: skip
            raise bad(f"{key}.{s}", f"must be a finite number, got {v!r}")
    if stats["std"] is not None and stats["std"] < 0:
        raise bad(f"{key}.std", f"must be at least 0, got {stats['std']!r}")
    mean, std = (None if v is None else float(v) for v in stats.values())
    return DictionaryColumn(name.strip(), kind, missing=missing, mean=mean, std=std,
                            range=_range(entry.get("range"), f"{key}.range", bad))  # fmt: skip


def _range(value: Any, key: str, bad: Any) -> tuple[float, float] | None:
    """A numeric column's declared ``[lo, hi]`` (finite, ``lo <= hi``), or None."""
    if value is None:
        return None
    numbers = isinstance(value, list) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in value
    )  # fmt: skip
    if not numbers or value[0] > value[1]:
        raise bad(key, f"must be [lo, hi], two finite numbers with lo <= hi, got {value!r}")
    return float(value[0]), float(value[1])


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false",
             type(None): "null", int: "a number", float: "a number"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def dictionary_of(
    table: Any, positive_label: str, features: list[str], statistics: bool = False
) -> dict[str, Any]:
    """The dictionary of one site's ``table`` (a :class:`~slate.data.readers.table.RawTable`)
    as JSON, for ``slate schema``: its ``features`` in file order, every text column's
    categories sorted (``"missing"``: whether a cell is missing here; ``"other": true``),
    every numeric column's ``range`` (its smallest and largest value here), and with
    ``statistics`` each numeric column's mean and population std (missing cells left out) and
    ``"missing"`` where at least 1% of its cells are missing.

    The categories and statistics are this site's: the other sites' values are not in it, and
    a site that sends the file to others shows them its categories (docs/security.md).
    """
    columns: list[dict[str, Any]] = []
    for name in features:
        if name in table.text:
            col = table.text[name]
            columns.append({"name": name, "type": "text", "categories": sorted(col.categories),
                            "missing": bool((col.codes < 0).any()), "other": True})  # fmt: skip
            continue
        entry: dict[str, Any] = {"name": name, "type": "numeric"}
        values = table.numeric[name]
        present = values[~np.isnan(values)]
        if present.size:
            entry["range"] = [float(present.min()), float(present.max())]
        if statistics:
            if present.size == 0:
                raise DataError(f"Column {name!r} of {table.path} holds no value: it has no mean.")
            entry["mean"] = float(present.mean())
            entry["std"] = float(present.std())
            entry["missing"] = bool(np.isnan(values).mean() >= 0.01)
        columns.append(entry)
    return {
        FORMAT_KEY: FORMAT,
        "label": {"column": table.label_name, "positive": str(positive_label).strip()},
        "columns": columns,
    }


def label_flags(
    dictionary: DataDictionary, label_column: Any, positive_label: Any
) -> tuple[str, str]:
    """``(label column, positive label)``: the flags' where given, else the dictionary's; a flag
    that names another label than the dictionary's is a :class:`SchemaFileError`."""
    pairs = (
        ("--label-column", label_column, dictionary.label_column, "label.column"),
        ("--positive-label", positive_label, dictionary.positive_label, "label.positive"),
    )
    for flag, given, declared, key in pairs:  # fmt: skip
        if given is not None and str(given).strip() != declared:
            raise SchemaFileError(
                f"{flag} {given!r} differs from the schema file {dictionary.path}'s {key} "
                f"{declared!r}. Give the schema's value, or leave {flag} out to take it."
            )
    return dictionary.label_column, dictionary.positive_label
