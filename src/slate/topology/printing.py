"""Human-readable summaries of a topology and its matrix (``slate topology --show``)."""

from __future__ import annotations

import numpy as np

from slate.errors import TopologyError
from slate.topology.schedule import Topology

__all__ = ["W7A_MODEL_BYTES", "describe", "describe_cycle", "format_matrix"]

#: Bytes of the float32 parameters of the paper's w7a model, ``Linear(300, 28), ReLU,
#: Linear(28, 1)``: (300 * 28 + 28) + (28 + 1) = 8457 parameters of 4 bytes.
W7A_MODEL_BYTES = 4 * ((300 * 28 + 28) + (28 + 1))


def describe(topology: Topology) -> str:
    """A short human-readable summary of a topology, one fact per line.

    Lists the name, :math:`N`, :math:`\\lambda = \\|W - J\\|_2`, the spectral gap
    :math:`1 - \\lambda`, the range of node degrees in ``W`` and, for a periodic topology, the
    period and the effective per-iteration :math:`\\lambda`. For a cycle of rounds
    (``one-peer-exponential``, ``base-K``) it says that ``W`` is the union's
    Metropolis-Hastings matrix and adds the cycle's length, the largest degree of a round and
    the effective per-iteration :math:`\\lambda` over one cycle.
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
    if topology.rounds is not None:
        lines.extend(_cycle_summary(topology))
    return "\n".join(lines)


def _cycle_summary(topology: Topology) -> list[str]:
    """describe()'s lines for a cycle of rounds."""
    length = topology.cycle_length
    most = max(max(topology.degrees_at(t)) for t in range(length))
    exact = topology.effective_lambda == 0.0
    return [
        "W: Metropolis-Hastings weights on the union of the rounds' graphs (a summary: the "
        "rounds, not W, are applied)",
        f"cycle: {length} round(s), iteration t applies round t mod {length}"
        + ("; the product of one cycle is J (exact average)" if exact else ""),
        f"largest degree of a round: {most}",
        f"effective lambda per iteration: {_fixed(topology.effective_lambda, 6)}",
    ]


def describe_cycle(topology: Topology, model_bytes: int = W7A_MODEL_BYTES) -> str:
    """Each round of a cycle: its degrees, the bytes each party sends, and its links.

    One line per round with the largest and the mean degree, the bytes sent per party in that
    round (degree times ``model_bytes``: one model to each neighbour; largest and mean), and
    the round's edges ``i-j``; then the bytes sent per party over one cycle (largest and mean
    over the parties of the sum over the rounds).

    Args:
        topology: a topology with a cycle of rounds.
        model_bytes: bytes of one model sent to one neighbour, at least 1.

    Raises:
        TopologyError: if ``topology`` has no cycle or ``model_bytes`` is below 1.
    """
    if topology.rounds is None:
        raise TopologyError(f"Topology '{topology.name}' has no cycle of rounds to describe.")
    if isinstance(model_bytes, bool) or not isinstance(model_bytes, int) or model_bytes < 1:
        raise TopologyError(
            f"The model size must be an integer of bytes >= 1, got {model_bytes!r}."
        )
    length = topology.cycle_length
    lines = [
        f"cycle of {length} round(s); model size B = {model_bytes} bytes; "
        "bytes sent per party in a round = degree * B",
        "round  max degree  mean degree  bytes/party max  bytes/party mean  edges",
    ]
    totals = np.zeros(topology.n, dtype=np.int64)
    for t in range(length):
        degrees = np.asarray(topology.degrees_at(t), dtype=np.int64)
        totals += degrees
        lines.append(
            f"{t:>5}  {int(degrees.max()):>10}  {degrees.mean():>11.2f}  "
            f"{int(degrees.max()) * model_bytes:>15}  {degrees.mean() * model_bytes:>16.1f}  "
            f"{_round_edges(topology.matrix_at(t)) or '-'}"
        )
    lines.append(
        f"per cycle: bytes sent per party max {int(totals.max()) * model_bytes}, "
        f"mean {totals.mean() * model_bytes:.1f}"
    )
    return "\n".join(lines)


def _round_edges(M: np.ndarray) -> str:
    """The edges ``i-j`` (``i < j``) of a round matrix, space-separated."""
    rows, cols = np.nonzero(np.triu(M > 0, k=1))
    return " ".join(f"{i}-{j}" for i, j in zip(rows.tolist(), cols.tolist(), strict=True))


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
