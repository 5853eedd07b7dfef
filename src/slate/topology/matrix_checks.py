r"""Checks on a mixing matrix and its mixing rate :math:`\lambda`.

Section 3.1 of the SLATE paper requires :math:`w_{ij} \ge 0`,
:math:`\underline{\mathbf{W}} = \underline{\mathbf{W}}^\top` and
:math:`\underline{\mathbf{W}} \mathbf{1} = \mathbf{1}`; gossip reaches consensus iff
:math:`\lambda = \|\underline{\mathbf{W}} - \mathbf{J}\|_2 < 1`.
"""

from __future__ import annotations

import math

import numpy as np

from slate.errors import TopologyError
from slate.topology.graph import averaging_matrix, connected_components

__all__ = ["mixing_rate", "spectral_gap", "validate"]

#: Largest :math:`\lambda` still counted as connected.
_CONNECTED_LAMBDA = 1.0 - 1e-9


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
    return float(np.linalg.norm(arr - averaging_matrix(arr.shape[0]), 2))


def spectral_gap(W: np.ndarray) -> float:
    r"""The spectral gap :math:`1 - \lambda` with :math:`\lambda` from :func:`mixing_rate`.

    Args:
        W: (N, N) matrix.

    Returns:
        :math:`1 - \|\underline{\mathbf{W}} - \mathbf{J}\|_2`; positive iff gossip with ``W``
        reaches consensus.
    """
    return 1.0 - mixing_rate(W)


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
        lam = float(np.linalg.norm(arr - averaging_matrix(n), 2))
        if lam >= _CONNECTED_LAMBDA:
            components = connected_components(arr)
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
