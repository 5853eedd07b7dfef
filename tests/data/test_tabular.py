"""Tests of the CSV reader: header handling, label selection, gzip and every error case."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slate.data.tabular import read_csv
from slate.errors import DataError


def _write(path: Path, content: str | bytes, *, gz: bool = False) -> Path:
    data = content.encode() if isinstance(content, str) else content
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


WITH_HEADER = "f1,label,f2\n1.5,yes,2\n-3,no,4e-1\n\n0,yes, 7 \n"
NO_HEADER = "1.5,yes,2\n-3,no,4e-1\n0,yes,7\n"
EXPECTED_X = np.array([[1.5, 2], [-3, 0.4], [0, 7]], dtype=np.float32)
EXPECTED_Y = np.array([1, 0, 1])


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("label_column", ["label", 1, "1", -2])
def test_header_auto_detected(tmp_path: Path, gz: bool, label_column: str | int) -> None:
    X, y = read_csv(_write(tmp_path / "t.csv", WITH_HEADER, gz=gz), label_column, "yes")
    assert X.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(X, EXPECTED_X)
    np.testing.assert_array_equal(y, EXPECTED_Y)


@pytest.mark.parametrize("label_column", [1, "1"])
def test_no_header_with_word_labels(tmp_path: Path, label_column: str | int) -> None:
    # The label cell 'yes' is not a number, but it must not make the first row a header.
    X, y = read_csv(_write(tmp_path / "t.csv", NO_HEADER), label_column, "yes")
    np.testing.assert_array_equal(X, EXPECTED_X)
    np.testing.assert_array_equal(y, EXPECTED_Y)


def test_explicit_header_flag_and_delimiter(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.tsv", "10\t20\t1\n3\t4\t0\n5\t6\t1\n")
    X, y = read_csv(path, 2, "1", header=True, delimiter="\t")
    np.testing.assert_array_equal(X, [[3, 4], [5, 6]])
    np.testing.assert_array_equal(y, [0, 1])
    X, y = read_csv(path, 2, "1", header=False, delimiter="\t")
    assert X.shape == (3, 2)
    np.testing.assert_array_equal(y, [1, 0, 1])


def test_numeric_labels_compare_by_value(tmp_path: Path) -> None:
    path = _write(tmp_path / "n.csv", "x,y\n1,1.0\n2,0\n3,1\n4,0.0\n")
    _, y = read_csv(path, "y", "1")
    np.testing.assert_array_equal(y, [1, 0, 1, 0])
    _, y = read_csv(path, "y", " 1.00 ")
    np.testing.assert_array_equal(y, [1, 0, 1, 0])


def test_digit_name_prefers_header_column(tmp_path: Path) -> None:
    # Column named "0" is the third column; the string "0" must mean that column.
    path = _write(tmp_path / "d.csv", "a,b,0\n1,2,p\n3,4,n\n")
    X, y = read_csv(path, "0", "p")
    np.testing.assert_array_equal(X, [[1, 2], [3, 4]])
    np.testing.assert_array_equal(y, [1, 0])


def test_quoted_cells_and_crlf(tmp_path: Path) -> None:
    path = _write(tmp_path / "q.csv", 'a,"label, with comma"\r\n"1.5",pos\r\n2,neg\r\n')
    X, y = read_csv(path, "label, with comma", "pos")
    np.testing.assert_array_equal(X, [[1.5], [2]])
    np.testing.assert_array_equal(y, [1, 0])


def test_matches_csv_module_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    data = rng.normal(size=(50, 6)).astype(np.float32)
    labels = rng.choice(["cat", "dog"], size=50)
    labels[:2] = ["cat", "dog"]
    path = tmp_path / "big.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["a", "b", "c", "target", "d", "e", "f"])
        for row, lab in zip(data, labels, strict=True):
            writer.writerow([*map(repr, row[:3].tolist()), lab, *map(repr, row[3:].tolist())])
    X, y = read_csv(path, "target", "dog")
    np.testing.assert_array_equal(X, data)
    np.testing.assert_array_equal(y, (labels == "dog").astype(np.int64))


# (content, label_column, positive_label, substrings the message must contain besides the name)
ERROR_CASES = [
    ("a,b\n1,x\n2,y\n", "label", "x", ["'label' not found", "'a', 'b'"]),
    ("1,2\n3,4\n", "label", "2", ["'label' not found", "no header"]),
    ("a,b\n1,x\n2,y\n", 5, "x", ["index 5", "'a', 'b'"]),
    ("a,b\n1,x\n2,y\n", "b", "z", ["'z' never occurs", "'x', 'y'"]),
    ("a,b\n1,x\n2,x\n", "b", "x", ["same label", "'x'"]),
    ("a,b\n1,x\n2,y\n3,z\n4,w\n", "b", "x", ["line 4", "not binary", "'x', 'y', 'z', 'w'"]),
    ("a,b,c\n1,2,x\n3,y\n", "c", "x", ["line 3", "expected 3 cells", "got 2"]),
    ("a,b,c\n1,2,x\n3,4,y,5\n", "c", "x", ["line 3", "expected 3 cells", "got 4"]),
    ("a,b,c\n1,2,x\n\n3,abc,y\n", "c", "x", ["line 4", "column 'b'", "'abc'"]),
    ("a,b,c\n1,2,x\n3,,y\n", "c", "x", ["line 3", "column 'b'", "''"]),
    ("a,b,c\n1,nan,x\n3,4,y\n", "c", "x", ["line 2", "column 'b'", "'nan'", "finite"]),
    ("1,x\n1e39,y\n", 1, "x", ["line 2", "column 'column 0'", "float32"]),
    ("a,b\n", "b", "x", ["no data rows"]),
    ("", "b", "x", ["empty"]),
    ("\n \n\n", 0, "x", ["empty"]),
    ("lab\nx\ny\n", "lab", "x", ["single column"]),
    ('a,b\n1,"x\n', "b", "x", ["line 2"]),
    ("a,b,b\n1,x,y\n", "b", "x", ["2 columns named 'b'"]),
]


@pytest.mark.parametrize(("content", "label_column", "positive", "needles"), ERROR_CASES)
@pytest.mark.parametrize("gz", [False, True])
def test_errors(
    tmp_path: Path,
    content: str,
    label_column: str | int,
    positive: str,
    needles: list[str],
    gz: bool,
) -> None:
    path = _write(tmp_path / "bad_table.csv", content, gz=gz)
    with pytest.raises(DataError) as info:
        read_csv(path, label_column, positive)
    message = str(info.value)
    assert "bad_table.csv" in message
    for needle in needles:
        assert needle in message, message


def test_non_utf8_names_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "latin.csv", b"a,b\n1,x\n2,\xe9t\xe9\n")
    with pytest.raises(DataError, match=r"latin\.csv, line 3: .*UTF-8"):
        read_csv(path, "b", "x")


def test_missing_file_and_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"absent\.csv"):
        read_csv(tmp_path / "absent.csv", 0, "1")
    path = _write(tmp_path / "ok.csv", "1,x\n2,y\n")
    with pytest.raises(DataError, match="delimiter"):
        read_csv(path, 1, "x", delimiter=";;")
    with pytest.raises(DataError, match="label_column"):
        read_csv(path, 1.5, "x")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- fuzzing

VALID = b"f1,label,f2\n1.5,yes,2\n-3,no,4e-1\n\n0,yes,7\n"
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _parse_or_data_error(path: Path, label_column: str | int) -> None:
    try:
        X, y = read_csv(path, label_column, "yes")
    except DataError as exc:
        assert str(exc)
        return
    assert X.dtype == np.float32 and y.dtype == np.int64
    assert X.shape[0] == y.shape[0] >= 2
    assert np.isfinite(X).all() and set(np.unique(y)) == {0, 1}


@FUZZ
@given(data=st.binary(max_size=300), label_column=st.sampled_from(["label", 1, "1", 0]))
def test_fuzz_random_bytes(tmp_path: Path, data: bytes, label_column: str | int) -> None:
    _parse_or_data_error(_write(tmp_path / "fuzz.csv", data), label_column)


@FUZZ
@given(cut=st.integers(0, len(VALID)), gz=st.booleans())
def test_fuzz_truncation(tmp_path: Path, cut: int, gz: bool) -> None:
    data = gzip.compress(VALID) if gz else VALID
    _parse_or_data_error(_write(tmp_path / "fuzz.csv", data[: cut * len(data) // len(VALID)]), 1)


@FUZZ
@given(
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    gz=st.booleans(),
)
def test_fuzz_byte_flips(tmp_path: Path, flips: list[tuple[int, int]], gz: bool) -> None:
    data = bytearray(gzip.compress(VALID) if gz else VALID)
    for pos, byte in flips:
        data[pos % len(data)] = byte
    _parse_or_data_error(_write(tmp_path / "fuzz.csv", bytes(data)), "label")
