"""Reader for LIBSVM / SVMlight text files (plain or gzip-compressed).

The format is one example per line::

    <label> <index>:<value> <index>:<value> ...  # optional comment

with 1-based feature indices (0-based with ``zero_based=True``). ``qid:<n>`` fields (query ids
of ranking data) are skipped and counted. Binary labels may be written as ``-1``/``+1`` or
``0``/``1`` (any spelling that parses to those numbers, e.g. ``+1`` or ``1.0``); they are returned
as ``0``/``1``.

Parsing is vectorised: every line is split once, all ``index:value`` tokens of the file are
joined and converted by numpy in one call, and the dense matrix is filled with one scatter.
Only when something is wrong does a slow per-token pass run, to report the exact line and token.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from slate.data.readers.files import MAX_ELEMENTS, read_text
from slate.errors import DataError

__all__ = ["LibsvmFile", "positive_value", "read_libsvm", "read_libsvm_file"]

_UTF8_BOM = b"\xef\xbb\xbf"
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# A token (the joined string separates tokens by single spaces) that holds no ':' at all.
_TOKEN_WITHOUT_COLON = re.compile(r"(?:^| )[^ :]+(?= |$)")
_MAX_LISTED_LABELS = 5


@dataclass(frozen=True)
class LibsvmFile:
    """A LIBSVM file read by :func:`read_libsvm_file`.

    Attributes:
        path: the file read.
        x: features ``(n, d)``, ``float32`` unless read with ``dtype=np.float64``.
        y: ``int64`` labels ``(n,)`` in {0, 1}.
        qid_fields: how many ``qid:`` fields (query ids of ranking data) were skipped.
    """

    path: str
    x: np.ndarray
    y: np.ndarray
    qid_fields: int = 0

    @property
    def note(self) -> str | None:
        """A line for the user when something in the file was skipped, else None."""
        if not self.qid_fields:
            return None
        return (
            f"{self.path}: skipped {self.qid_fields} 'qid:' field"
            f"{'' if self.qid_fields == 1 else 's'} (query ids of ranking data; they are not "
            "features)."
        )


def read_libsvm(
    path: str | os.PathLike[str],
    n_features: int | None = None,
    *,
    zero_based: bool = False,
    dtype: type[np.floating] = np.float32,
    positive: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Read a binary-classification LIBSVM file into dense arrays.

    Blank lines and everything after a ``#`` are ignored. Labels ``-1``/``+1`` or ``0``/``1``
    are mapped to ``0``/``1``; a file in which only one class occurs is accepted (the caller
    decides whether that is usable). Indices need not be sorted, but an index may occur only
    once per line. ``qid:<n>`` fields are skipped; :func:`read_libsvm_file` also says how many.

    Args:
        path: A plain-text or gzip-compressed (detected by its magic bytes) LIBSVM file.
        n_features: The number of features ``d``. If ``None``, ``d`` is the largest index in the
            file (plus one when ``zero_based``); if given, a larger index is an error.
        zero_based: Whether the file's feature indices start at 0 instead of LIBSVM's 1.
        dtype: The type of ``X``: ``float32``, or ``float64`` for values that are scaled before
            the model's float32 cast (statistics of values rounded to float32 are off for a
            column of large magnitude and small spread).

    Returns:
        ``(X, y)``: ``X`` is a C-contiguous ``dtype`` (default ``float32``) array of shape
        ``(n, d)`` and ``y`` an ``int64`` array of shape ``(n,)`` with values in ``{0, 1}``.

    Raises:
        DataError: If the file cannot be read, is not UTF-8, holds no data lines, has labels
            that are not binary, a malformed ``index:value`` token (missing ``:``, an index that
            is not an integer >= 1 (>= 0 when ``zero_based``) or exceeds ``n_features``, a
            value that is not a finite number representable as float32, an index repeated
            within a line), or if the dense matrix would exceed :data:`MAX_ELEMENTS` elements.
    """
    result = read_libsvm_file(
        path, n_features, zero_based=zero_based, dtype=dtype, positive=positive
    )
    return result.x, result.y


def read_libsvm_file(
    path: str | os.PathLike[str],
    n_features: int | None = None,
    *,
    zero_based: bool = False,
    dtype: type[np.floating] = np.float32,
    positive: str | None = None,
) -> LibsvmFile:
    """Read a binary-classification LIBSVM file, saying what was skipped.

    The same as :func:`read_libsvm` (see there for the arguments and errors), returning a
    :class:`LibsvmFile` that also counts the skipped ``qid:`` fields; its ``note`` is a line
    the caller can print.
    """
    name = os.fspath(path)
    if n_features is not None and (
        isinstance(n_features, bool)
        or not isinstance(n_features, (int, np.integer))
        or n_features < 1
    ):
        raise DataError(
            f"Cannot read {name}: n_features must be a positive integer or None, got "
            f"{n_features!r}."
        )
    if not isinstance(zero_based, (bool, np.bool_)):
        raise DataError(
            f"Cannot read {name}: zero_based must be True or False, got {zero_based!r}."
        )
    first_index = 0 if zero_based else 1
    text = read_text(name)

    label_tokens: list[str] = []
    line_numbers: list[int] = []
    counts: list[int] = []
    feature_tokens: list[str] = []
    qid_fields = 0
    for lineno, line in enumerate(text.split("\n"), start=1):
        hash_pos = line.find("#")
        tokens = (line[:hash_pos] if hash_pos >= 0 else line).split()
        if not tokens:
            continue
        fields = tokens[1:]
        if "qid:" in line:
            kept = [tok for tok in fields if not tok.startswith("qid:")]
            qid_fields += len(fields) - len(kept)
            fields = kept
        label_tokens.append(tokens[0])
        line_numbers.append(lineno)
        counts.append(len(fields))
        feature_tokens.extend(fields)

    if not label_tokens:
        raise DataError(
            f"LIBSVM file {name} contains no data lines (it is empty or holds only blank and "
            "comment lines). Expected lines of the form '<label> <index>:<value> ...'."
        )
    y = _map_labels(name, label_tokens, line_numbers, positive)
    n_rows = len(label_tokens)

    if not feature_tokens:
        if n_features is None:
            raise DataError(
                f"LIBSVM file {name} has {n_rows} data lines but no 'index:value' tokens at all, "
                "so the number of features cannot be inferred. Pass n_features explicitly or "
                "check the file."
            )
        return LibsvmFile(name, np.zeros((n_rows, n_features), dtype=dtype), y, qid_fields)

    token_lines = np.repeat(np.asarray(line_numbers, dtype=np.int64), counts)
    idx, vals = _parse_tokens(name, feature_tokens, token_lines, n_features, first_index)

    max_pos = int(np.argmax(idx))
    d = n_features if n_features is not None else int(idx[max_pos]) + 1 - first_index
    if n_rows * d > MAX_ELEMENTS:
        raise DataError(
            f"LIBSVM file {name}: a dense matrix of {n_rows} rows x {d} features "
            f"({n_rows * d} elements) exceeds the limit of {MAX_ELEMENTS} elements"
            + (
                f" (the largest index, {int(idx[max_pos])}, occurs on line "
                f"{int(token_lines[max_pos])})"
                if n_features is None
                else ""
            )
            + ". Expected a dataset that fits in memory as a dense float32 matrix; check for a "
            "stray huge feature index or use a smaller file."
        )

    rows = np.repeat(np.arange(n_rows, dtype=np.int64), counts)
    cols = idx - first_index
    keys = rows * d + cols
    if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        order = np.argsort(keys, kind="stable")
        same = keys[order[1:]] == keys[order[:-1]]
        if bool(same.any()):
            pos = int(order[1:][same].min())
            raise DataError(
                f"LIBSVM file {name}, line {int(token_lines[pos])}: feature index "
                f"{int(idx[pos])} occurs more than once on this line (token "
                f"'{feature_tokens[pos]}'). Expected each index at most once per line."
            )

    X = np.zeros((n_rows, d), dtype=dtype)
    X[rows, cols] = vals.astype(dtype)
    return LibsvmFile(name, X, y, qid_fields)


def _map_labels(
    name: str, label_tokens: list[str], line_numbers: list[int], positive: str | None = None
) -> np.ndarray:
    """Map label tokens to 0/1 (1 for ``positive``, by default +1 or 1), or raise a DataError
    naming the first offending line."""
    values: dict[str, float | None] = {}
    for tok in dict.fromkeys(label_tokens):
        try:
            values[tok] = float(tok)
        except ValueError:
            values[tok] = None
    distinct = set(values.values())
    if not (distinct <= {-1.0, 1.0} or distinct <= {0.0, 1.0}):
        seen: set[float | None] = set()
        bad_line, bad_tok = line_numbers[0], label_tokens[0]
        for tok, lineno in zip(label_tokens, line_numbers, strict=True):
            seen.add(values[tok])
            if not (seen <= {-1.0, 1.0} or seen <= {0.0, 1.0}):
                bad_line, bad_tok = lineno, tok
                break
        listed = list(values)[:_MAX_LISTED_LABELS]
        more = len(values) - len(listed)
        found = ", ".join(repr(t) for t in listed) + (f" and {more} more" if more > 0 else "")
        raise DataError(
            f"LIBSVM file {name}, line {bad_line}: labels are not binary (label {bad_tok!r} on "
            f"this line does not fit the labels before it). Distinct labels found: {found}. "
            "Expected labels -1/+1 or 0/1 only; multi-class or regression files must be "
            "converted to a binary task first."
        )
    chosen = positive_value(positive)
    if chosen not in distinct and len(distinct) > 1:
        raise DataError(
            f"LIBSVM file {name}: --positive-label {positive} never occurs; its labels are "
            f"{', '.join(sorted(values)[:_MAX_LISTED_LABELS])}."
        )
    mapping = {tok: int(v == chosen or (chosen == 1.0 and v is not None and v > 0))
               for tok, v in values.items()}  # fmt: skip
    return np.fromiter((mapping[t] for t in label_tokens), dtype=np.int64, count=len(label_tokens))


def positive_value(positive: str | None) -> float:
    """The label value of the positive class of a LIBSVM file: +1 (or 1) unless
    ``--positive-label`` names -1 or 0, the other class of a binary file."""
    if positive is None or positive.strip() in ("+1", "1"):
        return 1.0
    if positive.strip() in ("-1", "0"):
        return float(positive.strip())
    raise DataError(
        f"--positive-label {positive!r} cannot name a class of a LIBSVM file, whose labels are "
        "-1/+1 or 0/1: give +1 (the default), -1 or 0."
    )


def _parse_tokens(
    name: str,
    tokens: list[str],
    token_lines: np.ndarray,
    n_features: int | None,
    first_index: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Convert ``index:value`` tokens to int64 indices and float64 values, all at once."""
    n = len(tokens)
    joined = " ".join(tokens)
    ok = joined.count(":") == n and _TOKEN_WITHOUT_COLON.search(joined) is None
    if ok:
        pieces = joined.replace(":", " ").split()
        ok = len(pieces) == 2 * n
    if ok:
        try:
            idx = np.array(pieces[0::2], dtype=np.int64)
            vals = np.array(pieces[1::2], dtype=np.float64)
        except (ValueError, OverflowError):
            ok = False
    if ok:
        upper = _largest_index(n_features, first_index)
        ok = bool(
            (idx >= first_index).all()
            and (idx <= upper).all()
            and (np.abs(vals) <= _FLOAT32_MAX).all()  # also False for nan
        )
    if not ok:
        _raise_first_token_error(name, tokens, token_lines, n_features, first_index)
    return idx, vals


def _largest_index(n_features: int | None, first_index: int) -> int:
    """The largest index allowed: the last of ``n_features`` columns, or the memory limit."""
    if n_features is None:
        return MAX_ELEMENTS
    return n_features - 1 + first_index


def _raise_first_token_error(
    name: str,
    tokens: list[str],
    token_lines: np.ndarray,
    n_features: int | None,
    first_index: int,
) -> NoReturn:
    """Scan tokens one by one and raise a DataError for the first malformed one."""
    upper = _largest_index(n_features, first_index)
    for pos, tok in enumerate(tokens):
        where = f"LIBSVM file {name}, line {int(token_lines[pos])}"
        index_text, sep, value_text = tok.partition(":")
        if not sep:
            raise DataError(
                f"{where}: token {tok!r} has no ':'. Expected 'index:value' pairs after the "
                "label, separated by whitespace."
            )
        try:
            index = int(index_text)
        except ValueError:
            raise DataError(
                f"{where}: feature index {index_text!r} in token {tok!r} is not an integer. "
                "Expected 'index:value' with a 1-based integer index."
            ) from None
        if index < first_index:
            if first_index:
                raise DataError(
                    f"{where}: feature index {index} in token {tok!r} is below 1. LIBSVM "
                    "indices are 1-based, so every index must be at least 1"
                    + (
                        "; if the file numbers its features from 0, read it with zero_based=True."
                        if index == 0
                        else "."
                    )
                )
            raise DataError(
                f"{where}: feature index {index} in token {tok!r} is negative. Expected "
                "0-based indices (zero_based=True), at least 0."
            )
        if index > upper:
            expected = (
                f"at most n_features={n_features}"
                + (f" - 1 = {upper}, as indices are 0-based" if first_index == 0 else "")
                if n_features is not None
                else f"at most {MAX_ELEMENTS} (larger indices cannot fit in memory)"
            )
            raise DataError(
                f"{where}: feature index {index} in token {tok!r} is too large; expected an "
                f"index {expected}."
            )
        try:
            value = float(value_text)
        except ValueError:
            raise DataError(
                f"{where}: value {value_text!r} in token {tok!r} is not a number. Expected "
                "'index:value' with a numeric value."
            ) from None
        if not abs(value) <= _FLOAT32_MAX:
            raise DataError(
                f"{where}: value {value_text!r} in token {tok!r} is not a finite float32 "
                "number. Expected finite feature values (no nan or inf, magnitude below "
                f"{_FLOAT32_MAX:.3g})."
            )
    raise DataError(  # pragma: no cover - the fast path only fails on a token caught above
        f"LIBSVM file {name}: the 'index:value' tokens could not be parsed. Expected lines of "
        "the form '<label> <index>:<value> ...'."
    )
