"""Receives posted ahead (slate.engines.distributed.wire.transport): within a chunk the
distributed communicator posts each gossip round's receives when the previous round has arrived.
On 4 gloo processes over base-2 with local steps, the mixed parameters equal the simulator's
communicator on the same stacked values, bit for bit, whether the rounds were posted ahead or
not; a direct exchange between two rounds (tag 0) never takes a gossip message; nothing stays
posted past the chunk's end; and SLATE's two exchanges an iteration (the tracker, then the
parameters) each get their own messages."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slate.communication.gossip import GossipSettings
from slate.engines.distributed.control.failures import FailureGuard, Waiter
from slate.engines.distributed.wire.direct import DirectWire
from slate.engines.distributed.wire.transport import DistributedCommunicator
from slate.engines.simulator import SimulatorCommunicator
from slate.topology.registry import build_topology

WORLD = 4
EVERY = 2
END = 12  # the chunk: iterations 0..11, six gossip rounds (t = 1, 3, ..., 11)
D = 5


def _values(t: int, k: int) -> torch.Tensor:
    """Every party's value mixed by exchange ``k`` of iteration ``t`` (rows: parties)."""
    g = torch.Generator().manual_seed(1000 * t + k)
    return torch.randn(WORLD, D, generator=g, dtype=torch.float64)


def _party(rank: int, init: str, ahead: bool, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    topology = build_topology("base-2", WORLD)
    comm = DistributedCommunicator(topology, rank, waiter=Waiter(FailureGuard(rank)),
                                   settings=GossipSettings(every=EVERY))  # fmt: skip
    posted = []
    real_swap = comm._line.swap

    def watched(*args, **kwargs):
        posted.append(args[-1] is not None)
        return real_swap(*args, **kwargs)

    comm._line.swap = watched
    mixed, gathered = {}, {}
    comm.run_through(END if ahead else None)
    for t in range(END):
        comm.set_iteration(t)
        for k in range(2):  # two exchanges an iteration, as gradient tracking makes
            mixed[(t, k)] = comm.mix(_values(t, k)[rank : rank + 1].clone())
        if t == 6:  # a direct exchange between two rounds, on tag 0
            mine = torch.full((3,), float(rank))
            gathered = DirectWire(rank, tuple(range(WORLD))).gather(comm.waiter, mine)
    left_posted = len(comm._ahead)
    comm.run_through(None)
    out[rank] = (mixed, gathered, posted, left_posted)
    dist.barrier()
    dist.destroy_process_group()


def _run(tmp_path, ahead: bool) -> dict:
    init = f"file://{tmp_path / ('store-ahead' if ahead else 'store')}"
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_party, args=(init, ahead, out), nprocs=WORLD)
        return dict(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ahead")
    return {ahead: _run(tmp, ahead) for ahead in (True, False)}


def _simulated() -> dict:
    topology = build_topology("base-2", WORLD)
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float64,
                                 GossipSettings(every=EVERY))  # fmt: skip
    mixed = {}
    for t in range(END):
        comm.set_iteration(t)
        for k in range(2):
            mixed[(t, k)] = comm.mix(_values(t, k))
    return mixed


@pytest.mark.processes
def test_gossip_with_receives_posted_ahead_equals_the_simulator(runs):
    reference = _simulated()
    for ahead in (True, False):
        for rank, (mixed, _, _, _) in runs[ahead].items():
            for key, value in reference.items():
                torch.testing.assert_close(mixed[key][0], value[rank], rtol=0, atol=0)


@pytest.mark.processes
def test_every_round_but_the_chunks_first_was_posted_ahead(runs):
    rounds = END // EVERY
    for rank, (_, _, posted, left) in runs[True].items():
        # two exchanges a round; each round's receives posted at the previous round's end
        assert posted == [False, False] + [True, True] * (rounds - 1), rank
        assert left == 0  # the last round posts nothing: the chunk ends there
    for _, (_, _, posted, _) in runs[False].items():
        assert posted == [False, False] * rounds


@pytest.mark.processes
def test_a_direct_exchange_between_rounds_gets_its_own_messages(runs):
    for ahead in (True, False):
        for rank, (_, gathered, _, _) in runs[ahead].items():
            expected = [torch.full((3,), float(r)) for r in range(WORLD)]
            for got, want in zip(gathered, expected, strict=True):
                assert torch.equal(got, want), rank
