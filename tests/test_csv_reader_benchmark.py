"""The CSV reader benchmark runs on a small table and finds the two readers' tables equal."""

from __future__ import annotations

import pytest

from benchmarks.csv_reader import section


def test_the_benchmark_compares_equal_tables(monkeypatch):
    pytest.importorskip("pyarrow.csv")
    monkeypatch.delenv("SLATE_CSV_READER", raising=False)
    lines = section(rows=3_000, repeats=1)
    text = "\n".join(lines)
    assert "mixed, with an ID: equal; mixed, no ID: equal" in text
    assert sum("| slate, pyarrow |" in line for line in lines) == 2
