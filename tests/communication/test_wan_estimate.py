"""The ``--wan`` estimate against hand-computed values: small collectives charged as one direct
exchange, large ones as gloo's ring, and the whole command's set-up and teardown."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from slate.communication.gossip import WanLink
from slate.engines.base import DIRECT_BYTES, SET_UP_STORE_ROUND_TRIPS
from slate.engines.simulator import SimulatorEngine


def test_a_small_all_reduce_is_one_direct_exchange_whatever_n():
    for n in (2, 4, 8):
        engine = SimulatorEngine(n)
        engine.count_collective(torch.zeros(2))  # the stop and join flags: 8 bytes
        # (n - 1) copies of 8 bytes, one round trip (gloo's ring: n - 1 round trips)
        assert engine.collective_bytes == 8 * (n - 1)
        assert engine.collective_round_trips == 1


def test_a_large_all_reduce_is_gloos_ring():
    engine = SimulatorEngine(4)
    numel = DIRECT_BYTES // 4 + 1  # float32: one element over the direct exchange's limit
    engine.count_collective(torch.zeros(numel))
    assert engine.collective_bytes == Fraction(2 * 3 * numel * 4, 4)  # 2 (N - 1) / N
    assert engine.collective_round_trips == 6  # 2 (N - 1) steps, each a round trip


def test_all_gathers_small_and_large():
    engine = SimulatorEngine(8)
    engine.count_all_gather(torch.zeros(100))  # 400 bytes: direct
    assert (engine.collective_bytes, engine.collective_round_trips) == (7 * 400, 1)
    engine.count_all_gather(torch.zeros(DIRECT_BYTES // 4 + 1))  # ring: N - 1 round trips
    assert engine.collective_round_trips == 1 + 7


def test_the_store_round_trips_of_a_plain_run():
    assert SimulatorEngine(4).store_round_trips == SET_UP_STORE_ROUND_TRIPS["plain"] + 1


def test_the_whole_command_estimate():
    # 80 ms RTT: training 13.9 s, 5 s of the site's own work, 17 store round trips, 12 before
    # training and 4 after: 13.9 + 5 + 0.08 * 33 = 21.54 s
    link = WanLink(80.0, 10.0)
    assert link.whole_seconds(13.9, 5.0, 17, 12, 4) == pytest.approx(21.54)
    # the training estimate itself: 1 s compute, 100 rounds and 20 round trips at 80 ms,
    # 1 MB of gossip at half of 10 Mbit/s and 0.5 MB of collectives with headers
    transfer = 8 * (1e6 / 0.5 + 0.5e6 * 1500 / 1448) / 10e6
    assert link.seconds(1.0, 100, 1e6, 20, 0.5e6) == pytest.approx(1.0 + 120 * 0.08 + transfer)


def test_rounds_posted_early_wait_half_a_round_trip():
    link = WanLink(80.0, 10.0)
    # 100 rounds, 60 of them posted early (40 ms each), 20 other round trips; 1 s of compute
    assert link.seconds(1.0, 100, 0, 20, 0, 60) == pytest.approx(1.0 + 60 * 0.08 + 60 * 0.04)


def test_bytes_of_rounds_posted_early_go_at_the_early_goodput():
    """1 MB of gossip over 100 rounds, 60 of them early: 0.4 MB at half the line rate and
    0.6 MB at 0.8 of it, each byte 8 bits at 10 Mbit/s; all early: all at 0.8."""
    link = WanLink(80.0, 10.0)
    waits = 100 * 0.08 - 60 * 0.04
    bytes_seconds = 8 * (0.4e6 / 0.5 + 0.6e6 / 0.8) / 10e6
    assert link.seconds(0.0, 100, 1e6, 0, 0, 60) == pytest.approx(waits + bytes_seconds)
    assert link.seconds(0.0, 100, 1e6, 0, 0, 100) == pytest.approx(
        100 * 0.04 + 8 * 1e6 / 0.8 / 10e6
    )


def test_the_share_of_rounds_after_another_in_their_chunk():
    """base-2 (4 parties) with two local steps: each chunk of 12 iterations holds 6 rounds, of
    which the last 5 follow another; the same schedule in one chunk of 12 and one of 6 (3
    rounds, 2 early), and no chunk given (nothing posted early)."""
    from slate.communication.gossip import GossipSettings
    from slate.engines.simulator import SimulatorCommunicator
    from slate.topology.registry import build_topology

    def share(chunks: list[tuple[int, int]] | None) -> tuple[float, float]:
        comm = SimulatorCommunicator(build_topology("base-2", 4), torch.device("cpu"),
                                     torch.float32, GossipSettings(every=2))  # fmt: skip
        x = torch.zeros(4, 3)
        for start, end in chunks or [(0, 18)]:
            comm.run_through(end if chunks else None)
            for t in range(start, end):
                comm.set_iteration(t)
                comm.mix(x)
            comm.run_through(None)
        return comm.rounds_after_one, comm.rounds_here

    assert share([(0, 12), (12, 18)]) == (5 + 2, 9)
    assert share(None) == (0, 9)
