"""Tests of the party partitions (stratified IID and Dirichlet) and of the party-count checks."""

from __future__ import annotations

import numpy as np
import pytest

from slate.data.partition import (
    PARTITIONS,
    check_party_counts,
    dirichlet_partition,
    make_partition,
    stratified_partition,
)
from slate.errors import ConfigError, DataError


def _labels(n: int, rate: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.random(n) < rate).astype(np.int64)


def _assert_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert joined.size == n, "the parts must hold every index exactly once"
    np.testing.assert_array_equal(np.sort(joined), np.arange(n))
    for part in parts:
        assert part.dtype.kind in "iu"
        assert np.unique(part).size == part.size


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# --------------------------------------------------------------------------------------------
# stratified
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "n_parties", "rate"), [(1000, 20, 0.03), (257, 7, 0.3), (50, 1, 0.5)]
)
def test_stratified_disjoint_cover(n: int, n_parties: int, rate: float) -> None:
    labels = _labels(n, rate)
    parts = stratified_partition(labels, n_parties, seed=3)
    assert len(parts) == n_parties
    _assert_disjoint_cover(parts, n)


@pytest.mark.parametrize("n_parties", [1, 3, 8, 20, 33])
def test_stratified_per_class_counts_are_floor_or_ceil(n_parties: int) -> None:
    labels = _labels(997, 0.07, seed=1)
    parts = stratified_partition(labels, n_parties, seed=0)
    for cls in (0, 1):
        total = int((labels == cls).sum())
        lo, hi = total // n_parties, -(-total // n_parties)
        counts = [int((labels[p] == cls).sum()) for p in parts]
        assert sum(counts) == total
        assert all(c in (lo, hi) for c in counts), (cls, counts, lo, hi)
        if lo != hi:  # exactly total mod N parties get the extra example
            assert sum(c == hi for c in counts) == total % n_parties


def test_stratified_multiclass_labels() -> None:
    labels = np.repeat(np.arange(5), [13, 7, 22, 1, 40])
    parts = stratified_partition(labels, 4, seed=9)
    _assert_disjoint_cover(parts, labels.size)
    for cls, total in enumerate([13, 7, 22, 1, 40]):
        counts = [int((labels[p] == cls).sum()) for p in parts]
        assert max(counts) - min(counts) <= 1
        assert sum(counts) == total


def test_stratified_deterministic_and_seeded() -> None:
    labels = _labels(500, 0.2)
    a = stratified_partition(labels, 6, seed=11)
    b = stratified_partition(labels.copy(), 6, seed=11)
    c = stratified_partition(labels, 6, seed=12)
    assert _same(a, b)
    assert not _same(a, c)


def test_stratified_is_a_shuffle_not_a_contiguous_cut() -> None:
    # Party 0 should not simply get the first indices of each class.
    labels = np.zeros(400, dtype=np.int64)
    labels[::4] = 1
    parts = stratified_partition(labels, 4, seed=0)
    first_neg = np.flatnonzero(labels == 0)[:75]
    assert not set(first_neg) <= set(parts[0])


# --------------------------------------------------------------------------------------------
# dirichlet
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.05, 0.5, 10.0])
def test_dirichlet_disjoint_cover(alpha: float) -> None:
    labels = _labels(800, 0.25, seed=2)
    parts = dirichlet_partition(labels, 10, alpha, seed=4)
    assert len(parts) == 10
    _assert_disjoint_cover(parts, labels.size)


def test_dirichlet_deterministic_and_seeded() -> None:
    labels = _labels(800, 0.25, seed=2)
    a = dirichlet_partition(labels, 10, 0.5, seed=4)
    b = dirichlet_partition(labels.copy(), 10, 0.5, seed=4)
    c = dirichlet_partition(labels, 10, 0.5, seed=5)
    assert _same(a, b)
    assert not _same(a, c)


def _positive_share_std(labels: np.ndarray, alpha: float, seeds: range) -> float:
    """Std over parties (and seeds) of each party's share of the positives."""
    shares = []
    n_pos = labels.sum()
    for seed in seeds:
        parts = dirichlet_partition(labels, 10, alpha, seed=seed)
        shares.extend(labels[p].sum() / n_pos for p in parts)
    return float(np.std(shares))


def _mix_std(labels: np.ndarray, alpha: float, seeds: range) -> float:
    """Std over non-empty parties of the fraction of positives in the party (its class mix)."""
    fractions = []
    for seed in seeds:
        for p in dirichlet_partition(labels, 10, alpha, seed=seed):
            if p.size >= 5:
                fractions.append(labels[p].mean())
    return float(np.std(fractions))


def test_dirichlet_small_alpha_is_much_more_skewed() -> None:
    labels = np.zeros(4000, dtype=np.int64)
    labels[:2000] = 1
    seeds = range(10)
    skewed, even = _mix_std(labels, 0.1, seeds), _mix_std(labels, 100.0, seeds)
    assert skewed > 0.25, skewed  # parties are nearly single-class
    assert even < 0.05, even  # close to the global 50/50 mix
    assert skewed > 5 * even
    assert _positive_share_std(labels, 0.1, seeds) > 5 * _positive_share_std(labels, 100.0, seeds)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan")])
def test_dirichlet_bad_alpha(alpha: float) -> None:
    with pytest.raises(ConfigError, match="--dirichlet-alpha"):
        dirichlet_partition(_labels(100, 0.5), 4, alpha, seed=0)


# --------------------------------------------------------------------------------------------
# make_partition
# --------------------------------------------------------------------------------------------


def test_make_partition_dispatch() -> None:
    labels = _labels(300, 0.3)
    assert _same(make_partition(labels, 5, "stratified", 7), stratified_partition(labels, 5, 7))
    assert _same(
        make_partition(labels, 5, "dirichlet", 7, dirichlet_alpha=0.3),
        dirichlet_partition(labels, 5, 0.3, 7),
    )
    assert set(PARTITIONS) == {"stratified", "dirichlet"}


def test_make_partition_unknown_scheme() -> None:
    with pytest.raises(ConfigError) as info:
        make_partition(_labels(100, 0.5), 4, "round-robin", seed=0)
    message = str(info.value)
    assert "round-robin" in message and "--partition" in message
    assert "stratified" in message and "dirichlet" in message


@pytest.mark.parametrize("n_parties", [0, -3])
def test_make_partition_needs_a_party(n_parties: int) -> None:
    with pytest.raises(ConfigError, match="--nodes"):
        make_partition(_labels(100, 0.5), n_parties, "stratified", seed=0)


# --------------------------------------------------------------------------------------------
# check_party_counts
# --------------------------------------------------------------------------------------------


def test_check_party_counts_accepts_enough() -> None:
    labels = np.array([1, 1, 0, 1, 1, 0], dtype=np.int64)
    parts = [np.array([0, 1, 2]), np.array([3, 4, 5])]
    check_party_counts(labels, parts, positives=2, batch_size=5)  # no error


def test_check_party_counts_lists_positives_per_party() -> None:
    labels = np.array([1, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0], dtype=np.int64)
    parts = [np.array([0, 1, 2, 3]), np.array([4, 5, 6]), np.array([7, 8, 9, 10, 11])]
    assert [int(labels[p].sum()) for p in parts] == [3, 1, 3]
    with pytest.raises(DataError) as info:
        check_party_counts(labels, parts, positives=2, batch_size=10)
    message = str(info.value)
    # Grouped by count, the smallest first: party 1 holds 1, parties 0 and 2 hold 3.
    assert "Positives per party: party 1: 1; parties 0, 2: 3." in message
    assert "b = 2" in message and "--positives" in message
    assert "1 of 3 parties hold fewer (party 1)" in message  # only party 1 is short


def test_check_party_counts_empty_party() -> None:
    labels = np.array([1, 0, 1, 0], dtype=np.int64)
    parts = [np.array([0, 1, 2, 3]), np.array([], dtype=np.int64)]
    with pytest.raises(DataError, match=r"party 1: 0; party 0: 2\."):
        check_party_counts(labels, parts, positives=1, batch_size=2)


def test_check_party_counts_no_negatives() -> None:
    labels = np.array([1, 1, 0, 1, 1, 1], dtype=np.int64)
    parts = [np.array([0, 1, 2]), np.array([3, 4, 5])]  # party 1 holds positives only
    with pytest.raises(DataError) as info:
        check_party_counts(labels, parts, positives=2, batch_size=4)
    message = str(info.value)
    assert "No negative example at party 1," in message, message
    assert "Negatives per party: party 1: 0; party 0: 1." in message
    # With m == b no negative is ever drawn, so the same parties are fine.
    check_party_counts(labels, parts, positives=2, batch_size=2)


def test_check_party_counts_lets_a_party_without_positives_join() -> None:
    labels = np.array([1, 1, 0, 0, 0, 0], dtype=np.int64)
    parts = [np.array([0, 1, 2]), np.array([3, 4, 5])]  # party 1: negatives only
    notes = check_party_counts(labels, parts, positives=2, batch_size=4)
    assert len(notes) == 1 and notes[0].startswith("note: party 1 holds no positive"), notes


def test_check_party_counts_refuses_a_run_without_any_positive() -> None:
    labels = np.zeros(6, dtype=np.int64)
    parts = [np.array([0, 1, 2]), np.array([3, 4, 5])]
    with pytest.raises(DataError, match=r"No party holds a positive training row"):
        check_party_counts(labels, parts, positives=1, batch_size=2)
