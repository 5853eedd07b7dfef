"""The stop and join flags carried by the gossip (slate.communication.flag_flood): the window
against a brute-force flood of every party's own bit, and a run's exchanges with and without it."""

from __future__ import annotations

import itertools

import pytest

from slate.communication.flag_flood import (
    FlagFlood,
    flag_bits,
    flooding_start,
    gossip_iterations,
)
from slate.config import TrainConfig, default_checkpoint_every, resolve_config
from slate.topology import build_topology
from slate.training.loop import train


def flooded(topology, rounds: list[int]) -> bool:
    """Brute force: each party starts knowing its own bit; in each round it learns what every
    neighbour of that round knew before the round. Does every party end knowing every bit?"""
    n = topology.n
    known = [{i} for i in range(n)]
    for r in rounds:
        before = [set(k) for k in known]
        for i in range(n):
            for j, _ in topology.neighbours_at(i, r):
                known[i] |= before[j]
    return all(len(k) == n for k in known)


@pytest.mark.parametrize(
    ("name", "n"),
    [("base-2", 8), ("base-2", 6), ("base-3", 9), ("one-peer-exponential", 16), ("ring", 7),
     ("torus", 9), ("federated", 4), ("star", 5), ("exponential", 10)],
)  # fmt: skip
@pytest.mark.parametrize("first", [0, 3])
def test_the_window_is_the_shortest_suffix_that_floods(name, n, first):
    topology = build_topology(name, n)
    rounds = list(range(first, first + 12))
    k = flooding_start(topology, rounds)
    suffixes = [j for j in range(len(rounds)) if flooded(topology, rounds[j:])]
    assert k == (max(suffixes) if suffixes else None)


def test_base_2_on_a_power_of_two_floods_in_log2_n_rounds():
    for n in (2, 4, 8, 16):
        rounds = list(range(20))
        assert flooding_start(build_topology("base-2", n), rounds) == 20 - (n.bit_length() - 1)


def test_gossip_iterations_follow_local_steps_and_skip_exact_averages():
    ring = build_topology("ring", 4)
    assert gossip_iterations(ring, 25, 0, 100) == [24, 49, 74, 99]
    assert gossip_iterations(ring, 25, 30, 80) == [49, 74]
    assert gossip_iterations(ring, 1, 5, 8) == [5, 6, 7]
    # federated (period 10): iterations 9, 19, ... are exact averages, not messages
    assert 9 not in gossip_iterations(build_topology("federated", 4), 1, 0, 20)


def test_every_party_holds_the_or_of_the_flags_taken_when_the_window_opened():
    """Play the parties' messages of one planned chunk: each takes its flags at its first
    message of the window; a flag raised later waits for the next chunk."""
    topology, every = build_topology("base-2", 8), 1
    own = {i: flag_bits([i == 5, i == 2]) for i in range(8)}
    plans = {i: FlagFlood.plan(topology, every, 0, 10, lambda i=i: own[i]) for i in range(8)}
    assert plans[0] is not None and plans[0].window == (7, 10)
    for t in range(10):
        sent = {i: plans[i].outgoing(t) for i in range(8)}
        if t == 8:
            own[1] = flag_bits([True, True])  # too late for this chunk
        for i in range(8):
            for j, _ in topology.neighbours_at(i, t):
                plans[i].arrived(t, sent[j])
    assert {plans[i].agreed(10) for i in range(8)} == {0b11}
    assert plans[0].agreed(9) is None


def test_messages_outside_the_window_carry_nothing():
    plan = FlagFlood((5, 10), lambda: 0b1)
    assert plan.outgoing(4) == 0 and not plan.taken
    plan.arrived(4, 0b10)
    assert plan.outgoing(5) == 0b1
    plan.arrived(6, 0b10)
    assert plan.agreed(10) == 0b11


def _run(tmp_path, name: str, **extra):
    config = TrainConfig(dataset="digits", nodes=4, topology="base-2", iterations=60,
                         eval_every=30, checkpoint_every=10, seed=1, out=str(tmp_path / name),
                         **extra)  # fmt: skip
    return train(config, progress=False, figures=False, log=lambda _: None).summary


def test_a_run_whose_gossip_carries_the_flags_spends_no_exchange_on_them(tmp_path, monkeypatch):
    carried = _run(tmp_path, "carried")
    monkeypatch.setattr(FlagFlood, "plan", classmethod(lambda cls, *args: None))
    exchanged = _run(tmp_path, "exchanged")
    # Chunks end at 10, 20, ..., 60: the flags at 0 and 30 ride in the evaluation's sum,
    # those at 10, 20, 40 and 50 take a round trip each unless the gossip carries them (the
    # end, 60, needs none).
    assert exchanged["collective_round_trips"] - carried["collective_round_trips"] == 4
    assert carried["test_ap"] == exchanged["test_ap"]


@pytest.mark.parametrize("bits", list(itertools.product([False, True], repeat=2)))
def test_flag_bits(bits):
    value = flag_bits(list(bits))
    assert [bool(value >> k & 1) for k in range(2)] == list(bits)


@pytest.mark.parametrize(
    ("iterations", "every", "expected"), [(2000, 1, 200), (2000, 25, 200), (50, 25, 25),
                                          (50, 1, 5), (3, 1, 1), (1000, 30, 120)],
)  # fmt: skip
def test_the_default_checkpoint_interval_is_a_whole_number_of_gossip_rounds(
    iterations, every, expected
):
    assert default_checkpoint_every(iterations, every) == expected
    resolved = resolve_config(TrainConfig(dataset="digits", iterations=iterations,
                                          gossip_every=every))  # fmt: skip
    assert resolved.checkpoint_every == expected
