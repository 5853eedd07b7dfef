"""SLATE-M and CODA against their definitions, computed by hand, and their reductions."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import Tensor

from slate.algorithms import build_algorithm, configure
from slate.algorithms.coda import CODA_OBJECTIVES, auc_square_loss
from slate.algorithms.compute import Batch, PartyCompute
from slate.data.partition import stratified_partition
from slate.data.sampler import PartySampler
from slate.engines.simulator import SimulatorCommunicator
from slate.models import MLP, seeded
from slate.objectives import sigmoid_ap_objective
from slate.topology import build_topology

N, M, B, STEPS = 3, 8, 2, 12


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(size=(150, 4)))
    y = (rng.random(150) < 0.3).astype(np.int64)
    parts = stratified_partition(y, N, seed=0)
    with seeded(3):
        model = MLP(4, hidden=3).double()
    return x, torch.from_numpy(y), parts, model


def simulate(problem, name, topology="ring", n=N, steps=STEPS, mixer=None, **config):
    """Run ``name`` the way slate.training.loop.Run does: first_step at iteration 0 if needed
    (``mixer``: any object with ``mix`` and ``mix_step``; default the simulator's
    communicator)."""
    x, y, parts, model = problem
    parts = parts if n == N else [np.concatenate(parts)]
    algorithm = build_algorithm(name, *configure(name, **config))
    sampler = PartySampler(parts, y.numpy(), M, B, seed=5)
    compute = PartyCompute(
        model,
        algorithm.objective(),
        algorithm.n_extra,
        n_parties=n,
        context=algorithm.context([y[p] for p in parts]),
    )
    comm = mixer or SimulatorCommunicator(
        build_topology(topology, n), torch.device("cpu"), torch.float64
    )
    extra = algorithm.initial_extra(1, torch.device("cpu"), torch.float64)[0]
    params = torch.cat([compute.layout.flatten(model), extra]).expand(n, -1).clone()
    algorithm.init_state(params)
    states, t = [], 0
    blocks = algorithm.initial_batches(B)
    if blocks:
        idx = sampler.draw(blocks)
        params, _ = algorithm.first_step(params, Batch.stack(x[idx], y[idx]), comm, compute)
        states.append({k: v.clone() for k, v in algorithm.state.items()})
        t = 1
    idx = sampler.draw(steps - t)
    for k in range(steps - t):
        if mixer is None:
            comm.set_iteration(t + k)
        params, _ = algorithm.step(params, Batch(x[idx[k]], y[idx[k]]), comm, compute)
        states.append({k2: v.clone() for k2, v in algorithm.state.items()})
    return params, states, sampler, compute


@pytest.mark.parametrize("gradient_tracking", [False, True])
def test_slate_m_with_alpha_one_equals_slate(problem, gradient_tracking):
    common = {"lr": 0.1, "margin": 0.5, "gradient_tracking": gradient_tracking}
    slate_m, _, _, _ = simulate(problem, "slate-m", alpha=1.0, initial_batch=B, **common)
    slate, _, _, _ = simulate(problem, "slate", **common)
    torch.testing.assert_close(slate_m, slate, rtol=1e-12, atol=1e-14)


class MatrixMixer:
    """The two methods of :class:`slate.algorithms.base.Mixer` and nothing else: ``W @ x``
    with W built here from the ring's definition (a third to each party and its two
    neighbours), not by slate's topology code."""

    def __init__(self, n: int) -> None:
        W = np.zeros((n, n))
        for i in range(n):
            for j in (i - 1, i, i + 1):
                W[i, j % n] += 1 / 3
        self.W = torch.from_numpy(W)
        self.calls = 0

    def mix(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.W @ x

    def mix_step(self, x: Tensor, direction: Tensor, lr: float) -> Tensor:
        return self.mix(x - lr * direction)


@pytest.mark.parametrize("name", ["slate", "slate-m", "dpsgd", "coda"])
@pytest.mark.parametrize("gradient_tracking", [False, True])
def test_the_algorithms_need_only_mix_and_mix_step(problem, name, gradient_tracking):
    """Every algorithm runs on a bare two-method mixer (no engine, no communicator) and computes
    what it computes on the simulator's communicator."""
    config = {"lr": 0.1, "gradient_tracking": gradient_tracking}
    if name == "slate-m":
        config["initial_batch"] = B
    mixer = MatrixMixer(N)
    bare, _, _, _ = simulate(problem, name, mixer=mixer, **config)
    ours, _, _, _ = simulate(problem, name, **config)
    assert mixer.calls == STEPS * (2 if gradient_tracking else 1)  # every step mixed through it
    torch.testing.assert_close(bare, ours, rtol=1e-12, atol=1e-14)


def party_gradient(model, flat, features, labels, objective):
    """Ordinary autograd on one party's copy of the model."""
    module = copy.deepcopy(model)
    torch.nn.utils.vector_to_parameters(flat, module.parameters())
    loss = objective(module(features), labels, flat[:0])
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(module.parameters()))])


def reference_slate_m(problem, alpha, lr, momentum, initial_batch):
    """Alg. 2 line by line with explicit loops, on the same index stream as the simulator."""
    x, y, parts, model = problem
    W = build_topology("ring", N).W
    objective = sigmoid_ap_objective(0.5)
    sampler = PartySampler(parts, y.numpy(), M, B, seed=5)
    flat0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    xs = [flat0.clone() for _ in range(N)]

    def grad(n, params, idx):
        return party_gradient(model, params, x[idx], y[idx], objective)

    def mix(vectors):
        return [sum(W[n, r] * vectors[r] for r in range(N)) for n in range(N)]

    if momentum == "storm":
        blocks = sampler.draw(int(np.ceil(initial_batch / B)))
        u = [
            torch.stack([grad(n, xs[n], blocks[j, n]) for j in range(len(blocks))]).mean(0)
            for n in range(N)
        ]  # line 3
        x_prev = xs
        xs = mix([xs[n] - lr * u[n] for n in range(N)])  # lines 4-5 (no tracking)
        start = 1
    else:
        u = [torch.zeros_like(flat0) for _ in range(N)]
        x_prev, start = xs, 0
    idx = sampler.draw(STEPS - start)
    for k in range(STEPS - start):
        if momentum == "storm":  # line 10
            u = [
                grad(n, xs[n], idx[k, n]) + (1 - alpha) * (u[n] - grad(n, x_prev[n], idx[k, n]))
                for n in range(N)
            ]
        else:
            u = [alpha * grad(n, xs[n], idx[k, n]) + (1 - alpha) * u[n] for n in range(N)]
        x_prev = xs
        xs = mix([xs[n] - lr * u[n] for n in range(N)])  # line 12
    return torch.stack(xs)


@pytest.mark.parametrize("momentum", ["storm", "ema"])
@pytest.mark.parametrize("alpha", [0.1, 0.9])
def test_slate_m_estimators_equal_their_definitions(problem, momentum, alpha):
    ours, _, _, _ = simulate(
        problem, "slate-m", lr=0.1, margin=0.5, alpha=alpha, momentum=momentum, initial_batch=5
    )
    expected = reference_slate_m(problem, alpha, 0.1, momentum, initial_batch=5)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)


def test_slate_m_initial_batch_draws_ceil_b_over_b_batches(problem):
    algorithm = build_algorithm("slate-m", *configure("slate-m", initial_batch=7))
    assert algorithm.initial_batches(2) == 4
    assert build_algorithm("slate-m", *configure("slate-m")).initial_batches(3) == 5
    assert build_algorithm("slate-m", *configure("slate-m", momentum="ema")).initial_batches(3) == 0


def test_slate_m_tracking_keeps_mean_of_v_equal_to_mean_of_u(problem):
    _, states, _, _ = simulate(problem, "slate-m", lr=0.1, margin=0.5, gradient_tracking=True)
    for state in states:
        torch.testing.assert_close(state["v"].mean(0), state["u"].mean(0), rtol=1e-9, atol=1e-12)


def coda_gradient_by_hand(h, y, a, b, alpha, p, objective="square"):
    """Closed-form partial derivatives of CODA's loss w.r.t. h, a, b and alpha.

    ``square``: coupling weight ``2 (1 + alpha)``; ``margin``: ``2 alpha`` plus ``2 alpha p (1-p)``.
    """
    m = len(h)
    pos, neg = y.double(), 1 - y.double()
    weight = 1 + alpha if objective == "square" else alpha
    d_h = (
        2 * (1 - p) * (h - a) * pos + 2 * p * (h - b) * neg + 2 * weight * (p * neg - (1 - p) * pos)
    ) / m
    d_a = -2 * (1 - p) * ((h - a) * pos).sum() / m
    d_b = -2 * p * ((h - b) * neg).sum() / m
    margin_term = p * (1 - p) if objective == "margin" else 0.0
    d_alpha = 2 * (margin_term + (p * h * neg - (1 - p) * h * pos).mean()) - 2 * p * (1 - p) * alpha
    return d_h, d_a, d_b, d_alpha


@pytest.mark.parametrize("objective", ["square", "margin"])
@pytest.mark.parametrize("seed", range(5))
def test_coda_loss_gradients_match_autograd(seed, objective):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(10, generator=gen, dtype=torch.float64, requires_grad=True)
    y = (torch.arange(10) % 3 == 0).long()
    extra = torch.randn(3, generator=gen, dtype=torch.float64, requires_grad=True)
    p = torch.tensor([0.3], dtype=torch.float64)
    CODA_OBJECTIVES[objective](h, y, extra, p).backward()
    d_h, d_a, d_b, d_alpha = coda_gradient_by_hand(h.detach(), y, *extra.detach(), 0.3, objective)
    torch.testing.assert_close(h.grad, d_h)
    torch.testing.assert_close(extra.grad, torch.stack([d_a, d_b, d_alpha]))


def test_coda_square_loss_is_the_expanded_pairwise_square_loss():
    """Ying et al.: at the optimal a, b, alpha, L equals the pairwise square loss
    p (1-p) E[(1 - h(x+) + h(x-))^2] (expectations over the batch's classes) up to a constant."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(40, generator=gen, dtype=torch.float64)
    y = (torch.arange(40) % 4 == 0).long()
    p = float(y.double().mean())
    hp, hn = h[y == 1], h[y == 0]
    a, b, alpha = hp.mean(), hn.mean(), hn.mean() - hp.mean()
    loss = auc_square_loss(h, y, torch.stack([a, b, alpha]), torch.tensor([p]))
    pairwise = ((1 - hp[:, None] + hn[None, :]) ** 2).mean()
    # Per-sample means weigh the class terms by their frequencies: L = p (1-p) (pairwise - 1).
    torch.testing.assert_close(loss, p * (1 - p) * (pairwise - 1), rtol=1e-12, atol=1e-12)


def test_coda_context_is_each_partys_positive_rate(problem):
    _, y, parts, _ = problem
    algorithm = build_algorithm("coda", *configure("coda"))
    rates = algorithm.context([y[p] for p in parts])
    expected = [float(y[p].double().mean()) for p in parts]
    torch.testing.assert_close(rates[:, 0].double(), torch.tensor(expected, dtype=torch.float64))


def test_coda_one_step_is_descent_ascent_then_mixing(problem):
    x, y, parts, model = problem
    lr, lr_dual = 0.05, 0.5
    ours, _, _, compute = simulate(problem, "coda", steps=1, lr=lr, lr_dual=lr_dual)
    idx = PartySampler(parts, y.numpy(), M, B, seed=5).draw(1)[0]
    W = build_topology("ring", N).W
    flat0 = torch.cat(
        [
            torch.nn.utils.parameters_to_vector(model.parameters()).detach(),
            torch.zeros(3, dtype=torch.float64),
        ]
    )
    updated = []
    for n in range(N):
        params = flat0.clone().requires_grad_(True)
        module = copy.deepcopy(model)
        logits = torch.func.functional_call(
            module, compute.layout.unflatten(params[: compute.layout.size]), (x[idx[n]],)
        )
        p = y[parts[n]].double().mean().reshape(1)
        (g,) = torch.autograd.grad(auc_square_loss(logits, y[idx[n]], params[-3:], p), params)
        new = flat0 - lr * g
        new[-1] = torch.clamp(flat0[-1] + lr_dual * g[-1], -10, 10)
        updated.append(new)
    expected = torch.stack([sum(W[n, r] * updated[r] for r in range(N)) for n in range(N)])
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)


def test_coda_dual_variable_is_clamped(problem):
    params, _, _, _ = simulate(problem, "coda", steps=20, lr=0.01, lr_dual=1e4)
    assert float(params[:, -1].abs().max()) <= 10.0
    assert float(params[:, -1].abs().max()) == pytest.approx(10.0)


@pytest.mark.parametrize("name", ["slate", "dpsgd", "coda"])
def test_one_party_full_topology_is_centralised_sgd(problem, name):
    """N = 1: mixing is the identity, so each step is plain (descent-ascent) SGD."""
    x, y, parts, model = problem
    ours, _, _, compute = simulate(
        problem, name, topology="full", n=1, steps=5, lr=0.05, lr_dual=0.01
    )
    algorithm = build_algorithm(name, *configure(name, lr=0.05, lr_dual=0.01))
    sampler = PartySampler([np.concatenate(parts)], y.numpy(), M, B, seed=5)
    idx = sampler.draw(5)
    context = algorithm.context([y[np.concatenate(parts)]])
    flat = torch.cat(
        [
            torch.nn.utils.parameters_to_vector(model.parameters()).detach(),
            torch.zeros(algorithm.n_extra, dtype=torch.float64),
        ]
    )
    objective = algorithm.objective()
    for k in range(5):
        params = flat.clone().requires_grad_(True)
        logits = torch.func.functional_call(
            model, compute.layout.unflatten(params[: compute.layout.size]), (x[idx[k, 0]],)
        )
        args = (logits, y[idx[k, 0]], params[compute.layout.size :])
        loss = objective(*args, context[0].double()) if context is not None else objective(*args)
        (g,) = torch.autograd.grad(loss, params)
        step = 0.05 * g
        if name == "coda":
            step[-1] = -0.01 * g[-1]
        flat = flat - step
    torch.testing.assert_close(ours[0], flat, rtol=1e-10, atol=1e-12)


def test_one_party_slate_m_is_centralised_storm(problem):
    ours, _, _, _ = simulate(
        problem,
        "slate-m",
        topology="full",
        n=1,
        steps=STEPS,
        lr=0.1,
        margin=0.5,
        alpha=0.5,
        initial_batch=4,
    )
    x, y, parts, model = problem
    sampler = PartySampler([np.concatenate(parts)], y.numpy(), M, B, seed=5)
    objective = sigmoid_ap_objective(0.5)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    blocks = sampler.draw(2)
    u = torch.stack(
        [party_gradient(model, flat, x[i[0]], y[i[0]], objective) for i in blocks]
    ).mean(0)
    prev, flat = flat, flat - 0.1 * u
    for row in sampler.draw(STEPS - 1):
        i = row[0]
        g_now = party_gradient(model, flat, x[i], y[i], objective)
        g_prev = party_gradient(model, prev, x[i], y[i], objective)
        u = g_now + 0.5 * (u - g_prev)
        prev, flat = flat, flat - 0.1 * u
    torch.testing.assert_close(ours[0], flat, rtol=1e-10, atol=1e-12)


def _saddle_loss(h: Tensor, y: Tensor, p: float) -> float:
    """CODA's square loss at its saddle for scores ``h``: a, b at the class means, alpha at its
    maximiser, and the common shift of every score that the model's bias would choose (the
    minimum over a grid of shifts 0.01 apart on [-3, 3]: on the test's scores, within 1 of 0,
    the loss is either the same at every shift (p = 0.1, to 1e-15) or falls to one minimiser
    inside [-2, 2] and rises after it (p = 0.03), so a wider grid finds the same minimum)."""
    pos, neg = y == 1, y == 0
    best = math.inf
    for shift in torch.linspace(-3, 3, 601, dtype=torch.float64):
        s = h + shift
        a, b = s[pos].mean(), s[neg].mean()
        coupling = (p * s * neg - (1 - p) * s * pos).mean()
        alpha = coupling / (p * (1 - p))  # dL/dalpha = 2 coupling - 2 p (1-p) alpha = 0
        extra = torch.stack([a, b, alpha])
        loss = float(auc_square_loss(s, y.long(), extra, torch.tensor([p], dtype=torch.float64)))
        best = min(best, loss)
    return best


def test_coda_p_is_the_rate_the_sampler_draws_positives_at():
    """A w7a-like party (3% positives) sampled with b = 2 of m = 20: p must be 0.1, the rate of
    the batches the class means are taken over, so that the saddle ranks scorers: a perfect one
    below a constant one below a reversed one. With the party's 3% they would all tie."""
    from slate.config import TrainConfig, resolve_config
    from slate.training.checks import algorithm_config

    config = resolve_config(TrainConfig(algorithm="coda", positives=2, batch_size=20))
    algorithm = build_algorithm("coda", algorithm_config(config))
    party_labels = (torch.arange(1000) % 100 < 3).long()  # 3% positives
    p = float(algorithm.context([party_labels, party_labels])[0, 0])
    assert p == pytest.approx(0.1)
    y = (torch.arange(20) < 2).long()  # one batch: b = 2 positives among m = 20
    gap = y.double()  # positives scored 1 above negatives: the square loss's margin
    perfect, constant, reversed_ = (_saddle_loss(k * gap, y, p) for k in (1.0, 0.0, -1.0))
    assert perfect == pytest.approx(-0.09, abs=1e-9)
    assert constant == pytest.approx(0.0, abs=1e-9)
    assert reversed_ == pytest.approx(0.27, abs=1e-9)
    # The party's own rate makes every scorer reach -p (1 - p): the objective stops ranking.
    tied = [_saddle_loss(k * gap, y, 0.03) for k in (1.0, 0.0, -1.0)]
    assert tied == pytest.approx([-0.03 * 0.97] * 3, abs=1e-5)  # up to the shift grid
