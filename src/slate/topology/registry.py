"""Building a validated :class:`~slate.topology.schedule.Topology` by name."""

from __future__ import annotations

from slate.errors import TopologyError
from slate.topology.builders import erdos_renyi, exponential, federated, full, ring, star, torus
from slate.topology.cycles import ONE_PEER_EXPONENTIAL, base_graph, one_peer_exponential, parse_base
from slate.topology.graph import check_n
from slate.topology.matrix_file import from_file
from slate.topology.schedule import Topology

__all__ = ["FILE_PREFIX", "TOPOLOGY_NAMES", "build_topology"]

#: Names accepted by :func:`build_topology` (besides ``"file:PATH"``); ``"base-K"`` stands for
#: ``base-2``, ``base-3``, ... (any integer K >= 2).
TOPOLOGY_NAMES: tuple[str, ...] = (
    "ring",
    "full",
    "federated",
    "star",
    "torus",
    "exponential",
    "erdos-renyi",
    ONE_PEER_EXPONENTIAL,
    "base-K",
)

#: Prefix of a topology name that loads a custom matrix: ``"file:PATH"``.
FILE_PREFIX = "file:"


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
        name: one of :data:`TOPOLOGY_NAMES` (case-insensitive; ``base-K`` with an integer
            :math:`K \\ge 2`, e.g. ``base-2``) or ``"file:PATH"`` for a matrix read by
            :func:`from_file`. ``one-peer-exponential`` (Ying et al., 2021) and ``base-K``
            (Takezawa et al., 2023) are cycles of rounds (see :mod:`slate.topology.cycles`).
        n: number of nodes :math:`N \\ge 1`; a file's matrix must be (n, n);
            ``one-peer-exponential`` needs a power of 2.
        seed: seed of the ``erdos-renyi`` graph.
        fed_period: averaging period :math:`q` of ``federated``.
        er_probability: edge probability of ``erdos-renyi`` (``None``: the default).

    Returns:
        The :class:`Topology`.

    Raises:
        TopologyError: for an unknown name, ``n < 1``, a bad period or probability, an
            unreadable file, a file matrix whose shape is not (n, n), an invalid matrix,
            ``base-K`` without an integer :math:`K \\ge 2`, or ``one-peer-exponential`` with
            :math:`N` not a power of 2.
    """
    if not isinstance(name, str):
        raise TopologyError(f"A topology name must be a string, got {name!r}.")
    n = check_n(n)
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
    if key == ONE_PEER_EXPONENTIAL:
        return one_peer_exponential(n)
    base = parse_base(key)
    if base is not None:
        return base_graph(n, base)
    builder = _BUILDERS.get(key)
    if builder is None:
        raise TopologyError(
            f"Unknown topology {name!r}: valid names are {', '.join(TOPOLOGY_NAMES)} (an "
            "integer K >= 2, e.g. base-2), or file:PATH for a matrix in a .npy/.csv/.txt file."
        )
    return Topology(name=key, W=builder(n))


_BUILDERS = {
    "ring": ring,
    "full": full,
    "star": star,
    "torus": torus,
    "exponential": exponential,
}
