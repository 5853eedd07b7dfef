"""Tests of the CSV reader: header handling, label selection, gzip and every error case."""

from __future__ import annotations

import csv
import gzip
import io
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slate.data.readers import blocks as block_reading
from slate.data.readers.delimited import NA_TOKENS, read_csv, read_table
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
        _read_table_or_data_error(path, label_column)
        return
    assert X.dtype == np.float32 and y.dtype == np.int64
    assert X.shape[0] == y.shape[0] >= 2
    assert np.isfinite(X).all() and set(np.unique(y)) == {0, 1}
    _read_table_or_data_error(path, label_column)


def _read_table_or_data_error(path: Path, label_column: str | int) -> None:
    """The lenient reader, delimiter detected, on the same bytes: a table or a DataError."""
    try:
        table = read_table(path, label_column, "yes", delimiter=None, labels="optional")
    except DataError as exc:
        assert str(exc)
        return
    assert table.rows == len(table.first_lines) >= 1
    assert set(table.numeric) | set(table.text) == set(table.columns)
    for values in table.numeric.values():
        assert values.shape == (table.rows,) and not np.isinf(values).any()
    for column in table.text.values():
        assert column.codes.shape == (table.rows,)
        assert column.codes.min() >= -1 and column.codes.max() < len(column.categories)


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


# ============================================================================= read_table

MIXED = (
    "age;colour;income;y\n"
    "34;red;1200.5;yes\n"
    " NA ;blue;n/a;no\n"
    "\n"
    "51; red ;;yes\n"
    '"29";"dark; blue";3e3;no\n'
    "40;?;-7;yes\n"
)


@pytest.mark.parametrize("gz", [False, True])
def test_read_table_mixed_columns(tmp_path: Path, gz: bool) -> None:
    table = read_table(_write(tmp_path / "mixed.csv", MIXED, gz=gz), "y", "yes")
    assert table.delimiter == ";" and table.has_header
    assert table.header == ("age", "colour", "income", "y")
    assert table.columns == ("age", "colour", "income")
    assert set(table.numeric) == {"age", "income"} and set(table.text) == {"colour"}
    np.testing.assert_array_equal(table.numeric["age"], [34, np.nan, 51, 29, 40])
    np.testing.assert_array_equal(table.numeric["income"], [1200.5, np.nan, np.nan, 3000, -7])
    assert table.numeric["age"].dtype == np.float64
    colour = table.text["colour"]
    assert colour.codes.dtype == np.int32
    np.testing.assert_array_equal(colour.codes, [0, 1, 0, 2, -1])
    assert colour.categories == ("red", "blue", "dark; blue")
    np.testing.assert_array_equal(table.y, [1, 0, 1, 0, 1])
    assert table.y is not None and table.y.dtype == np.int64
    assert table.label_name == "y" and table.label_values == ("yes", "no")
    assert table.rows == 5
    np.testing.assert_array_equal(table.first_lines, [2, 3, 5, 6, 7])
    assert table.first_lines.dtype == np.int64
    assert table.missing == {"age": 1, "colour": 1, "income": 2}


def test_every_na_token_is_missing(tmp_path: Path) -> None:
    tokens = [*NA_TOKENS, " na ", "n/A", "NONE", "Null", "  ", "nAn"]
    lines = ["x,t,y"] + [f"{tok},{tok},{i % 2}" for i, tok in enumerate(tokens)]
    lines += ["1.5,word,1", "2.5,word,0"]
    table = read_table(_write(tmp_path / "na.csv", "\n".join(lines) + "\n"), "y", "1")
    n = len(tokens)
    assert np.isnan(table.numeric["x"][:n]).all()
    np.testing.assert_array_equal(table.numeric["x"][n:], [1.5, 2.5])
    np.testing.assert_array_equal(table.text["t"].codes, [-1] * n + [0, 0])
    assert table.text["t"].categories == ("word",)
    assert table.missing == {"x": n, "t": n}


def test_na_values_are_added_and_match_whole_cells(tmp_path: Path) -> None:
    content = "x,t,y\n-999,missing,1\n-999.0,MISSING,0\n5,-999,1\n7,a,0\n"
    table = read_table(
        _write(tmp_path / "na.csv", content), "y", "1", na_values=["-999", "missing"]
    )
    # "-999.0" is a number, not the token "-999"; tokens ignore case and surrounding spaces.
    np.testing.assert_array_equal(table.numeric["x"], [np.nan, -999, 5, 7])
    np.testing.assert_array_equal(table.text["t"].codes, [-1, -1, -1, 0])
    assert table.text["t"].categories == ("a",)
    assert table.missing == {"x": 1, "t": 3}


def test_categorical_columns_are_text_even_when_numeric(tmp_path: Path) -> None:
    content = "grade,size,y\n1,10,p\n2,20,n\n1,NA,p\n3,30.5,n\n"
    table = read_table(_write(tmp_path / "c.csv", content), "y", "p", categorical_columns=["grade"])
    assert set(table.text) == {"grade"} and set(table.numeric) == {"size"}
    np.testing.assert_array_equal(table.text["grade"].codes, [0, 1, 0, 2])
    assert table.text["grade"].categories == ("1", "2", "3")
    np.testing.assert_array_equal(table.numeric["size"], [10, 20, np.nan, 30.5])
    with pytest.raises(
        DataError, match=r"c\.csv: categorical column\(s\) 'grad' not found.*'grade'"
    ):
        read_table(tmp_path / "c.csv", "y", "p", categorical_columns=["grad"])


def _dirty_file(tmp_path: Path) -> Path:
    rows = ["id,score,city,count,y"]
    for i in range(100):
        score = "unknown" if i == 40 else ("n.a." if i == 70 else f"{i / 10}")
        count = "many" if i == 10 else str(i)
        rows.append(f"{i},{score},{['oslo', 'rome', '12'][i % 3]},{count},{i % 2}")
    return _write(tmp_path / "dirty.csv", "\n".join(rows) + "\n")


def test_dirty_numeric_columns_are_all_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        read_table(_dirty_file(tmp_path), "y", "1")
    message = str(info.value)
    assert "dirty.csv" in message and "2 problems" in message
    # score: first bad cell on line 42 (row 40), 98 of 100 cells numeric.
    assert "line 42, column 'score': cell 'unknown' is not a number" in message
    assert "98% of the column is numeric" in message and "'unknown', 'n.a.'" in message
    assert "line 12, column 'count': cell 'many'" in message and "99%" in message
    assert "--na-values" in message and "--categorical-columns" in message
    assert "'city'" not in message  # a third of 'city' is numeric: a text column, not a problem
    assert "\n" not in message  # one paragraph


def test_dirty_columns_pass_once_declared(tmp_path: Path) -> None:
    table = read_table(
        _dirty_file(tmp_path),
        "y",
        "1",
        na_values=["unknown", "n.a."],
        categorical_columns=["count"],
    )
    assert set(table.numeric) == {"id", "score"} and set(table.text) == {"city", "count"}
    assert table.missing["score"] == 2 and np.isnan(table.numeric["score"][[40, 70]]).all()
    assert table.numeric["score"][41] == pytest.approx(4.1)
    assert table.text["city"].categories == ("oslo", "rome", "12")
    np.testing.assert_array_equal(table.text["city"].codes[:4], [0, 1, 2, 0])
    assert table.text["count"].categories[10] == "many"


def test_mostly_text_column_with_a_few_numbers_is_text(tmp_path: Path) -> None:
    content = "colour,y\n" + "".join(f"{c},{i % 2}\n" for i, c in enumerate("ab3c5d"))
    table = read_table(_write(tmp_path / "t.csv", content), "y", "1")
    assert table.text["colour"].categories == ("a", "b", "3", "c", "5", "d")


@pytest.mark.parametrize("bad", ["inf", "-Infinity", "1e39", "-nan"])
def test_non_finite_numbers_are_problems(tmp_path: Path, bad: str) -> None:
    content = f"x,y\n1,0\n{bad},1\n3,0\n"
    with pytest.raises(DataError) as info:
        read_table(_write(tmp_path / "inf.csv", content), "y", "1")
    message = str(info.value)
    assert f"inf.csv, line 3, column 'x': cell {bad!r} is not a finite number" in message
    assert "float32" in message


def test_one_report_covers_labels_and_columns(tmp_path: Path) -> None:
    content = "a,b,label\n1,x,pos\n2,2,\n3,3,neg\nzz,4,pos\n5,5,maybe\n6,6,neg\n7,7,pos\n8,8,neg\n"
    content += "".join(f"{i},{i},pos\n" for i in range(9, 40))
    with pytest.raises(DataError) as info:
        read_table(_write(tmp_path / "many.csv", content), "label", "pos", missing="error")
    message = str(info.value)
    assert "many.csv cannot be used as it is; 4 problems were found:" in message
    assert "(1) line 3, column 'label': the label cell '' is missing (1 row without" in message
    assert "(2) line 6, column 'label': labels are not binary" in message
    assert "'maybe'" in message
    assert "(3) line 5, column 'a': cell 'zz' is not a number, but 97%" in message
    assert "(4) line 2, column 'b': cell 'x' is not a number, but 97%" in message


def test_empty_label_cell_names_its_line(tmp_path: Path) -> None:
    # An empty label cell is named with its line, not reported as "a third distinct value"
    # further down.
    path = _write(tmp_path / "lab.csv", "x,y\n1,a\n2, \n3,b\n4,NA\n")
    for reader in (read_table, read_csv):
        with pytest.raises(DataError) as info:
            reader(path, "y", "a")
        message = str(info.value)
        assert "lab.csv, line 3, column 'y': the label cell ' ' is missing" in message
        assert "2 rows without a label" in message and "third" not in message


def test_labels_optional(tmp_path: Path) -> None:
    path = _write(tmp_path / "nolab.csv", "a,b\n1,x\n2,y\n")
    for label in ("label", None):
        table = read_table(path, label, "1", labels="optional")
        assert table.y is None and table.label_name is None and table.label_values == ()
        assert table.columns == ("a", "b") and table.header == ("a", "b")
    with pytest.raises(DataError, match=r"'label' not found"):
        read_table(path, "label", "1")
    with pytest.raises(DataError, match=r"no label column given"):
        read_table(path, None, "1")
    table = read_table(path, "b", "x", labels="optional")
    np.testing.assert_array_equal(table.y, [1, 0])
    assert table.columns == ("a",)
    negatives = _write(tmp_path / "neg.csv", "a,b\n1,n\n2,n\n")
    np.testing.assert_array_equal(read_table(negatives, "b", "p", labels="optional").y, [0, 0])
    single = _write(tmp_path / "one.csv", "a\n1\n2\n")
    assert read_table(single, "y", None, labels="optional").numeric["a"].tolist() == [1, 2]


def test_labels_single_class_ok(tmp_path: Path) -> None:
    path = _write(tmp_path / "neg.csv", "a,y\n1,0\n2,0\n")
    with pytest.raises(DataError, match="never occurs"):
        read_table(path, "y", "1")
    table = read_table(path, "y", "1", labels="single_class_ok")
    np.testing.assert_array_equal(table.y, [0, 0])
    table = read_table(path, "y", "0.0", labels="single_class_ok")
    np.testing.assert_array_equal(table.y, [1, 1])
    with pytest.raises(DataError, match="same label"):
        read_table(path, "y", "0")


def test_missing_error_mode(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.csv", "a,t,y\n1,x,1\n,y,0\n3,NULL,1\n")
    table = read_table(path, "y", "1")
    assert table.missing == {"a": 1, "t": 1}
    with pytest.raises(DataError) as info:
        read_table(path, "y", "1", missing="error")
    message = str(info.value)
    assert "(1) line 3, column 'a': cell '' marks a missing value (1 missing cell" in message
    assert "(2) line 4, column 't': cell 'NULL' marks a missing value" in message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("a,b,y\n1,2,0\n3,4,1\n", ","),
        ("a;b;y\n1,5;2;0\n3;4,25;1\n", ";"),
        ("a\tb\ty\n1\t2\t0\n3\t4\t1\n", "\t"),
        ('"a,1";"b,2";y\n1;2;0\n3;4;1\n', ";"),  # delimiters inside quotes do not count
        ("1,5;2;0\n3,25;4;1\n3;4,5;1\n", ";"),  # no header: the count that holds on every line
        ("a\n1\n2\n", ","),
    ],
)
def test_delimiter_detection(tmp_path: Path, content: str, expected: str) -> None:
    table = read_table(_write(tmp_path / "d.csv", content), None, None, labels="optional")
    assert table.delimiter == expected
    assert len(table.header) == content.splitlines()[1].count(expected) + 1


def test_strict_reader_detects_the_delimiter_when_asked(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.tsv", "a\tb\ty\n1\t2\t0\n3\t4\t1\n")
    X, y = read_csv(path, "y", "1", delimiter=None)
    np.testing.assert_array_equal(X, [[1, 2], [3, 4]])
    np.testing.assert_array_equal(y, [0, 1])
    with pytest.raises(DataError, match="label column 'y' not found"):
        read_csv(path, "y", "1")  # the strict reader's default delimiter stays ','


def test_european_file_reads_decimal_commas_as_text_problem(tmp_path: Path) -> None:
    # Semicolon-separated with decimal commas: detected, and the commas are not numbers.
    content = "a;y\n" + "".join(f"{i},5;{i % 2}\n" for i in range(10))
    table = read_table(_write(tmp_path / "eu.csv", content), "y", "1")
    assert table.delimiter == ";" and table.text["a"].categories[0] == "0,5"


def test_latin1_encoding(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "latin.csv", "ville,x,y\nMontr\xe9al,1,1\nS\xe8te,2,0\n".encode("latin-1")
    )
    table = read_table(path, "y", "1", encoding="latin-1")
    assert table.text["ville"].categories == ("Montréal", "Sète")
    with pytest.raises(DataError) as info:
        read_table(path, "y", "1")
    message = str(info.value)
    assert "latin.csv, line 2: the file is not valid UTF-8 text (byte 0xe9 at byte offset 15" in (
        message
    )
    assert "--encoding latin-1" in message
    with pytest.raises(DataError, match=r"unknown text encoding 'klingon'"):
        read_table(path, "y", "1", encoding="klingon")


def test_utf16_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "u16.csv", "a,y\n1,1\n2,0\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"u16\.csv, line 1: .*byte offset 0.*--encoding utf-16"):
        read_table(path, "y", "1")
    table = read_table(path, "y", "1", encoding="utf-16")
    np.testing.assert_array_equal(table.numeric["a"], [1, 2])


def test_decoding_error_deep_in_a_gzip_file(tmp_path: Path) -> None:
    content = b"x,y\n" + b"1,0\n2,1\n" * 20_000 + b"3,\xff\n"
    path = _write(tmp_path / "deep.csv.gz", content, gz=True)
    with pytest.raises(DataError) as info:
        read_table(path, "y", "1")
    message = str(info.value)
    assert (
        f"line 40002: the file is not valid UTF-8 text (byte 0xff at byte offset {len(content) - 2}"
        in message
    )


def test_utf8_bom_is_dropped(tmp_path: Path) -> None:
    table = read_table(_write(tmp_path / "bom.csv", b"\xef\xbb\xbfa,y\n1,1\n2,0\n"), "y", "1")
    assert table.columns == ("a",)


@pytest.mark.parametrize(
    ("content", "label", "has_header"),
    [
        ("colour,size,y\nred,big,p\nblue,small,n\n", 2, True),  # words only, none repeated
        ("red,big,p\nblue,small,n\nred,small,n\n", 2, False),  # 'red' occurs again: data
        ("red,1.5,p\nblue,2,n\n", 2, False),  # a number in the first row: data
        ("colour,size,y\nred,1.5,p\nblue,2,n\n", 2, True),  # a word above numbers: header
        ("NA,size,y\n1,2,p\n3,4,n\n", 2, True),
        ("1,,p\n2,3,n\n", 2, False),  # a missing cell is no header name
        ("colour,size,y\nred,big,p\nred,big,n\n", "y", True),  # the label name in row 1
    ],
)
def test_header_detection(tmp_path: Path, content: str, label: int | str, has_header: bool) -> None:
    table = read_table(_write(tmp_path / "h.csv", content), label, "p")
    assert table.has_header is has_header
    assert table.rows == content.count("\n") - has_header


def test_rows_spanning_lines_keep_their_first_line(tmp_path: Path) -> None:
    content = 'note,x,y\n"two\nlines",1,1\n\n"three\r\nline\nnote",2,0\nplain,3,1\n'
    table = read_table(_write(tmp_path / "ml.csv", content), "y", "1")
    np.testing.assert_array_equal(table.first_lines, [2, 5, 8])
    assert table.text["note"].categories == ("two\nlines", "three\r\nline\nnote", "plain")


@pytest.mark.parametrize("block_rows", [None, 1, 4])
def test_line_numbers_with_breaks_inside_cells_and_blank_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_rows: int | None
) -> None:
    rng = np.random.default_rng(7)
    breaks = ["", "", "\n", "\r\n", "\r", "a\nb\r\nc"]
    text, expected, line = "note,x,y\r\n", [], 2
    for i in range(120):
        for _ in range(int(rng.integers(0, 3)) if rng.random() < 0.2 else 0):
            text += "\r\n" if rng.random() < 0.5 else " \n"  # blank lines
            line += 1
        note = f"n{i}{breaks[int(rng.integers(len(breaks)))]}"
        text += f'"{note}",{i},{i % 2}\r\n'
        expected.append(line)
        line += 1 + note.count("\n") + note.count("\r") - note.count("\r\n")
    path = _write(tmp_path / "breaks.csv", text)
    if block_rows is not None:
        monkeypatch.setattr(block_reading, "_BLOCK_CELLS", 1)
        monkeypatch.setattr(block_reading, "_MIN_BLOCK_ROWS", block_rows)
    table = read_table(path, "y", "1")
    np.testing.assert_array_equal(table.first_lines, expected)
    np.testing.assert_array_equal(table.numeric["x"], np.arange(120))
    bad = _write(tmp_path / "late.csv", text + '"x",oops,1,extra\r\n')
    with pytest.raises(DataError, match=rf"late\.csv, line {line}: expected 3 cells"):
        read_table(bad, "y", "1")


def test_header_then_many_blank_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "gap.csv", "a,y\n" + "\n" * 80 + "1,1\n2,0\n")
    table = read_table(path, "y", "1")
    np.testing.assert_array_equal(table.first_lines, [82, 83])
    with pytest.raises(DataError, match="has a header row but no data rows"):
        read_table(_write(tmp_path / "none.csv", "a,y\n" + "\n" * 80), "y", "1")


def test_missing_cells_spelt_differently_across_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spellings = ["", " 1.5 ", "NA", "7", "n/a ", "1e3", "nan", "-2"]
    rows = [f"{spellings[i % 8]},{i % 2}" for i in range(400)]
    path = _write(tmp_path / "na.csv", "a,y\n" + "\n".join(rows) + "\n")
    expected = [np.nan, 1.5, np.nan, 7, np.nan, 1000, np.nan, -2] * 50
    for block_rows in (None, 3, 64):
        if block_rows is not None:
            monkeypatch.setattr(block_reading, "_BLOCK_CELLS", 1)
            monkeypatch.setattr(block_reading, "_MIN_BLOCK_ROWS", block_rows)
        table = read_table(path, "y", "1")
        np.testing.assert_array_equal(table.numeric["a"], expected)
        assert table.missing == {"a": 200}


def test_duplicate_feature_names(tmp_path: Path) -> None:
    path = _write(tmp_path / "dup.csv", "a,a,y\n1,2,1\n3,4,0\n")
    with pytest.raises(DataError, match=r"dup\.csv: the header names two feature columns 'a'"):
        read_table(path, "y", "1")
    X, _ = read_csv(path, "y", "1")  # the strict reader works by position, as before
    np.testing.assert_array_equal(X, [[1, 2], [3, 4]])


def test_bad_arguments(tmp_path: Path) -> None:
    path = _write(tmp_path / "ok.csv", "a,y\n1,1\n2,0\n")
    with pytest.raises(DataError, match="labels must be one of"):
        read_table(path, "y", "1", labels="maybe")
    with pytest.raises(DataError, match="missing must be one of"):
        read_table(path, "y", "1", missing="ignore")
    with pytest.raises(DataError, match="no positive label"):
        read_table(path, "y", None)
    with pytest.raises(DataError, match="sequences of strings"):
        read_table(path, "y", "1", na_values="NA")


def test_row_shape_error_stops_at_once(tmp_path: Path) -> None:
    path = _write(tmp_path / "shape.csv", "a,b,y\nx,1,1\n2,2\n3,zz,0\n")
    with pytest.raises(DataError, match=r"shape\.csv, line 3: expected 3 cells .* got 2"):
        read_table(path, "y", "1")


def test_strict_reader_lists_every_bad_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "strict.csv", "a,b,c,y\n1,x,3,1\n2,2,,0\n3,3,3,1\n")
    with pytest.raises(DataError) as info:
        read_csv(path, "y", "1")
    message = str(info.value)
    assert "2 problems" in message
    assert "(1) line 2, column 'b': cell 'x' is not a number (1 of its 3" in message
    assert "(2) line 3, column 'c': cell '' marks a missing value" in message


def test_column_turning_to_text_after_many_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Blocks of 64 rows: 'code' is numeric in the first blocks, words after, so it is read again.
    rows = ["code,v,y"]
    for i in range(300):
        code = str(i % 7) if i < 100 else ["k", "m", "NA", "3"][i % 4]
        rows.append(f"{code},{i},{i % 2}")
    path = _write(tmp_path / "late.csv", "\n".join(rows) + "\n")
    whole = read_table(path, "y", "1")
    monkeypatch.setattr(block_reading, "_BLOCK_CELLS", 1)
    blocks = read_table(path, "y", "1")
    for table in (whole, blocks):
        assert set(table.text) == {"code"} and set(table.numeric) == {"v"}
        assert table.text["code"].categories == ("0", "1", "2", "3", "4", "5", "6", "k", "m")
        codes = table.text["code"].codes
        np.testing.assert_array_equal(codes[:8], [0, 1, 2, 3, 4, 5, 6, 0])
        np.testing.assert_array_equal(codes[100:104], [7, 8, -1, 3])
        assert table.missing == {"code": 50, "v": 0}
        np.testing.assert_array_equal(table.numeric["v"], np.arange(300))
        np.testing.assert_array_equal(table.first_lines, np.arange(2, 302))
    np.testing.assert_array_equal(whole.y, blocks.y)


def test_small_blocks_give_the_same_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    path = tmp_path / "blocks.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["a", "b", "t", "y"])
        for i in range(500):
            a = "" if rng.random() < 0.1 else repr(float(rng.normal()))
            t = rng.choice(["u", "v", "w", "NA"])
            writer.writerow([a, int(rng.integers(0, 5)), t, i % 3 == 0])
    whole = read_table(path, "y", "True", categorical_columns=["b"])
    monkeypatch.setattr(block_reading, "_BLOCK_CELLS", 1)
    blocks = read_table(path, "y", "True", categorical_columns=["b"])
    np.testing.assert_array_equal(whole.numeric["a"], blocks.numeric["a"])
    for name in ("b", "t"):
        np.testing.assert_array_equal(whole.text[name].codes, blocks.text[name].codes)
        assert whole.text[name].categories == blocks.text[name].categories
    assert whole.missing == blocks.missing and whole.missing["a"] > 0
    np.testing.assert_array_equal(whole.y, blocks.y)
    np.testing.assert_array_equal(whole.first_lines, np.arange(2, 502))


def test_memory_stays_near_the_result(tmp_path: Path) -> None:
    # 30 000 rows x 25 columns. Holding every row as Python strings would take ~50 MB; the
    # streaming reader's peak is the float64 result (5.7 MB) plus one block of rows (~10 MB).
    rng = np.random.default_rng(0)
    data = rng.normal(size=(30_000, 25))
    path = tmp_path / "big.csv"
    names = ",".join(f"f{j}" for j in range(25))
    np.savetxt(path, data, fmt="%.6g", delimiter=",", header=names, comments="")
    tracemalloc.start()
    try:
        table = read_table(path, None, None, labels="optional")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    result = sum(a.nbytes for a in table.numeric.values())
    assert result == 30_000 * 25 * 8
    assert peak < 2 * result + 12 * 2**20, f"peak {peak / 2**20:.1f} MB"
    np.testing.assert_allclose(table.numeric["f3"], data[:, 3], rtol=1e-5)


# ----------------------------------------------------------------------------- round trips

WORDS = [
    "red",
    "dark blue",
    "x,y",
    'say "hi"',
    "semi;colon",
    "tab\there",
    "two\nlines",
    "  padded  ",
    "émigré",
    "N.A.",
    "a'b",
]
MISSING_CELLS = [*NA_TOKENS, " NA ", "none", "NULL ", " "]
LABELS = [("yes", "no"), ("1", "0"), ("pos", "neg")]


@st.composite
def _tables(draw: st.DrawFn) -> dict:
    n_rows = draw(st.integers(2, 25))
    kinds = draw(st.lists(st.sampled_from(["numeric", "text", "coded"]), min_size=1, max_size=4))
    cells: list[list[str]] = []
    for kind in kinds:
        if kind == "numeric":
            value = st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr)
            value = value | st.integers(-(10**6), 10**6).map(str)
        elif kind == "text":
            value = st.sampled_from(WORDS)
        else:
            value = st.integers(0, 3).map(str)
        cell = st.one_of(value, st.sampled_from(MISSING_CELLS)) if draw(st.booleans()) else value
        cells.append(draw(st.lists(cell, min_size=n_rows, max_size=n_rows)))
    pos, neg = draw(st.sampled_from(LABELS))
    rest = draw(st.lists(st.sampled_from([pos, neg]), min_size=n_rows - 2, max_size=n_rows - 2))
    labels = [pos, neg, *rest]
    label_at = draw(st.integers(0, len(kinds)))
    return {"kinds": kinds, "cells": cells, "labels": labels, "positive": pos, "label_at": label_at}


def _expected_column(cells: list[str], kind: str) -> tuple[object, object, int]:
    """(numbers or None, (codes, categories) or None, missing count) for one written column."""
    folded = {t.casefold() for t in NA_TOKENS}
    is_na = [c.strip().casefold() in folded for c in cells]
    missing = sum(is_na)
    if kind == "numeric" or (kind == "text" and missing == len(cells)):
        numbers = [np.nan if na else float(c) for c, na in zip(cells, is_na, strict=True)]
        return numbers, None, missing
    categories: list[str] = []
    codes = []
    for cell, na in zip(cells, is_na, strict=True):
        if na:
            codes.append(-1)
            continue
        if cell.strip() not in categories:
            categories.append(cell.strip())
        codes.append(categories.index(cell.strip()))
    return None, (codes, tuple(categories)), missing


@FUZZ
@given(
    spec=_tables(),
    delimiter=st.sampled_from([",", ";", "\t"]),
    quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]),
    terminator=st.sampled_from(["\n", "\r\n"]),
    detect=st.booleans(),
    by_index=st.booleans(),
    gz=st.booleans(),
    block_rows=st.sampled_from([None, 1, 3]),
)
def test_round_trip(
    tmp_path: Path,
    spec: dict,
    delimiter: str,
    quoting: int,
    terminator: str,
    detect: bool,
    by_index: bool,
    gz: bool,
    block_rows: int | None,
) -> None:
    kinds, cells, labels = spec["kinds"], spec["cells"], spec["labels"]
    names = [f"c{j}" for j in range(len(kinds))]
    at = spec["label_at"]
    header = [*names[:at], "target", *names[at:]]
    columns = [*cells[:at], labels, *cells[at:]]
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter=delimiter, quoting=quoting, lineterminator=terminator)
    writer.writerow(header)
    writer.writerows(zip(*columns, strict=True))
    path = _write(tmp_path / "rt.csv", buffer.getvalue(), gz=gz)

    coded = [n for n, k in zip(names, kinds, strict=True) if k == "coded"]
    with pytest.MonkeyPatch.context() as patch:
        if block_rows is not None:  # blocks of 1 or 3 rows instead of ~100 000 cells
            patch.setattr(block_reading, "_BLOCK_CELLS", 1)
            patch.setattr(block_reading, "_MIN_BLOCK_ROWS", block_rows)
        table = read_table(
            path,
            at if by_index else "target",
            spec["positive"],
            delimiter=None if detect else delimiter,
            header=None if detect else True,
            categorical_columns=coded,
        )
    assert table.delimiter == delimiter and table.has_header
    assert table.columns == tuple(names) and table.header == tuple(header)
    np.testing.assert_array_equal(table.y, [int(v == spec["positive"]) for v in labels])
    assert table.label_values == tuple(dict.fromkeys(labels))
    lines = [2]
    for row in zip(*columns, strict=True):
        lines.append(lines[-1] + 1 + sum(cell.count("\n") for cell in row))
    np.testing.assert_array_equal(table.first_lines, lines[:-1])
    for name, kind, written in zip(names, kinds, cells, strict=True):
        numbers, text, missing = _expected_column(written, kind)
        assert table.missing[name] == missing
        if numbers is not None:
            np.testing.assert_array_equal(table.numeric[name], numbers)
        else:
            assert text is not None
            codes, categories = text
            np.testing.assert_array_equal(table.text[name].codes, codes)
            assert table.text[name].categories == categories
    if all(table.missing[n] == 0 for n in table.numeric) and not table.text:
        # Complete numeric data: the strict reader gives the same numbers as one matrix.
        X, y = read_csv(path, "target", spec["positive"], delimiter=delimiter)
        np.testing.assert_array_equal(X, np.column_stack([table.numeric[n] for n in names]))
        np.testing.assert_array_equal(y, table.y)


def test_from_columns_equals_reading_the_same_table(tmp_path: Path) -> None:
    from slate.data.readers.delimited import RawTable, read_table

    path = _write(tmp_path / "t.csv", "age,city,y\n20,a,1\n,b,0\n40,,0\n33.5,a,1\n")
    read = read_table(path, "y", "1")
    built = RawTable.from_columns(
        str(path), [1, 0, 0, 1], age=[20.0, float("nan"), 40.0, 33.5], city=["a", "b", None, "a"]
    )
    assert built.columns == read.columns and built.rows == read.rows
    np.testing.assert_array_equal(built.numeric["age"], read.numeric["age"])
    np.testing.assert_array_equal(built.text["city"].codes, read.text["city"].codes)
    assert built.text["city"].categories == read.text["city"].categories
    np.testing.assert_array_equal(built.y, read.y)
    assert built.missing == read.missing
