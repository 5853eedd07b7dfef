"""Tests of the cycles that average exactly: one-peer exponential and base-K graphs.

Every computed value is checked against an independent reference: products of the round
matrices multiplied here, gossip simulated party by party, degrees and Metropolis-Hastings
weights counted entry by entry, and the cycle lengths of the authors' code.
"""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

from slate.cli import main
from slate.errors import TopologyError
from slate.topology import (
    TOPOLOGY_NAMES,
    W7A_MODEL_BYTES,
    Topology,
    base_graph,
    base_rounds,
    build_topology,
    describe,
    describe_cycle,
    federated,
    hyper_hypercube_rounds,
    mixing_rate,
    one_peer_exponential,
    ring,
    simple_base_rounds,
    surviving_topology,
)
from tests.references import brute_force_mh

TOL = 1e-12

#: Cycle lengths of yukiTakezawa/BaseGraph's ``BaseGraph(n, max_degree=K - 1)`` for
#: n = 2, ..., 64 (run once on the authors' code; each of their cycles multiplies to J).
AUTHORS_LENGTHS = {
    2: [1, 3, 2, 5, 4, 5, 3, 7, 6, 7, 5, 7, 6, 7, 4, 9, 8, 9, 7, 9, 8, 9, 6, 9, 8, 9, 7, 9, 8, 9,
        5, 11, 10, 11, 9, 11, 10, 11, 8, 11, 10, 11, 9, 11, 10, 11, 7, 11, 10, 11, 9, 11, 10, 11,
        8, 11, 10, 11, 9, 11, 10, 11, 6],
    3: [1, 1, 2, 3, 2, 4, 3, 2, 4, 5, 3, 5, 5, 4, 4, 5, 3, 6, 5, 5, 6, 6, 4, 6, 6, 3, 6, 7, 5, 7,
        5, 6, 6, 7, 4, 7, 7, 6, 6, 7, 6, 7, 7, 5, 7, 7, 5, 7, 7, 6, 7, 7, 4, 8, 7, 7, 8, 8, 6, 8,
        8, 6, 6],
    4: [1, 1, 1, 3, 2, 3, 2, 2, 4, 4, 2, 4, 4, 4, 2, 5, 3, 5, 4, 4, 5, 5, 3, 5, 5, 3, 4, 5, 5, 5,
        3, 5, 6, 6, 3, 6, 6, 5, 5, 6, 5, 6, 5, 5, 6, 6, 3, 6, 6, 6, 5, 6, 4, 6, 5, 6, 6, 6, 5, 6,
        6, 5, 3],
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# independent references
# ---------------------------------------------------------------------------------------------


def product(rounds: list[np.ndarray] | tuple[np.ndarray, ...]) -> np.ndarray:
    """W(L-1) ... W(0), multiplied here."""
    P = np.eye(rounds[0].shape[0])
    for R in rounds:
        P = R @ P
    return P


def off_degrees(M: np.ndarray) -> list[int]:
    """Number of j != i with m_ij > 0, counted entry by entry."""
    n = M.shape[0]
    return [sum(1 for j in range(n) if j != i and M[i, j] > 0) for i in range(n)]


def floor_log(n: int, base: int) -> int:
    """floor(log_base n) in integers."""
    p = 0
    while base ** (p + 1) <= n:
        p += 1
    return p


def assert_valid_round(R: np.ndarray) -> None:
    assert R.dtype == np.float64
    assert (R >= 0).all()
    np.testing.assert_allclose(R, R.T, atol=0, rtol=0)
    np.testing.assert_allclose(R.sum(axis=0), 1.0, atol=TOL)
    np.testing.assert_allclose(R.sum(axis=1), 1.0, atol=TOL)


def gossip_by_party(topology: Topology, x: np.ndarray, t: int) -> np.ndarray:
    """One round computed party by party from neighbours_at and self_weight_at."""
    out = np.empty_like(x)
    for i in range(topology.n):
        out[i] = topology.self_weight_at(i, t) * x[i]
        for j, w in topology.neighbours_at(i, t):
            out[i] += w * x[j]
    return out


# ---------------------------------------------------------------------------------------------
# the constructions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", [2, 3, 4])
@pytest.mark.parametrize("n", range(2, 65))
def test_base_cycle_multiplies_to_j_with_degree_at_most_k(n: int, base: int) -> None:
    topo = build_topology(f"base-{base}", n)
    rounds = [topo.matrix_at(t) for t in range(topo.cycle_length)]
    np.testing.assert_allclose(product(rounds), np.full((n, n), 1.0 / n), atol=TOL, rtol=0)
    for R in rounds:
        assert_valid_round(R)
        assert max(off_degrees(R)) <= base - 1
    assert topo.cycle_length <= 2 * floor_log(n, base) + 2
    assert topo.cycle_length == AUTHORS_LENGTHS[base][n - 2]


def assert_averages_with_degree_below(rounds: list[np.ndarray], n: int, base: int) -> None:
    """No round for one party; otherwise the rounds multiply to J, each of degree < base."""
    if n == 1:
        assert rounds == []
        return
    np.testing.assert_allclose(product(rounds), np.full((n, n), 1.0 / n), atol=TOL, rtol=0)
    for R in rounds:
        assert max(off_degrees(R)) <= base - 1


@pytest.mark.parametrize("base", [2, 3, 5])
@pytest.mark.parametrize("n", [1, 7, 20, 33, 100])
def test_simple_base_graph_also_multiplies_to_j(n: int, base: int) -> None:
    rounds = simple_base_rounds(n, base)
    assert_averages_with_degree_below(rounds, n, base)
    for R in rounds:
        assert_valid_round(R)
    assert len(rounds) <= 2 * floor_log(n, base) + 2


@pytest.mark.parametrize("n", [2**m for m in range(1, 7)])
def test_one_peer_exponential_pairs_i_with_i_xor_2_tau(n: int) -> None:
    topo = build_topology("one-peer-exponential", n)
    m = n.bit_length() - 1
    assert topo.cycle_length == m
    rounds = [topo.matrix_at(t) for t in range(m)]
    np.testing.assert_allclose(product(rounds), np.full((n, n), 1.0 / n), atol=TOL, rtol=0)
    for tau, R in enumerate(rounds):
        assert_valid_round(R)
        assert off_degrees(R) == [1] * n
        for i in range(n):
            assert topo.neighbours_at(i, tau) == [(i ^ (1 << tau), 0.5)]
            assert topo.self_weight_at(i, tau) == 0.5
            peer = i ^ (1 << tau)
            assert peer in ((i + 2**tau) % n, (i - 2**tau) % n)


def test_cycle_lengths_at_the_issue_sizes() -> None:
    assert build_topology("base-2", 20).cycle_length == 7
    assert build_topology("base-3", 20).cycle_length == 5
    assert build_topology("one-peer-exponential", 16).cycle_length == 4
    assert build_topology("Base-2", 16).cycle_length == 4  # a hypercube, like one-peer


def test_one_node_is_trivial() -> None:
    for name in ("one-peer-exponential", "base-2", "base-5"):
        topo = build_topology(name, 1)
        assert topo.cycle_length == 1
        assert not topo.is_time_varying
        assert topo.is_full_average_at(0) and topo.is_full_average_at(3)
        assert topo.neighbours_at(0, 2) == []
        assert topo.union_neighbours(0) == []


def test_few_parties_average_in_one_round() -> None:
    topo = build_topology("base-4", 4)
    assert topo.cycle_length == 1
    assert topo.is_full_average_at(0) and topo.is_full_average_at(1)
    np.testing.assert_array_equal(topo.matrix_at(5), np.full((4, 4), 0.25))
    assert not topo.is_time_varying


@pytest.mark.parametrize("base, n", [(2, 8), (3, 6), (4, 12), (2, 1)])
def test_hyper_hypercube(base: int, n: int) -> None:
    rounds = hyper_hypercube_rounds(n, base)
    assert_averages_with_degree_below(rounds, n, base)
    with pytest.raises(TopologyError, match="prime factor above 3"):
        hyper_hypercube_rounds(10, 3)


# ---------------------------------------------------------------------------------------------
# the Topology API on cycles
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, n", [("base-2", 20), ("base-3", 20), ("one-peer-exponential", 16)])
def test_gossip_party_by_party_reaches_the_mean_after_one_cycle(name: str, n: int) -> None:
    topo = build_topology(name, n)
    x = np.random.default_rng(0).normal(size=(n, 3))
    mean = x.mean(axis=0)
    for t in range(topo.cycle_length):
        x = gossip_by_party(topo, x, t)
        np.testing.assert_allclose(x.sum(axis=0) / n, mean, atol=TOL)
    np.testing.assert_allclose(x, np.broadcast_to(mean, x.shape), atol=TOL, rtol=0)


@pytest.mark.parametrize("name, n", [("base-2", 20), ("base-3", 11), ("one-peer-exponential", 8)])
def test_neighbours_at_agrees_with_matrix_at(name: str, n: int) -> None:
    topo = build_topology(name, n)
    L = topo.cycle_length
    for t in range(2 * L + 1):
        M = topo.matrix_at(t)
        assert M is topo.rounds[t % L]
        assert not M.flags.writeable
        assert topo.is_full_average_at(t) == bool(np.array_equal(M, np.full((n, n), 1.0 / n)))
        for i in range(n):
            expected = [(j, float(M[i, j])) for j in range(n) if j != i and M[i, j] > 0]
            assert topo.neighbours_at(i, t) == expected
            assert topo.self_weight_at(i, t) == M[i, i]
        assert topo.degrees_at(t) == tuple(off_degrees(M))


def test_union_neighbours_and_w_is_the_unions_metropolis_hastings() -> None:
    topo = build_topology("base-2", 20)
    adjacency = np.zeros((20, 20), dtype=bool)
    for t in range(topo.cycle_length):
        for i in range(20):
            for j, _ in topo.neighbours_at(i, t):
                adjacency[i, j] = True
    for i in range(20):
        assert topo.union_neighbours(i) == [j for j in range(20) if adjacency[i, j]]
    np.testing.assert_allclose(topo.W, brute_force_mh(adjacency), atol=TOL, rtol=0)
    assert topo.lam == pytest.approx(mixing_rate(brute_force_mh(adjacency)), abs=1e-12)
    assert topo.degrees == tuple(int(adjacency[i].sum()) for i in range(20))


def test_cycle_properties() -> None:
    topo = build_topology("base-3", 20)
    assert topo.is_time_varying
    assert topo.effective_lambda == 0.0
    assert topo.period is None
    np.testing.assert_allclose(topo.cycle_product, np.full((20, 20), 0.05), atol=TOL, rtol=0)
    assert "cycle=5" in repr(topo)
    again = pickle.loads(pickle.dumps(topo))
    assert again.cycle_length == 5
    for t in range(5):
        np.testing.assert_array_equal(again.matrix_at(t), topo.matrix_at(t))


def test_effective_lambda_of_a_cycle_that_does_not_average_exactly() -> None:
    W = ring(6)
    topo = Topology.from_rounds("twice-ring", [W, np.eye(6), W])
    assert topo.cycle_length == 3
    np.testing.assert_allclose(topo.W, W, atol=TOL, rtol=0)  # the union is the ring: MH is 1/3
    assert topo.effective_lambda == pytest.approx(mixing_rate(W @ W) ** (1 / 3), rel=1e-12)
    assert topo.effective_lambda > 0.5
    assert topo.is_time_varying
    assert not Topology.from_rounds("same", [W, W]).is_time_varying


def test_static_and_periodic_topologies_keep_their_behaviour() -> None:
    ring_topo = build_topology("ring", 6)
    assert ring_topo.rounds is None
    assert ring_topo.cycle_length == 1
    assert not ring_topo.is_time_varying
    for t in (0, 5):
        assert ring_topo.neighbours_at(2, t) == ring_topo.neighbours(2)
        assert ring_topo.self_weight_at(2, t) == pytest.approx(1 / 3)
    assert ring_topo.union_neighbours(0) == [1, 5]
    fed = federated(4, period=3)
    assert fed.cycle_length == 3
    assert fed.is_time_varying
    assert fed.neighbours_at(1, 0) == []
    assert fed.neighbours_at(1, 2) == [(0, 0.25), (2, 0.25), (3, 0.25)]
    assert fed.self_weight_at(1, 0) == 1.0
    assert fed.union_neighbours(1) == [0, 2, 3]
    assert not federated(4, period=1).is_time_varying
    assert not build_topology("full", 5).is_time_varying


def test_invalid_cycles_are_refused() -> None:
    W = ring(4)
    with pytest.raises(TopologyError, match="both an averaging period and a cycle"):
        Topology(name="x", W=W, period=2, rounds=(W,))
    with pytest.raises(TopologyError, match="non-empty"):
        Topology(name="x", W=W, rounds=())
    with pytest.raises(TopologyError, match="shape"):
        Topology(name="x", W=W, rounds=(np.eye(3),))
    with pytest.raises(TopologyError, match=r"Round 1 .* not symmetric"):
        Topology(name="x", W=W, rounds=(W, np.array([[0.5, 0.5, 0, 0], [0, 0.5, 0.5, 0]] * 2)))
    with pytest.raises(TopologyError, match="not connected"):
        Topology.from_rounds("islands", [np.eye(4)])
    with pytest.raises(ValueError):
        build_topology("base-2", 5).matrix_at(-1)
    with pytest.raises(IndexError):
        build_topology("base-2", 5).neighbours_at(5, 0)


# ---------------------------------------------------------------------------------------------
# names and errors
# ---------------------------------------------------------------------------------------------


def test_names_are_registered() -> None:
    assert "one-peer-exponential" in TOPOLOGY_NAMES
    assert "base-K" in TOPOLOGY_NAMES
    with pytest.raises(TopologyError) as info:
        build_topology("hypercube", 8)
    assert "one-peer-exponential" in str(info.value) and "base-K" in str(info.value)
    assert build_topology(" BASE-03 ", 9).name == "base-3"
    assert build_topology("One-Peer-Exponential", 4).name == "one-peer-exponential"


@pytest.mark.parametrize("name", ["base-1", "base-0", "base-x", "base-", "base--3", "base-2.5"])
def test_bad_base_names(name: str) -> None:
    with pytest.raises(TopologyError) as info:
        build_topology(name, 8)
    message = str(info.value)
    assert "\n" not in message
    assert name in message
    assert "integer of at least 2" in message


def test_one_peer_exponential_needs_a_power_of_two() -> None:
    with pytest.raises(TopologyError) as info:
        build_topology("one-peer-exponential", 20)
    message = str(info.value)
    assert "\n" not in message
    assert "N = 20" in message and "16 and 32" in message and "base-2" in message
    with pytest.raises(TopologyError, match="N = 3; the nearest powers of 2 are 2 and 4"):
        one_peer_exponential(3)
    with pytest.raises(TopologyError, match="integer >= 2"):
        base_rounds(5, 1)
    assert base_graph(6, 3).name == "base-3"


# ---------------------------------------------------------------------------------------------
# printing and the CLI
# ---------------------------------------------------------------------------------------------


def test_describe_mentions_the_cycle() -> None:
    text = describe(build_topology("base-2", 20))
    assert "cycle: 7 round(s)" in text
    assert "the product of one cycle is J" in text
    assert "largest degree of a round: 1" in text
    assert "effective lambda per iteration: 0.000000" in text
    assert "cycle" not in describe(build_topology("ring", 20))
    with pytest.raises(TopologyError, match="no cycle"):
        describe_cycle(build_topology("ring", 5))


def _table_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s", line)]


@pytest.mark.parametrize("model_bytes", [None, 1204])
def test_cli_show_base_2_at_20(capsys: pytest.CaptureFixture[str], model_bytes: int | None) -> None:
    argv = ["topology", "base-2", "--nodes", "20", "--show"]
    if model_bytes is not None:
        argv += ["--model-bytes", str(model_bytes)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    B = 4 * (300 * 28 + 28 + 28 + 1) if model_bytes is None else model_bytes
    assert W7A_MODEL_BYTES == 33828
    assert f"model size B = {B} bytes" in out
    assert "cycle: 7 round(s)" in out
    topo = build_topology("base-2", 20)
    rows = _table_rows(out)
    assert len(rows) == 7
    totals = np.zeros(20, dtype=np.int64)
    for t, row in enumerate(rows):
        degrees = off_degrees(topo.rounds[t])
        totals += degrees
        assert int(row[0]) == t
        assert int(row[1]) == max(degrees) == 1
        assert float(row[2]) == pytest.approx(sum(degrees) / 20, abs=0.005)
        assert int(row[3]) == max(degrees) * B
        assert float(row[4]) == pytest.approx(sum(degrees) / 20 * B, abs=0.05)
        edges = {tuple(map(int, e.split("-"))) for e in row[5:]}
        M = topo.rounds[t]
        assert edges == {(i, j) for i in range(20) for j in range(i + 1, 20) if M[i, j] > 0}
    assert f"per cycle: bytes sent per party max {int(totals.max()) * B}, " in out
    assert f"mean {totals.mean() * B:.1f}" in out
    # W is still printed, as for static topologies: 20 rows of 20 numbers.
    matrix_rows = [ln for ln in out.splitlines() if re.fullmatch(r"(\d\.\d{4} ){19}\d\.\d{4}", ln)]
    assert len(matrix_rows) == 20


def test_cli_static_output_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "ring", "--nodes", "4", "--show"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-4:] == [
        "0.3333 0.3333 0.0000 0.3333",
        "0.3333 0.3333 0.3333 0.0000",
        "0.0000 0.3333 0.3333 0.3333",
        "0.3333 0.0000 0.3333 0.3333",
    ]
    assert len(out) == 9
    assert not any("cycle" in line or "bytes" in line for line in out)


def test_cli_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "one-peer-exponential", "--nodes", "20"]) != 0
    assert "16 and 32" in capsys.readouterr().err
    assert main(["topology", "base-1", "--nodes", "20"]) != 0
    assert "integer of at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["topology", "base-2", "--show", "--model-bytes", "0"])


# ---------------------------------------------------------------------------------------------
# survivors
# ---------------------------------------------------------------------------------------------


def _union_edges(topo: Topology, ranks: list[int]) -> set[tuple[int, int]]:
    edges = set()
    for t in range(topo.cycle_length):
        M = topo.matrix_at(t)
        for a in range(topo.n):
            for b in range(a + 1, topo.n):
                if M[a, b] > 0:
                    edges.add((ranks[a], ranks[b]))
    return edges


@pytest.mark.parametrize("base", [2, 3])
def test_survivors_of_a_base_cycle_get_a_base_cycle(base: int) -> None:
    topo = build_topology(f"base-{base}", 20)
    alive = [r for r in range(20) if r not in (3, 7, 11)]
    new, graph = surviving_topology(topo, reversed(alive))
    assert new.name == f"base-{base}"
    assert new.n == 17
    assert graph.ranks == tuple(alive) and graph.lost == (3, 7, 11)
    reference = build_topology(f"base-{base}", 17)
    assert new.cycle_length == reference.cycle_length
    for t in range(new.cycle_length):
        np.testing.assert_array_equal(new.matrix_at(t), reference.matrix_at(t))
    np.testing.assert_allclose(product(new.rounds), np.full((17, 17), 1 / 17), atol=TOL, rtol=0)
    np.testing.assert_array_equal(graph.W, new.W)
    old_edges = _union_edges(topo, list(range(20)))
    new_edges = _union_edges(new, alive)
    assert set(graph.removed_edges) == old_edges - new_edges
    assert {b.edge for b in graph.bridges} == new_edges - old_edges
    assert all(b.around == () and f"base-{base} cycle" in b.reason for b in graph.bridges)
    assert any(3 in e for e in graph.removed_edges)


def test_survivors_of_one_peer_exponential() -> None:
    topo = build_topology("one-peer-exponential", 16)
    new, _ = surviving_topology(topo, range(15))
    assert new.name == "base-2" and new.n == 15
    np.testing.assert_allclose(product(new.rounds), np.full((15, 15), 1 / 15), atol=TOL, rtol=0)
    assert max(max(off_degrees(R)) for R in new.rounds) == 1
    new, _ = surviving_topology(topo, [0, 2, 4, 6, 8, 10, 12, 14])
    assert new.name == "one-peer-exponential" and new.cycle_length == 3
    same, graph = surviving_topology(topo, range(16))
    assert same is topo and graph.unchanged
    alone, _ = surviving_topology(topo, [5])
    assert alone.n == 1 and alone.is_full_average_at(0)


def test_survivors_of_an_unnamed_cycle_keep_its_degree_budget() -> None:
    topo = Topology.from_rounds("custom", build_topology("base-3", 9).rounds)
    new, _ = surviving_topology(topo, range(7), on_disconnected="raise")
    assert new.name == "base-3"
    np.testing.assert_allclose(product(new.rounds), np.full((7, 7), 1 / 7), atol=TOL, rtol=0)
    with pytest.raises(TopologyError, match="on_disconnected"):
        surviving_topology(topo, range(7), on_disconnected="nope")  # type: ignore[arg-type]
