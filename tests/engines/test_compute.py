"""PartyCompute's gradient paths: eager (vmapped forward, one reverse pass) and compiled."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, vmap

from slate import APLoss
from slate.algorithms.compute import Batch, FlatParameters, PartyCompute
from slate.models import MLP, seeded
from slate.objectives.ap import sigmoid_ap_objective

P, M, D = 5, 12, 7


@pytest.fixture(scope="module")
def problem():
    gen = torch.Generator().manual_seed(0)
    with seeded(0):
        model = MLP(D, hidden=6)
    layout = FlatParameters(model)
    x = layout.flatten(model) + 0.1 * torch.randn(P, layout.size, generator=gen)
    features = torch.randn(P, M, D, generator=gen)
    labels = (torch.rand(P, M, generator=gen) < 0.3).long()
    labels[:, 0] = 1
    return model, x, Batch(features, labels)


def grad_transform_reference(model, x, batch):
    """Per-party gradients by the grad transform: ``vmap(grad(loss))``."""
    objective = sigmoid_ap_objective(0.1)
    layout = FlatParameters(model)

    def loss(flat, feats, labels):
        return objective(functional_call(model, layout.unflatten(flat), (feats,)), labels, None)

    return vmap(grad(loss))(x, batch.features, batch.labels)


@pytest.mark.kernels
def test_eager_gradients_equal_those_of_the_grad_transform(problem) -> None:
    model, x, batch = problem
    losses, grads = PartyCompute(model, sigmoid_ap_objective(0.1), n_parties=P)(x, batch)
    torch.testing.assert_close(
        grads, grad_transform_reference(model, x, batch), rtol=1e-6, atol=1e-7
    )
    assert losses.shape == (P,) and not losses.requires_grad and not grads.requires_grad


@pytest.mark.kernels
def test_one_party_each_gets_the_grad_transforms_gradient_without_vmap(problem) -> None:
    """A distributed process computes for one party: its call skips vmap (a third faster on
    w7a's MLP) and still gives the grad transform's gradient."""
    model, x, batch = problem
    reference = grad_transform_reference(model, x, batch)
    for p in range(P):
        one = Batch(batch.features[p : p + 1], batch.labels[p : p + 1])
        compute = PartyCompute(model, sigmoid_ap_objective(0.1), n_parties=1)
        losses, grads = compute(x[p : p + 1], one)
        torch.testing.assert_close(grads[0], reference[p], rtol=1e-6, atol=1e-7)
        assert losses.shape == (1,) and grads.shape == (1, x.shape[1])


@pytest.mark.processes
def test_compiled_gradients_match_eager(problem) -> None:
    model, x, batch = problem
    eager = PartyCompute(model, sigmoid_ap_objective(0.1), n_parties=P)
    compiled = PartyCompute(model, sigmoid_ap_objective(0.1), n_parties=P, compile=True)
    for _ in range(2):  # the second call reuses the compiled graph
        l_e, g_e = eager(x, batch)
        l_c, g_c = compiled(x, batch)
        assert compiled.compiled
        torch.testing.assert_close(l_c, l_e, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g_c, g_e, rtol=1e-4, atol=1e-6)


def test_failed_compilation_falls_back_to_eager_with_a_warning(problem, monkeypatch) -> None:
    model, x, batch = problem

    def broken_compile(fn, **kwargs):
        def fail(*args):
            raise RuntimeError("no C++ compiler found\nlong details")

        return fail

    monkeypatch.setattr(torch, "compile", broken_compile)
    compute = PartyCompute(model, sigmoid_ap_objective(0.1), n_parties=P, compile=True)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler found.*eager path"):
        losses, grads = compute(x, batch)
    assert not compute.compiled
    expected = PartyCompute(model, sigmoid_ap_objective(0.1), n_parties=P)(x, batch)
    assert torch.equal(grads, expected[1]) and torch.equal(losses, expected[0])


def test_split_returns_the_tail_after_the_parameters(problem) -> None:
    model, x, _ = problem
    layout = FlatParameters(model)
    extended = torch.cat([x, torch.arange(P * 3.0).view(P, 3)], dim=1)
    views, tail = layout.split(extended)
    assert torch.equal(tail, extended[:, layout.size :])
    assert torch.equal(views["hidden.weight"], x[:, : 6 * D].view(P, 6, D))


class TiedTwice(torch.nn.Module):
    """One Linear applied twice through two attribute names (a tied weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(D, D)
        self.second = torch.nn.Linear(D, D)
        self.second.weight = self.first.weight
        self.head = torch.nn.Linear(D, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.second(torch.tanh(self.first(x))))).squeeze(-1)


def test_tied_weights_get_the_gradient_of_both_uses(problem) -> None:
    _, _, batch = problem
    with seeded(1):
        model = TiedTwice()
    compute = PartyCompute(model, sigmoid_ap_objective(0.1), n_parties=P)
    assert compute.has_tied_weights
    x = compute.layout.flatten(model).expand(P, -1).clone()
    _, grads = compute(x, batch)
    loss = APLoss(0.1, validate_args=False)
    for p in range(P):
        model.zero_grad()
        loss(torch.sigmoid(model(batch.features[p])), batch.labels[p]).backward()
        expected = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
        torch.testing.assert_close(grads[p], expected, rtol=1e-5, atol=1e-6)
