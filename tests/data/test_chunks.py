"""``read_table_chunks``: the same cells as ``read_table``, one block of rows at a time."""

from __future__ import annotations

import numpy as np
import pytest

from slate.data.readers import blocks as block_reading
from slate.data.readers.chunks import read_table_chunks
from slate.data.readers.delimited import read_table


def _cells(table, column):
    if column in table.numeric:
        return table.numeric[column]
    text = table.text[column]
    return np.array([*text.categories, ""], dtype=object)[text.codes]


@pytest.mark.parametrize("block_cells", [40, 100_000])
def test_chunks_concatenate_to_the_whole_table(tmp_path, monkeypatch, block_cells):
    rng = np.random.default_rng(0)
    lines = ["a,b,c,when,y"]
    for _ in range(500):
        b = rng.choice(["x", "y", ""])
        c = "" if rng.random() < 0.1 else str(rng.integers(0, 100))
        lines.append(f"{rng.normal():.5f},{b},{c},2024-01-{rng.integers(1, 28):02d},"
                     f"{int(rng.random() < 0.2)}")  # fmt: skip
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    whole = read_table(path, "y", "1", categorical_columns=["b"])
    monkeypatch.setattr(block_reading, "_BLOCK_CELLS", block_cells)
    chunks = list(read_table_chunks(path, "y", "1", categorical_columns=["b"]))
    assert len(chunks) > (5 if block_cells == 40 else 0)
    assert sum(c.rows for c in chunks) == whole.rows
    for column in whole.columns:
        joined = np.concatenate([_cells(c, column) for c in chunks])
        np.testing.assert_array_equal(joined, _cells(whole, column))
    np.testing.assert_array_equal(np.concatenate([c.y for c in chunks]), whole.y)
    np.testing.assert_array_equal(
        np.concatenate([c.first_lines for c in chunks]), whole.first_lines
    )


def test_a_header_only_file_is_one_empty_chunk(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("a,b\n")
    (chunk,) = read_table_chunks(path, "y", None)
    assert chunk.rows == 0 and chunk.columns == ("a", "b") and chunk.y is None
