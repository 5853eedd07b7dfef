r"""The surviving graph: the mixing matrix over the parties left after some are lost.

When parties drop out of a run, the survivors keep training on the graph that remains. Given
the mixing matrix :math:`\mathbf{W} \in \mathbb{R}^{N \times N}` and the set
:math:`S = \{s_0 < s_1 < \dots < s_{M-1}\}` of surviving ranks, :func:`surviving_graph` returns
:math:`\mathbf{W}' \in \mathbb{R}^{M \times M}` whose row and column :math:`k` belong to party
:math:`s_k` (the survivors in their original rank order), and a :class:`SurvivorGraph` record of
what changed.

**Edges.** The graph of :math:`\mathbf{W}` has an edge :math:`\{i, j\}` wherever
:math:`w_{ij} > 0` or :math:`w_{ji} > 0` (:math:`i \ne j`). The surviving graph keeps every edge
between two survivors and drops every edge with a lost end.

**Weights.** Metropolis-Hastings weights over the surviving graph (plus any bridges):

.. math::

    w'_{ij} = \frac{1}{1 + \max(d_i, d_j)} \text{ for an edge } \{i, j\}, \qquad
    w'_{ii} = 1 - \sum_{j \ne i} w'_{ij}, \qquad w'_{ij} = 0 \text{ otherwise},

with :math:`d_i` the degree of :math:`i` in the new graph. :math:`\mathbf{W}'` is symmetric and
doubly stochastic (Section 3.1 of the paper), with :math:`w'_{ii} \ge 1 / (1 + d_i) > 0`, so
:math:`\lambda = \|\mathbf{W}' - \mathbf{J}\|_2 < 1` exactly when the new graph is connected.
When the new graph is complete these weights are all :math:`1/M`, and :math:`\mathbf{J}` is
returned exactly (so ``full`` stays an exact average). When no party is lost, :math:`\mathbf{W}`
is returned unchanged, whatever its weights: pass the run's original :math:`\mathbf{W}` with
the ranks alive now (not the previous survivors' matrix), so that a party that rejoins restores
the original graph and its weights, and bridges never pile up.

**The disconnection rule.** If the survivors' graph is connected, nothing is added. Otherwise
(for example a ring of 6 that loses two parties that are not neighbours) the survivors are not
left as islands; with ``on_disconnected="bridge"`` (the default) they are reconnected,
deterministically, and every added edge is reported as a :class:`Bridge`:

1. *Bridge around each lost cluster.* Group the lost parties into clusters: the connected
   components of the original graph restricted to the lost parties (a single lost party whose
   neighbours all survive is a cluster of one). Taking the clusters in order of their smallest
   rank, list the cluster's surviving former neighbours in increasing rank,
   :math:`b_1 < b_2 < \dots < b_k`, and add the edge :math:`\{b_t, b_{t+1}\}` for every
   :math:`t` where :math:`b_t` and :math:`b_{t+1}` lie in different components of the survivors'
   graph before any bridge was added (an edge already added is not added twice). A ring of 6
   that loses ranks 1 and 4 thus gains the bridges 0-2 (around 1) and 3-5 (around 4) and becomes
   the ring 0-2-3-5 of 4 parties.
2. *Join what is still apart.* If the graph is still disconnected, order its components by
   their smallest rank and link the smallest rank of each component to the smallest rank of the
   next. Step 1 already reconnects every graph that was connected before the loss (every path
   between two survivors that ran through lost parties now runs along the bridges around their
   clusters), so step 2 only acts when :math:`\mathbf{W}` itself was disconnected.

With ``on_disconnected="raise"`` a disconnected surviving graph raises :class:`TopologyError`
naming its components instead (a run that prefers to stop). ``"allow"`` keeps the islands;
it is only meant for a periodic topology such as ``federated``, whose exact average
:math:`\mathbf{J}` every :math:`q`-th round does the mixing (:func:`surviving_topology` chooses
it for those).

**Cycles of rounds** (``one-peer-exponential``, ``base-K``): :func:`surviving_topology` does not
cut the rounds, which would no longer multiply to :math:`\mathbf{J}`; it builds the same kind of
cycle afresh over the :math:`M` survivors (:func:`slate.topology.cycles.rebuild_cycle`: a
``base-K`` cycle stays ``base-K``; ``one-peer-exponential`` stays itself when :math:`M` is a
power of 2 and becomes ``base-2`` otherwise). Its :class:`SurvivorGraph` describes the union
graphs (the ``W`` of the cycles): the removed edges are every edge of the old union that the new
one lacks (those with a lost end, and those between survivors that the rebuilt cycle no longer
uses), the components are the old union's restricted to the survivors, and every edge of the
new union that the old one lacked is reported as an added edge (a :class:`Bridge` with
``around = ()`` whose reason names the rebuilt cycle). ``W`` is then the new union's
Metropolis-Hastings matrix, as for any cycle; the rounds are what the parties apply.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from typing import Any, Literal

import numpy as np

from slate.errors import GROUPS_SHOWN, RUNS_SHOWN, TopologyError, parties_text, ranges_text
from slate.topology.cycles import rebuild_cycle
from slate.topology.graph import averaging_matrix, connected_components, metropolis_hastings
from slate.topology.matrix_checks import mixing_rate, validate
from slate.topology.schedule import Topology

__all__ = ["Bridge", "OnDisconnected", "SurvivorGraph", "surviving_graph", "surviving_topology"]

#: What :func:`surviving_graph` does when the survivors' graph is disconnected.
OnDisconnected = Literal["bridge", "raise", "allow"]

_MODES: tuple[str, ...] = ("bridge", "raise", "allow")


@dataclass(frozen=True)
class Bridge:
    """An edge added to reconnect the survivors, in original ranks.

    Attributes:
        i: the smaller rank of the edge.
        j: the larger rank of the edge.
        around: the lost parties (one cluster, increasing) whose former neighbours ``i`` and
            ``j`` are; empty for an edge that joins components (step 2 of the rule).
        reason: one sentence saying why the edge was added.
    """

    i: int
    j: int
    around: tuple[int, ...]
    reason: str

    @property
    def edge(self) -> tuple[int, int]:
        """The edge as ``(i, j)`` with ``i < j``."""
        return (self.i, self.j)

    def __str__(self) -> str:
        return f"{self.i}-{self.j}"


@dataclass(frozen=True, eq=False)
class SurvivorGraph:
    r"""The survivors' mixing matrix and what changed to get it.

    Attributes:
        W: the (M, M) float64 mixing matrix, read-only; row and column ``k`` belong to the
            party of original rank ``ranks[k]``.
        ranks: the surviving original ranks, increasing.
        lost: the lost original ranks, increasing.
        n_before: :math:`N`, the number of parties of the input matrix.
        removed_edges: the edges ``(i, j)``, ``i < j``, of the input graph with a lost end.
        components_before: the connected components of the survivors' graph before any bridge,
            each as increasing original ranks, ordered by their smallest rank.
        bridges: the added edges, in the order the rule added them.
        unchanged: True when nobody was lost and ``W`` is the input matrix.
    """

    W: np.ndarray
    ranks: tuple[int, ...]
    lost: tuple[int, ...]
    n_before: int
    removed_edges: tuple[tuple[int, int], ...]
    components_before: tuple[tuple[int, ...], ...]
    bridges: tuple[Bridge, ...]
    unchanged: bool

    @property
    def n(self) -> int:
        """Number of survivors :math:`M`."""
        return len(self.ranks)

    @property
    def reconnected(self) -> bool:
        """True when bridges were added because the survivors' graph was disconnected."""
        return bool(self.bridges)

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """The edges ``(i, j)``, ``i < j``, of the new graph, in original ranks."""
        rows, cols = np.nonzero(np.triu(self.W > 0, k=1))
        pairs = zip(rows.tolist(), cols.tolist(), strict=True)
        return tuple((self.ranks[a], self.ranks[b]) for a, b in pairs)

    @cached_property
    def lam(self) -> float:
        r""":math:`\lambda = \|\mathbf{W}' - \mathbf{J}\|_2` of the new matrix."""
        return mixing_rate(self.W)

    def index(self, rank: int) -> int:
        """The row of ``W`` that belongs to the original ``rank``.

        Raises:
            KeyError: if ``rank`` did not survive.
        """
        try:
            return self.ranks.index(rank)
        except ValueError:
            raise KeyError(f"rank {rank!r} is not among the survivors {list(self.ranks)}") from None

    def describe(self) -> str:
        """What changed, one fact per line, in original ranks."""
        survivors = ranges_text(self.ranks)
        if self.unchanged:
            return f"no party lost: all {self.n} parties ({survivors}) keep the mixing matrix W"
        lines = [
            f"parties lost: {ranges_text(self.lost)} "
            f"(survivors: {survivors}; {self.n} of {self.n_before})",
            "edges removed with them: " + (_edge_list(self.removed_edges) or "none"),
        ]
        if len(self.components_before) > 1:
            parts = _components_text(self.components_before)
            lines.append(
                f"without them the graph splits into {len(self.components_before)} "
                f"components: {parts}"
            )
        if self.bridges:
            lines.append("bridges added: " + "; ".join(f"{b} ({b.reason})" for b in self.bridges))
        elif len(self.components_before) > 1:
            lines.append(
                "no bridges added (on_disconnected='allow'): the groups mix only through "
                "exact averages, if the topology has them"
            )
        lines.append(
            f"Metropolis-Hastings weights over {len(self.edges)} edge(s); "
            f"lambda ||W - J||_2: {self.lam:.6f}"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record: survivors, lost, removed and added edges, components, lambda."""
        return {
            "survivors": list(self.ranks),
            "lost": list(self.lost),
            "removed_edges": [list(e) for e in self.removed_edges],
            "components_before": [list(c) for c in self.components_before],
            "added_edges": [
                {"edge": [b.i, b.j], "around": list(b.around), "reason": b.reason}
                for b in self.bridges
            ],
            "lambda": self.lam,
        }


def _edge_list(edges: Iterable[tuple[int, int]]) -> str:
    """Edges as ``i-j``, the first :data:`~slate.errors.RUNS_SHOWN` of them and how many more."""
    edges = list(edges)
    text = ", ".join(f"{i}-{j}" for i, j in edges[:RUNS_SHOWN])
    left = len(edges) - RUNS_SHOWN
    return f"{text} and {left} more" if left > 0 else text


def _components_text(components: Iterable[Iterable[int]]) -> str:
    """Components as ``{0-3}, {5, 7}``: the first :data:`~slate.errors.GROUPS_SHOWN` of them."""
    components = list(components)
    text = ", ".join("{" + ranges_text(c) + "}" for c in components[:GROUPS_SHOWN])
    left = len(components) - GROUPS_SHOWN
    return f"{text} and {left} more" if left > 0 else text


def _check_survivors(survivors: Iterable[int], n: int) -> tuple[int, ...]:
    """The survivors as increasing ints in ``0..n-1``, or TopologyError."""
    if isinstance(survivors, (str, bytes)):
        raise TopologyError(
            f"The surviving ranks must be a collection of integers, got the string {survivors!r}."
        )
    try:
        items = list(survivors)
    except TypeError:
        raise TopologyError(
            f"The surviving ranks must be a collection of integers, got {survivors!r}."
        ) from None
    ranks: list[int] = []
    for r in items:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
            raise TopologyError(
                f"A surviving rank must be an integer, got {r!r} (type {type(r).__name__})."
            )
        if not 0 <= r < n:
            raise TopologyError(
                f"Surviving rank {int(r)} is not a party of the {n}-party mixing matrix "
                f"(ranks 0..{n - 1})."
            )
        ranks.append(int(r))
    if not ranks:
        raise TopologyError(
            "No party survives: there is no graph to rebuild (at least one surviving rank is "
            "needed)."
        )
    if len(set(ranks)) != len(ranks):
        repeated = sorted({r for r in ranks if ranks.count(r) > 1})
        raise TopologyError(f"Surviving ranks are listed more than once: {ranges_text(repeated)}.")
    return tuple(sorted(ranks))


def surviving_graph(
    W: object,
    survivors: Iterable[int],
    *,
    on_disconnected: OnDisconnected = "bridge",
) -> SurvivorGraph:
    r"""The mixing matrix over the surviving parties, with the module's disconnection rule.

    Keeps the edges of :math:`\mathbf{W}` between survivors, bridges the survivors' graph if
    it is disconnected (see the module docstring) and puts Metropolis-Hastings weights
    :math:`w'_{ij} = 1 / (1 + \max(d_i, d_j))`, :math:`w'_{ii} = 1 - \sum_{j \ne i} w'_{ij}` on
    the result (:math:`\mathbf{J}` exactly when it is complete). A pure function: the input is
    not modified.

    Args:
        W: the (N, N) mixing matrix of the run (symmetric, doubly stochastic, nonnegative).
        survivors: the surviving ranks in ``0..N-1`` (any order, each once, at least one).
        on_disconnected: ``"bridge"`` to reconnect by the rule, ``"raise"`` to refuse, or
            ``"allow"`` to keep separate components (for periodic topologies only).

    Returns:
        The :class:`SurvivorGraph`: the (M, M) matrix over the survivors in increasing
        original rank, and the removed and added edges. With every rank surviving, ``W`` is
        returned unchanged.

    Raises:
        TopologyError: if ``W`` is not a valid mixing matrix, the survivors are not distinct
            ranks of ``W`` or there are none, ``on_disconnected`` is unknown, or the surviving
            graph is disconnected under ``"raise"``.
    """
    if on_disconnected not in _MODES:
        raise TopologyError(
            f"Unknown on_disconnected {on_disconnected!r}: use one of {', '.join(_MODES)}."
        )
    arr = validate(W, name="The mixing matrix W", require_connected=False)
    n = arr.shape[0]
    ranks = _check_survivors(survivors, n)
    alive = np.zeros(n, dtype=bool)
    alive[list(ranks)] = True
    lost = tuple(int(r) for r in np.flatnonzero(~alive))

    linked = (arr > 0) | (arr.T > 0)
    np.fill_diagonal(linked, False)
    idx = np.asarray(ranks)
    sub = linked[np.ix_(idx, idx)]
    before = connected_components(sub)
    components_before = tuple(tuple(ranks[k] for k in comp) for comp in before)

    if not lost:
        arr.setflags(write=False)
        return SurvivorGraph(
            W=arr,
            ranks=ranks,
            lost=(),
            n_before=n,
            removed_edges=(),
            components_before=components_before,
            bridges=(),
            unchanged=True,
        )

    upper = np.triu(linked, k=1)
    rows, cols = np.nonzero(upper)
    removed_edges = tuple(
        (i, j)
        for i, j in zip(rows.tolist(), cols.tolist(), strict=True)
        if not (alive[i] and alive[j])
    )

    bridges: list[Bridge] = []
    if len(before) > 1:
        if on_disconnected == "raise":
            parts = _components_text(components_before)
            raise TopologyError(
                f"Losing {parties_text(lost)} disconnects the survivors into "
                f"{len(before)} groups ({parts}) that can no longer reach consensus; reconnect "
                "them with bridges or stop the run."
            )
        if on_disconnected == "bridge":
            bridges = _bridge(linked, alive, ranks, sub, before, lost)

    M = len(ranks)
    if M == 1 or bool(np.all(sub | np.eye(M, dtype=bool))):
        new_W = averaging_matrix(M)
    else:
        new_W = metropolis_hastings(sub)
    new_W = validate(
        new_W,
        name="The survivors' mixing matrix",
        require_connected=on_disconnected != "allow",
    )
    new_W.setflags(write=False)
    return SurvivorGraph(
        W=new_W,
        ranks=ranks,
        lost=lost,
        n_before=n,
        removed_edges=removed_edges,
        components_before=components_before,
        bridges=tuple(bridges),
        unchanged=False,
    )


def _bridge(
    linked: np.ndarray,
    alive: np.ndarray,
    ranks: tuple[int, ...],
    sub: np.ndarray,
    before: list[list[int]],
    lost: tuple[int, ...],
) -> list[Bridge]:
    """Add the rule's bridges to ``sub`` (survivor-local adjacency, modified) and list them."""
    local = {r: k for k, r in enumerate(ranks)}
    component_of = np.empty(len(ranks), dtype=np.int64)
    for c, comp in enumerate(before):
        component_of[comp] = c
    bridges: list[Bridge] = []

    def add(a: int, b: int, around: tuple[int, ...], reason: str) -> None:
        ka, kb = local[a], local[b]
        sub[ka, kb] = sub[kb, ka] = True
        bridges.append(Bridge(i=min(a, b), j=max(a, b), around=around, reason=reason))

    # Step 1: around each cluster of lost parties, in order of the cluster's smallest rank.
    lost_idx = np.asarray(lost)
    for cluster_local in connected_components(linked[np.ix_(lost_idx, lost_idx)]):
        cluster = tuple(int(lost_idx[k]) for k in cluster_local)
        touches = linked[list(cluster)].any(axis=0) & alive
        boundary = [int(r) for r in np.flatnonzero(touches)]
        for a, b in pairwise(boundary):
            ka, kb = local[a], local[b]
            if component_of[ka] == component_of[kb] or sub[ka, kb]:
                continue
            who = f"lost {parties_text(cluster)}"
            add(
                a,
                b,
                cluster,
                f"bridges {who}, whose surviving neighbours {a} and {b} were cut apart",
            )

    # Step 2: join what is still apart, smallest rank to smallest rank, in rank order.
    after = connected_components(sub)
    for left, right in pairwise(after):
        a, b = ranks[left[0]], ranks[right[0]]
        add(a, b, (), f"joins the group of rank {a} to the group of rank {b}")
    return bridges


def surviving_topology(
    topology: Topology,
    survivors: Iterable[int],
    *,
    on_disconnected: OnDisconnected = "bridge",
) -> tuple[Topology, SurvivorGraph]:
    r"""The :class:`Topology` of the survivors of ``topology``.

    The gossip matrix is :func:`surviving_graph` of ``topology.W``; the name and the averaging
    period are kept. A periodic topology (``federated``: :math:`\mathbf{W} = \mathbf{I}` with
    :math:`\mathbf{J}` every :math:`q`-th round) is never bridged, since its exact averages mix
    all survivors: it stays :math:`\mathbf{I}` over the :math:`M` survivors with the same
    period. A cycle of rounds is rebuilt over the survivors (see the module docstring); with
    every rank surviving, the original topology is returned.

    Args:
        topology: the run's original topology (pass the original, not a previous survivors'
            topology, so that a rejoin restores it).
        survivors: the surviving ranks.
        on_disconnected: as for :func:`surviving_graph`; ignored for a periodic topology and
            for a cycle, whose rebuilt cycle is always connected.

    Returns:
        ``(new_topology, survivor_graph)``.

    Raises:
        TopologyError: as :func:`surviving_graph`.
    """
    if topology.rounds is not None:
        if on_disconnected not in _MODES:
            raise TopologyError(
                f"Unknown on_disconnected {on_disconnected!r}: use one of {', '.join(_MODES)}."
            )
        return _surviving_cycle(topology, survivors)
    mode: OnDisconnected = "allow" if topology.period is not None else on_disconnected
    graph = surviving_graph(topology.W, survivors, on_disconnected=mode)
    return Topology(name=topology.name, W=graph.W, period=topology.period), graph


def _surviving_cycle(
    topology: Topology, survivors: Iterable[int]
) -> tuple[Topology, SurvivorGraph]:
    """A cycle rebuilt over the survivors and the record of its union graph's changes."""
    cut = surviving_graph(topology.W, survivors, on_disconnected="allow")
    if cut.unchanged:
        return topology, cut
    rebuilt = rebuild_cycle(topology, cut.n)
    old_edges = set(_union_edges(topology.W, tuple(range(cut.n_before))))
    new_edges = _union_edges(rebuilt.W, cut.ranks)
    reason = f"{rebuilt.name} cycle rebuilt over {cut.n} survivors"
    added = tuple(
        Bridge(i=i, j=j, around=(), reason=reason) for i, j in new_edges if (i, j) not in old_edges
    )
    kept = set(new_edges)
    removed = tuple(edge for edge in sorted(old_edges) if edge not in kept)
    graph = SurvivorGraph(
        W=rebuilt.W,
        ranks=cut.ranks,
        lost=cut.lost,
        n_before=cut.n_before,
        removed_edges=removed,
        components_before=cut.components_before,
        bridges=added,
        unchanged=False,
    )
    return rebuilt, graph


def _union_edges(W: np.ndarray, ranks: tuple[int, ...]) -> list[tuple[int, int]]:
    """The edges ``(i, j)``, ``i < j``, of the graph of ``W`` in original ranks, where row
    ``k`` of ``W`` belongs to ``ranks[k]`` (increasing)."""
    rows, cols = np.nonzero(np.triu((W > 0) | (W.T > 0), k=1))
    return [(ranks[a], ranks[b]) for a, b in zip(rows.tolist(), cols.tolist(), strict=True)]
