"""Small collectives as one direct exchange (slate.engines.distributed.wire.direct): on 3 gloo
processes, DirectWire's sum, min and max equal gloo's all_reduce, its gather gloo's
all_gather and its broadcast gloo's, bit for bit (integers, and floats summed in rank order), with
one batch_isend_irecv step per exchange; the engine sends messages up to DIRECT_BYTES directly and
larger ones through gloo's ring."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slate.engines.distributed.control.failures import FailureGuard, Waiter
from slate.engines.distributed.wire.direct import DIRECT_BYTES, REDUCERS, DirectWire
from tests import spawned

WORLD = 3
OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def _values(rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return {
        "ints": torch.randint(-1000, 1000, (37,), generator=g, dtype=torch.int64),
        "words": torch.randint(0, 1 << 30, (9,), generator=g, dtype=torch.int64),
        "floats": torch.randn(53, generator=g, dtype=torch.float64),
    }


def _party(rank: int, init: str, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    steps = []
    real = dist.batch_isend_irecv

    def counted(ops):
        steps.append(len(ops))
        return real(ops)

    dist.batch_isend_irecv = counted
    wire = DirectWire(rank, tuple(range(WORLD)))
    waiter = Waiter(FailureGuard(rank))
    values = _values(rank)
    got = {}
    for name, value in values.items():
        for op in ("sum", "min", "max"):
            got[f"{name}-{op}"] = wire.reduce(waiter, value.clone(), op)
        got[f"{name}-gather"] = torch.stack(wire.gather(waiter, value))
        shared = value.clone() if rank == 1 else torch.zeros_like(value)
        wire.broadcast(waiter, shared, 1)
        got[f"{name}-broadcast"] = shared
    direct_steps = list(steps)
    dist.batch_isend_irecv = real
    # gloo's own collectives on the same values (integers: any order gives the same bits)
    for name, value in values.items():
        for op in ("sum", "min", "max") if name != "floats" else ("min", "max"):
            ring = value.clone()
            dist.all_reduce(ring, op=OPS[op])
            got[f"gloo-{name}-{op}"] = ring
        parts = [torch.empty_like(value) for _ in range(WORLD)]
        dist.all_gather(parts, value)
        got[f"gloo-{name}-gather"] = torch.stack(parts)
        shared = value.clone() if rank == 1 else torch.zeros_like(value)
        dist.broadcast(shared, 1)
        got[f"gloo-{name}-broadcast"] = shared
    out[rank] = (got, direct_steps)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    init = f"file://{tmp_path_factory.mktemp('direct') / 'store'}"
    with mp.Manager() as manager:
        out = manager.dict()
        spawned.spawn(_party, (init, out), nprocs=WORLD)
        return dict(out)


@pytest.mark.processes
def test_direct_exchanges_equal_gloos_collectives(results):
    for rank in range(WORLD):
        got, _ = results[rank]
        for key, value in got.items():
            if key.startswith("gloo-"):
                assert torch.equal(got[key.removeprefix("gloo-")], value), (rank, key)


@pytest.mark.processes
def test_a_float_sum_is_the_rank_order_sum_with_the_same_bits_everywhere(results):
    values = [_values(r)["floats"] for r in range(WORLD)]
    in_order = REDUCERS["sum"](REDUCERS["sum"](values[0], values[1]), values[2])
    for rank in range(WORLD):
        assert torch.equal(results[rank][0]["floats-sum"], in_order)


@pytest.mark.processes
def test_each_exchange_is_one_step_of_one_message_each_way_per_peer(results):
    # Three values, each with 3 reductions and a gather: each exchange is 2 sends and 2
    # receives; then 3 broadcasts: the source posts 2 sends, each other member 1 receive.
    exchanges = 4 + 4 + 4
    for rank in range(WORLD):
        steps = results[rank][1]
        broadcasts = [2 if rank == 1 else 1] * 3
        assert len(steps) == exchanges + 3
        assert sorted(steps) == sorted([4] * exchanges + broadcasts)


def test_the_engine_sends_small_messages_directly_and_large_ones_through_the_ring():
    from slate.engines.distributed.engine import DistributedEngine

    engine = DistributedEngine.__new__(DistributedEngine)  # only the choice, no process group
    engine._wire, engine.rank, engine.members = None, 0, (0, 1, 2)
    small = torch.zeros(DIRECT_BYTES // 8, dtype=torch.float64)
    large = torch.zeros(DIRECT_BYTES // 8 + 1, dtype=torch.float64)
    assert isinstance(engine._small_exchange(small), DirectWire)
    assert engine._small_exchange(large) is None
    engine.members = (0,)
    assert engine._small_exchange(small) is None  # alone: nothing to exchange
