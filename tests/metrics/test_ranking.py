"""Tests of slate.metrics against scikit-learn and an independent brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.metrics import precision_recall_curve as sk_pr_curve

from slate.metrics import auroc, average_precision, consensus_distance, precision_recall_curve

SEEDS = range(12)
KINDS = ["continuous", "round1", "int0to3", "all_equal", "single_pos", "imbalanced"]
DTYPES = [torch.float32, torch.float64]


def _make_case(kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random ``(scores, labels)`` of one kind, with at least one positive and one negative."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400))
    if kind == "single_pos":
        y = np.zeros(n, dtype=np.int64)
    elif kind == "imbalanced":
        n = max(n, 200)
        y = (rng.random(n) < 0.03).astype(np.int64)
    else:
        y = rng.integers(0, 2, n)
    pos = int(rng.integers(0, n))
    y[pos] = 1
    y[(pos + 1) % n] = 0
    signal = rng.normal(size=n) + y
    if kind in ("continuous", "single_pos", "imbalanced"):
        s = signal
    elif kind == "round1":
        s = np.round(1.0 / (1.0 + np.exp(-signal)), 1)
    elif kind == "int0to3":
        s = np.clip(rng.integers(0, 4, n) + y * rng.integers(0, 2, n), 0, 3).astype(np.float64)
    elif kind == "all_equal":
        s = np.full(n, 0.37)
    else:  # pragma: no cover
        raise AssertionError(kind)
    return s, y


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.kernels
def test_ap_auroc_curve_match_sklearn(kind: str, seed: int, dtype: torch.dtype) -> None:
    s, y = _make_case(kind, seed)
    ts, ty = torch.tensor(s, dtype=dtype), torch.tensor(y)
    y_np, s_np = y, ts.numpy()  # sklearn sees the scores after the cast to ``dtype``

    assert average_precision(ts, ty) == pytest.approx(
        average_precision_score(y_np, s_np), abs=1e-12, rel=0
    )
    assert auroc(ts, ty) == pytest.approx(roc_auc_score(y_np, s_np), abs=1e-12, rel=0)

    p, r, t = precision_recall_curve(ts, ty)
    sp, sr, st_ = sk_pr_curve(y_np, s_np)
    np.testing.assert_array_equal(p, sp)
    np.testing.assert_array_equal(r, sr)
    np.testing.assert_array_equal(t, st_)
    assert t.dtype == st_.dtype
    assert p[-1] == 1.0 and r[-1] == 0.0
    assert len(p) == len(r) == len(t) + 1


@pytest.mark.parametrize("seed", SEEDS)
def test_label_dtypes_equivalent(seed: int) -> None:
    s, y = _make_case("round1", seed)
    ts = torch.tensor(s)
    expected = average_precision(ts, torch.tensor(y))
    for ty in (torch.tensor(y, dtype=torch.bool), torch.tensor(y, dtype=torch.float32)):
        assert average_precision(ts, ty) == expected
        assert auroc(ts, ty) == auroc(ts, torch.tensor(y))


def test_all_equal_scores_ap_is_prevalence() -> None:
    y = torch.tensor([1, 0, 0, 1, 0])
    s = torch.zeros(5)
    assert average_precision(s, y) == pytest.approx(0.4, abs=1e-15)
    assert auroc(s, y) == 0.5
    p, r, t = precision_recall_curve(s, y)
    np.testing.assert_array_equal(p, [0.4, 1.0])
    np.testing.assert_array_equal(r, [1.0, 0.0])
    np.testing.assert_array_equal(t, [0.0])


def test_perfect_and_reversed_ranking() -> None:
    y = torch.tensor([0, 0, 1, 1])
    s = torch.tensor([0.1, 0.2, 0.8, 0.9])
    assert average_precision(s, y) == 1.0
    assert auroc(s, y) == 1.0
    assert auroc(-s, y) == 0.0


def test_single_sample_positive() -> None:
    assert average_precision(torch.tensor([0.3]), torch.tensor([1])) == 1.0


# --------------------------------------------------------------------------- brute force


def _brute_force_ap(s: np.ndarray, y: np.ndarray) -> float:
    """AP by definition: mean over positives of the precision at that positive's score.

    For tie-free scores, precision at positive i is
    #{j : y_j = 1, s_j >= s_i} / #{j : s_j >= s_i}.
    """
    total = 0.0
    n_pos = 0
    for i in range(len(s)):
        if y[i] != 1:
            continue
        n_pos += 1
        above = 0
        above_pos = 0
        for j in range(len(s)):
            if s[j] >= s[i]:
                above += 1
                above_pos += int(y[j] == 1)
        total += above_pos / above
    return total / n_pos


@pytest.mark.parametrize("seed", SEEDS)
def test_brute_force_reference(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(5, 120))
    y = rng.integers(0, 2, n)
    y[0] = 1
    s = rng.permutation(n).astype(np.float64) + rng.normal(scale=0.1, size=n)
    assert len(np.unique(s)) == n  # tie-free
    ref = _brute_force_ap(s, y)
    assert average_precision_score(y, s) == pytest.approx(ref, abs=1e-12, rel=0)
    assert average_precision(torch.tensor(s), torch.tensor(y)) == pytest.approx(
        ref, abs=1e-12, rel=0
    )


# --------------------------------------------------------------------------- hypothesis


@st.composite
def _int_cases(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    n = draw(st.integers(min_value=1, max_value=40))
    scores = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    labels = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    pos = draw(st.integers(0, n - 1))
    labels[pos] = 1
    return scores, labels


@settings(max_examples=100, deadline=None)
@given(_int_cases())
def test_property_matches_sklearn(case: tuple[list[int], list[int]]) -> None:
    scores, labels = case
    s_np = np.asarray(scores, dtype=np.float64)
    y_np = np.asarray(labels)
    ts, ty = torch.tensor(s_np), torch.tensor(y_np)

    assert average_precision(ts, ty) == pytest.approx(
        average_precision_score(y_np, s_np), abs=1e-12, rel=0
    )
    p, r, t = precision_recall_curve(ts, ty)
    sp, sr, st_ = sk_pr_curve(y_np, s_np)
    np.testing.assert_array_equal(p, sp)
    np.testing.assert_array_equal(r, sr)
    np.testing.assert_array_equal(t, st_)
    if 0 in labels:
        assert auroc(ts, ty) == pytest.approx(roc_auc_score(y_np, s_np), abs=1e-12, rel=0)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("fn", [average_precision, auroc, precision_recall_curve])
def test_no_positives_raises(fn) -> None:
    with pytest.raises(ValueError, match="undefined without positives"):
        fn(torch.tensor([0.1, 0.5, 0.2]), torch.tensor([0, 0, 0]))


@pytest.mark.parametrize("fn", [average_precision, auroc, precision_recall_curve])
def test_empty_raises(fn) -> None:
    with pytest.raises(ValueError, match="undefined without positives"):
        fn(torch.tensor([]), torch.tensor([]))


def test_auroc_no_negatives_raises() -> None:
    with pytest.raises(ValueError, match="without negatives"):
        auroc(torch.tensor([0.1, 0.5]), torch.tensor([1, 1]))


@pytest.mark.parametrize("fn", [average_precision, auroc, precision_recall_curve])
def test_mismatched_lengths_raise(fn) -> None:
    with pytest.raises(ValueError, match="same length"):
        fn(torch.tensor([0.1, 0.5, 0.2]), torch.tensor([0, 1]))


@pytest.mark.parametrize("fn", [average_precision, auroc, precision_recall_curve])
@pytest.mark.parametrize("bad", [[0, 2, 1], [0, -1, 1], [0.0, 0.5, 1.0], [0.0, float("nan"), 1.0]])
def test_labels_not_binary_raise(fn, bad: list[float]) -> None:
    with pytest.raises(ValueError, match="only the values 0 and 1"):
        fn(torch.tensor([0.1, 0.5, 0.2]), torch.tensor(bad))


@pytest.mark.parametrize("fn", [average_precision, auroc, precision_recall_curve])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_scores_raise(fn, bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        fn(torch.tensor([0.1, bad, 0.2]), torch.tensor([0, 1, 0]))


@pytest.mark.parametrize("fn", [average_precision, auroc, precision_recall_curve])
def test_wrong_ndim_raises(fn) -> None:
    with pytest.raises(ValueError, match="1-D"):
        fn(torch.zeros(2, 2), torch.tensor([[0, 1], [1, 0]]))


def test_non_tensor_raises() -> None:
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        average_precision(np.array([0.1, 0.2]), torch.tensor([0, 1]))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- consensus


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_consensus_distance_matches_numpy(seed: int, dtype: torch.dtype) -> None:
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 12)), int(rng.integers(1, 50))
    x = torch.tensor(rng.normal(size=(n, d)), dtype=dtype)
    xn = x.numpy().astype(np.float64)
    expected = float(np.mean(np.sum((xn - xn.mean(axis=0)) ** 2, axis=1)))
    assert consensus_distance(x) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_consensus_distance_zero_when_equal_and_ignores_grad() -> None:
    x = torch.ones(4, 3, requires_grad=True)
    assert consensus_distance(x) == 0.0
    assert consensus_distance(torch.tensor([[0.0, 0.0], [2.0, 0.0]])) == 1.0


@pytest.mark.parametrize(
    ("bad", "exc"),
    [
        (torch.zeros(3), ValueError),
        (torch.zeros(0, 3), ValueError),
        (torch.tensor([[0.0, float("nan")]]), ValueError),
        (np.zeros((2, 2)), TypeError),
    ],
)
def test_consensus_distance_validation(bad: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        consensus_distance(bad)  # type: ignore[arg-type]
