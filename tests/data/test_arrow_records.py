"""The optional pyarrow reader gives what the pure reader gives: the same tables, chunks, notes
and error messages, and it steps aside (for the pure reader) wherever it could differ."""

from __future__ import annotations

import dataclasses
import gzip
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from slate.data.readers import arrow_records
from slate.data.readers.arrow_records import READER_VARIABLE, ArrowRecords, open_records
from slate.data.readers.chunks import read_table_chunks
from slate.data.readers.delimited import RawTable, read_csv_table, read_table
from slate.data.readers.libsvm import read_libsvm
from slate.data.readers.text_records import TextRecords
from slate.errors import DataError

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture
def arrow():
    """Skips the test when pyarrow is not installed."""
    return pytest.importorskip("pyarrow.csv")


def _same(a: RawTable, b: RawTable) -> None:
    for field in dataclasses.fields(RawTable):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if field.name == "numeric":
            assert x.keys() == y.keys()
            for key in x:  # bit for bit (the sign of a zero, NaN's payload)
                assert x[key].dtype == y[key].dtype == np.float64
                np.testing.assert_array_equal(x[key].view(np.uint64), y[key].view(np.uint64))
        elif field.name == "text":
            assert x.keys() == y.keys()
            for key in x:
                assert x[key].categories == y[key].categories, key
                np.testing.assert_array_equal(x[key].codes, y[key].codes, err_msg=key)
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x is not None and y is not None and x.dtype == y.dtype, field.name
            np.testing.assert_array_equal(x, y, err_msg=field.name)
        else:
            assert x == y, field.name


def _both(monkeypatch, read):
    """``read()`` with the pure reader, then with pyarrow allowed: both results (or errors)."""
    out = []
    for choice in ("python", "auto"):
        monkeypatch.setenv(READER_VARIABLE, choice)
        try:
            out.append(read())
        except DataError as err:
            out.append(err)
    return out


def _same_error(monkeypatch, read) -> str:
    pure, fast = _both(monkeypatch, read)
    assert isinstance(pure, DataError) and isinstance(fast, DataError), (pure, fast)
    assert str(pure) == str(fast)
    return str(pure)


def _messy(path: Path, rows: int, seed: int = 0, bom: bool = True) -> None:
    """An ID, a date, free text (quoted delimiters and quotes), missing cells spelt several
    ways, percentages, padded numbers, a column that turns to text after many rows, labels
    '1'/'-1', CRLF line ends, and a header behind a byte-order mark."""
    rng = random.Random(seed)
    words = ["ok", '"late, again"', '"said ""no"""', "", "call back", " spaced ", "Étienne"]
    lines = ["id,visit,note,pct,amount,code,late_text,label"]
    for i in range(rows):
        amount = rng.choice(["", "NA", "?", f"{rng.gauss(0, 1e3):.4f}", f" {rng.randint(-9, 9)} "])
        late = str(rng.randint(0, 99)) if i < 2 * rows // 3 else rng.choice(["n/a-word", "x"])
        lines.append(
            f"ID-{i:06d},2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},"
            f"{rng.choice(words)},{rng.uniform(0, 100):.1f}%,{amount},{rng.randint(1, 4)},"
            f"{late},{'1' if rng.random() < 0.1 else '-1'}"
        )
    text = "\r\n".join(lines) + "\r\n"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))


def test_pyarrow_reads_a_messy_table_as_the_pure_reader_does(tmp_path, monkeypatch, arrow):
    path = tmp_path / "messy.csv"
    _messy(path, 30_000)  # three blocks of rows, a column read again as text
    monkeypatch.delenv(READER_VARIABLE, raising=False)
    with open_records(str(path), "utf-8", None) as records:
        assert isinstance(records, ArrowRecords)
    pure, fast = _both(
        monkeypatch,
        lambda: read_table(path, "label", "1", categorical_columns=["code"], na_values=["n/a"]),
    )
    _same(pure, fast)
    assert {"ok", "late, again", 'said "no"', "spaced"} <= set(pure.text["note"].categories)
    assert pure.missing["amount"] > 0 and "late_text" in pure.text and pure.notes


def test_chunks_and_their_listed_bad_cells_are_the_same(tmp_path, monkeypatch, arrow):
    path = tmp_path / "score.csv"
    _messy(path, 30_000, seed=3, bom=False)
    read = lambda: list(  # noqa: E731
        read_table_chunks(
            path, "label", "1", numeric_columns=["late_text", "amount"], keep_going=True
        )
    )
    pure, fast = _both(monkeypatch, read)
    assert len(pure) == len(fast) > 2
    for a, b in zip(pure, fast, strict=True):
        _same(a, b)
    assert any(cell.value == "n/a-word" for chunk in pure for cell in chunk.bad_cells)


def test_a_numeric_table_reads_alike_through_the_strict_reader(tmp_path, monkeypatch, arrow):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(5_000, 4)) * 10.0 ** rng.integers(-30, 30, size=(5_000, 4))
    rows = [
        ",".join(f"{v!r}" for v in row) + f",{i % 7 == 0:d}"
        for i, row in enumerate(values.tolist())
    ]
    path = tmp_path / "numbers.csv"
    path.write_text("a,b,c,d,y\n" + "\n".join(rows) + "\n")
    pure, fast = _both(monkeypatch, lambda: read_csv_table(path, "y", "1"))
    np.testing.assert_array_equal(pure.x.view(np.uint32), fast.x.view(np.uint32))
    np.testing.assert_array_equal(pure.y, fast.y)
    assert pure.feature_names == fast.feature_names


@pytest.mark.skipif(not (SHARED / "w7a" / "w7a.gz").is_file(), reason="w7a not in shared/data")
def test_real_rows_written_as_csv_read_alike(tmp_path, monkeypatch, arrow):
    x, y = read_libsvm(SHARED / "w7a" / "w7a.gz", n_features=300)
    path = tmp_path / "w7a.csv"
    cells = [",".join(map(str, row)) + f",{label}" for row, label in zip(x[:, :40], y, strict=True)]
    names = ",".join(f"f{j}" for j in range(40))
    path.write_text(f"{names},label\n" + "\n".join(cells) + "\n")
    pure, fast = _both(monkeypatch, lambda: read_table(path, "label", "1"))
    _same(pure, fast)


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (b"a,b,y\n1,2,1\n3,x,0\n" + b"4,5,0\n" * 20, "line 3"),  # a word among numbers
        (b"a,b,y\n1,2,1\n3,4\n", "line 3"),  # a short row
        (b'a,b,y\n1,2,1\n"3"4,5,0\n', "line 3"),  # quoting that pyarrow would accept
        (b'a,b,y\n1,2,1\n"3,5,0\n', "line 3"),  # a quote never closed
        (b"a,b,y\n1,2,1\n\n3,\xff,0\n", "line 4"),  # undecodable, after a blank line
        (b'a,b,y\n"1\n2",2,1\n3,,0\n', "line 4"),  # a missing cell after a two-line record
    ],
)
def test_a_bad_file_gets_the_same_message(tmp_path, monkeypatch, arrow, content, where):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    message = _same_error(monkeypatch, lambda: read_csv_table(path, "y", "1"))
    assert where in message and str(path) in message


@pytest.mark.parametrize(
    ("name", "content", "options"),
    [
        ("blank.csv", b"a,b\n1,2\n\n3,4\n", {}),
        ("lone_cr.csv", b"a,b\r1,2\r3,4\r", {}),
        ("multiline.csv", b'a,b\n"x\ny",2\n3,4\n', {}),
        ("odd_quote.csv", b'a,b\n"x"y,2\n3,4\n', {}),
        ("one_column.csv", b"a\n1\n  \n2\n", {}),
        ("nul.csv", b"a,b\n1,\x002\n", {}),
        ("latin.csv", "a,b\né,2\n".encode("latin-1"), {"encoding": "latin-1"}),
        ("spaces.csv", b"a  b\n1 2\n", {"delimiter": "whitespace"}),
    ],
)
def test_files_pyarrow_could_read_differently_go_to_the_pure_reader(
    tmp_path, arrow, name, content, options
):
    path = tmp_path / name
    path.write_bytes(content)
    assert ArrowRecords.open(str(path), options.get("encoding", "utf-8"),
                             options.get("delimiter")) is None  # fmt: skip


def test_gzip_is_read_alike(tmp_path, monkeypatch, arrow):
    plain = tmp_path / "t.csv"
    _messy(plain, 2_000)
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(plain.read_bytes()))
    assert isinstance(ArrowRecords.open(str(path), "utf-8", None), ArrowRecords)
    _same(*_both(monkeypatch, lambda: read_table(path, "label", "1")))
    path.write_bytes(gzip.compress(plain.read_bytes())[:-20])  # truncated: the pure reader's
    assert ArrowRecords.open(str(path), "utf-8", None) is None
    assert "gzip" in _same_error(monkeypatch, lambda: read_table(path, "label", "1"))


def test_a_file_over_max_bytes_goes_to_the_pure_reader(tmp_path, arrow):
    path = tmp_path / "t.csv"
    path.write_bytes(b"a,b\n1,2\n" * 100)
    assert isinstance(open_records(str(path), "utf-8", None), ArrowRecords)
    assert isinstance(open_records(str(path), "utf-8", None, max_bytes=100), TextRecords)


def _cells(records) -> list[tuple[int, list[str]]]:
    out = []
    while True:
        lines, rows = records.block(7)
        if not rows:
            return out
        out += list(zip(lines, rows, strict=True))


def test_random_quoting_parses_to_the_same_cells_or_is_left_to_csv(tmp_path, arrow):
    rng = random.Random(7)
    pieces = ['"', '""', ",", "a", " ", "1", "é", "\n"]
    used = 0
    for case in range(1500):
        lines = [
            ",".join("".join(rng.choices(pieces, k=rng.randint(0, 4))) for _ in range(2))
            + rng.choice(["\n", "\r\n"])
            for _ in range(rng.randint(1, 4))
        ]
        body = "".join(lines)[: None if rng.random() < 0.8 else -1]
        path = tmp_path / f"{case}.csv"
        path.write_text("x,y\n" + body, newline="")
        fast = ArrowRecords.open(str(path), "utf-8", ",")
        if fast is None:
            continue
        used += 1
        with fast, TextRecords(str(path), "utf-8", ",") as pure:
            assert _cells(fast) == _cells(pure), repr(body)
    assert used > 100


def test_without_pyarrow_the_pure_reader_reads(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow fails, as if absent
    monkeypatch.delenv(READER_VARIABLE, raising=False)
    assert not arrow_records.arrow_available()
    path = tmp_path / "t.csv"
    _messy(path, 200)
    with open_records(str(path), "utf-8", None) as records:
        assert isinstance(records, TextRecords)
    table = read_table(path, "label", "1")
    assert table.rows == 200 and "note" in table.text


def test_the_reader_is_chosen_by_the_environment(tmp_path, monkeypatch, arrow):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    monkeypatch.setenv(READER_VARIABLE, "python")
    assert isinstance(open_records(str(path), "utf-8", None), TextRecords)
    monkeypatch.setenv(READER_VARIABLE, "auto")
    assert isinstance(open_records(str(path), "utf-8", None), ArrowRecords)
    monkeypatch.setenv(READER_VARIABLE, "fastest")
    with pytest.raises(DataError, match="SLATE_CSV_READER"):
        open_records(str(path), "utf-8", None)


def test_plain_numbers_convert_to_the_value_float_gives(arrow):
    pa = pytest.importorskip("pyarrow")
    rng = random.Random(1)
    cells = []
    for _ in range(20_000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25)))
        point = rng.randint(0, len(digits))
        cell = rng.choice(["", "+", "-"]) + digits[:point] + rng.choice([".", ""]) + digits[point:]
        if rng.random() < 0.3:
            cell += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 400))
        cells.append(cell)
    cells += ["1.", ".5", "-0", "+.0e-1", "1e400", "-1e-400", "9" * 400, "1_0", " 1", "inf"]
    values = arrow_records._plain_numbers(pa.array(cells, type=pa.string()))
    assert values is not None
    plain = [float(c) for c in cells[:-3]]  # the last three are left to float(), as NaN here
    np.testing.assert_array_equal(values[:-3].view(np.uint64), np.array(plain).view(np.uint64))
    assert np.isnan(values[-3:]).all()
