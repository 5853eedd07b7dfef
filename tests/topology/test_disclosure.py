"""What the evaluation average gives away (:mod:`slate.topology.disclosure`), checked against a
brute-force linear-algebra reference.

The reference sets up what site ``i`` knows as linear functionals of the sites' models
``z_0 .. z_{N-1}``: its own ``e_i``, each heard neighbour's ``e_j`` and the sum ``1`` (the
average times N). Site ``k`` is exposed to ``i`` iff ``k`` is neither ``i`` nor heard and
``e_k`` lies in the row space of those functionals: appending ``e_k`` leaves the rank unchanged
(integer matrices, ranks computed exactly by sympy).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import sympy
from sympy.polys.domains import QQ
from sympy.polys.matrices import DomainMatrix

from slate.topology import Topology, build_topology
from slate.topology.disclosure import (
    evaluated_iterations,
    evaluation_exposures,
    exposed_by_average,
    exposure_text,
    heard_in_round,
    run_exposures,
    tracking_exposures,
)


def _rank(A: sympy.Matrix) -> int:
    """The exact rank of a rational matrix (over QQ)."""
    return DomainMatrix.from_Matrix(A).convert_to(QQ).rank()


def _reference_round(M: np.ndarray, averaged: bool) -> list[tuple[int, ...]]:
    """For each site, the sites whose ``e_k`` the known functionals span (rank test)."""
    n = M.shape[0]
    out: list[tuple[int, ...]] = []
    for i in range(n):
        heard = [] if averaged else [j for j in range(n) if j != i and (M[i, j] > 0 or M[j, i] > 0)]
        rows = [[int(c == i) for c in range(n)]]
        rows += [[int(c == j) for c in range(n)] for j in heard]
        rows.append([1] * n)
        known = sympy.Matrix(rows)
        rank = _rank(known)
        exposed = []
        for k in range(n):
            if k == i or k in heard:
                continue
            unit = sympy.Matrix([[int(c == k) for c in range(n)]])
            if _rank(known.col_join(unit)) == rank:
                exposed.append(k)
        out.append(tuple(exposed))
    return out


def _reference_run(topology, evaluated, every: int) -> list[tuple[int, ...]]:
    """The union over every evaluation of the reference of the round before it."""
    n = topology.n
    union: list[set[int]] = [set() for _ in range(n)]
    memo: dict[int, list[tuple[int, ...]]] = {}  # (the same round, the same answer)
    for T in evaluated:
        if T < 1:
            continue
        t = T - 1
        key = t % (every * topology.cycle_length)
        if key in memo:
            found = memo[key]
        elif (t + 1) % every:
            found = memo[key] = _reference_round(np.eye(n), averaged=False)
        else:
            r = t // every
            found = memo[key] = _reference_round(
                np.asarray(topology.matrix_at(r)), topology.is_full_average_at(r)
            )
        for i, ks in enumerate(found):
            union[i].update(ks)
    return [tuple(sorted(s)) for s in union]


GRAPHS = [
    *(("ring", n) for n in (2, 3, 4, 5, 6, 8)),
    *(("torus", n) for n in (4, 6, 8, 9, 12)),
    *(("full", n) for n in (2, 3, 4, 7)),
    *(("exponential", n) for n in (3, 4, 5, 6, 8, 10)),
    *(("star", n) for n in (3, 4, 6)),
    ("erdos-renyi", 7),
    ("erdos-renyi", 10),
]


@pytest.mark.parametrize(("name", "n"), GRAPHS, ids=[f"{a}-{b}" for a, b in GRAPHS])
def test_a_static_graph_exposes_what_the_rank_argument_finds(name, n):
    topology = build_topology(name, n)
    W = np.asarray(topology.W)
    averaged = topology.is_full_average_at(0)
    assert exposed_by_average(heard_in_round(W, averaged)) == _reference_round(W, averaged)
    assert run_exposures(topology, 40, 10) == _reference_round(W, averaged)


CYCLES = (
    [("one-peer-exponential", n) for n in (2, 4, 8)]
    + [("base-2", n) for n in (3, 4, 5, 6)]
    + [("base-3", n) for n in (4, 5)]
    + [("federated", n) for n in (2, 3, 4)]
)


SCHEDULES = [(60, 10, 1), (61, 7, 1), (60, 10, 2), (45, 9, 3), (60, 1, 1)]


@pytest.mark.parametrize(("name", "n"), CYCLES, ids=[f"{a}-{b}" for a, b in CYCLES])
@pytest.mark.parametrize(("iterations", "eval_every", "every"), SCHEDULES)
def test_a_schedule_exposes_the_union_over_the_rounds_before_its_evaluations(
    name, n, iterations, eval_every, every
):
    topology = build_topology(name, n)
    evaluated = evaluated_iterations(iterations, eval_every)
    expected = _reference_run(topology, evaluated, every)
    assert evaluation_exposures(topology, evaluated, every) == expected
    assert run_exposures(topology, iterations, eval_every, every) == expected


def test_the_named_cases():
    """A ring of 4: each site recovers the site opposite; a ring of 5, a complete graph of 4 or
    more, a torus of 3 x 3: nobody; two sites: each the other (the total minus its own)."""
    assert run_exposures(build_topology("ring", 4), 100, 10) == [(2,), (3,), (0,), (1,)]
    for name, n in (("ring", 5), ("full", 4), ("full", 9), ("torus", 9), ("exponential", 8)):
        assert run_exposures(build_topology(name, n), 100, 10) == [()] * n, name
    assert run_exposures(build_topology("ring", 2), 100, 10) == [(1,), (0,)]


def test_local_steps_hear_nobody_on_an_iteration_without_a_round():
    """A ring of 4 with H = 2: an evaluation after a gossip round exposes the opposite site; one
    after a local step only (nobody heard: the sum of three) exposes nothing."""
    ring = build_topology("ring", 4)
    assert evaluation_exposures(ring, [0, 4, 8], gossip_every=2) == [(2,), (3,), (0,), (1,)]
    assert evaluation_exposures(ring, [0, 3, 7], gossip_every=2) == [()] * 4
    assert evaluation_exposures(build_topology("ring", 2), [3], gossip_every=2) == [(1,), (0,)]


def test_a_cycle_exposes_at_the_rounds_its_evaluations_follow():
    """A cycle of a ring of 4 and a perfect matching: an evaluation after the ring's round
    exposes the opposite site, one after the matching's round nothing (two unheard)."""
    ring = np.asarray(build_topology("ring", 4).W)
    matching = np.array([[0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5], [0, 0, 0.5, 0.5]])
    cycle = Topology.from_rounds("test", (ring, matching))
    assert evaluation_exposures(cycle, [0, 2, 4, 6]) == [()] * 4  # rounds 1, 1, 1
    assert evaluation_exposures(cycle, [0, 1, 3]) == [(2,), (3,), (0,), (1,)]  # round 0
    assert run_exposures(cycle, 60, 10) == [()] * 4
    assert run_exposures(cycle, 61, 10) == [(2,), (3,), (0,), (1,)]  # the last: round 0
    assert run_exposures(cycle, 60, 5) == [(2,), (3,), (0,), (1,)]  # 5, 15, ...: round 0


def test_only_new_positions_of_the_schedule_are_visited():
    """A million iterations cost one period of the schedule, and give the full list's answer."""
    topology = build_topology("base-2", 6)
    full = evaluation_exposures(topology, evaluated_iterations(3000, 7), 3)
    assert run_exposures(topology, 3000, 7, 3) == full
    assert run_exposures(topology, 1_000_000, 7, 3) == full


def test_every_small_graph_agrees_with_the_reference():
    """Every graph on 4 sites (64 of them, connected or not), as a gossip round."""
    pairs = list(itertools.combinations(range(4), 2))
    for chosen in itertools.product((False, True), repeat=len(pairs)):
        A = np.eye(4)
        for (i, j), on in zip(pairs, chosen, strict=True):
            A[i, j] = A[j, i] = float(on)
        assert exposed_by_average(heard_in_round(A)) == _reference_round(A, False)


def test_the_text_names_each_pair():
    assert exposure_text([(2,), (), (0, 3), ()]) == (
        "site 0 recovers site 2's model; site 2 recovers the models of sites 0 and 3"
    )
    assert exposure_text([(), ()]) is None


# --------------------------------------------------------------------------- gradient tracking


def _rational(M: np.ndarray) -> sympy.Matrix:
    return sympy.Matrix([[sympy.Rational(float(v)).limit_denominator(10**6) for v in row]
                         for row in np.asarray(M)])  # fmt: skip


def _reference_window(now, now_avg, nxt, nxt_avg, eta, sum_now, sum_next):
    """Two linked rounds written as sympy expressions of the unknown messages: z_{t+1} =
    M_t z_t - eta M_{t+1} q_{t+1} by matrix products; what site i knows as a list of
    expressions; site k exposed when a message it sent that i did not receive is a linear
    combination of them (ranks of linear_eq_to_matrix), and not identically i's own."""
    n = now.shape[0]
    z = sympy.Matrix(sympy.symbols(f"z0:{n}"))
    q = sympy.Matrix(sympy.symbols(f"q0:{n}"))
    unknowns = [*z, *q]
    z_next = _rational(now) * z - eta * _rational(nxt) * q

    def hears(M: np.ndarray, averaged: bool, i: int) -> list[int]:
        if averaged:
            return []
        return [j for j in range(n) if j != i and (M[i, j] > 0 or M[j, i] > 0)]

    out = []
    for i in range(n):
        known = [z[i], q[i]] + [z[j] for j in hears(now, now_avg, i)]
        for j in hears(nxt, nxt_avg, i):
            known += [q[j], z_next[j]]
        if now_avg or sum_now:
            known.append(sum(z))
        if nxt_avg:
            known += [sum(q), sum(z_next)]
        if sum_next:
            known.append(sum(z_next))
        A, _ = sympy.linear_eq_to_matrix(known, unknowns)
        rank = _rank(A)

        def spans(expr, A=A, rank=rank):
            row, _ = sympy.linear_eq_to_matrix([expr], unknowns)
            return _rank(A.col_join(row)) == rank

        found = []
        for k in range(n):
            if k == i:
                continue
            sent_now = k not in hears(now, now_avg, i) and spans(z[k])
            sent_next = (
                k not in hears(nxt, nxt_avg, i)
                and sympy.expand(z_next[k] - z_next[i]) != 0
                and spans(z_next[k])
            )
            if sent_now or sent_next:
                found.append(k)
        out.append(tuple(found))
    return out


def _reference_tracking(topology, iterations, eval_every, eta):
    """Every pair of rounds t, t + 1 < iterations (the evaluations at t + 1 and t + 2 as sums),
    and the last round with the last evaluation (the single-round reference)."""
    evaluated = set(evaluated_iterations(iterations, eval_every))
    union = [set(ks) for ks in _reference_run(topology, [iterations], 1)]
    cache = {}
    for t in range(iterations - 1):
        key = (t % topology.cycle_length, t + 1 in evaluated, t + 2 in evaluated)
        if key not in cache:
            cache[key] = _reference_window(
                np.asarray(topology.matrix_at(t)), topology.is_full_average_at(t),
                np.asarray(topology.matrix_at(t + 1)), topology.is_full_average_at(t + 1),
                sympy.Rational(1, 7), key[1], key[2],
            )  # fmt: skip
        for i, ks in enumerate(cache[key]):
            union[i].update(ks)
    return [tuple(sorted(s)) for s in union]


TRACKED = [("ring", n) for n in (3, 4, 5, 6, 7, 8, 9)] + [
    ("full", 4), ("torus", 9), ("exponential", 8), ("star", 5), ("base-2", 4), ("base-2", 6),
    ("one-peer-exponential", 8), ("federated", 4),
]  # fmt: skip


TRACKED_CASES = [(name, n, 13, 4) for name, n in TRACKED] + [
    (name, n, 12, 1) for name, n in TRACKED if n <= 6
]


@pytest.mark.parametrize(
    ("name", "n", "iterations", "eval_every"),
    TRACKED_CASES,
    ids=[f"{a}-{b}-T{c}-e{d}" for a, b, c, d in TRACKED_CASES],
)
def test_gradient_tracking_exposes_what_the_symbolic_reference_finds(
    name, n, iterations, eval_every
):
    topology = build_topology(name, n)
    expected = _reference_tracking(topology, iterations, eval_every, sympy.Rational(1, 7))
    assert tracking_exposures(topology, iterations, eval_every) == expected


def test_gradient_tracking_named_cases():
    """Gossip alone links the rounds: a ring of 5 exposes both sites two hops away, a ring of 8
    the opposite site, a ring of 9, a 3 x 3 torus and a complete graph nobody."""
    exposed = lambda name, n: tracking_exposures(build_topology(name, n), 100, 10)  # noqa: E731
    assert exposed("ring", 5)[0] == (2, 3)
    assert exposed("ring", 8) == [((k + 4) % 8,) for k in range(8)]
    for name, n in (("ring", 9), ("torus", 9), ("full", 4)):
        assert exposed(name, n) == [()] * n, name
