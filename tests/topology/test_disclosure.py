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

from slate.topology import Topology, build_topology
from slate.topology.disclosure import (
    evaluated_iterations,
    evaluation_exposures,
    exposed_by_average,
    exposure_text,
    heard_in_round,
    run_exposures,
)


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
        rank = known.rank()
        exposed = []
        for k in range(n):
            if k == i or k in heard:
                continue
            unit = sympy.Matrix([[int(c == k) for c in range(n)]])
            if known.col_join(unit).rank() == rank:
                exposed.append(k)
        out.append(tuple(exposed))
    return out


def _reference_run(topology, evaluated, every: int) -> list[tuple[int, ...]]:
    """The union over every evaluation of the reference of the round before it."""
    n = topology.n
    union: list[set[int]] = [set() for _ in range(n)]
    for T in evaluated:
        if T < 1:
            continue
        t = T - 1
        if (t + 1) % every:
            found = _reference_round(np.eye(n), averaged=False)
        else:
            r = t // every
            found = _reference_round(np.asarray(topology.matrix_at(r)),
                                     topology.is_full_average_at(r))  # fmt: skip
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
