"""``--dp-epsilon``'s mechanism (:mod:`slate.algorithms.privacy`), sampler and secret streams,
each against an independent reference: autograd of the AP surrogate on a group's kept rows
alone, the binomial law of the sample, and the Gaussian law of the noise."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
import torch

from slate.algorithms.compute import Batch, PartyCompute
from slate.algorithms.privacy import (
    NoiseAhead,
    PrivateCompute,
    PrivateGroups,
    clip_scales,
    clipped_sum,
    expected_contributors,
    row_objective,
)
from slate.data.sampler import PoissonGroupSampler, row_slots_for, slots_for
from slate.models import build_model
from slate.objectives.ap import ap_surrogate, masked_sigmoid_ap_objective
from slate.objectives.bce import bce_objective
from slate.security.secret_random import SecretStream

GROUPS, SLOTS, PARTIES, FEATURES = 4, 6, 2, 5


class _Zero:
    """A noise source that adds nothing (the clipping tests look at the sum alone)."""

    def normal(self, count: int, std: float = 1.0) -> np.ndarray:
        return np.zeros(count)


def _grouped_batch(seed: int = 0) -> Batch:
    """Two parties' slots: G groups of k, some empty (label -1), one group with no positive."""
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(PARTIES, GROUPS * SLOTS, FEATURES, generator=gen) * 3
    labels = torch.randint(0, 2, (PARTIES, GROUPS * SLOTS), generator=gen)
    labels[:, 4:6] = -1  # the end of group 0 empty
    labels[0, SLOTS : 2 * SLOTS] = 0  # party 0's group 1 holds no positive
    labels[:, 3 * SLOTS :: 2] = -1  # every other slot of group 3 empty
    return Batch(features, labels)


def _compute(objective) -> tuple[torch.nn.Module, PartyCompute]:
    model = build_model("mlp", (FEATURES,), hidden=4, seed=3)
    return model, PartyCompute(model, objective, n_parties=PARTIES)


def test_each_group_gradient_is_the_ap_surrogate_of_its_kept_rows_and_clipped_to_c():
    margin, clip = 0.1, 0.05
    model, inner = _compute(masked_sigmoid_ap_objective(margin))
    shape = PrivateGroups(GROUPS, SLOTS, clip, (0.0, 0.0), (1.0, 1.0))
    private = PrivateCompute(inner, shape, [_Zero(), _Zero()])
    x = inner.layout.flatten(model).expand(PARTIES, -1).clone()
    x[1] += 0.3 * torch.randn(x.shape[1], generator=torch.Generator().manual_seed(1))
    batch = _grouped_batch()
    losses, grads = private.group_gradients(x, batch)
    for party in range(PARTIES):
        for group in range(GROUPS):
            rows = slice(group * SLOTS, (group + 1) * SLOTS)
            labels = batch.labels[party, rows]
            kept = labels >= 0
            leaf = x[party].clone().requires_grad_(True)
            params = inner.layout.unflatten(leaf)
            logits = torch.func.functional_call(model, params, (batch.features[party, rows][kept],))
            if bool((labels[kept] == 1).any()):
                reference = ap_surrogate(torch.sigmoid(logits), labels[kept], margin)
                (expected,) = torch.autograd.grad(reference, leaf)
            else:  # a group without a positive contributes nothing
                reference, expected = torch.tensor(0.0), torch.zeros_like(leaf)
            assert float(losses[group, party]) == pytest.approx(float(reference.detach()), abs=1e-6)
            torch.testing.assert_close(grads[group, party], expected, atol=1e-6, rtol=1e-5)
    clipped = grads.double() * clip_scales(grads, clip)[..., None]
    norms, raw = clipped.norm(dim=-1), grads.double().norm(dim=-1)
    assert bool((norms <= clip).all())
    assert bool((raw > clip).any()), "the test must clip some group"
    small = raw <= clip  # unchanged below C; scaled to exactly C, same direction, above it
    torch.testing.assert_close(clipped[small], grads.double()[small])
    at_clip = torch.full_like(norms[~small], clip)
    torch.testing.assert_close(norms[~small], at_clip, rtol=3e-5, atol=0)
    cosine = torch.nn.functional.cosine_similarity(clipped[~small], grads.double()[~small], dim=-1)
    torch.testing.assert_close(cosine, torch.ones_like(cosine))
    torch.testing.assert_close(clipped_sum(grads, clip), clipped.sum(dim=0))
    # The estimate without noise: the clipped groups' sum over the divisor.
    _, estimate = private(x, batch)
    torch.testing.assert_close(estimate, clipped.sum(dim=0).float())


def test_row_objective_is_the_rows_own_loss_and_nothing_for_an_empty_slot():
    masked = row_objective(bce_objective, with_context=False)
    logits, extra = torch.tensor([0.7]), torch.zeros(0)
    reference = bce_objective(logits, torch.tensor([1]), extra)
    assert float(masked(logits, torch.tensor([1]), extra)) == pytest.approx(float(reference))
    assert float(masked(logits, torch.tensor([-1]), extra)) == 0.0


def test_the_noise_is_added_in_float64_with_std_2cz_over_the_divisor():
    """Two calls on the same rows differ by the noise alone: (n1 - n2) / D, whose standard
    deviation is sqrt(2) 2 C z / D; over 35 000 coordinates its estimate has a relative
    standard error of 1/sqrt(2 * 35 000) = 0.38%, so 3% is 7.9 of them (a chi-square)."""
    model = build_model("mlp", (FEATURES,), hidden=5000, seed=3)
    inner = PartyCompute(model, masked_sigmoid_ap_objective(0.1), n_parties=PARTIES)
    clip, z, divisor = 0.5, 1.7, (2.5, 4.0)
    std = tuple(2 * clip * z for _ in range(PARTIES))
    streams = [SecretStream.for_test(11, p, "noise") for p in range(PARTIES)]
    private = PrivateCompute(inner, PrivateGroups(GROUPS, SLOTS, clip, std, divisor), streams)
    x = inner.layout.flatten(model).expand(PARTIES, -1).clone()
    batch = _grouped_batch()
    _, first = private(x, batch)
    _, second = private(x, batch)
    difference = (first - second).double()
    assert difference.shape[1] > 35_000
    for party in range(PARTIES):
        expected = math.sqrt(2) * 2 * clip * z / divisor[party]
        assert float(difference[party].std()) == pytest.approx(expected, rel=0.03)
    # The test seed reproduces the noise; the secret default never repeats it.
    again = PrivateCompute(
        inner, private.groups, [SecretStream.for_test(11, p, "noise") for p in range(PARTIES)]
    )
    torch.testing.assert_close(again(x, batch)[1], first)
    secret = PrivateCompute(inner, private.groups, [SecretStream(), SecretStream()])
    assert not torch.equal(secret(x, batch)[1], first)


def test_secret_stream_normals_are_standard_gaussian():
    """Mean and variance of 400 000 draws, within 6 standard errors; and the tail mass
    beyond 2 within 6 standard errors of 4.55%."""
    draws = SecretStream().normal(400_000, std=3.0) / 3.0
    n = len(draws)
    assert abs(draws.mean()) < 6 / math.sqrt(n)
    assert abs(draws.var() - 1) < 6 * math.sqrt(2 / n)
    tail = 2 * (1 - 0.5 * (1 + math.erf(2 / math.sqrt(2))))
    assert abs(np.mean(np.abs(draws) > 2) - tail) < 6 * math.sqrt(tail * (1 - tail) / n)
    assert draws.dtype == np.float64


def test_poisson_sampling_takes_each_class_at_its_declared_rate():
    """Over 400 steps, the rows taken of each class against the binomial law of their count,
    within 6 standard deviations (a false alarm below 1e-8); no row twice in a step; each
    group's rows first, then its empty slots."""
    rng = np.random.default_rng(0)
    labels = (rng.random(900) < 0.1).astype(np.int64)
    parts = [np.arange(0, 500), np.arange(500, 900)]
    rates = [(0.3, 0.05), (0.5, 0.02)]
    groups = 4
    expected = max(q1 * labels[p].sum() + q0 * (1 - labels[p]).sum()
                   for p, (q1, q0) in zip(parts, rates, strict=True))  # fmt: skip
    size = slots_for(expected / groups)
    streams = [SecretStream.for_test(5, p, "sample") for p in range(2)]
    sampler = PoissonGroupSampler(parts, labels, rates, groups, size, streams, pad=len(labels))
    steps = 400
    drawn = sampler.draw(steps).numpy()
    assert drawn.shape == (steps, 2, groups * size)
    for k, (part, (q_pos, q_neg)) in enumerate(zip(parts, rates, strict=True)):
        taken = drawn[:, k]
        real = taken[taken != len(labels)]
        assert set(real.tolist()) <= set(part.tolist())
        for step in taken:
            kept = step[step != len(labels)]
            assert len(set(kept.tolist())) == len(kept)
            slots = step.reshape(groups, size) != len(labels)
            assert all((row[:-1] >= row[1:]).all() for row in slots)  # rows, then padding
        for cls, q in ((1, q_pos), (0, q_neg)):
            n = int((labels[part] == cls).sum())
            count = int((labels[real] == cls).sum())
            mean, sd = steps * n * q, math.sqrt(steps * n * q * (1 - q))
            assert abs(count - mean) < 6 * sd, (k, cls, count, mean, sd)
        # Each taken row's group is uniform: every group holds about a G-th of the rows.
        per_group = (taken.reshape(steps, groups, size) != len(labels)).sum(axis=(0, 2))
        share = per_group.sum() / groups
        assert (abs(per_group - share) < 6 * math.sqrt(share)).all(), (k, per_group)


def test_rows_of_one_slot_each_are_never_lost_to_a_collision():
    """Groups of one row (D-PSGD, CODA): every taken row gets its own slot while there are
    slots, so the rows kept per step follow each class's binomial law (within 6 standard
    deviations). Dealt into slots at random, as groups are, a third of them would be lost
    (rows that land on an occupied slot) and the sum, divided by the expected rows, shrunk."""
    rng = np.random.default_rng(4)
    labels = (rng.random(1200) < 0.1).astype(np.int64)
    parts = [np.arange(0, 700), np.arange(700, 1200)]
    rates = [(0.4, 0.06), (0.5, 0.08)]
    expected = max(q1 * labels[p].sum() + q0 * (1 - labels[p]).sum()
                   for p, (q1, q0) in zip(parts, rates, strict=True))  # fmt: skip
    slots = 4 * int(expected)  # never full here: nothing may be lost
    streams = [SecretStream.for_test(9, p, "sample") for p in range(2)]
    sampler = PoissonGroupSampler(parts, labels, rates, slots, 1, streams, pad=len(labels))
    steps = 300
    drawn = sampler.draw(steps).numpy()
    for k, (part, (q_pos, q_neg)) in enumerate(zip(parts, rates, strict=True)):
        for step in drawn[:, k]:
            kept = step[step != len(labels)]
            assert (step[: len(kept)] == kept).all()  # slots 0, 1, 2, ..., then empty
            assert len(set(kept.tolist())) == len(kept) and set(kept) <= set(part)
            assert (np.diff(labels[kept]) <= 0).all()  # positives first
        real = drawn[:, k][drawn[:, k] != len(labels)]
        for cls, q in ((1, q_pos), (0, q_neg)):
            n = int((labels[part] == cls).sum())
            count = int((labels[real] == cls).sum())
            mean, sd = steps * n * q, math.sqrt(steps * n * q * (1 - q))
            assert abs(count - mean) < 6 * sd, (k, cls, count, mean, sd)


@pytest.mark.parametrize("expected", [4.0, 16.0, 128.0, 2000.0])
def test_row_slots_hold_a_steps_rows_but_rarely(expected):
    """P(Poisson(mu) > row_slots_for(mu)) below 2e-3, by the exact tail (a step's row count
    is a sum of Bernoulli draws, whose tail is lighter than the Poisson law of its mean)."""
    slots = row_slots_for(expected)
    log_term = [-expected + j * math.log(expected) - math.lgamma(j + 1) for j in range(slots + 1)]
    assert 1.0 - sum(math.exp(t) for t in log_term) < 2e-3
    assert slots <= expected + 3 * math.sqrt(expected) + 2


def test_a_full_group_cuts_its_negatives_and_keeps_its_positives():
    """Three slots for groups that expect about eight rows: most groups overflow. Each group's
    kept rows are its positives first, and the positives taken still follow the binomial law
    of their rate (within 6 standard deviations), which a cut in random order would break
    (it would keep about 3/8 of them); the negatives kept are far fewer than taken."""
    rng = np.random.default_rng(2)
    labels = (rng.random(400) < 0.05).astype(np.int64)
    part, (q_pos, q_neg), groups, size, steps = np.arange(400), (0.3, 0.08), 4, 3, 300
    stream = SecretStream.for_test(7, 0, "sample")
    sampler = PoissonGroupSampler([part], labels, [(q_pos, q_neg)], groups, size, [stream],
                                  pad=len(labels))  # fmt: skip
    drawn = sampler.draw(steps).numpy()[:, 0].reshape(steps, groups, size)
    kept_labels = np.where(drawn == len(labels), -1, labels[np.minimum(drawn, len(labels) - 1)])
    assert (kept_labels[..., :-1] >= kept_labels[..., 1:]).all()  # positives, negatives, empty
    n_pos = int(labels.sum())
    positives = int((kept_labels == 1).sum())
    mean, sd = steps * n_pos * q_pos, math.sqrt(steps * n_pos * q_pos * (1 - q_pos))
    assert abs(positives - mean) < 6 * sd, (positives, mean, sd)
    negatives_taken = steps * (len(labels) - n_pos) * q_neg
    assert int((kept_labels == 0).sum()) < 0.5 * negatives_taken


def test_noise_drawn_ahead_is_the_streams_next_draws_in_order():
    """NoiseAhead's takes are each party's stream read on demand, draw after draw, scaled by
    its std; a take of another size is drawn on the spot; after keep() the kept party's stream
    has moved past the draw made ahead, which is dropped."""
    std = torch.tensor([2.0, 0.5], dtype=torch.float64)

    class Slow(SecretStream):
        """Draws slowly on the worker thread, so that a take that does not wait for the draw
        made ahead would read the stream while it runs."""

        def normal(self, count: int, std: float = 1.0):
            if threading.current_thread() is not threading.main_thread():
                time.sleep(0.05)
            return super().normal(count, std)

    ahead = NoiseAhead([Slow.for_test(3, p, "noise") for p in range(2)], std)
    plain = [SecretStream.for_test(3, p, "noise") for p in range(2)]

    def on_demand(dim: int) -> torch.Tensor:
        draws = [s.normal(dim, float(v)) for s, v in zip(plain, std, strict=True)]
        return torch.from_numpy(np.stack(draws))

    for dim in (50, 50, 50):
        torch.testing.assert_close(ahead.take(dim), on_demand(dim), rtol=0, atol=0)
    on_demand(50)  # the size-50 draw made ahead of the first take of 20, dropped
    for _ in range(2):
        torch.testing.assert_close(ahead.take(20), on_demand(20), rtol=0, atol=0)
    ahead.keep([1])
    plain[1].normal(20)  # the draw made ahead of the keep, dropped
    torch.testing.assert_close(
        ahead.take(20), torch.from_numpy(plain[1].normal(20, 0.5))[None], rtol=0, atol=0
    )


def test_the_divisor_is_the_expected_number_of_contributing_groups():
    """G (1 - (1 - q/G)^n) against a simulation of where n rows sampled at rate q fall."""
    groups, n, q = 8, 37, 0.217
    rng = np.random.default_rng(1)
    trials = 20_000
    taken = rng.random((trials, n)) < q
    where = rng.integers(0, groups, (trials, n))
    occupied = [len(set(where[t][taken[t]].tolist())) for t in range(trials)]
    exact = expected_contributors("group", groups, n, 1000, q, 0.1)
    assert np.mean(occupied) == pytest.approx(exact, abs=6 * np.std(occupied) / math.sqrt(trials))
    assert expected_contributors("row", groups, n, 1000, q, 0.1) == pytest.approx(q * n + 100)
