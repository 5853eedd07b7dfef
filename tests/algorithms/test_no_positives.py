"""A party that holds no positive training row, on the algorithms' steps.

The AP surrogate (SLATE, SLATE-M) has no term at such a party: its local gradient is exactly
zero, so its new model is the mixing of its own and its neighbours' stepped models,
:math:`x_{n,t+1} = w_{nn} x_{n,t} + \\sum_{r \\ne n} w_{nr} (x_{r,t} - \\eta v_{r,t})`. D-PSGD's
cross-entropy uses all its rows; CODA's min-max loss uses its negatives' terms (its ``a``, the
positives' mean score, gets no gradient there).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from slate.algorithms import build_algorithm, configure
from slate.algorithms.compute import Batch, PartyCompute
from slate.data.partition import stratified_partition
from slate.data.sampler import PartySampler
from slate.models import MLP, seeded
from slate.topology import build_topology

N, M, B, STEPS, EMPTY = 3, 8, 2, 6, 1  # EMPTY: the party without positives


class RecordingMixer:
    """Plain mixing by a fixed matrix ``w``, recording each step's ``(x, direction)``."""

    def __init__(self, w: Tensor) -> None:
        self.w = w
        self.steps: list[tuple[Tensor, Tensor]] = []

    def mix(self, x: Tensor) -> Tensor:
        return self.w @ x

    def mix_step(self, x: Tensor, direction: Tensor, lr: float) -> Tensor:
        self.steps.append((x.clone(), direction.clone()))
        return self.w @ (x - lr * direction)


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(size=(150, 4)))
    y = (rng.random(150) < 0.3).astype(np.int64)
    parts = stratified_partition(y, N, seed=0)
    parts[EMPTY] = parts[EMPTY][y[parts[EMPTY]] == 0]  # its positives removed
    with seeded(3):
        model = MLP(4, hidden=3).double()
    return x, torch.from_numpy(y), parts, model


def run(problem, name: str, **config) -> tuple[RecordingMixer, list[Tensor]]:
    """``STEPS`` iterations of ``name`` (its initial batch first, if any); the mixer and the
    local gradients ``(N, d)`` of each call."""
    x, y, parts, model = problem
    algorithm = build_algorithm(name, *configure(name, lr=0.1, **config))
    sampler = PartySampler(parts, y.numpy(), M, B, seed=5)
    inner = PartyCompute(model, algorithm.objective(), algorithm.n_extra, n_parties=N,
                         context=algorithm.context([y[p] for p in parts]))  # fmt: skip
    grads: list[Tensor] = []

    def compute(params: Tensor, batch: Batch, once: bool = False) -> tuple[Tensor, Tensor]:
        losses, g = inner(params, batch, once=once)
        grads.append(g.clone())
        return losses, g

    mixer = RecordingMixer(
        torch.as_tensor(np.array(build_topology("ring", N).matrix_at(0))).double()
    )
    extra = algorithm.initial_extra(1, torch.device("cpu"), torch.float64)[0]
    params = torch.cat([inner.layout.flatten(model), extra]).expand(N, -1).clone()
    algorithm.init_state(params)
    t = 0
    if blocks := algorithm.initial_batches(B):
        idx = sampler.draw(blocks)
        params, _ = algorithm.first_step(params, Batch.stack(x[idx], y[idx]), mixer, compute)
        t = 1
    for k in sampler.draw(STEPS - t):
        params, losses = algorithm.step(params, Batch(x[k], y[k]), mixer, compute)
        assert torch.isfinite(losses).all() and torch.isfinite(params).all()
    return mixer, grads


def test_the_sampler_gives_the_empty_party_m_negatives(problem):
    _, y, parts, _ = problem
    drawn = PartySampler(parts, y.numpy(), M, B, seed=5).draw(4)
    assert drawn.shape == (4, N, M)
    assert int(y[drawn[:, EMPTY]].sum()) == 0
    assert bool((y[drawn[:, 0, :B]] == 1).all()) and int(y[drawn[:, 0, B:]].sum()) == 0


@pytest.mark.parametrize(
    ("name", "config"),
    [("slate", {}), ("slate", {"gradient_tracking": True}), ("slate-m", {}),
     ("slate-m", {"momentum": "ema"})],
)  # fmt: skip
def test_ap_surrogate_gives_the_empty_party_a_zero_gradient(problem, name, config):
    mixer, grads = run(problem, name, **config)
    for g in grads:  # every block of every call, SLATE-M's previous iterate included
        assert bool((g.view(-1, N, g.shape[-1])[:, EMPTY] == 0).all())
        assert bool((g.view(-1, N, g.shape[-1])[:, 0] != 0).any())
    if config.get("gradient_tracking"):
        return  # its direction is then its tracker, a mix of its neighbours' gradients
    w = mixer.w
    for x, direction in mixer.steps:
        assert bool((direction[EMPTY] == 0).all())  # u = 0 stays 0 (STORM, EMA)
        others = [r for r in range(N) if r != EMPTY]
        mixed = w[EMPTY, EMPTY] * x[EMPTY] + sum(
            w[EMPTY, r] * (x[r] - 0.1 * direction[r]) for r in others
        )
        torch.testing.assert_close((w @ (x - 0.1 * direction))[EMPTY], mixed)


def test_dpsgd_trains_on_every_row_of_the_empty_party(problem):
    _, grads = run(problem, "dpsgd")
    assert all(bool((g[EMPTY] != 0).any()) for g in grads)


def test_coda_uses_the_empty_party_s_negative_terms_only(problem):
    _, grads = run(problem, "coda", sampled_positive_rate=B / M)  # p = b / m, as a run sets
    for g in grads:
        a, b = g[EMPTY, -3], g[EMPTY, -2]  # extra = (a, b, alpha)
        assert float(a) == 0.0  # a: the positives' mean score, no positive here
        assert float(b) != 0.0 and bool((g[EMPTY, :-3] != 0).any())
