"""``python -m benchmarks.csv_reader [--rows N] [--repeats R]``: how long slate takes to read a
mixed CSV table with its pure reader and with pyarrow, and pandas' ``read_csv`` as a reference.

The table is written to a temporary folder: an ID per row, an ISO date, six numbers with 2%
empty cells, a count, a percentage, a city (with ``NA`` cells), a note in free text (quoted
cells holding commas and quotes, empty cells), and labels ``1``/``-1``; CRLF line ends. A
second file is the same table without its ID column, whose one category per row costs the
same Python work in both readers. Each read is ``read_table(path, "label", "1")`` in this
process with ``SLATE_CSV_READER`` set to ``python`` or ``auto``; the readers take turns in each
repeat, so that a shared machine's load falls on all of them alike, and the two readers' tables
are checked to be equal. pandas (types inferred, no encoding into codes: not the same work) and
``pyarrow.csv.read_csv`` (cells split and typed by pyarrow alone) are references only. Printed:
the section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.machine import cpu_name
from slate.data.readers.arrow_records import READER_VARIABLE, ArrowRecords, open_records
from slate.data.readers.delimited import RawTable, read_table


def write_table(path: Path, rows: int, ids: bool = True, seed: int = 0) -> None:
    """The benchmark's mixed table (see the module docstring)."""
    rng = np.random.default_rng(seed)
    columns: dict[str, np.ndarray] = {}
    if ids:
        columns["id"] = np.char.add("ID-", np.char.zfill(np.arange(rows).astype(str), 7))
    start = dt.date(2015, 1, 1)
    dates = np.datetime64(start) + rng.integers(0, 3000, rows).astype("timedelta64[D]")
    columns["visit_date"] = dates.astype(str)
    for j in range(6):
        cells = np.char.mod("%.6g", rng.normal(size=rows)).astype(object)
        cells[rng.random(rows) < 0.02] = ""
        columns[f"x{j}"] = cells
    columns["count"] = rng.integers(0, 500, rows).astype(str)
    columns["share"] = np.char.mod("%.1f%%", rng.uniform(0, 100, rows))
    cities = np.array(["Lyon", "Paris", "Nantes", "Lille", "NA", "Saint-Étienne"])
    columns["city"] = cities[rng.integers(0, len(cities), rows)]
    notes = np.array(['"fine, thanks"', "ok", "", "call back", '"said ""no"""'], dtype=object)
    columns["note"] = notes[rng.integers(0, len(notes), rows)]
    columns["label"] = np.where(rng.random(rows) < 0.05, "1", "-1")
    body = [",".join(map(str, row)) for row in zip(*columns.values(), strict=True)]
    path.write_text("\r\n".join([",".join(columns), *body]) + "\r\n", newline="")


def _equal(a: RawTable, b: RawTable) -> bool:
    for field in dataclasses.fields(RawTable):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if field.name == "numeric":
            if x.keys() != y.keys() or not all(np.array_equal(x[k], y[k], True) for k in x):
                return False
        elif field.name == "text":
            if x.keys() != y.keys() or not all(
                x[k].categories == y[k].categories and np.array_equal(x[k].codes, y[k].codes)
                for k in x
            ):
                return False
        elif isinstance(x, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


def _slate(path: Path, reader: str) -> Callable[[], object]:
    def read() -> RawTable:
        os.environ[READER_VARIABLE] = reader
        return read_table(path, "label", "1")

    return read


def _references(path: Path) -> dict[str, Callable[[], object]]:
    found: dict[str, Callable[[], object]] = {}
    try:
        import pyarrow.csv as pa_csv

        found["pyarrow.csv.read_csv alone"] = lambda: pa_csv.read_csv(path)
    except ImportError:
        pass
    try:
        import pandas as pd

        found["pandas.read_csv"] = lambda: pd.read_csv(path)
    except ImportError:
        pass
    return found


def measure(path: Path, repeats: int) -> tuple[dict[str, list[float]], bool]:
    """Seconds per read of each reader over ``repeats`` turns, and whether slate's two readers
    gave equal tables."""
    with open_records(str(path), "utf-8", None) as records:
        if not isinstance(records, ArrowRecords):
            raise SystemExit(f"pyarrow does not read {path}: install it (pip install pyarrow)")
    readers = {"slate, pure Python": _slate(path, "python"), "slate, pyarrow": _slate(path, "auto")}
    readers |= _references(path)
    seconds: dict[str, list[float]] = {name: [] for name in readers}
    tables: dict[str, object] = {}
    for _ in range(repeats):
        for name, read in readers.items():
            start = time.perf_counter()
            tables[name] = read()
            seconds[name].append(time.perf_counter() - start)
    os.environ.pop(READER_VARIABLE, None)
    same = _equal(tables["slate, pure Python"], tables["slate, pyarrow"])  # type: ignore[arg-type]
    return seconds, same


def _versions() -> str:
    cpu = cpu_name()
    found = [f"Python {platform.python_version()}", f"numpy {np.__version__}"]
    for module in ("pyarrow", "pandas"):
        try:
            found.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            found.append(f"no {module}")
    return f"{cpu}, {os.cpu_count()} logical cores, {', '.join(found)}"


def section(rows: int, repeats: int) -> list[str]:
    """The markdown lines of the benchmark's section."""
    lines = [
        "\n## Reading a CSV table: the pure reader, pyarrow, pandas\n",
        f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {_versions()}.\n",
        "| table | reader | median s | min s | pure / this (median) | MB / s |",
        "|---|---|---|---|---|---|",
    ]
    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        for ids, what in ((True, "mixed, with an ID"), (False, "mixed, no ID")):
            path = Path(tmp) / f"table_{int(ids)}.csv"
            write_table(path, rows, ids=ids)
            megabytes = path.stat().st_size / 1e6
            seconds, same = measure(path, repeats)
            checks.append(f"{what}: {'equal' if same else 'NOT EQUAL'}")
            pure = statistics.median(seconds["slate, pure Python"])
            for name, times in seconds.items():
                median = statistics.median(times)
                lines.append(
                    f"| {what} ({rows:,} rows, {megabytes:.0f} MB) | {name} | {median:.2f} | "
                    f"{min(times):.2f} | {pure / median:.2f}x | {megabytes / median:.0f} |"
                )
            if not same:
                raise SystemExit("the two readers' tables differ:\n" + "\n".join(lines))
    lines.append(
        f"\n`python -m benchmarks.csv_reader --rows {rows} --repeats {repeats}` (one process, "
        "the readers taking turns in each repeat; tables compared: "
        f"{'; '.join(checks)}). The two slate rows are `read_table(path, 'label', '1')` with "
        "`SLATE_CSV_READER=python` and with pyarrow; the pandas and `pyarrow.csv` rows are "
        "references that infer types and encode nothing."
    )
    return lines


def main() -> None:
    """Print the section's lines."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.csv_reader")
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(section(args.rows, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
