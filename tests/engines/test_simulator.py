"""The simulator against a plain per-party Python loop, and against centralised SGD."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from slate import APLoss
from slate.algorithms import AlgorithmConfig, build_algorithm
from slate.algorithms.compute import Batch, PartyCompute
from slate.data.partition import stratified_partition
from slate.data.sampler import PartySampler
from slate.engines.simulator import SimulatorCommunicator
from slate.models import MLP, seeded
from slate.topology import build_topology

N_PARTIES, STEPS, M, B = 4, 50, 10, 3


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(240, 6)))
    y = (rng.random(240) < 0.25).astype(np.int64)
    parts = stratified_partition(y, N_PARTIES, seed=0)
    indices = PartySampler(parts, y, M, B, seed=0).draw(STEPS)
    with seeded(0):
        model = MLP(6, hidden=5).double()
    return x, torch.from_numpy(y), indices, model


def run_simulator(problem, algorithm_name, topology_name, gradient_tracking, lr=0.05):
    x, y, indices, model = problem
    topology = build_topology(topology_name, N_PARTIES)
    algorithm = build_algorithm(
        algorithm_name, AlgorithmConfig(lr=lr, margin=0.5, gradient_tracking=gradient_tracking)
    )
    compute = PartyCompute(model, algorithm.objective())
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float64)
    params = compute.layout.flatten(model).expand(N_PARTIES, -1).clone()
    algorithm.init_state(params)
    trace = []
    for t in range(STEPS):
        comm.set_iteration(t)
        params, _ = algorithm.step(params, Batch(x[indices[t]], y[indices[t]]), comm, compute)
        trace.append({k: v.clone() for k, v in algorithm.state.items()})
    return params, trace, compute


def flat_grad(module, loss):
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(module.parameters()))])


def run_reference_slate(problem, topology_name, gradient_tracking, lr=0.05):
    """Alg. 1 written the obvious way: one module per party, loops over parties and neighbours."""
    x, y, indices, model = problem
    W = build_topology(topology_name, N_PARTIES).W
    models = [copy.deepcopy(model) for _ in range(N_PARTIES)]
    loss_fn = APLoss(0.5)
    d = sum(p.numel() for p in model.parameters())
    u_prev = [torch.zeros(d, dtype=torch.float64) for _ in range(N_PARTIES)]
    v_prev = [torch.zeros(d, dtype=torch.float64) for _ in range(N_PARTIES)]
    for t in range(STEPS):
        u = []
        for n, module in enumerate(models):
            idx = indices[t, n]
            loss = loss_fn(torch.sigmoid(module(x[idx])), y[idx])
            u.append(flat_grad(module, loss))
        if gradient_tracking:
            v = [
                sum(W[n, r] * (v_prev[r] + u[r] - u_prev[r]) for r in range(N_PARTIES))
                for n in range(N_PARTIES)
            ]
            u_prev, v_prev = u, v
        else:
            v = u
        current = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]
        new = [
            sum(W[n, r] * (current[r] - lr * v[r]) for r in range(N_PARTIES))
            for n in range(N_PARTIES)
        ]
        for module, flat in zip(models, new, strict=True):
            torch.nn.utils.vector_to_parameters(flat, module.parameters())
    return torch.stack(
        [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]
    )


@pytest.mark.parametrize("gradient_tracking", [False, True])
@pytest.mark.parametrize("topology_name", ["ring", "star"])
@pytest.mark.kernels
def test_slate_simulator_equals_per_party_loop(problem, topology_name, gradient_tracking):
    ours, _, _ = run_simulator(problem, "slate", topology_name, gradient_tracking)
    reference = run_reference_slate(problem, topology_name, gradient_tracking)
    torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-12)
    # The parties did not all agree (mixing on a ring is not exact averaging).
    assert float((ours - ours.mean(0)).abs().max()) > 1e-6


@pytest.mark.kernels
def test_dpsgd_full_topology_equals_centralised_sgd(problem):
    x, y, indices, model = problem
    ours, _, _ = run_simulator(problem, "dpsgd", "full", gradient_tracking=False, lr=0.1)
    central = copy.deepcopy(model)
    for t in range(STEPS):
        union = indices[t].reshape(-1)  # all parties' batches, equal sizes
        loss = F.binary_cross_entropy_with_logits(central(x[union]), y[union].double())
        grad = flat_grad(central, loss)
        flat = torch.nn.utils.parameters_to_vector(central.parameters()).detach()
        torch.nn.utils.vector_to_parameters(flat - 0.1 * grad, central.parameters())
    expected = torch.nn.utils.parameters_to_vector(central.parameters()).detach()
    for row in ours:
        torch.testing.assert_close(row, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("algorithm_name", ["slate", "dpsgd"])
def test_gradient_tracking_keeps_mean_of_v_equal_to_mean_of_u(problem, algorithm_name):
    _, trace, _ = run_simulator(problem, algorithm_name, "ring", gradient_tracking=True)
    for state in trace:
        torch.testing.assert_close(state["v"].mean(0), state["u"].mean(0), rtol=1e-9, atol=1e-12)
    assert not torch.allclose(trace[-1]["v"], trace[-1]["u"])


@pytest.mark.kernels
def test_federated_topology_agrees_only_after_averaging_rounds(problem):
    x, y, indices, model = problem
    topology = build_topology("federated", N_PARTIES, fed_period=5)
    algorithm = build_algorithm("slate", AlgorithmConfig(lr=0.05, margin=0.5))
    compute = PartyCompute(model, algorithm.objective())
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float64)
    params = compute.layout.flatten(model).expand(N_PARTIES, -1).clone()
    algorithm.init_state(params)
    for t in range(10):
        comm.set_iteration(t)
        params, _ = algorithm.step(params, Batch(x[indices[t]], y[indices[t]]), comm, compute)
        spread = float((params - params.mean(0)).abs().max())
        if (t + 1) % 5 == 0:
            assert spread == 0.0
        else:
            assert spread > 0.0


def test_gossip_traffic_counts_one_buffer_per_neighbour(problem):
    _, _, compute = run_simulator(problem, "slate", "ring", gradient_tracking=False)
    topology = build_topology("ring", N_PARTIES)
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float32)
    buffer = torch.zeros(N_PARTIES, compute.layout.size)
    for t in range(7):
        comm.set_iteration(t)
        comm.mix(buffer)
    traffic = comm.traffic()
    assert traffic["messages_per_party"] == 2 * 7
    assert traffic["comm_bytes_per_party"] == 2 * compute.layout.size * 4 * 7


@pytest.mark.parametrize("topology_name", ["ring", "full", "torus", "exponential"])
@pytest.mark.parametrize("width", [50, 70000])  # one block, and many blocks of columns
@pytest.mark.kernels
def test_mixing_equals_the_dense_product(topology_name, width) -> None:
    """mix and mix_step (sparse W, column blocks, fused step) against W @ (x - lr v) in float64."""
    n = 16
    topology = build_topology(topology_name, n)
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float64)
    gen = torch.Generator().manual_seed(0)
    x, v = (
        torch.randn(n, width, generator=gen, dtype=torch.float64),
        torch.randn(n, width, generator=gen, dtype=torch.float64),
    )
    W = torch.tensor(topology.W, dtype=torch.float64)
    torch.testing.assert_close(comm.mix(x), W @ x, rtol=0, atol=1e-12)
    torch.testing.assert_close(comm.mix_step(x, v, 0.3), W @ (x - 0.3 * v), rtol=0, atol=1e-12)


def test_sparse_networks_are_stored_sparse() -> None:
    def layout(name: str, n: int) -> torch.layout:
        topology = build_topology(name, n)
        comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float32)
        return comm.gossip_matrix(0)[0].layout

    assert layout("ring", 20) == torch.sparse_csr  # 60 of 400 entries
    assert layout("ring", 4) == torch.strided  # 12 of 16
    assert layout("erdos-renyi", 4) == torch.strided


def test_mixing_counts_the_same_traffic_fused_or_not() -> None:
    topology = build_topology("ring", 8)
    fused = SimulatorCommunicator(topology, torch.device("cpu"), torch.float32)
    plain = SimulatorCommunicator(topology, torch.device("cpu"), torch.float32)
    x = torch.ones(8, 100)
    fused.mix_step(x, x, 0.1)
    plain.mix(x - 0.1 * x)
    assert fused.traffic() == plain.traffic()
