"""Federated standardisation statistics against pooled numpy statistics."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slate.data.preprocess import Standardizer, federated_moments


def _moments_over_processes(blocks, processes):
    """Run federated_moments in ``processes`` threads, each with some parties, whose ``total``
    is a real exchange: every thread waits for the others and gets the sum of all values."""
    groups = [g for g in (blocks[k::processes] for k in range(processes)) if g]
    barrier = threading.Barrier(len(groups))
    posted: dict[int, torch.Tensor] = {}
    results = [None] * len(groups)

    def total_for(k):
        def total(value, what=""):
            posted[k] = value.clone()
            barrier.wait()
            summed = sum(posted[j] for j in range(len(groups)))
            barrier.wait()  # everyone has read before the next round posts
            return summed

        return total

    def run(k):
        results[k] = federated_moments(groups[k], total_for(k))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 5),
    st.sampled_from([1.0, 1e3, 1e6]),
    st.integers(0, 2**31 - 1),
)
@pytest.mark.kernels
def test_federated_moments_equal_pooled_numpy(parties, width, scale, seed):
    rng = np.random.default_rng(seed)
    blocks = [
        (rng.normal(scale, scale / 7, size=(int(rng.integers(1, 30)), width))).astype(np.float32)
        for _ in range(parties)
    ]
    pooled = np.concatenate(blocks).astype(np.float64)
    mean, std, rows = federated_moments(blocks)
    assert rows == len(pooled)
    np.testing.assert_allclose(mean, pooled.mean(0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(std, pooled.std(0), rtol=1e-9, atol=1e-9)
    # Parties spread over processes that exchange only the sums: every process gets the same.
    for got_mean, got_std, got_rows in _moments_over_processes(blocks, 3):
        assert got_rows == rows
        np.testing.assert_allclose(got_mean, pooled.mean(0), rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(got_std, pooled.std(0), rtol=1e-9, atol=1e-9)


def test_total_is_applied_to_both_rounds():
    seen = []

    def total(value, what):
        seen.append((what, value.clone()))
        return value * 2  # two identical processes

    block = np.array([[1.0, 2.0], [3.0, 6.0]], dtype=np.float32)
    mean, std, rows = federated_moments([block], total)
    assert rows == 4 and [what for what, _ in seen] == [
        "standardisation sums",
        "standardisation squares",
    ]
    np.testing.assert_allclose(mean, [2.0, 4.0])
    np.testing.assert_allclose(std, np.concatenate([block, block]).std(0))


def test_constant_feature_is_centred_not_divided_by_zero():
    x = np.array([[5.0, 1.0], [5.0, 3.0], [5.0, 5.0]], dtype=np.float32)
    transform = Standardizer.fit([x[:1], x[1:]])
    z = transform.apply(x)
    assert np.isfinite(z).all()
    np.testing.assert_allclose(z[:, 0], 0.0)
    np.testing.assert_allclose(z[:, 1], (x[:, 1] - 3.0) / np.std([1.0, 3.0, 5.0]), rtol=1e-6)


def test_standardizer_round_trips_through_its_dict():
    transform = Standardizer.fit([np.arange(12, dtype=np.float32).reshape(4, 3)])
    again = Standardizer.from_dict(transform.to_dict())
    np.testing.assert_array_equal(again.mean, transform.mean)
    np.testing.assert_array_equal(again.scale, transform.scale)


def test_large_magnitudes_keep_their_variance():
    # E[x^2] - mean^2 would lose these digits in float64.
    x = (1e8 + np.arange(10, dtype=np.float64)).reshape(-1, 1).astype(np.float32)
    _, std, _ = federated_moments([x[:3], x[3:]])
    assert std[0] == pytest.approx(x.astype(np.float64).std(), rel=1e-9)
