"""The benchmark's hand-written limit computes the same iteration as the simulator."""

from __future__ import annotations

import torch

from benchmarks.cases import LR, MARGIN, hand_mlp_step
from slate.algorithms import AlgorithmConfig, build_algorithm
from slate.algorithms.compute import Batch, PartyCompute
from slate.engines.simulator import SimulatorCommunicator
from slate.models import build_model
from slate.topology import build_topology


def test_hand_batched_kernel_equals_the_simulator_step():
    n = 5
    module = build_model("mlp", (300,), seed=2).double()
    gen = torch.Generator().manual_seed(1)
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    x0 = flat + 0.01 * torch.randn(n, flat.numel(), generator=gen, dtype=torch.float64)
    feats = torch.rand(n, 20, 300, generator=gen, dtype=torch.float64)
    labels = torch.zeros(n, 20, dtype=torch.long)
    labels[:, :2] = 1
    topology = build_topology("ring", n)
    algorithm = build_algorithm("slate", AlgorithmConfig(lr=LR, margin=MARGIN))
    compute = PartyCompute(module, algorithm.objective(), n_parties=n)
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float64)
    algorithm.init_state(x0)
    expected, _ = algorithm.step(x0.clone(), Batch(feats, labels), comm, compute)
    ours = hand_mlp_step(x0.clone(), feats, labels, torch.tensor(topology.W))
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
