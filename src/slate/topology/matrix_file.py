r"""Reading a custom mixing matrix from a file (``--topology file:W.csv``).

``.npy`` files are read without ever unpickling; ``.csv`` and ``.txt`` files hold one row of
:math:`\underline{\mathbf{W}}` per line. The matrix read must pass
:func:`~slate.topology.matrix_checks.validate`.
"""

from __future__ import annotations

import math
import os
import tokenize
from pathlib import Path

import numpy as np

from slate.errors import TopologyError
from slate.topology.matrix_checks import validate

__all__ = ["from_file"]

_CSV_SUFFIXES = (".csv", ".txt")
_NPY_SUFFIXES = (".npy",)


def _read_npy(path: Path) -> np.ndarray:
    """Read a .npy file without ever unpickling; errors name the file."""
    fmt = np.lib.format
    try:
        with path.open("rb") as fh:
            try:
                version = fmt.read_magic(fh)
            except ValueError as exc:
                raise TopologyError(
                    f"Cannot read the topology file {path}: it is not a NumPy .npy file (its "
                    "first bytes are not the .npy header). Save W with numpy.save or use a "
                    ".csv file."
                ) from exc
            if version == (1, 0):
                shape, _fortran, dtype = fmt.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _fortran, dtype = fmt.read_array_header_2_0(fh)
            else:
                raise TopologyError(
                    f"Cannot read the topology file {path}: unsupported .npy format version "
                    f"{version}; save W with numpy.save (format 1.0 or 2.0)."
                )
            if dtype.hasobject:
                raise TopologyError(
                    f"Refusing the topology file {path}: it stores Python objects (dtype "
                    f"{dtype}), which would have to be unpickled, and pickled data is never "
                    "unpickled; save W as a plain numeric array with numpy.save."
                )
            if dtype.kind not in "biuf":
                raise TopologyError(
                    f"Cannot read the topology file {path}: it stores entries of dtype {dtype}; "
                    "W must be an array of real numbers."
                )
            expected = math.prod(shape) * dtype.itemsize
            remaining = os.fstat(fh.fileno()).st_size - fh.tell()
            if remaining < expected:
                raise TopologyError(
                    f"Cannot read the topology file {path}: its header announces shape {shape} "
                    f"({expected} bytes) but only {remaining} bytes follow; the file is "
                    "truncated or corrupt."
                )
            fh.seek(0)
            arr = np.load(fh, allow_pickle=False)
    except TopologyError:
        raise
    except (
        OSError,
        ValueError,
        EOFError,
        TypeError,
        SyntaxError,
        OverflowError,
        MemoryError,
        tokenize.TokenError,  # raised by numpy's parser of version 1/2 .npy headers
    ) as exc:
        detail = str(exc).rstrip(".") or type(exc).__name__
        raise TopologyError(
            f"Cannot read the topology file {path}: it is not a valid .npy file ({detail}); "
            "save W with numpy.save or use a .csv file."
        ) from exc
    if not isinstance(arr, np.ndarray):  # pragma: no cover - magic checked above
        raise TopologyError(f"The topology file {path} does not hold a single array.")
    return arr


def _read_csv(path: Path) -> np.ndarray:
    """Read a comma- or whitespace-separated matrix; errors name the file and the line."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TopologyError(
            f"Cannot read the topology file {path}: it is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start}); a .csv/.txt W must list numbers, one matrix row per line."
        ) from exc
    except OSError as exc:
        raise TopologyError(
            f"Cannot read the topology file {path}: {exc.strerror or exc}."
        ) from exc

    rows: list[list[float]] = []
    first_line = 0
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")] if "," in line else line.split()
        values: list[float] = []
        for col, token in enumerate(fields, start=1):
            try:
                values.append(float(token))
            except ValueError:
                shown = token if len(token) <= 40 else token[:37] + "..."
                raise TopologyError(
                    f"Cannot read the topology file {path}: line {lineno}, field {col} "
                    f"({shown!r}) is not a number; each line must hold one row of W as numbers "
                    "separated by commas or whitespace."
                ) from None
        if rows and len(values) != len(rows[0]):
            raise TopologyError(
                f"Cannot read the topology file {path}: line {lineno} has {len(values)} "
                f"number(s) but line {first_line} has {len(rows[0])}; every row of W must have "
                "the same length."
            )
        if not rows:
            first_line = lineno
        rows.append(values)
    if not rows:
        raise TopologyError(
            f"The topology file {path} is empty: it contains no numbers (blank lines and lines "
            "starting with '#' are ignored); expected an N x N matrix W."
        )
    return np.array(rows, dtype=np.float64)


def from_file(path: str | os.PathLike[str]) -> np.ndarray:
    r"""Load and validate a custom mixing matrix from a file.

    ``.npy`` files are read with ``numpy.load(..., allow_pickle=False)`` after their header
    is checked (object arrays are refused, nothing is ever unpickled). ``.csv`` and ``.txt``
    files hold one row of :math:`\underline{\mathbf{W}}` per line, numbers separated by commas
    or whitespace; blank lines and lines starting with ``#`` are skipped. The matrix must pass
    :func:`validate`.

    Args:
        path: the file; its suffix (case-insensitive) selects the format.

    Returns:
        The validated (N, N) float64 matrix.

    Raises:
        TopologyError: if the file cannot be read, is empty, holds something other than
            numbers (naming the line for text files), or the matrix is invalid.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in _NPY_SUFFIXES:
        raw = _read_npy(p)
    elif suffix in _CSV_SUFFIXES:
        raw = _read_csv(p)
    else:
        raise TopologyError(
            f"Unsupported topology file {p}: the suffix {p.suffix or '(none)'!r} is not one of "
            f"{', '.join(_NPY_SUFFIXES + _CSV_SUFFIXES)}."
        )
    if raw.size == 0:
        raise TopologyError(
            f"The topology file {p} is empty: it holds an array of shape {tuple(raw.shape)}; "
            "expected an N x N matrix W."
        )
    return validate(raw, name=f"The matrix W in {p}")
