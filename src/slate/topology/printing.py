"""Human-readable summaries of a topology and its matrix (``slate topology --show``)."""

from __future__ import annotations

import numpy as np

from slate.errors import TopologyError
from slate.topology.schedule import Topology

__all__ = ["describe", "format_matrix"]


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
