"""Tests of the per-party mini-batch sampler: batch layout, stream independence, uniformity."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from scipy import stats

from slate.data.partition import stratified_partition
from slate.data.sampler import PartySampler, validate_batch_shape
from slate.errors import ConfigError

M, B = 10, 3


def _labels(n: int = 2000, rate: float = 0.1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.random(n) < rate).astype(np.int64)


def _sampler(parts, labels, seed=0, m=M, b=B, parties=None) -> PartySampler:
    return PartySampler(parts, labels, batch_size=m, positives=b, seed=seed, parties=parties)


def test_batch_layout_positives_first_from_own_party() -> None:
    labels = _labels()
    parts = stratified_partition(labels, 8, seed=1)
    draws = _sampler(parts, labels).draw(50)
    assert isinstance(draws, torch.Tensor)
    assert draws.dtype == torch.int64
    assert tuple(draws.shape) == (50, 8, M)
    idx = draws.numpy()
    for n, part in enumerate(parts):
        own = set(part.tolist())
        cols = idx[:, n, :]
        assert set(cols.ravel().tolist()) <= own, f"party {n} drew another party's example"
        assert (labels[cols[:, :B]] == 1).all(), "the first b columns must be positives"
        assert (labels[cols[:, B:]] == 0).all(), "the other m - b columns must be negatives"


def test_b_equals_m_draws_only_positives() -> None:
    labels = _labels()
    parts = stratified_partition(labels, 4, seed=0)
    idx = _sampler(parts, labels, m=5, b=5).draw(20).numpy()
    assert (labels[idx] == 1).all()


def _parts_with_same_first(labels: np.ndarray, n_parties: int, first: np.ndarray):
    """A partition into ``n_parties`` whose party 0 is exactly ``first``."""
    rest = np.setdiff1d(np.arange(labels.size), first)
    others = stratified_partition(labels[rest], n_parties - 1, seed=n_parties)
    return [first.copy()] + [rest[p] for p in others]


def test_party_draws_independent_of_n_and_of_other_parties() -> None:
    labels = _labels()
    first = stratified_partition(labels, 10, seed=3)[0]
    parts4 = _parts_with_same_first(labels, 4, first)
    parts8 = _parts_with_same_first(labels, 8, first)
    assert not np.array_equal(parts4[1], parts8[1])
    d4 = _sampler(parts4, labels, seed=5).draw(40).numpy()
    d8 = _sampler(parts8, labels, seed=5).draw(40).numpy()
    np.testing.assert_array_equal(d4[:, 0], d8[:, 0])

    # Changing party 0's data leaves the other parties' draws untouched.
    changed = [first[: first.size // 2 + 5].copy(), *parts4[1:]]
    assert labels[changed[0]].min() == 0 and labels[changed[0]].max() == 1
    d4b = _sampler(changed, labels, seed=5).draw(40).numpy()
    np.testing.assert_array_equal(d4b[:, 1:], d4[:, 1:])
    assert not np.array_equal(d4b[:, 0], d4[:, 0])


def test_independent_of_chunking() -> None:
    labels = _labels()
    parts = stratified_partition(labels, 6, seed=2)
    one = _sampler(parts, labels, seed=9)
    a = torch.cat([one.draw(10), one.draw(5)]).numpy()
    b = _sampler(parts, labels, seed=9).draw(15).numpy()
    np.testing.assert_array_equal(a, b)
    c = _sampler(parts, labels, seed=9)
    pieces = [c.draw(1) for _ in range(15)]
    np.testing.assert_array_equal(torch.cat(pieces).numpy(), b)


def test_reproducible_and_seed_dependent() -> None:
    labels = _labels()
    parts = stratified_partition(labels, 6, seed=2)
    a = _sampler(parts, labels, seed=1).draw(30).numpy()
    b = _sampler(parts, labels, seed=1).draw(30).numpy()
    c = _sampler(parts, labels, seed=2).draw(30).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    for n in range(6):  # every party's stream moves with the seed
        assert not np.array_equal(a[:, n], c[:, n])
    # the parties do not share one stream: compare the drawn positions within each party's
    # positives (equal if two parties used the same random numbers)
    positions = []
    for n in (0, 1):
        own_pos = parts[n][labels[parts[n]] == 1]
        positions.append(np.searchsorted(own_pos, a[:, n, :B]))
    assert not np.array_equal(positions[0], positions[1])


def test_single_party_matches_full_sampler() -> None:
    labels = _labels()
    parts = stratified_partition(labels, 8, seed=4)
    full = _sampler(parts, labels, seed=7).draw(25).numpy()
    own = _sampler([parts[3]], labels, seed=7, parties=[3]).draw(25).numpy()
    assert own.shape == (25, 1, M)
    np.testing.assert_array_equal(own[:, 0], full[:, 3])
    two = _sampler([parts[5], parts[2]], labels, seed=7, parties=[5, 2]).draw(25).numpy()
    np.testing.assert_array_equal(two[:, 0], full[:, 5])
    np.testing.assert_array_equal(two[:, 1], full[:, 2])


def test_state_dict_resumes_exact_stream() -> None:
    labels = _labels()
    parts = stratified_partition(labels, 5, seed=0)
    reference = _sampler(parts, labels, seed=3)
    reference.draw(7)
    state = copy.deepcopy(reference.state_dict())
    json.dumps(state)  # plain data, storable in a checkpoint
    expected = reference.draw(12).numpy()

    resumed = _sampler(parts, labels, seed=3)
    fresh_first = resumed.draw(12).numpy()
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(resumed.draw(12).numpy(), expected)
    assert not np.array_equal(fresh_first, expected)

    # a sampler built with another seed is moved onto the saved stream as well
    other = _sampler(parts, labels, seed=99)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.draw(12).numpy(), expected)


def test_with_replacement_uniform_over_party_examples() -> None:
    labels = _labels(3000, 0.05, seed=6)
    parts = stratified_partition(labels, 4, seed=0)
    steps = 4000
    idx = _sampler(parts, labels, seed=0, m=8, b=2).draw(steps).numpy()
    for n in (0, 3):
        for cls, cols in ((1, idx[:, n, :2]), (0, idx[:, n, 2:])):
            members = parts[n][labels[parts[n]] == cls]
            counts = np.array([np.count_nonzero(cols == i) for i in members])
            assert counts.sum() == cols.size
            expected = cols.size / members.size
            # frequency of each example ~ 1 / P_n; chi-square goodness of fit
            _, p_value = stats.chisquare(counts, np.full(members.size, expected))
            assert p_value > 1e-3, (n, cls, p_value)
            assert counts.min() > 0
            assert np.abs(counts - expected).max() < 6 * np.sqrt(expected)
    # with replacement: a batch may repeat a positive when P_n is small
    tiny = np.array([0, 1, 2, 3, 4, 5])
    tiny_labels = np.array([1, 1, 0, 0, 0, 0])
    rep = _sampler([tiny], tiny_labels, m=6, b=4).draw(5).numpy()
    assert all(len(set(row[0, :4].tolist())) < 4 for row in rep)


def test_draw_to_device() -> None:
    labels = _labels()
    parts = stratified_partition(labels, 2, seed=0)
    out = _sampler(parts, labels).draw(3, device="cpu")
    assert out.device.type == "cpu"


@pytest.mark.parametrize(
    ("m", "b", "flag"),
    [(5, 6, "--positives"), (5, 0, "--positives"), (0, 0, "--batch-size"), (-2, 1, "--batch-size")],
)
def test_validate_batch_shape_errors(m: int, b: int, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        validate_batch_shape(m, b)


def test_validate_batch_shape_b_greater_than_m_names_both() -> None:
    with pytest.raises(ConfigError) as info:
        validate_batch_shape(20, 21)
    message = str(info.value)
    assert "--positives" in message and "--batch-size" in message
    assert "21" in message and "20" in message


@pytest.mark.parametrize(("m", "b"), [(1, 1), (20, 1), (20, 20)])
def test_validate_batch_shape_ok(m: int, b: int) -> None:
    validate_batch_shape(m, b)


def test_sampler_constructor_validates() -> None:
    labels = _labels()
    with pytest.raises(ConfigError, match="--positives"):
        _sampler([np.arange(100)], labels, m=4, b=5)
