"""The report helpers of ``slate reproduce claims``: table rows without their formatting
entries, and rows as a CSV."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

__all__ = ["strip_private", "write_rows"]


def strip_private(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without their private (``_``) formatting entries."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """``rows`` as a CSV without their private entries; every key of any row is a column."""
    clean = strip_private(rows)
    columns = list(dict.fromkeys(k for r in clean for k in r))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(clean)
