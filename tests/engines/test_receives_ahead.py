"""Receives posted ahead (slate.engines.distributed.wire.transport): within a chunk the
distributed communicator posts each gossip round's receives two rounds ahead. On 4 gloo processes
over base-2 and the ring with local steps (on the ring a pair then holds two receives of one
tag), the mixed parameters are the same bits whether the rounds were posted ahead or not, and
equal the simulator communicator's on the same stacked values (bit for bit on base-2, whose
weights 1/2 make every product exact, so each sum is rounded once in any order and on any CPU;
to float64 rounding on the ring); a direct exchange between two rounds (tag 0) never takes a gossip
message; nothing stays posted past the chunk's end; and SLATE's two exchanges an iteration (the
tracker, then the parameters) each get their own messages."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slate.communication.gossip import GossipSettings
from slate.engines.distributed.control.failures import FailureGuard, Waiter
from slate.engines.distributed.wire.direct import DirectWire
from slate.engines.distributed.wire.transport import ROUNDS_AHEAD, DistributedCommunicator
from slate.engines.simulator import SimulatorCommunicator
from slate.topology.registry import build_topology
from tests import spawned

WORLD = 4
EVERY = 2
END = 12  # the chunk: iterations 0..11, six gossip rounds (t = 1, 3, ..., 11)
D = 5


def _values(t: int, k: int) -> torch.Tensor:
    """Every party's value mixed by exchange ``k`` of iteration ``t`` (rows: parties)."""
    g = torch.Generator().manual_seed(1000 * t + k)
    return torch.randn(WORLD, D, generator=g, dtype=torch.float64)


TOPOLOGIES = ("base-2", "ring")


def _variant(rank: int, name: str, ahead: bool) -> tuple:
    """One communicator's chunk on ``name``, its receives posted ahead or not: what it mixed and
    gathered, whether each exchange found posted receives, what was left posted, and the most
    receives it held posted at once."""
    topology = build_topology(name, WORLD)
    comm = DistributedCommunicator(topology, rank, waiter=Waiter(FailureGuard(rank)),
                                   settings=GossipSettings(every=EVERY))  # fmt: skip
    posted = []
    real_swap = comm._line.swap

    def watched(*args, **kwargs):
        posted.append(args[-1] is not None)
        return real_swap(*args, **kwargs)

    comm._line.swap = watched
    mixed, gathered, depth = {}, {}, 0
    comm.run_through(END if ahead else None)
    for t in range(END):
        comm.set_iteration(t)
        for k in range(2):  # two exchanges an iteration, as gradient tracking makes
            mixed[(t, k)] = comm.mix(_values(t, k)[rank : rank + 1].clone())
            depth = max(depth, len(comm._ahead))
        if t == 6:  # a direct exchange between two rounds, on tag 0
            mine = torch.full((3,), float(rank))
            gathered = DirectWire(rank, tuple(range(WORLD))).gather(comm.waiter, mine)
    left_posted = len(comm._ahead)
    comm.run_through(None)
    return mixed, gathered, posted, left_posted, depth


def _party(rank: int, init: str, out) -> None:
    """Every topology, posted ahead and not, one after the other in one process group."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    results = {}
    for name in TOPOLOGIES:
        for ahead in (True, False):
            results[(name, ahead)] = _variant(rank, name, ahead)
            dist.barrier()  # (nothing of one variant is in flight during the next)
    out[rank] = results
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def all_runs(tmp_path_factory) -> dict:
    init = f"file://{tmp_path_factory.mktemp('ahead') / 'store'}"
    with mp.Manager() as manager:
        out = manager.dict()
        spawned.spawn(_party, (init, out), nprocs=WORLD)
        return dict(out)


@pytest.fixture(params=TOPOLOGIES)
def runs(request, all_runs) -> tuple[str, dict]:
    """``(topology, {ahead: {rank: that variant's results}})``."""
    name = request.param
    return name, {
        ahead: {rank: results[(name, ahead)] for rank, results in all_runs.items()}
        for ahead in (True, False)
    }


def _simulated(name: str) -> dict:
    topology = build_topology(name, WORLD)
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float64,
                                 GossipSettings(every=EVERY))  # fmt: skip
    mixed = {}
    for t in range(END):
        comm.set_iteration(t)
        for k in range(2):
            mixed[(t, k)] = comm.mix(_values(t, k))
    return mixed


@pytest.mark.processes
@pytest.mark.kernels
def test_gossip_with_receives_posted_ahead_equals_the_simulator(runs):
    """Posted ahead or not, the same bits; and the simulator's values, bit for bit on base-2
    (weights 1/2) and to float64 rounding on the ring (its matrix product sums the thirds in
    another order)."""
    name, runs = runs
    reference = _simulated(name)
    tolerance = 0.0 if name == "base-2" else 1e-15
    for rank, (mixed, *_) in runs[True].items():
        for key, value in reference.items():
            assert torch.equal(mixed[key], runs[False][rank][0][key]), (name, rank, key)
            torch.testing.assert_close(mixed[key][0], value[rank], rtol=0, atol=tolerance)


@pytest.mark.processes
def test_every_round_but_the_chunks_first_was_posted_ahead(runs):
    _, runs = runs
    rounds = END // EVERY
    for rank, (_, _, posted, left, depth) in runs[True].items():
        # two exchanges a round; each round's receives posted at an earlier round's end
        assert posted == [False, False] + [True, True] * (rounds - 1), rank
        assert depth == 2 * ROUNDS_AHEAD  # each exchange's next rounds, posted at once
        assert left == 0  # the last round posts nothing: the chunk ends there
    for _, (_, _, posted, _, depth) in runs[False].items():
        assert posted == [False, False] * rounds and depth == 0


@pytest.mark.processes
def test_a_direct_exchange_between_rounds_gets_its_own_messages(runs):
    _, runs = runs
    for ahead in (True, False):
        for rank, (_, gathered, *_) in runs[ahead].items():
            expected = [torch.full((3,), float(r)) for r in range(WORLD)]
            for got, want in zip(gathered, expected, strict=True):
                assert torch.equal(got, want), rank
