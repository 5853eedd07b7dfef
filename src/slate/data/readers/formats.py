"""Text columns that are numbers in disguise: percentages, thousands separators, ISO dates.

A column read as text (:mod:`slate.data.readers.delimited`) whose every distinct value is one of
these formats is turned into a numeric column, and the table says so in a note:

* ``29.2%`` reads as ``29.2`` (plain numbers may be mixed in; at least one cell has ``%``);
* ``1,234,567.5`` reads as ``1234567.5`` (at least one cell has a separator);
* ``2024-03-01`` or ``2024-03-01T12:30:00`` reads as days since 1970-01-01 (``19783.52...``).

Only the distinct values are parsed, so the cost is that of the categories, not of the rows. A
column named in ``--categorical-columns`` stays text.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable

import numpy as np

__all__ = ["FORMATS", "parse_disguised_numbers"]

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_PERCENT = re.compile(rf"^({_NUMBER})\s*%$")
_PLAIN = re.compile(rf"^{_NUMBER}$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?$")
_EPOCH = dt.datetime(1970, 1, 1)
_DAY = 86_400.0


def _percent(cell: str) -> tuple[float, bool] | None:
    match = _PERCENT.match(cell)
    if match:
        return float(match.group(1)), True
    return (float(cell), False) if _PLAIN.match(cell) else None


def _thousands(cell: str) -> tuple[float, bool] | None:
    if _THOUSANDS.match(cell):
        return float(cell.replace(",", "")), True
    return (float(cell), False) if _PLAIN.match(cell) else None


def _iso_date(cell: str) -> tuple[float, bool] | None:
    if not _ISO_DATE.match(cell):
        return None
    try:
        moment = dt.datetime.fromisoformat(cell)
    except ValueError:
        return None
    return (moment - _EPOCH).total_seconds() / _DAY, True


#: name -> (parser of one cell: (value, whether the cell shows the format) or None, note).
FORMATS: dict[str, tuple[Callable[[str], tuple[float, bool] | None], str]] = {
    "percent": (_percent, "numbers written with '%'; read as numbers ('{example}' as {value})"),
    "thousands": (
        _thousands,
        "numbers written with thousands separators; read as numbers ('{example}' as {value})",
    ),
    "date": (_iso_date, "ISO dates; read as days since 1970-01-01 ('{example}' as {value})"),
}


def parse_disguised_numbers(
    categories: tuple[str, ...], codes: np.ndarray
) -> tuple[np.ndarray, str, str, str] | None:
    """The numeric column behind a text column's ``categories`` and ``codes`` (-1 missing):
    ``(values, format, example, note)``, or None when the values are not all of one format."""
    if not categories:
        return None
    for name, (parse, note) in FORMATS.items():
        parsed = []
        for category in categories:  # stop at the first value not in this format
            one = parse(category)
            if one is None:
                break
            parsed.append(one)
        if len(parsed) < len(categories) or not any(p[1] for p in parsed):
            continue
        numbers = np.array([p[0] for p in parsed] + [math.nan], dtype=np.float64)
        example = next(c for c, p in zip(categories, parsed, strict=True) if p[1])
        value = numbers[categories.index(example)]
        return numbers[codes], name, example, note.format(example=example, value=f"{value:g}")
    return None
