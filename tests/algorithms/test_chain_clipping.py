"""Grouped clipping on a Linear chain (:mod:`slate.algorithms.chain_clipping`) against the generic
path: every group's own copy of the parameters, differentiated by ``vmap`` and autograd
(:meth:`PrivateCompute.group_gradients`, itself checked against autograd group by group in
``test_privacy.py``), clipped and summed by :func:`clipped_sum`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from slate.algorithms import build_algorithm
from slate.algorithms.base import AlgorithmConfig
from slate.algorithms.chain_clipping import linear_chain
from slate.algorithms.compute import Batch, PartyCompute
from slate.algorithms.privacy import PrivateCompute, PrivateGroups, clipped_sum
from slate.models import MLP, build_model
from slate.objectives.ap import masked_sigmoid_ap_objective

PARTIES, FEATURES = 3, 7


class _Zero:
    def normal(self, count: int, std: float = 1.0) -> np.ndarray:
        return np.zeros(count)


class _Scaled(MLP):
    """An MLP whose forward differs: it must not take the chain's path."""

    def forward(self, x: Tensor) -> Tensor:
        return 2.0 * super().forward(x)


def _batch(groups: int, size: int, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(PARTIES, groups * size, FEATURES, generator=gen) * 2
    labels = torch.randint(0, 2, (PARTIES, groups * size), generator=gen)
    labels[:, 1::5] = -1  # empty slots
    labels[0, :size] = 0  # party 0's first group holds no positive
    return Batch(features, labels)


def _private(objective, groups: int, size: int, clip: float = 1.0, n_extra: int = 0,
             context=None):  # fmt: skip
    model = build_model("mlp", (FEATURES,), hidden=5, seed=4)
    inner = PartyCompute(model, objective, n_extra=n_extra, n_parties=PARTIES, context=context)
    shape = PrivateGroups(groups, size, clip, (0.0,) * PARTIES, (1.0,) * PARTIES)
    private = PrivateCompute(inner, shape, [_Zero()] * PARTIES)
    x = inner.layout.flatten(model).repeat(PARTIES, 1)
    x = torch.cat([x, torch.zeros(PARTIES, n_extra)], dim=1)
    x += 0.4 * torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
    return private, x


def _against_the_generic_path(private: PrivateCompute, x: Tensor, batch: Batch) -> None:
    """The same losses and clipped sum, with C the median group gradient norm: some groups
    clipped, others not."""
    assert private.chain is not None
    generic_losses, grads = private.group_gradients(x, batch)
    norms = grads.norm(dim=-1)
    clip = float(norms[norms > 0].median())
    assert bool((norms > clip).any()) and bool(((norms > 0) & (norms < clip)).any())
    losses, total = private.chain(x, batch, clip)
    torch.testing.assert_close(losses, generic_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total, clipped_sum(grads, clip), rtol=1e-5, atol=1e-6)


def test_only_a_declared_chain_that_holds_every_parameter_takes_the_path():
    assert linear_chain(MLP(4, 3)) == ("hidden", "out")
    assert linear_chain(_Scaled(4, 3)) is None  # declared by MLP, not by the subclass
    assert linear_chain(build_model("mnist-cnn", (1, 28, 28))) is None
    extra = MLP(4, 3)
    extra.scale = nn.Parameter(torch.ones(1))  # a parameter outside the chain
    assert linear_chain(extra) is None


def test_the_chains_forward_is_the_models():
    private, x = _private(masked_sigmoid_ap_objective(0.1), 2, 4, 1.0)
    batch = _batch(2, 4, seed=1)
    _, _, logits = private.chain.forward(x, batch.features)
    for party in range(PARTIES):
        params = private.inner.layout.unflatten(x[party])
        features = (batch.features[party],)
        expected = torch.func.functional_call(private.inner.module, params, features)
        torch.testing.assert_close(logits[party], expected)


@pytest.mark.parametrize("groups,size", [(3, 6), (5, 3)])
def test_slate_groups_equal_the_generic_path(groups, size):
    private, x = _private(masked_sigmoid_ap_objective(0.1), groups, size)
    _against_the_generic_path(private, x, _batch(groups, size, seed=2))


@pytest.mark.parametrize("name", ["dpsgd", "coda"])
def test_rows_of_one_equal_the_generic_path(name):
    """D-PSGD's cross-entropy, and CODA's loss with its own variables and per-party context."""
    algorithm = build_algorithm(name, AlgorithmConfig(sampled_positive_rate=0.25))
    context = algorithm.context([torch.tensor([0, 1, 0, 0])] * PARTIES)
    if context is not None:
        context = context.float()
    with_context = context is not None
    private, x = _private(algorithm.masked_objective(with_context), 24, 1,
                          n_extra=algorithm.n_extra, context=context)  # fmt: skip
    _against_the_generic_path(private, x, _batch(24, 1, seed=3))


def test_the_estimate_is_the_clipped_sum_over_the_divisor():
    private, x = _private(masked_sigmoid_ap_objective(0.1), 3, 5, clip=0.08)
    batch = _batch(3, 5, seed=4)
    _, grads = private.group_gradients(x, batch)
    _, estimate = private(x, batch)  # no noise (the sources are zero), divisor 1
    torch.testing.assert_close(estimate, clipped_sum(grads, 0.08).float(), rtol=1e-5, atol=1e-6)
    assert not estimate.requires_grad
