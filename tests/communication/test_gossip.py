"""Talking less: local steps, time-varying rounds and CHOCO compressed gossip, against brute-force
references, and the distributed communicator against the simulator's in real gloo processes."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slate.cli import main
from slate.communication import choco
from slate.communication.choco import (
    auto_consensus_step,
    consensus_error_after,
    noisy_consensus_error,
    tuning_rounds,
)
from slate.communication.compression import parse_compressor
from slate.communication.gossip import GossipSettings
from slate.engines.distributed.wire.transport import DistributedCommunicator
from slate.engines.simulator import SimulatorCommunicator
from slate.topology import build_topology
from tests import spawned
from tests.sites import run_command

CPU = torch.device("cpu")


def _parameters(n: int, d: int, seed: int = 0, dtype=torch.float64) -> tuple[torch.Tensor, ...]:
    """A common start x0 (every party the same) and per-party moves away from it."""
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(1, d, generator=gen, dtype=dtype).expand(n, d).clone()
    moves = [0.1 * torch.randn(n, d, generator=gen, dtype=dtype) for _ in range(12)]
    return x0, *moves


# --------------------------------------------------------------------------- local steps


@pytest.mark.parametrize("every", [1, 3, 5])
@pytest.mark.kernels
def test_local_steps_gossip_only_every_h_th_iteration(every):
    topology = build_topology("ring", 6)
    comm = SimulatorCommunicator(topology, CPU, torch.float64, GossipSettings(every=every))
    W = torch.tensor(topology.W)
    x = torch.randn(6, 7, dtype=torch.float64)
    for t in range(12):
        comm.set_iteration(t)
        expected = W @ x if (t + 1) % every == 0 else x
        torch.testing.assert_close(comm.mix(x), expected, rtol=0, atol=1e-12)
    rounds = 12 // every
    assert comm.rounds == rounds
    assert comm.messages_sent == 2 * rounds  # two neighbours on a ring
    assert comm.bytes_sent == 2 * rounds * 7 * 8


def test_a_round_without_gossip_is_the_plain_local_step():
    comm = SimulatorCommunicator(build_topology("ring", 4), CPU, torch.float64, GossipSettings(4))
    x, v = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    comm.set_iteration(0)
    stepped = torch.add(x, v, alpha=-0.3)
    torch.testing.assert_close(comm.mix_step(x, v, 0.3), stepped, rtol=0, atol=0)
    assert comm.traffic() == {"comm_bytes_per_party": 0, "messages_per_party": 0, "rounds": 0}


def test_time_varying_rounds_advance_by_gossip_round():
    """With H = 2 and base-2 over 6 parties, iteration t = 2 r + 1 applies round r's matrix."""
    topology = build_topology("base-2", 6)
    comm = SimulatorCommunicator(topology, CPU, torch.float64, GossipSettings(every=2))
    x = torch.randn(6, 3, dtype=torch.float64)
    for r in range(2 * topology.cycle_length):
        comm.set_iteration(2 * r + 1)
        expected = torch.tensor(topology.matrix_at(r)) @ x
        torch.testing.assert_close(comm.mix(x), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name,n", [("base-2", 20), ("base-3", 11), ("one-peer-exponential", 16)])
@pytest.mark.kernels
def test_one_cycle_of_gossip_is_the_exact_average(name, n):
    topology = build_topology(name, n)
    comm = SimulatorCommunicator(topology, CPU, torch.float64)
    x = torch.randn(n, 4, dtype=torch.float64)
    y = x
    for t in range(topology.cycle_length):
        comm.set_iteration(t)
        y = comm.mix(y)
    torch.testing.assert_close(y, x.mean(dim=0).expand_as(x), rtol=0, atol=1e-12)
    assert comm.rounds == topology.cycle_length


@pytest.mark.parametrize("spec", ["none", "int8"])
def test_federated_local_rounds_send_nothing_and_are_no_rounds(spec):
    """W = I between averages: no bytes, no messages, no rounds, compressed or not."""
    topology = build_topology("federated", 4, fed_period=5)
    compressor = None if spec == "none" else parse_compressor(spec)
    x0 = torch.zeros(4, 6)
    comm = SimulatorCommunicator(
        topology, CPU, torch.float32, GossipSettings(compressor=compressor), x0=x0
    )
    for t in range(10):
        comm.set_iteration(t)
        comm.mix(x0 + t)
    assert comm.rounds == 2 * 2 * (4 - 1)  # two averages, each 2 (N - 1) all-reduce steps
    assert comm.messages_sent == 2 * 2 * (4 - 1)


def test_an_exact_average_counts_the_all_reduce_steps():
    comm = SimulatorCommunicator(build_topology("full", 5), CPU, torch.float32)
    comm.mix(torch.zeros(5, 10))
    assert comm.rounds == 2 * (5 - 1)


# --------------------------------------------------------------------------- CHOCO


def choco_reference(W_of, x, moves, compress, gamma):
    """CHOCO-Gossip written out per edge with Python loops: x_{t+1/2} = x_t + move_t, then one
    round on W_of(t) (copies start at x0, one pair per directed edge)."""
    n, x0_row = x.shape[0], x[0]
    sent = {}  # (i, j) -> hat x_{i -> j}
    for t, move in enumerate(moves):
        x = x + move
        W = W_of(t)
        edges = [(i, j) for i in range(n) for j in range(n) if i != j and W[i, j] > 0]
        q = {}
        for i, j in edges:
            copy = sent.get((i, j), x0_row)
            q[(i, j)] = compress(x[i] - copy)
        for (i, j), value in q.items():
            sent[(i, j)] = sent.get((i, j), x0_row) + value
        new = x.clone()
        for i, j in edges:
            new[i] = new[i] + gamma * W[i, j] * (sent[(j, i)] - sent[(i, j)])
        x = new
    return x


@pytest.mark.parametrize(
    "name,n,spec,gamma",
    [("ring", 6, "int8", 0.5), ("base-2", 6, "topk:0.3", 0.2), ("ring", 5, "sign", 0.3),
     ("one-peer-exponential", 8, "int8", 0.7)],
)  # fmt: skip
@pytest.mark.kernels
def test_choco_simulator_equals_the_per_edge_reference(name, n, spec, gamma):
    topology = build_topology(name, n)
    compressor = parse_compressor(spec)
    x0, *moves = _parameters(n, 37)
    settings = GossipSettings(compressor=compressor, consensus_step=gamma)
    comm = SimulatorCommunicator(topology, CPU, torch.float64, settings, x0=x0)
    x = x0
    for t, move in enumerate(moves):
        comm.set_iteration(t)
        x = comm.mix(x + move)

    def one_row(v):
        return compressor.compress(v[None])[0]

    expected = choco_reference(lambda t: topology.matrix_at(t), x0, moves, one_row, gamma)
    torch.testing.assert_close(x, expected, rtol=0, atol=1e-10)
    # Bytes as encoded: one payload per directed edge of every round, averaged over parties.
    edges = sum(int((topology.matrix_at(t) > 0).sum()) - n for t in range(len(moves)))
    assert comm.bytes_sent == pytest.approx(edges * compressor.payload_bytes(37) / n)
    assert comm.rounds == len(moves)


@pytest.mark.kernels
def test_choco_with_an_exact_compressor_and_unit_step_is_plain_gossip():
    """C = identity and gamma = 1: the copies equal the parameters after each round, so the
    round is x + sum_j w_ij (x_j - x_i) = W x (up to float32 rounding: "none" sends float32)."""
    topology = build_topology("ring", 5)
    x0, move, *_ = _parameters(5, 9, dtype=torch.float32)
    settings = GossipSettings(compressor=parse_compressor("none"), consensus_step=1.0)
    comm = SimulatorCommunicator(topology, CPU, torch.float32, settings, x0=x0)
    x = x0 + move
    W = torch.tensor(topology.W, dtype=torch.float32)
    torch.testing.assert_close(comm.mix(x), W @ x, rtol=0, atol=1e-6)


@pytest.mark.kernels
def test_choco_preserves_the_average():
    topology = build_topology("base-2", 7)
    settings = GossipSettings(compressor=parse_compressor("topk:0.2"), consensus_step=0.3)
    x0, *moves = _parameters(7, 20)
    comm = SimulatorCommunicator(topology, CPU, torch.float64, settings, x0=x0)
    x = x0
    for t, move in enumerate(moves):
        comm.set_iteration(t)
        before = (x + move).mean(dim=0)
        x = comm.mix(x + move)
        torch.testing.assert_close(x.mean(dim=0), before, rtol=0, atol=1e-12)


def test_choco_state_round_trips():
    topology = build_topology("ring", 4)
    settings = GossipSettings(compressor=parse_compressor("int8"), consensus_step=0.5)
    x0, a, b = _parameters(4, 10)[:3]
    first = SimulatorCommunicator(topology, CPU, torch.float64, settings, x0=x0)
    first.mix(x0 + a)
    second = SimulatorCommunicator(topology, CPU, torch.float64, settings, x0=x0)
    second.load_state_dict(first.state_dict())
    first.set_iteration(1)
    second.set_iteration(1)
    torch.testing.assert_close(first.mix(x0 + b), second.mix(x0 + b), rtol=0, atol=0)


def noisy_reference_error(topology, compressor, gamma, d, rounds, seed=0):
    """noisy_consensus_error written out: the same noise draws (one N(0, I) matrix per round from
    a generator seeded with ``seed``) through the per-edge reference, one round at a time, and
    the mean of ||X - mean||^2 / (N d) over the second half of the rounds."""
    n = topology.n
    gen = torch.Generator().manual_seed(seed)
    noise = [torch.randn(n, d, generator=gen).double() for _ in range(rounds)]

    def one_row(v):
        return compressor.compress(v[None])[0]

    errors = []
    x, sent = torch.zeros(n, d, dtype=torch.float64), {}
    for r in range(rounds):
        x = x + noise[r]
        W = topology.matrix_at(r)
        edges = [(i, j) for i in range(n) for j in range(n) if i != j and W[i, j] > 0]
        for i, j in edges:
            copy = sent.get((i, j), torch.zeros(d, dtype=torch.float64))
            sent[(i, j)] = copy + one_row(x[i] - copy)
        new = x.clone()
        for i, j in edges:
            new[i] = new[i] + gamma * W[i, j] * (sent[(j, i)] - sent[(i, j)])
        x = new
        errors.append(float(((x - x.mean(dim=0)) ** 2).sum()) / (n * d))
        if not errors[-1] <= 1e8:
            return math.inf
    return float(np.mean(errors[rounds // 2 :]))


@pytest.mark.parametrize("name,spec", [("ring", "topk:0.2"), ("base-2", "sign")])
def test_noisy_consensus_error_equals_the_per_edge_reference(name, spec):
    topology, compressor = build_topology(name, 5), parse_compressor(spec)
    for gamma in (0.05, 0.3, 1.0):
        fast = noisy_consensus_error(topology, compressor, gamma, 16, 30)
        slow = noisy_reference_error(topology, compressor, gamma, 16, 30)
        assert fast == pytest.approx(slow, rel=1e-4)


def test_exact_noisy_gossip_is_w_applied_to_each_step():
    """C exact, gamma = 1: every round is x <- W (x + xi) on the same noise draws."""
    topology = build_topology("ring", 6)
    error = noisy_consensus_error(topology, parse_compressor("none"), 1.0, 8, 20, seed=3)
    gen = torch.Generator().manual_seed(3)
    W, x, errors = torch.tensor(topology.W), torch.zeros(6, 8, dtype=torch.float64), []
    for _ in range(20):
        x = W @ (x + torch.randn(6, 8, generator=gen).double())
        errors.append(float(((x - x.mean(dim=0)) ** 2).sum()) / 48)
    assert error == pytest.approx(float(np.mean(errors[10:])), rel=1e-5)


AUTO_CASE = ("ring", 6, "sign", 20)  # topology, N, compressor, d


def test_auto_consensus_step_is_the_brute_force_argmin_under_the_same_noise(monkeypatch):
    # (the reference is slow: 60 rounds, more than the 50 a ring's 50 cycles ask, keep the
    # noisy and the noiseless argmin apart, 0.5 against 1.0, as 120 did)
    monkeypatch.setattr(choco, "TUNING_ROUNDS", 60)
    name, n, spec, d = AUTO_CASE
    topology, compressor = build_topology(name, n), parse_compressor(spec)
    grid = (0.01, 0.05, 0.1, 0.2, 0.5, 1.0)
    chosen = auto_consensus_step(topology, compressor, d, grid=grid)
    candidates = sorted({*grid, compressor.default_consensus_step})
    rounds = tuning_rounds(topology)
    assert rounds == 60
    errors = [noisy_reference_error(topology, compressor, g, d, rounds) for g in candidates]
    assert chosen == candidates[int(np.argmin(errors))]
    assert min(errors) <= errors[candidates.index(compressor.default_consensus_step)]
    # Noiseless consensus prefers a larger step here: the noise is what decides.
    noiseless = [consensus_error_after(topology, compressor, g, d, rounds) for g in candidates]
    assert candidates[int(np.argmin(noiseless))] > chosen
    assert auto_consensus_step(topology, compressor, d, grid=grid) == chosen  # deterministic


def test_auto_consensus_step_can_keep_the_default():
    """The default is a candidate: a grid of worse values leaves it chosen."""
    topology, compressor = build_topology("ring", 6), parse_compressor("topk:0.1")
    default = compressor.default_consensus_step
    assert auto_consensus_step(topology, compressor, 20, grid=(0.001, 1.0)) == default


def test_exact_gossip_consensus_error_is_lambda_to_the_power_2t():
    """No compression, gamma = 1: the disagreement shrinks exactly as W^T on the zero-mean part."""
    topology = build_topology("ring", 6)
    error = consensus_error_after(topology, parse_compressor("none"), 1.0, 6, 5)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 6, generator=gen)
    x = (x - x.mean(dim=0)).double()
    y = torch.linalg.matrix_power(torch.tensor(topology.W), 5) @ x
    assert error == pytest.approx(float((y**2).sum() / (x**2).sum()), rel=1e-5)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--compress", "topk:0"], "topk"),
        (["--compress", "topk:1.5"], "topk"),
        (["--topology", "one-peer-exponential", "--nodes", "20"], "power of 2"),
        (["--gossip-every", "0"], "--gossip-every"),
        (["--gossip-every", "2", "--gradient-tracking"], "K-GT"),
        (["--compress", "sign", "--gradient-tracking"], "public copies"),
        (["--compress", "topk:0.1", "--gradient-tracking"], "--compress topk:0.1"),
        (["--consensus-step", "0.5"], "--compress"),
        (["--compress", "int8", "--consensus-step", "2"], "(0, 1]"),
        (["--wan", "80"], "RTT_MS,MBIT_S"),
    ],
)
def test_bad_communication_flags_get_one_paragraph(flags, words, capsys, tmp_path):
    code = main(["train", "--iterations", "5", "--no-progress", "--out", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert words in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3


# --------------------------------------------------------------------------- distributed


def _party(rank: int, world: int, init: str, cases: list[tuple], out):
    """One party of every case of ``cases`` (of the same world size), one after another in
    one process group."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    handed: list[int] = []
    real = dist.batch_isend_irecv

    def spy(ops):
        handed.extend(op.tensor.numel() * op.tensor.element_size() for op in ops
                      if op.op is dist.isend)  # fmt: skip
        return real(ops)

    dist.batch_isend_irecv = spy
    for case in cases:
        spec, topology_name, every, _ = case
        handed.clear()
        topology = build_topology(topology_name, world)
        compressor = None if spec == "none" else parse_compressor(spec)
        settings = GossipSettings(every=every, compressor=compressor, consensus_step=0.4)
        x0, *moves = _parameters(world, 41, dtype=torch.float32)
        comm = DistributedCommunicator(topology, rank, settings=settings, x0=x0[rank : rank + 1])
        x = x0[rank : rank + 1]
        for t, move in enumerate(moves):
            comm.set_iteration(t)
            x = comm.mix(x + move[rank : rank + 1])
        out[(case, rank)] = (x, comm.counters(), sum(handed))
        dist.barrier()
    dist.destroy_process_group()


COMMUNICATOR_CASES = [("int8", "base-2", 2, 5), ("topk:0.2", "one-peer-exponential", 1, 4),
                      ("none", "base-3", 3, 4), ("sign", "ring", 1, 4)]  # fmt: skip


@pytest.fixture(scope="module")
def communicated(tmp_path_factory) -> dict:
    """Every case of :data:`COMMUNICATOR_CASES` on real gloo processes: one spawn of parties
    per world size, each running its cases in turn (a fresh communicator each, as the
    processes of separate runs would make), so three cases cost one start of four processes."""
    results = {}
    for world in sorted({case[3] for case in COMMUNICATOR_CASES}):
        cases = [case for case in COMMUNICATOR_CASES if case[3] == world]
        init = f"file://{tmp_path_factory.mktemp('gloo') / 'store'}"
        with mp.Manager() as manager:
            out = manager.dict()
            spawned.spawn(_party, (world, init, cases, out), nprocs=world)
            results.update(dict(out))
    return results


@pytest.mark.processes
@pytest.mark.parametrize("spec,topology_name,every,world", COMMUNICATOR_CASES)
def test_distributed_communicator_equals_the_simulator(
    communicated, spec, topology_name, every, world
):
    """Every party counts the same rounds, also one idle in some round of base-2 over 5."""
    case = (spec, topology_name, every, world)
    topology = build_topology(topology_name, world)
    compressor = None if spec == "none" else parse_compressor(spec)
    settings = GossipSettings(every=every, compressor=compressor, consensus_step=0.4)
    x0, *moves = _parameters(world, 41, dtype=torch.float32)
    comm = SimulatorCommunicator(topology, CPU, torch.float32, settings, x0=x0)
    x = x0
    for t, move in enumerate(moves):
        comm.set_iteration(t)
        x = comm.mix(x + move)
    bytes_total = 0.0
    for rank in range(world):
        ours, (sent, _messages, rounds), handed = communicated[(case, rank)]
        # Float32 rounding: on one machine the two are equal bit for bit in these cases (the
        # same elementwise operations); with the processes on other CPU kernels they were up to
        # 1.0e-6 apart, four ulps at values near 2.3 (docs/testing.md).
        torch.testing.assert_close(ours[0], x[rank], rtol=0, atol=1e-6)
        assert sent == handed  # what it reports is what it handed to torch.distributed
        assert rounds == comm.rounds == math.floor(len(moves) / every)
        bytes_total += sent
    assert bytes_total / world == pytest.approx(comm.bytes_sent)


# --------------------------------------------------------------------------- whole runs

RUN = ["--dataset", "digits", "--nodes", "4", "--iterations", "60", "--eval-every", "30",
       "--seed", "3", "--no-progress", "--no-plots"]  # fmt: skip
TALKING_LESS = {
    "base2-H3-int8": ["--topology", "base-2", "--gossip-every", "3", "--compress", "int8"],
    "onepeer-topk-coda": ["--algorithm", "coda", "--lr-dual", "0.01", "--topology",
                          "one-peer-exponential", "--compress", "topk:0.1"],
}  # fmt: skip


@pytest.mark.processes
@pytest.mark.parametrize("case", list(TALKING_LESS))
def test_distributed_run_equals_the_simulator_when_talking_less(case, tmp_path):
    """Real ``slate train --engine distributed`` processes against the simulator: parameters
    to 1e-5, AP to 1e-4, and the same rounds and bytes."""
    flags = [*RUN, *TALKING_LESS[case]]
    dist_out, sim_out = tmp_path / "dist", tmp_path / "sim"
    done = run_command(
        [sys.executable, "-m", "slate", "train", *flags, "--engine", "distributed",
         "--out", str(dist_out)], timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert main(["train", *flags, "--out", str(sim_out)]) == 0
    ours = json.loads((dist_out / "summary.json").read_text())
    theirs = json.loads((sim_out / "summary.json").read_text())
    assert ours["test_ap"] == pytest.approx(theirs["test_ap"], abs=1e-4)
    for key in ("rounds", "comm_bytes_per_party", "messages_per_party", "consensus_step"):
        assert ours[key] == pytest.approx(theirs[key], rel=1e-12), key
    a = torch.load(dist_out / "model.pt", weights_only=True)
    b = torch.load(sim_out / "model.pt", weights_only=True)
    for name, value in b.items():
        torch.testing.assert_close(a[name], value, rtol=0, atol=1e-5)


def test_a_dropped_party_with_compressed_gossip_keeps_training(tmp_path):
    """The party set changes mid-run: the public copies restart on the surviving graph and the
    run goes on learning."""
    import json

    out = tmp_path / "run"
    flags = ["--dataset", "digits", "--nodes", "6", "--iterations", "300", "--no-progress",
             "--compress", "int8", "--gossip-every", "2", "--drop-party", "2@100",
             "--no-plots"]  # fmt: skip
    assert main(["train", *flags, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["members"] == [0, 1, 3, 4, 5]
    assert summary["test_ap"] > 0.8
    assert summary["rounds"] == 150
