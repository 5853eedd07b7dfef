"""APLoss against eq. (6), finite differences and a brute-force definition."""

from __future__ import annotations

import pytest
import torch

from slate import APLoss
from slate.objectives.ap import ap_surrogate


def random_batch(seed: int, m: int = 12, b: int = 3):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(m, generator=gen, dtype=torch.float64)
    labels = torch.zeros(m, dtype=torch.long)
    labels[torch.randperm(m, generator=gen)[:b]] = 1
    return logits, labels


def brute_force_loss(scores, labels, s):
    """Mean over positives i of -g1_i / g2_i, with explicit loops over the batch."""
    m = len(scores)
    values = []
    for i in range(m):
        if labels[i] != 1:
            continue
        g1 = (
            sum(
                max(s - (scores[i] - scores[j]), 0.0) ** 2 * float(labels[j] == 1) for j in range(m)
            )
            / m
        )
        g2 = sum(max(s - (scores[i] - scores[j]), 0.0) ** 2 for j in range(m)) / m
        values.append(-g1 / g2)
    return sum(values) / len(values)


def eq6_gradient(scores, labels, s):
    """Eq. (6) w.r.t. the scores h: sum_ij (g1_i - g2_i 1[y_j]) dl_ij / (b m g2_i^2)."""
    m = len(scores)
    b = int(sum(labels))
    grad = torch.zeros(m, dtype=torch.float64)
    for i in range(m):
        if labels[i] != 1:
            continue
        hinge = [max(s - (scores[i] - scores[j]), 0.0) for j in range(m)]
        g1 = sum(hinge[j] ** 2 * float(labels[j] == 1) for j in range(m)) / m
        g2 = sum(h**2 for h in hinge) / m
        for j in range(m):
            weight = (g1 - g2 * float(labels[j] == 1)) / (b * m * g2**2)
            # d l_ij / d h_i = -2 hinge_ij and d l_ij / d h_j = +2 hinge_ij
            grad[i] += weight * (-2 * hinge[j])
            grad[j] += weight * (2 * hinge[j])
    return grad


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("margin", [0.1, 0.5, 1.0])
def test_loss_equals_brute_force(seed, margin):
    logits, labels = random_batch(seed)
    scores = torch.sigmoid(logits)
    ours = APLoss(margin)(scores, labels)
    ref = brute_force_loss(scores.tolist(), labels.tolist(), margin)
    assert float(ours) == pytest.approx(ref, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("margin", [0.1, 0.9])
def test_autograd_gradient_equals_eq6(seed, margin):
    logits, labels = random_batch(seed, m=10, b=1 + seed % 4)
    scores = torch.sigmoid(logits).requires_grad_(True)
    APLoss(margin)(scores, labels).backward()
    expected = eq6_gradient(scores.detach().tolist(), labels.tolist(), margin)
    torch.testing.assert_close(scores.grad, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_gradient_through_model_matches_finite_differences(seed):
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(16, 5, generator=gen, dtype=torch.float64)
    labels = (torch.arange(16) < 4).long()
    weights = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    loss_fn = APLoss(0.3)

    def loss_at(w):
        return loss_fn(torch.sigmoid(features @ w), labels)

    loss_at(weights).backward()
    eps = 1e-6
    numeric = torch.zeros(5, dtype=torch.float64)
    for k in range(5):
        step = torch.zeros(5, dtype=torch.float64)
        step[k] = eps
        numeric[k] = (loss_at(weights.detach() + step) - loss_at(weights.detach() - step)) / (
            2 * eps
        )
    torch.testing.assert_close(weights.grad, numeric, rtol=1e-6, atol=1e-8)


def test_self_pair_keeps_denominator_positive():
    # A lone positive far above every negative: g2 = s^2 / m from l(i, i) alone, and f = -1.
    scores = torch.tensor([0.99, 0.01, 0.02, 0.03])
    labels = torch.tensor([1, 0, 0, 0])
    assert float(APLoss(0.1)(scores, labels)) == pytest.approx(-1.0)


def test_perfect_and_reversed_rankings_bound_the_loss():
    labels = torch.tensor([1, 1, 0, 0, 0])
    good = APLoss(0.1)(torch.tensor([0.9, 0.8, 0.1, 0.2, 0.15]), labels)
    bad = APLoss(0.1)(torch.tensor([0.1, 0.2, 0.9, 0.8, 0.85]), labels)
    assert -1.0 <= float(good) < float(bad) < 0.0


def test_no_positive_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one positive"):
        APLoss()(torch.rand(5), torch.zeros(5, dtype=torch.long))


@pytest.mark.parametrize(
    ("scores", "labels", "message"),
    [
        (torch.rand(4), torch.tensor([1, 0, 1]), "same shape"),
        (torch.rand(4), torch.tensor([1, 0, 2, 0]), "0/1 labels"),
        (torch.rand(2, 2), torch.ones(2, 2), "same shape"),
    ],
)
def test_bad_input_is_rejected(scores, labels, message):
    with pytest.raises(ValueError, match=message):
        APLoss()(scores, labels)


def test_margin_must_be_positive():
    with pytest.raises(ValueError, match="margin"):
        APLoss(margin=0.0)


@pytest.mark.kernels
def test_functional_core_runs_under_vmap():
    logits, labels = random_batch(0)
    stacked = torch.stack([logits, logits.flip(0)])
    both = torch.stack([labels, labels.flip(0)])
    batched = torch.func.vmap(lambda s, y: ap_surrogate(torch.sigmoid(s), y, 0.1))(stacked, both)
    single = ap_surrogate(torch.sigmoid(logits), labels, 0.1)
    torch.testing.assert_close(batched, torch.stack([single, single]))


def test_no_state_between_calls():
    loss = APLoss(0.1)
    logits, labels = random_batch(3)
    first = loss(torch.sigmoid(logits), labels)
    loss(torch.rand(12), labels)
    assert torch.equal(first, loss(torch.sigmoid(logits), labels))
    assert list(loss.state_dict()) == []


def test_a_batch_without_positives_has_zero_loss_and_an_exactly_zero_gradient():
    scores = torch.rand(8, dtype=torch.float64, requires_grad=True)
    loss = ap_surrogate(scores, torch.zeros(8, dtype=torch.long), 0.1)
    (grad,) = torch.autograd.grad(loss, scores)
    assert float(loss.detach()) == 0.0 and bool((grad == 0).all())
