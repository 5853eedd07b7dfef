"""Tests of the LIBSVM reader against scikit-learn's reference parser and on bad input."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_svmlight_file

from slate.data.readers.files import MAX_ELEMENTS
from slate.data.readers.libsvm import read_libsvm, read_libsvm_file
from slate.errors import DataError

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _write(path: Path, content: str | bytes, *, gz: bool = False) -> Path:
    data = content.encode() if isinstance(content, str) else content
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _random_libsvm(rng: np.random.Generator, n: int, d: int, labels: tuple[str, str]) -> str:
    lines = []
    for _ in range(n):
        label = labels[int(rng.integers(2))]
        idx = np.sort(rng.choice(np.arange(1, d + 1), size=int(rng.integers(0, d)), replace=False))
        vals = rng.normal(size=idx.size).round(4)
        lines.append(" ".join([label, *(f"{i}:{v}" for i, v in zip(idx, vals, strict=True))]))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("labels", [("-1", "+1"), ("0", "1"), ("-1.0", "1.0"), ("0", "+1")])
@pytest.mark.parametrize("gz", [False, True])
def test_matches_sklearn(tmp_path: Path, labels: tuple[str, str], gz: bool) -> None:
    rng = np.random.default_rng(0)
    name = "toy.svm.gz" if gz else "toy.svm"  # sklearn recognises gzip by the suffix only
    path = _write(tmp_path / name, _random_libsvm(rng, 200, 17, labels), gz=gz)
    X, y = read_libsvm(path, n_features=17)
    X_ref, y_ref = load_svmlight_file(str(path), n_features=17)
    assert X.dtype == np.float32 and y.dtype == np.int64
    assert X.shape == (200, 17) and y.shape == (200,)
    np.testing.assert_array_equal(X, X_ref.toarray().astype(np.float32))
    np.testing.assert_array_equal(y, (y_ref > 0).astype(np.int64))


def test_inferred_width_comments_blank_lines_crlf(tmp_path: Path) -> None:
    text = (
        "# header comment\r\n"
        "+1 3:1.5 1:2 # unsorted indices and a comment\r\n"
        "\r\n"
        "-1 2:-0.25\r\n"
        "   \n"
        "-1\n"
        "\n"
    )
    X, y = read_libsvm(_write(tmp_path / "a.txt", text))
    np.testing.assert_array_equal(X, [[2, 0, 1.5], [0, -0.25, 0], [0, 0, 0]])
    np.testing.assert_array_equal(y, [1, 0, 0])
    X, _ = read_libsvm(tmp_path / "a.txt", n_features=5)
    assert X.shape == (3, 5) and not X[:, 3:].any()


def test_gzip_detected_by_magic_not_suffix(tmp_path: Path) -> None:
    text = "+1 1:1\n-1 2:2\n"
    X1, y1 = read_libsvm(_write(tmp_path / "plain_named.txt", text, gz=True))
    X2, y2 = read_libsvm(_write(tmp_path / "gz_named_but_plain.gz", text))
    np.testing.assert_array_equal(X1, X2)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(X1, [[1, 0], [0, 2]])


def test_single_class_is_allowed(tmp_path: Path) -> None:
    _, y = read_libsvm(_write(tmp_path / "one.txt", "-1 1:1\n-1 2:1\n"))
    np.testing.assert_array_equal(y, [0, 0])


def test_labels_only_with_n_features(tmp_path: Path) -> None:
    X, y = read_libsvm(_write(tmp_path / "z.txt", "+1\n-1\n"), n_features=4)
    assert X.shape == (2, 4) and not X.any()
    np.testing.assert_array_equal(y, [1, 0])


@pytest.mark.skipif(not (SHARED / "w7a" / "w7a.gz").exists(), reason="shared w7a not present")
def test_real_w7a() -> None:
    path = SHARED / "w7a" / "w7a.gz"
    X, y = read_libsvm(path, n_features=300)
    assert X.shape == (24692, 300)
    assert abs(y.mean() - 0.0300) <= 0.0005
    X_ref, y_ref = load_svmlight_file(str(path), n_features=300)
    np.testing.assert_array_equal(X, X_ref.toarray().astype(np.float32))
    np.testing.assert_array_equal(y, (y_ref > 0).astype(np.int64))


@pytest.mark.skipif(not (SHARED / "w8a" / "w8a.gz").exists(), reason="shared w8a not present")
def test_real_w8a_is_fast() -> None:
    start = time.perf_counter()
    X, y = read_libsvm(SHARED / "w8a" / "w8a.gz")
    elapsed = time.perf_counter() - start
    assert X.shape == (49749, 300)
    assert abs(y.mean() - 0.0297) <= 0.0005
    assert elapsed < 2.0, f"w8a took {elapsed:.2f} s"


# (file content, n_features, substrings the message must contain besides the file name)
ERROR_CASES = [
    ("+1 1:0.5\n-1 3\n", None, ["line 2", "'3'", "':'"]),
    ("+1 1:0.5\n\n-1 0:1\n", None, ["line 3", "'0:1'", "1-based"]),
    ("+1 1:0.5\n-1 -4:1\n", None, ["line 2", "'-4:1'"]),
    ("+1 1:1\n-1 1.5:2\n", None, ["line 2", "'1.5'", "not an integer"]),
    ("+1 1:1\n-1 x:2\n", None, ["line 2", "'x'"]),
    ("+1 1:1\n-1 3:abc\n", None, ["line 2", "'abc'", "not a number"]),
    ("+1 1:1\n-1 3:\n", None, ["line 2", "'3:'"]),
    ("+1 1:1\n-1 :3\n", None, ["line 2", "':3'"]),
    ("+1 1:1\n-1 1:2:3 4\n", None, ["line 2"]),
    ("+1 1:1\n# c\n-1 3:nan\n", None, ["line 3", "'nan'", "finite"]),
    ("+1 1:inf\n", None, ["line 1", "'inf'", "finite"]),
    ("+1 1:-1e300\n", None, ["line 1", "float32"]),
    ("+1 1:1\n-1 7:1\n", 5, ["line 2", "7", "n_features=5"]),
    ("+1 1:1 3:1 1:2\n", None, ["line 1", "index 1", "more than once"]),
    ("+1 1:1\n-1 2:1\n2 1:1\n", None, ["line 3", "not binary", "'2'", "'+1'", "'-1'"]),
    ("-1 1:1\n1 2:1\n0 1:1\n", None, ["line 3", "not binary", "'0'"]),
    ("+1 1:1\nspam 2:1\n", None, ["line 2", "not binary", "'spam'"]),
    ("+1 1:1\n-1 3000000000:1\n", None, ["line 2", "3000000000", "too large"]),
    ("+1 1:1\n-1 1500000000:1\n", None, ["line 2", "1500000000", str(MAX_ELEMENTS)]),
    ("+1 1:1\n-1 99999999999999999999999:1\n", None, ["line 2", "too large"]),
]


@pytest.mark.parametrize(("content", "n_features", "needles"), ERROR_CASES)
@pytest.mark.parametrize("gz", [False, True])
def test_errors_name_file_and_line(
    tmp_path: Path, content: str, n_features: int | None, needles: list[str], gz: bool
) -> None:
    path = _write(tmp_path / "bad_input.svm", content, gz=gz)
    with pytest.raises(DataError) as info:
        read_libsvm(path, n_features=n_features)
    message = str(info.value)
    assert "bad_input.svm" in message
    for needle in needles:
        assert needle in message


def test_non_utf8_names_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "latin.svm", b"+1 1:1\n-1 2:1\n-1 3:1 # caf\xe9\n")
    with pytest.raises(DataError, match=r"latin\.svm, line 3: .*UTF-8"):
        read_libsvm(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n", "# only a comment\n\n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    with pytest.raises(DataError, match=r"empty\.svm contains no data lines"):
        read_libsvm(_write(tmp_path / "empty.svm", content))


def test_no_features_without_n_features(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"labels\.svm .*n_features"):
        read_libsvm(_write(tmp_path / "labels.svm", "+1\n-1\n"))


def test_memory_guard_with_n_features(tmp_path: Path) -> None:
    path = _write(tmp_path / "wide.svm", "+1 1:1\n-1 2:1\n")
    with pytest.raises(DataError, match=r"wide\.svm: a dense matrix of 2 rows"):
        read_libsvm(path, n_features=2**30 + 1)


@pytest.mark.parametrize("n_features", [0, -3, 2.5, True])
def test_bad_n_features(tmp_path: Path, n_features: object) -> None:
    path = _write(tmp_path / "ok.svm", "+1 1:1\n")
    with pytest.raises(DataError, match="n_features"):
        read_libsvm(path, n_features=n_features)  # type: ignore[arg-type]


def test_missing_file_and_corrupt_gzip(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nothere\.svm"):
        read_libsvm(tmp_path / "nothere.svm")
    with pytest.raises(DataError, match=r"dir_instead"):
        read_libsvm((tmp_path / "dir_instead").mkdir() or tmp_path / "dir_instead")
    broken = gzip.compress(b"+1 1:1\n" * 100)[:-12]
    with pytest.raises(DataError, match=r"broken\.svm\.gz .*gzip"):
        read_libsvm(_write(tmp_path / "broken.svm.gz", broken))


# ----------------------------------------------------------------------------- qid, zero_based

RANKING = "+1 qid:1 1:0.5 3:2\n-1 qid:1 2:1.5\n-1 qid:2 1:-1 3:4 # comment qid:9\n+1 qid:2 2:7\n"


@pytest.mark.parametrize("gz", [False, True])
def test_qid_fields_are_skipped_and_counted(tmp_path: Path, gz: bool) -> None:
    path = _write(tmp_path / ("rank.svm.gz" if gz else "rank.svm"), RANKING, gz=gz)
    result = read_libsvm_file(path)
    X_ref, y_ref, qid = load_svmlight_file(str(path), query_id=True)
    np.testing.assert_array_equal(result.x, X_ref.toarray().astype(np.float32))
    np.testing.assert_array_equal(result.y, (y_ref > 0).astype(np.int64))
    np.testing.assert_array_equal(qid, [1, 1, 2, 2])
    assert result.qid_fields == 4 and result.path == str(path)
    assert (
        result.note
        == f"{path}: skipped 4 'qid:' fields (query ids of ranking data; they are not features)."
    )
    X, y = read_libsvm(path)
    np.testing.assert_array_equal(X, result.x)
    np.testing.assert_array_equal(y, result.y)
    plain = read_libsvm_file(_write(tmp_path / "plain.svm", "+1 1:1\n-1 2:1\n"))
    assert plain.qid_fields == 0 and plain.note is None


def test_zero_based_matches_sklearn(tmp_path: Path) -> None:
    text = "+1 0:1.5 4:2\n-1 2:-1\n+1 0:3 1:1\n"
    path = _write(tmp_path / "zero.svm", text)
    X, y = read_libsvm(path, zero_based=True)
    X_ref, _ = load_svmlight_file(str(path), zero_based=True)
    assert X.shape == (3, 5)
    np.testing.assert_array_equal(X, X_ref.toarray().astype(np.float32))
    np.testing.assert_array_equal(y, [1, 0, 1])
    X, _ = read_libsvm(path, n_features=6, zero_based=True)
    assert X.shape == (3, 6) and not X[:, 5].any()
    with pytest.raises(DataError, match=r"line 1: feature index 4 .* at most n_features=4 - 1 = 3"):
        read_libsvm(path, n_features=4, zero_based=True)
    with pytest.raises(DataError, match=r"zero\.svm, line 1: feature index 0 .*zero_based=True"):
        read_libsvm(path)
    negative = _write(tmp_path / "neg.svm", "+1 0:1\n-1 -2:1\n")
    with pytest.raises(DataError, match=r"neg\.svm, line 2: feature index -2 .* is negative"):
        read_libsvm(negative, zero_based=True)
    with pytest.raises(DataError, match="zero_based must be True or False"):
        read_libsvm(path, zero_based="yes")  # type: ignore[arg-type]


def test_zero_based_one_based_agree_after_shift(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    text = _random_libsvm(rng, 50, 9, ("-1", "+1"))

    def shift(token: str) -> str:
        index, sep, value = token.partition(":")
        return f"{int(index) - 1}:{value}" if sep else token

    shifted = "\n".join(" ".join(map(shift, line.split())) for line in text.splitlines())
    X1, y1 = read_libsvm(_write(tmp_path / "one.svm", text), n_features=9)
    X0, y0 = read_libsvm(_write(tmp_path / "zero.svm", shifted), n_features=9, zero_based=True)
    np.testing.assert_array_equal(X0, X1)
    np.testing.assert_array_equal(y0, y1)


# ----------------------------------------------------------------------------- fuzzing

VALID = b"# toy\n+1 1:0.5 3:-2\n-1 2:1e-3\n\n+1 4:7 # trailing\n-1\n"
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _parse_or_data_error(path: Path) -> None:
    try:
        X, y = read_libsvm(path)
    except DataError as exc:
        assert str(exc)
        return
    assert X.dtype == np.float32 and y.dtype == np.int64
    assert X.shape[0] == y.shape[0] >= 1
    assert np.isfinite(X).all() and set(np.unique(y)) <= {0, 1}


@FUZZ
@given(data=st.binary(max_size=300))
def test_fuzz_random_bytes(tmp_path: Path, data: bytes) -> None:
    _parse_or_data_error(_write(tmp_path / "fuzz.svm", data))


@FUZZ
@given(cut=st.integers(0, len(VALID)), gz=st.booleans())
def test_fuzz_truncation(tmp_path: Path, cut: int, gz: bool) -> None:
    data = gzip.compress(VALID) if gz else VALID
    _parse_or_data_error(_write(tmp_path / "fuzz.svm", data[: cut * len(data) // len(VALID)]))


@FUZZ
@given(
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    gz=st.booleans(),
)
def test_fuzz_byte_flips(tmp_path: Path, flips: list[tuple[int, int]], gz: bool) -> None:
    data = bytearray(gzip.compress(VALID) if gz else VALID)
    for pos, byte in flips:
        data[pos % len(data)] = byte
    _parse_or_data_error(_write(tmp_path / "fuzz.svm", bytes(data)))
