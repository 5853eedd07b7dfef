r"""Network topologies: the doubly stochastic mixing matrix :math:`\underline{\mathbf{W}}`.

Section 3.1 of the SLATE paper describes the network of :math:`N` parties by a matrix
:math:`\underline{\mathbf{W}} = \{w_{ij}\} \in \mathbb{R}^{N \times N}` with

1. :math:`w_{ij} > 0` iff nodes :math:`i` and :math:`j` are linked (or :math:`i = j`),
2. :math:`\underline{\mathbf{W}} = \underline{\mathbf{W}}^\top`,
3. :math:`\underline{\mathbf{W}} \mathbf{1} = \mathbf{1}` and
   :math:`\mathbf{1}^\top \underline{\mathbf{W}} = \mathbf{1}^\top`,

and measures how well it mixes by :math:`\lambda = \|\underline{\mathbf{W}} - \mathbf{J}\|_2`
with :math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top`; for a symmetric doubly stochastic
matrix this is the second largest absolute eigenvalue. Gossip converges to the average iff
:math:`\lambda < 1`, i.e. the graph is connected (and not periodic).

Builders return plain ``float64`` arrays; :func:`build_topology` wraps them, validated, in a
:class:`Topology`, which also handles the time-varying federated schedule
(:math:`\mathbf{W} = \mathbf{I}` on ordinary rounds and :math:`\mathbf{J}` every ``period``-th).
"""

from __future__ import annotations

import math
import os
import tokenize
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from slate.errors import TopologyError

__all__ = [
    "FILE_PREFIX",
    "TOPOLOGY_NAMES",
    "Topology",
    "build_topology",
    "describe",
    "erdos_renyi",
    "exponential",
    "federated",
    "format_matrix",
    "from_file",
    "full",
    "mixing_rate",
    "ring",
    "spectral_gap",
    "star",
    "torus",
    "validate",
]

#: Names accepted by :func:`build_topology` (besides ``"file:PATH"``).
TOPOLOGY_NAMES: tuple[str, ...] = (
    "ring",
    "full",
    "federated",
    "star",
    "torus",
    "exponential",
    "erdos-renyi",
)

#: Prefix of a topology name that loads a custom matrix: ``"file:PATH"``.
FILE_PREFIX = "file:"

#: Largest :math:`\lambda` still counted as connected.
_CONNECTED_LAMBDA = 1.0 - 1e-9

#: Attempts :func:`erdos_renyi` makes to draw a connected graph.
_ER_MAX_TRIES = 1000

_CSV_SUFFIXES = (".csv", ".txt")
_NPY_SUFFIXES = (".npy",)


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def _check_n(n: object, what: str = "the number of nodes") -> int:
    """Return ``n`` as an int, or raise TopologyError unless it is an integer >= 1."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TopologyError(
            f"Invalid topology size: {what} must be an integer of at least 1, got {n!r} "
            f"(type {type(n).__name__})."
        )
    if n < 1:
        raise TopologyError(
            f"Invalid topology size: {what} must be at least 1 (a network needs one party or "
            f"more), got {int(n)}."
        )
    return int(n)


def _averaging_matrix(n: int) -> np.ndarray:
    r"""Return :math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top` as float64."""
    return np.full((n, n), 1.0 / n, dtype=np.float64)


def _metropolis_hastings(adjacency: np.ndarray) -> np.ndarray:
    r"""Metropolis-Hastings weights for a symmetric boolean adjacency matrix.

    :math:`w_{ij} = 1 / (1 + \max(d_i, d_j))` for every edge :math:`(i, j)`,
    :math:`w_{ii} = 1 - \sum_{j \ne i} w_{ij}` and 0 elsewhere, where :math:`d_i` is the degree
    of node :math:`i`. The result is symmetric and doubly stochastic with a positive diagonal,
    so :math:`\lambda < 1` exactly when the graph is connected.

    Args:
        adjacency: (N, N) symmetric boolean matrix; the diagonal is ignored.

    Returns:
        The (N, N) float64 mixing matrix.
    """
    adj = np.array(adjacency, dtype=bool)
    np.fill_diagonal(adj, False)
    degree = adj.sum(axis=1)
    pair_max = np.maximum(degree[:, None], degree[None, :])
    W = np.where(adj, 1.0 / (1.0 + pair_max), 0.0)
    np.fill_diagonal(W, 1.0 - W.sum(axis=1))
    return W


def _components(W: np.ndarray) -> list[list[int]]:
    """Connected components of the graph with an edge wherever ``w_ij > 0`` (``i != j``)."""
    n = W.shape[0]
    linked = (W > 0) | (W.T > 0)
    seen = np.zeros(n, dtype=bool)
    components: list[list[int]] = []
    for start in range(n):
        if seen[start]:
            continue
        seen[start] = True
        queue = deque([start])
        members = [start]
        while queue:
            node = queue.popleft()
            for other in np.flatnonzero(linked[node] & ~seen):
                seen[other] = True
                queue.append(int(other))
                members.append(int(other))
        components.append(sorted(members))
    return components


def _as_square_float(W: object, name: str) -> np.ndarray:
    """Convert ``W`` to a float64 2-D square array or raise TopologyError."""
    try:
        arr = np.asarray(W)
    except (ValueError, TypeError) as exc:
        raise TopologyError(
            f"{name} is not a matrix of numbers: it could not be converted to an array ({exc})."
        ) from exc
    if arr.dtype.kind not in "biuf":
        raise TopologyError(
            f"{name} must hold real numbers, but its entries have dtype {arr.dtype}; a mixing "
            "matrix is a square array of nonnegative floats."
        )
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] == 0:
        raise TopologyError(
            f"{name} is not square: a mixing matrix must be a non-empty square 2-D (N x N) "
            f"array, got shape {tuple(arr.shape)}."
        )
    return arr.astype(np.float64, copy=True)


# ----------------------------------------------------------------------------------------------
# spectral quantities
# ----------------------------------------------------------------------------------------------


def mixing_rate(W: np.ndarray) -> float:
    r"""The paper's :math:`\lambda = \|\underline{\mathbf{W}} - \mathbf{J}\|_2`.

    :math:`\|\cdot\|_2` is the spectral norm (largest singular value) and
    :math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top`. For a symmetric doubly stochastic
    :math:`\underline{\mathbf{W}}` this equals the second largest absolute eigenvalue (the
    eigenvalue 1 of :math:`\mathbf{1}` removed once); it is 0 for :math:`\mathbf{J}` itself and
    1 for a disconnected graph. One gossip round contracts the disagreement
    :math:`\|x - \mathbf{J}x\|` by at least this factor.

    Args:
        W: (N, N) matrix.

    Returns:
        :math:`\lambda \ge 0` as a Python float.

    Raises:
        TopologyError: if ``W`` is not a non-empty square matrix of real numbers.
    """
    arr = _as_square_float(W, "W")
    if not np.all(np.isfinite(arr)):
        raise TopologyError(
            "W contains NaN or infinite entries, so its mixing rate lambda is undefined."
        )
    return float(np.linalg.norm(arr - _averaging_matrix(arr.shape[0]), 2))


def spectral_gap(W: np.ndarray) -> float:
    r"""The spectral gap :math:`1 - \lambda` with :math:`\lambda` from :func:`mixing_rate`.

    Args:
        W: (N, N) matrix.

    Returns:
        :math:`1 - \|\underline{\mathbf{W}} - \mathbf{J}\|_2`; positive iff gossip with ``W``
        reaches consensus.
    """
    return 1.0 - mixing_rate(W)


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


def validate(
    W: object,
    name: str = "W",
    atol: float = 1e-6,
    *,
    require_connected: bool = True,
) -> np.ndarray:
    r"""Check that ``W`` is a valid mixing matrix and return it as a float64 copy.

    The properties checked, in order, are those of Section 3.1: square 2-D, finite,
    :math:`w_{ij} \ge 0`, :math:`|w_{ij} - w_{ji}| \le` ``atol``,
    :math:`|\sum_j w_{ij} - 1| \le` ``atol`` for every row and every column, and connected:
    :math:`\lambda = \|\underline{\mathbf{W}} - \mathbf{J}\|_2 < 1 - 10^{-9}` (a disconnected
    graph has :math:`\lambda = 1`). ``N = 1`` (``[[1]]``) is valid.

    Args:
        W: the candidate matrix (anything :func:`numpy.asarray` accepts).
        name: how to refer to the matrix in error messages (e.g. a file name).
        atol: absolute tolerance for symmetry and the row and column sums.
        require_connected: check :math:`\lambda < 1`; switched off for the gossip matrix of a
            time-varying topology whose periodic exact averaging provides the mixing.

    Returns:
        ``W`` as a new float64 (N, N) array.

    Raises:
        TopologyError: naming the first property that fails and its worst offending entry,
            row or column.
    """
    if not (isinstance(atol, (int, float)) and math.isfinite(atol) and atol >= 0):
        raise TopologyError(f"The tolerance atol must be a finite number >= 0, got {atol!r}.")
    arr = _as_square_float(W, name)
    n = arr.shape[0]

    bad = np.argwhere(~np.isfinite(arr))
    if bad.size:
        i, j = (int(v) for v in bad[0])
        raise TopologyError(
            f"{name} is not finite: entry ({i}, {j}) is {arr[i, j]!r} ({len(bad)} non-finite "
            "entries in all); every weight must be a finite number."
        )

    i, j = np.unravel_index(int(np.argmin(arr)), arr.shape)
    if arr[i, j] < 0:
        raise TopologyError(
            f"{name} has a negative entry: entry ({i}, {j}) is {arr[i, j]:.6g} (the most "
            f"negative of {int((arr < 0).sum())}); mixing weights must be nonnegative."
        )

    asym = np.abs(arr - arr.T)
    i, j = np.unravel_index(int(np.argmax(asym)), asym.shape)
    if asym[i, j] > atol:
        raise TopologyError(
            f"{name} is not symmetric: entry ({i}, {j}) is {arr[i, j]:.6g} but entry ({j}, {i}) "
            f"is {arr[j, i]:.6g} (difference {asym[i, j]:.3g}, tolerance {atol:g}); the paper "
            "requires W = W^T."
        )

    for axis, kind in ((1, "row"), (0, "column")):
        sums = arr.sum(axis=axis)
        k = int(np.argmax(np.abs(sums - 1.0)))
        if abs(sums[k] - 1.0) > atol:
            raise TopologyError(
                f"{name} is not doubly stochastic: {kind} {k} sums to {sums[k]:.6g}, but every "
                f"row and column must sum to 1 (tolerance {atol:g})."
            )

    if require_connected and n > 1:
        lam = float(np.linalg.norm(arr - _averaging_matrix(n), 2))
        if lam >= _CONNECTED_LAMBDA:
            components = _components(arr)
            if len(components) > 1:
                first, second = components[0], components[1]
                raise TopologyError(
                    f"{name} is not connected: the graph of its positive off-diagonal weights "
                    f"splits into {len(components)} components (e.g. node {first[0]} cannot "
                    f"reach node {second[0]}), so lambda = ||W - J||_2 = {lam:.6g} and the "
                    "parties never reach consensus; a mixing matrix must have lambda < 1."
                )
            raise TopologyError(
                f"{name} is connected but periodic (e.g. a bipartite graph with a zero "
                f"diagonal): lambda = ||W - J||_2 = {lam:.6g} is not below 1, so gossip "
                "oscillates instead of converging; give some node a positive self-weight."
            )
    return arr


# ----------------------------------------------------------------------------------------------
# builders
# ----------------------------------------------------------------------------------------------


def ring(n: int) -> np.ndarray:
    r"""The paper's ring: each node averages itself and its two neighbours.

    For :math:`N \ge 3`, :math:`w_{ii} = w_{i,i\pm1 \bmod N} = 1/3`; its eigenvalues are
    :math:`(1 + 2\cos(2\pi k/N))/3`, so :math:`\lambda = (1 + 2\cos(2\pi/N))/3` for
    :math:`N \ge 4` (:math:`N = 3` gives :math:`\mathbf{J}`). For :math:`N = 1` it is
    ``[[1]]``. For :math:`N = 2` the two neighbours :math:`i \pm 1` coincide, so the 1/3 weights
    would give rows ``[1/3, 2/3]`` (neither symmetric-looking nor the intended ring); we use
    :math:`w_{ij} = 1/2` for all entries, i.e. :math:`\mathbf{J}`.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix.
    """
    n = _check_n(n)
    if n <= 2:
        return _averaging_matrix(n)
    W = np.zeros((n, n), dtype=np.float64)
    idx = np.arange(n)
    W[idx, idx] = 1.0 / 3.0
    W[idx, (idx + 1) % n] = 1.0 / 3.0
    W[idx, (idx - 1) % n] = 1.0 / 3.0
    return W


def full(n: int) -> np.ndarray:
    r"""Complete averaging :math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top` (lambda = 0).

    With this matrix every round is an exact average: SLATE becomes distributed
    (data-parallel) training.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix with every entry :math:`1/N`.
    """
    return _averaging_matrix(_check_n(n))


def star(n: int) -> np.ndarray:
    r"""A star: node 0 is linked to every other node, with Metropolis-Hastings weights.

    The hub has degree :math:`N - 1` and the leaves degree 1, so :math:`w_{0j} = 1/N`,
    :math:`w_{00} = 1/N` and :math:`w_{jj} = 1 - 1/N` for the leaves; :math:`\lambda = 1 - 1/N`.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix.
    """
    n = _check_n(n)
    adj = np.zeros((n, n), dtype=bool)
    adj[0, 1:] = True
    adj[1:, 0] = True
    return _metropolis_hastings(adj)


def _torus_shape(n: int) -> tuple[int, int]:
    """Rows r <= cols c with r * c = n and r the largest divisor of n not above sqrt(n)."""
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def torus(n: int) -> np.ndarray:
    r"""A 2-D torus (grid with wrap-around) with Metropolis-Hastings weights.

    The :math:`N` nodes form an :math:`r \times c` grid with :math:`rc = N` and :math:`r`
    the divisor of :math:`N` closest to :math:`\sqrt N` from below (a prime :math:`N` gives a
    :math:`1 \times N` ring). Node :math:`(a, b)` is linked to
    :math:`(a \pm 1 \bmod r, b)` and :math:`(a, b \pm 1 \bmod c)`; neighbours that coincide
    (a side of length 2) or are the node itself (a side of length 1) are counted once or not at
    all, so the degree is 4 when both sides are at least 3.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix.
    """
    n = _check_n(n)
    rows, cols = _torus_shape(n)
    adj = np.zeros((n, n), dtype=bool)
    for a in range(rows):
        for b in range(cols):
            node = a * cols + b
            for da, db in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                other = ((a + da) % rows) * cols + (b + db) % cols
                if other != node:
                    adj[node, other] = adj[other, node] = True
    return _metropolis_hastings(adj)


def exponential(n: int) -> np.ndarray:
    r"""The exponential graph with Metropolis-Hastings weights.

    Node :math:`i` is linked to :math:`i \pm 2^k \bmod N` for every :math:`k \ge 0` with
    :math:`2^k < N` (the relation is symmetric by construction; coinciding neighbours count
    once). For :math:`N = 2^m` every node has degree :math:`2m - 1`.

    Args:
        n: number of nodes :math:`N \ge 1`.

    Returns:
        The (N, N) float64 matrix.
    """
    n = _check_n(n)
    adj = np.zeros((n, n), dtype=bool)
    idx = np.arange(n)
    hop = 1
    while hop < n:
        adj[idx, (idx + hop) % n] = True
        adj[idx, (idx - hop) % n] = True
        hop *= 2
    adj = adj | adj.T
    return _metropolis_hastings(adj)


def erdos_renyi(n: int, p: float | None = None, seed: int = 0) -> np.ndarray:
    r"""A connected Erdős–Rényi graph :math:`G(N, p)` with Metropolis-Hastings weights.

    Each of the :math:`N(N-1)/2` possible edges is present independently with probability
    :math:`p` (default :math:`\min(1, 2\ln N / N)`, above the connectivity threshold
    :math:`\ln N / N`). Graphs are drawn from ``numpy.random.default_rng(seed)`` until one is
    connected, so the result is a deterministic function of ``(n, p, seed)``.

    Args:
        n: number of nodes :math:`N \ge 1`.
        p: edge probability in :math:`(0, 1]`, or ``None`` for the default.
        seed: seed of the random generator.

    Returns:
        The (N, N) float64 matrix.

    Raises:
        TopologyError: if ``p`` is not in :math:`(0, 1]` or no connected graph was drawn in
            1000 tries.
    """
    n = _check_n(n)
    if p is None:
        p = 1.0 if n == 1 else min(1.0, 2.0 * math.log(n) / n)
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating, np.integer)):
        raise TopologyError(
            f"The Erdős–Rényi edge probability must be a number in (0, 1], got {p!r}."
        )
    p = float(p)
    if not (0.0 < p <= 1.0):
        raise TopologyError(
            f"The Erdős–Rényi edge probability must be in (0, 1] (0 can never give a connected "
            f"graph), got {p!r}."
        )
    if n == 1:
        return np.ones((1, 1), dtype=np.float64)
    rng = np.random.default_rng(seed)
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    for _ in range(_ER_MAX_TRIES):
        adj = (rng.random((n, n)) < p) & upper
        adj = adj | adj.T
        if len(_components(adj.astype(np.float64))) == 1:
            return _metropolis_hastings(adj)
    raise TopologyError(
        f"Could not draw a connected Erdős–Rényi graph with N = {n} nodes and edge probability "
        f"p = {p:g} in {_ER_MAX_TRIES} tries (seed {seed}); use a larger probability, e.g. "
        f"at least 2 ln(N)/N = {2.0 * math.log(n) / n:.3g}."
    )


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


# ----------------------------------------------------------------------------------------------
# the Topology object
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Topology:
    r"""A validated network: the gossip matrix and, optionally, periodic exact averaging.

    On iteration :math:`t` (0-based) the parties apply :meth:`matrix_at`:
    :math:`\mathbf{J}` when ``period`` is set and :math:`(t + 1) \bmod q = 0`, and the gossip
    matrix ``W`` otherwise. Federated learning is ``W = I`` with ``period = q``: local steps,
    then an exact average every :math:`q`-th iteration (Section 3.1).

    Attributes:
        name: the topology's name (e.g. ``"ring"`` or ``"file:W.csv"``).
        W: the (N, N) gossip matrix of ordinary rounds; stored as a read-only float64 copy.
        period: :math:`q \ge 1` for periodic exact averaging, or ``None``.

    Raises:
        TopologyError: on construction, if ``W`` is invalid (without a period it must also be
            connected) or ``period`` is not a positive integer.
    """

    name: str
    W: np.ndarray
    period: int | None = None
    _J: np.ndarray = field(init=False, repr=False)
    _w_is_j: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        period = self.period
        if period is not None:
            if isinstance(period, bool) or not isinstance(period, (int, np.integer)):
                raise TopologyError(
                    f"The averaging period of topology '{self.name}' must be an integer >= 1, "
                    f"got {period!r}."
                )
            if period < 1:
                raise TopologyError(
                    f"The averaging period of topology '{self.name}' must be at least 1 "
                    f"(average every q-th iteration), got {int(period)}."
                )
            object.__setattr__(self, "period", int(period))
        W = validate(
            self.W,
            name=f"The W of topology '{self.name}'",
            require_connected=period is None,
        )
        W.setflags(write=False)
        J = _averaging_matrix(W.shape[0])
        J.setflags(write=False)
        object.__setattr__(self, "W", W)
        object.__setattr__(self, "_J", J)
        object.__setattr__(self, "_w_is_j", bool(np.array_equal(W, J)))

    def __repr__(self) -> str:
        return f"Topology(name={self.name!r}, n={self.n}, period={self.period}, lam={self.lam:.6g})"

    @property
    def n(self) -> int:
        """Number of nodes :math:`N`."""
        return int(self.W.shape[0])

    def _averages_at(self, t: int) -> bool:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"iteration t must be an integer >= 0, got {t!r}")
        return self.period is not None and (int(t) + 1) % self.period == 0

    def matrix_at(self, t: int) -> np.ndarray:
        r"""The matrix applied at iteration ``t`` (0-based), read-only.

        :math:`\mathbf{J}` if ``period`` is set and :math:`(t + 1) \bmod q = 0`, else ``W``
        (the identity for federated).

        Raises:
            ValueError: if ``t`` is not an integer >= 0.
        """
        return self._J if self._averages_at(t) else self.W

    def is_full_average_at(self, t: int) -> bool:
        r"""True when :meth:`matrix_at` ``(t)`` is exactly :math:`\mathbf{J}`.

        An engine can then replace gossip with an all-reduce mean. This holds on every
        averaging round of a periodic topology and on every round when ``W`` equals
        :math:`\mathbf{J}` entry for entry (``full``, or any topology with ``N = 1``).
        """
        return self._averages_at(t) or self._w_is_j

    def neighbours(self, n: int) -> list[tuple[int, float]]:
        """Neighbours of node ``n`` in the gossip matrix ``W`` and their weights.

        Args:
            n: the node, ``0 <= n < N``.

        Returns:
            ``[(r, w_nr), ...]`` for every ``r != n`` with ``w_nr > 0``, in increasing ``r``.
            Empty for the identity rounds of federated learning.

        Raises:
            IndexError: if ``n`` is not a node.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n < self.n:
            raise IndexError(f"node {n!r} is not in 0..{self.n - 1}")
        row = self.W[int(n)]
        return [(int(r), float(row[r])) for r in np.flatnonzero(row > 0) if r != n]

    @property
    def degrees(self) -> tuple[int, ...]:
        """Number of neighbours of every node in ``W``."""
        off = self.W > 0
        np.fill_diagonal(off, False)
        return tuple(int(d) for d in off.sum(axis=1))

    @cached_property
    def lam(self) -> float:
        r""":math:`\lambda = \|\mathbf{W} - \mathbf{J}\|_2` of the gossip matrix ``W``.

        For federated learning ``W = I`` and this is honestly 1.0 (``N > 1``): ordinary rounds
        do not mix; see :attr:`effective_lambda`.
        """
        return mixing_rate(self.W)

    @cached_property
    def effective_lambda(self) -> float:
        r"""Per-iteration mixing rate over one period.

        :math:`\lambda(\mathbf{M}_{q-1} \cdots \mathbf{M}_0)^{1/q}` where
        :math:`\mathbf{M}_t` = :meth:`matrix_at` ``(t)``; with a period this is
        :math:`\lambda(\mathbf{J}\mathbf{W}^{q-1})^{1/q} = 0` for doubly stochastic ``W``.
        Without a period it equals :attr:`lam`.
        """
        if self.period is None:
            return self.lam
        product = np.eye(self.n)
        for t in range(self.period):
            product = self.matrix_at(t) @ product
        return mixing_rate(product) ** (1.0 / self.period)

    @property
    def spectral_gap(self) -> float:
        r"""The spectral gap :math:`1 - \lambda` of ``W`` (see :attr:`lam`)."""
        return 1.0 - self.lam


def federated(n: int, period: int = 10) -> Topology:
    r"""Federated learning: :math:`\mathbf{W} = \mathbf{I}`, :math:`\mathbf{J}` every q-th round.

    Args:
        n: number of nodes :math:`N \ge 1`.
        period: :math:`q \ge 1`; iteration :math:`t` averages exactly when
            :math:`(t + 1) \bmod q = 0`.

    Returns:
        The :class:`Topology` named ``"federated"``.
    """
    n = _check_n(n)
    return Topology(name="federated", W=np.eye(n, dtype=np.float64), period=period)


# ----------------------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------------------


def build_topology(
    name: str,
    n: int,
    *,
    seed: int = 0,
    fed_period: int = 10,
    er_probability: float | None = None,
) -> Topology:
    """Build a validated topology by name.

    Args:
        name: one of :data:`TOPOLOGY_NAMES` (case-insensitive) or ``"file:PATH"`` for a matrix
            read by :func:`from_file`.
        n: number of nodes :math:`N \\ge 1`; a file's matrix must be (n, n).
        seed: seed of the ``erdos-renyi`` graph.
        fed_period: averaging period :math:`q` of ``federated``.
        er_probability: edge probability of ``erdos-renyi`` (``None``: the default).

    Returns:
        The :class:`Topology`.

    Raises:
        TopologyError: for an unknown name, ``n < 1``, a bad period or probability, an
            unreadable file, a file matrix whose shape is not (n, n), or an invalid matrix.
    """
    if not isinstance(name, str):
        raise TopologyError(f"A topology name must be a string, got {name!r}.")
    n = _check_n(n)
    stripped = name.strip()
    if stripped.lower().startswith(FILE_PREFIX):
        path = stripped[len(FILE_PREFIX) :].strip()
        if not path:
            raise TopologyError(
                f"Topology {name!r} names no file: use 'file:PATH' with a .npy, .csv or .txt "
                "file holding W."
            )
        W = from_file(path)
        if W.shape != (n, n):
            raise TopologyError(
                f"The topology file {path} holds a matrix of shape {W.shape}, but --nodes asks "
                f"for N = {n} parties, so W must be ({n}, {n})."
            )
        return Topology(name=f"{FILE_PREFIX}{path}", W=W)

    key = stripped.lower()
    if key == "federated":
        return federated(n, period=fed_period)
    if key == "erdos-renyi":
        return Topology(name=key, W=erdos_renyi(n, p=er_probability, seed=seed))
    builder = _BUILDERS.get(key)
    if builder is None:
        raise TopologyError(
            f"Unknown topology {name!r}: valid names are {', '.join(TOPOLOGY_NAMES)}, or "
            "file:PATH for a matrix in a .npy/.csv/.txt file."
        )
    return Topology(name=key, W=builder(n))


_BUILDERS = {
    "ring": ring,
    "full": full,
    "star": star,
    "torus": torus,
    "exponential": exponential,
}


# ----------------------------------------------------------------------------------------------
# printing
# ----------------------------------------------------------------------------------------------


def describe(topology: Topology) -> str:
    """A short human-readable summary of a topology, one fact per line.

    Lists the name, :math:`N`, :math:`\\lambda = \\|W - J\\|_2`, the spectral gap
    :math:`1 - \\lambda`, the range of node degrees in ``W`` and, for a periodic topology, the
    period and the effective per-iteration :math:`\\lambda`.
    """
    degrees = topology.degrees
    lo, hi = min(degrees), max(degrees)
    degree = f"{lo}" if lo == hi else f"{lo}..{hi}"
    lines = [
        f"topology: {topology.name}",
        f"nodes N: {topology.n}",
        f"lambda ||W - J||_2: {_fixed(topology.lam, 6)}",
        f"spectral gap 1 - lambda: {_fixed(topology.spectral_gap, 6)}",
        f"degree (neighbours per node in W): {degree}",
    ]
    if topology.period is not None:
        lines.append(f"period: exact average J every {topology.period} iteration(s), W otherwise")
        lines.append(f"effective lambda per iteration: {_fixed(topology.effective_lambda, 6)}")
    return "\n".join(lines)


def _fixed(value: float, decimals: int) -> str:
    """``value`` with fixed ``decimals``, printing a rounded-away ``-0`` as ``0``."""
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def format_matrix(W: np.ndarray, *, max_size: int = 32) -> str:
    """Format a matrix compactly with 4 decimals, one row per line.

    Args:
        W: a 2-D array.
        max_size: larger matrices print a note and only their leading ``max_size`` x
            ``max_size`` block.

    Returns:
        The text, without a trailing newline.

    Raises:
        TopologyError: if ``W`` is not 2-D.
    """
    arr = np.asarray(W, dtype=np.float64)
    if arr.ndim != 2:
        raise TopologyError(f"Can only format a 2-D matrix, got shape {tuple(arr.shape)}.")
    lines: list[str] = []
    rows, cols = arr.shape
    if rows > max_size or cols > max_size:
        lines.append(
            f"({rows} x {cols} matrix; showing the first "
            f"{min(rows, max_size)} x {min(cols, max_size)} block)"
        )
        arr = arr[:max_size, :max_size]
    cells = [[_fixed(v, 4) for v in row] for row in arr]
    width = max((len(c) for row in cells for c in row), default=0)
    lines.extend(" ".join(c.rjust(width) for c in row) for row in cells)
    return "\n".join(lines)
