"""Tests of slate.topology.survivors: the mixing matrix over the parties left after a loss."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slate.errors import TopologyError
from slate.topology import (
    Bridge,
    SurvivorGraph,
    build_topology,
    erdos_renyi,
    exponential,
    federated,
    full,
    is_connected,
    mixing_rate,
    ring,
    star,
    surviving_graph,
    surviving_topology,
    torus,
)
from tests.references import brute_force_mh

TOL = 1e-12


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def adjacency_of(W: np.ndarray) -> np.ndarray:
    adj = (W > 0) | (W.T > 0)
    np.fill_diagonal(adj, False)
    return adj


def edges_of(W: np.ndarray) -> set[tuple[int, int]]:
    n = W.shape[0]
    adj = adjacency_of(W)
    return {(i, j) for i in range(n) for j in range(i + 1, n) if adj[i, j]}


def assert_mixing_matrix(W: np.ndarray, m: int) -> None:
    """Symmetric, doubly stochastic and nonnegative to 1e-12, float64, (m, m)."""
    assert W.dtype == np.float64
    assert W.shape == (m, m)
    assert np.all(W >= 0)
    np.testing.assert_allclose(W, W.T, rtol=0, atol=TOL)
    np.testing.assert_allclose(W.sum(axis=1), 1.0, rtol=0, atol=TOL)
    np.testing.assert_allclose(W.sum(axis=0), 1.0, rtol=0, atol=TOL)


def mh_matrix(adjacency: np.ndarray) -> np.ndarray:
    return brute_force_mh(np.asarray(adjacency, dtype=bool))


# ---------------------------------------------------------------------------------------------
# is_connected
# ---------------------------------------------------------------------------------------------


def test_is_connected() -> None:
    assert is_connected(ring(6))
    assert is_connected(np.ones((1, 1)))
    assert not is_connected(np.eye(3))
    assert is_connected(np.eye(1))
    path = np.zeros((4, 4), dtype=bool)
    for i in range(3):
        path[i, i + 1] = path[i + 1, i] = True
    assert is_connected(path)
    path[1, 2] = path[2, 1] = False
    assert not is_connected(path)
    one_way = np.zeros((2, 2))
    one_way[0, 1] = 0.5  # an edge in either direction counts
    assert is_connected(one_way)


@pytest.mark.parametrize("bad", [np.zeros((2, 3)), np.zeros(3), np.zeros((0, 0)), [["a"]]])
def test_is_connected_rejects_non_matrices(bad: object) -> None:
    with pytest.raises(TopologyError):
        is_connected(bad)


# ---------------------------------------------------------------------------------------------
# the documented cases
# ---------------------------------------------------------------------------------------------


def test_ring_of_six_losing_two_non_adjacent_parties_becomes_a_ring_of_four() -> None:
    g = surviving_graph(ring(6), {1, 4} ^ set(range(6)))
    assert isinstance(g, SurvivorGraph)
    assert g.ranks == (0, 2, 3, 5)
    assert g.lost == (1, 4)
    assert g.n == 4 and g.n_before == 6
    assert g.removed_edges == ((0, 1), (1, 2), (3, 4), (4, 5))
    assert g.components_before == ((0, 5), (2, 3))
    assert [b.edge for b in g.bridges] == [(0, 2), (3, 5)]
    assert [b.around for b in g.bridges] == [(1,), (4,)]
    assert all(isinstance(b, Bridge) for b in g.bridges)
    assert g.reconnected and not g.unchanged
    # 0-2-3-5-0 in local order (0, 1, 2, 3): exactly the ring of 4
    assert g.edges == ((0, 2), (0, 5), (2, 3), (3, 5))
    np.testing.assert_allclose(g.W, ring(4), rtol=0, atol=TOL)
    assert g.lam == pytest.approx(1.0 / 3.0, abs=TOL)
    assert_mixing_matrix(g.W, 4)
    text = g.describe()
    assert "0-2" in text and "3-5" in text and "2 components" in text
    record = json.loads(json.dumps(g.to_dict()))
    assert record["added_edges"][0]["edge"] == [0, 2]
    assert record["added_edges"][1]["around"] == [4]
    assert record["survivors"] == [0, 2, 3, 5] and record["lost"] == [1, 4]


def test_ring_losing_adjacent_parties_or_one_party_stays_a_path_without_bridges() -> None:
    g = surviving_graph(ring(6), [0, 3, 4, 5])
    assert g.bridges == () and not g.reconnected
    assert g.edges == ((0, 5), (3, 4), (4, 5))
    g1 = surviving_graph(ring(6), [0, 1, 2, 3, 5])
    assert g1.bridges == ()
    assert g1.edges == ((0, 1), (0, 5), (1, 2), (2, 3))
    for h in (g, g1):
        np.testing.assert_allclose(h.W, mh_matrix(adjacency_of(h.W)), rtol=0, atol=TOL)
        assert h.lam < 1


def test_losing_a_leaf_of_a_star() -> None:
    g = surviving_graph(star(5), [0, 1, 2, 4])
    assert g.lost == (3,)
    assert g.removed_edges == ((0, 3),)
    assert g.bridges == ()
    np.testing.assert_allclose(g.W, star(4), rtol=0, atol=TOL)
    assert g.W[0, 0] == pytest.approx(0.25) and g.W[1, 1] == pytest.approx(0.75)
    assert_mixing_matrix(g.W, 4)


def test_losing_the_hub_of_a_star_chains_the_leaves() -> None:
    g = surviving_graph(star(5), [1, 2, 3, 4])
    assert g.components_before == ((1,), (2,), (3,), (4,))
    assert [b.edge for b in g.bridges] == [(1, 2), (2, 3), (3, 4)]
    assert all(b.around == (0,) for b in g.bridges)
    path = np.zeros((4, 4), dtype=bool)
    for i in range(3):
        path[i, i + 1] = path[i + 1, i] = True
    np.testing.assert_allclose(g.W, brute_force_mh(path), rtol=0, atol=TOL)


@pytest.mark.parametrize("survivors", [[0, 1], [0, 2, 4], [1, 2, 3, 4], [4, 2]])
def test_full_graph_stays_the_exact_average(survivors: list[int]) -> None:
    g = surviving_graph(full(5), survivors)
    m = len(survivors)
    assert np.array_equal(g.W, np.full((m, m), 1.0 / m))
    assert g.bridges == ()
    np.testing.assert_allclose(g.W, mh_matrix(~np.eye(m, dtype=bool)), rtol=0, atol=TOL)
    assert g.lam == pytest.approx(0.0, abs=TOL)


@pytest.mark.parametrize("builder", [ring, full, star, torus, exponential])
@pytest.mark.parametrize("n", [2, 5, 9])
def test_all_but_one_lost_gives_one(builder, n: int) -> None:
    for keep in range(n):
        g = surviving_graph(builder(n), [keep])
        assert g.ranks == (keep,)
        assert np.array_equal(g.W, np.ones((1, 1)))
        assert g.bridges == ()
        assert g.lam == 0.0


def test_a_lost_cluster_is_bridged_as_one() -> None:
    # the path 0-1-2-3-4 loses 1 and 2, which are neighbours: one bridge 0-3 around both
    path = np.zeros((5, 5), dtype=bool)
    for i in range(4):
        path[i, i + 1] = path[i + 1, i] = True
    g = surviving_graph(brute_force_mh(path), [0, 3, 4])
    assert [(b.edge, b.around) for b in g.bridges] == [((0, 3), (1, 2))]
    assert g.edges == ((0, 3), (3, 4))
    assert "lost parties 1, 2" in g.bridges[0].reason


def test_disconnected_input_is_joined_in_rank_order() -> None:
    # two separate triangles {0, 1, 2} and {3, 4, 5}; losing 0 cannot be bridged around
    W = np.zeros((6, 6))
    W[:3, :3] = W[3:, 3:] = 1.0 / 3.0
    g = surviving_graph(W, [1, 2, 3, 4, 5])
    assert g.components_before == ((1, 2), (3, 4, 5))
    assert [(b.edge, b.around) for b in g.bridges] == [((1, 3), ())]
    assert "joins" in g.bridges[0].reason
    assert is_connected(g.W) and g.lam < 1
    assert_mixing_matrix(g.W, 5)


def test_no_loss_returns_w_unchanged() -> None:
    custom = np.array([[0.5, 0.3, 0.2], [0.3, 0.6, 0.1], [0.2, 0.1, 0.7]])
    g = surviving_graph(custom, [2, 0, 1])
    assert g.unchanged and g.lost == () and g.bridges == () and g.removed_edges == ()
    assert np.array_equal(g.W, custom)
    assert "no party lost" in g.describe()


def test_custom_weights_are_replaced_by_mh_after_a_loss() -> None:
    custom = np.array(
        [
            [0.4, 0.3, 0.2, 0.1],
            [0.3, 0.5, 0.1, 0.1],
            [0.2, 0.1, 0.6, 0.1],
            [0.1, 0.1, 0.1, 0.7],
        ]
    )
    g = surviving_graph(custom, [0, 1, 2])
    np.testing.assert_allclose(g.W, np.full((3, 3), 1.0 / 3.0), rtol=0, atol=TOL)


def test_pure_and_read_only() -> None:
    W = ring(6)
    before = W.copy()
    g = surviving_graph(W, [0, 2, 3, 5])
    assert np.array_equal(W, before)
    assert W.flags.writeable
    assert not g.W.flags.writeable
    again = surviving_graph(W, [5, 3, 2, 0])
    assert np.array_equal(g.W, again.W) and g.bridges == again.bridges


def test_index_maps_original_ranks_to_rows() -> None:
    g = surviving_graph(ring(6), [0, 2, 3, 5])
    assert [g.index(r) for r in (0, 2, 3, 5)] == [0, 1, 2, 3]
    with pytest.raises(KeyError, match="not among the survivors"):
        g.index(1)


def test_raise_mode_names_the_groups() -> None:
    with pytest.raises(TopologyError, match=r"disconnects the survivors into 2 groups"):
        surviving_graph(ring(6), [0, 2, 3, 5], on_disconnected="raise")
    # connected survivors never raise
    assert surviving_graph(ring(6), [0, 1, 2, 3], on_disconnected="raise").bridges == ()


def test_allow_mode_keeps_islands() -> None:
    g = surviving_graph(ring(6), [0, 2, 3, 5], on_disconnected="allow")
    assert g.bridges == ()
    assert not is_connected(g.W)
    assert g.lam == pytest.approx(1.0)
    assert_mixing_matrix(g.W, 4)
    assert "on_disconnected='allow'" in g.describe()


@pytest.mark.parametrize(
    ("survivors", "match"),
    [
        ([], "No party survives"),
        ([0, 0, 1], "more than once"),
        ([0, 6], "not a party"),
        ([-1], "not a party"),
        ([True, 2], "must be an integer"),
        ([0.0, 1], "must be an integer"),
        ("012", "string"),
        (5, "collection of integers"),
    ],
)
def test_bad_survivors(survivors: object, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        surviving_graph(ring(6), survivors)  # type: ignore[arg-type]


def test_bad_matrix_or_mode() -> None:
    with pytest.raises(TopologyError, match="not symmetric"):
        surviving_graph(np.array([[0.5, 0.5], [0.0, 1.0]]), [0])
    with pytest.raises(TopologyError, match="Unknown on_disconnected"):
        surviving_graph(ring(4), [0], on_disconnected="drop")  # type: ignore[arg-type]


def test_surviving_topology() -> None:
    topo, g = surviving_topology(build_topology("ring", 6), [0, 2, 3, 5])
    assert topo.name == "ring" and topo.n == 4 and topo.period is None
    np.testing.assert_allclose(topo.W, ring(4), rtol=0, atol=TOL)
    assert [b.edge for b in g.bridges] == [(0, 2), (3, 5)]
    fed, gf = surviving_topology(federated(5, period=4), [0, 2, 4])
    assert fed.period == 4 and np.array_equal(fed.W, np.eye(3))
    assert gf.bridges == ()
    assert fed.is_full_average_at(3) and not fed.is_full_average_at(0)
    full_topo, _ = surviving_topology(build_topology("full", 4), [1, 3])
    assert full_topo.is_full_average_at(0)


# ---------------------------------------------------------------------------------------------
# properties on random graphs and random losses
# ---------------------------------------------------------------------------------------------


@st.composite
def graph_and_survivors(draw: st.DrawFn, connected: bool = True) -> tuple[np.ndarray, list[int]]:
    """A random graph on 1..12 nodes (connected via a random spanning tree) and survivors."""
    n = draw(st.integers(min_value=1, max_value=12))
    adj = np.zeros((n, n), dtype=bool)
    if connected:
        for k in range(1, n):
            parent = draw(st.integers(min_value=0, max_value=k - 1))
            adj[k, parent] = adj[parent, k] = True
    for i in range(n):
        for j in range(i + 1, n):
            if draw(st.booleans()) and draw(st.booleans()):
                adj[i, j] = adj[j, i] = True
    alive = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    survivors = [r for r in range(n) if alive[r]]
    if not survivors:
        survivors = [draw(st.integers(min_value=0, max_value=n - 1))]
    return brute_force_mh(adj), survivors


def check_survivor_graph(W: np.ndarray, survivors: list[int], g: SurvivorGraph) -> None:
    m = len(survivors)
    assert g.ranks == tuple(sorted(survivors))
    assert set(g.lost) == set(range(W.shape[0])) - set(survivors)
    if not g.lost:
        assert g.unchanged and np.array_equal(g.W, W)
        return
    assert_mixing_matrix(g.W, m)
    assert is_connected(g.W)
    if m >= 2:
        assert g.lam < 1.0 - 1e-9
        assert mixing_rate(g.W) < 1.0
    # the new edges are the surviving edges plus the reported bridges, nothing else
    local = {r: k for k, r in enumerate(g.ranks)}
    kept = {(i, j) for i, j in edges_of(W) if i in local and j in local}
    added = {b.edge for b in g.bridges}
    assert not kept & added
    assert set(g.edges) == kept | added
    assert len(added) == len(g.bridges)
    assert g.removed_edges == tuple(sorted(edges_of(W) - kept))
    # the weights are Metropolis-Hastings over the new edges (J when complete, same values)
    np.testing.assert_allclose(g.W, brute_force_mh(adjacency_of(g.W)), rtol=0, atol=TOL)
    # bridges only when the survivors were cut apart; each joins two former components
    if len(g.components_before) == 1:
        assert g.bridges == ()
    comp = {r: c for c, members in enumerate(g.components_before) for r in members}
    for b in g.bridges:
        assert comp[b.i] != comp[b.j]


@settings(deadline=None)  # Hypothesis's default 100 examples
@given(graph_and_survivors())
def test_random_connected_graphs_and_losses(case: tuple[np.ndarray, list[int]]) -> None:
    W, survivors = case
    g = surviving_graph(W, survivors)
    check_survivor_graph(W, survivors, g)
    # a connected graph is always reconnected by step 1 (bridges around lost clusters)
    adj = adjacency_of(W)
    for b in g.bridges:
        assert b.around
        assert any(adj[b.i, r] for r in b.around) and any(adj[b.j, r] for r in b.around)


@settings(deadline=None)  # Hypothesis's default 100 examples
@given(graph_and_survivors(connected=False))
def test_random_possibly_disconnected_graphs_and_losses(
    case: tuple[np.ndarray, list[int]],
) -> None:
    W, survivors = case
    check_survivor_graph(W, survivors, surviving_graph(W, survivors))


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["ring", "star", "torus", "exponential", "erdos-renyi", "full"]),
    n=st.integers(min_value=2, max_value=16),
    data=st.data(),
)
def test_named_topologies_and_losses(name: str, n: int, data: st.DataObject) -> None:
    W = erdos_renyi(n, seed=n) if name == "erdos-renyi" else build_topology(name, n).W
    survivors = data.draw(
        st.lists(st.integers(min_value=0, max_value=n - 1), min_size=1, max_size=n, unique=True)
    )
    check_survivor_graph(W, survivors, surviving_graph(W, survivors))
