"""Federated AP and AUROC from summed histograms on the public grid against scikit-learn, on
random cases (ties, scores beyond the grid) and on w7a."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

from slate.metrics.histograms import (
    DEFAULT_BINS,
    LOGIT_RANGE,
    BinnedMetrics,
    bin_index,
    binned_counts,
    grid_edges,
    lower_edges,
    metrics_from_counts,
)
from slate.training.evaluation import FederatedEvaluation
from tests.sites import HAVE_W7A, SHARED


@st.composite
def scored_parties(draw):
    """Scores and labels of 1-5 parties (both classes present overall), and a bin count; some
    scores far beyond the grid's range (``+-LOGIT_RANGE``), some exactly tied."""
    bins = draw(st.sampled_from([4, 16, 256, DEFAULT_BINS]))
    parties = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    # Rounded scores make exact ties, as binary features do.
    decimals = draw(st.sampled_from([0, 1, 3, 8]))
    blocks = []
    for _ in range(parties):
        n = int(rng.integers(0, 40))
        y = (rng.random(n) < draw(st.floats(0.05, 0.6))).astype(np.int64)
        s = np.round(rng.normal(y * 1.5, 2.0 + 10 * (decimals == 0)), decimals)
        far = rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.5]))  # beyond the grid
        s[far] = np.sign(s[far] + 0.1) * rng.uniform(LOGIT_RANGE, 10 * LOGIT_RANGE, far.sum())
        blocks.append((s, y))
    y_all = np.concatenate([y for _, y in blocks])
    if y_all.sum() == 0 or y_all.sum() == len(y_all):
        blocks.append((np.array([1.0, -1.0]), np.array([1, 0])))
    return bins, blocks


def _sum_counts(blocks, bins):
    return sum(binned_counts(torch.tensor(s), torch.tensor(y), bins) for s, y in blocks)


def _pooled(case):
    """The pooled raw scores, labels and bin indices of all parties, and the summed counts."""
    bins, blocks = case
    scores = np.concatenate([s for s, _ in blocks])
    labels = np.concatenate([y for _, y in blocks])
    index = bin_index(torch.tensor(scores), bins).numpy()
    return scores, labels, index, _sum_counts(blocks, bins)


@settings(deadline=None)  # Hypothesis's default 100 examples
@given(scored_parties())
def test_summed_histograms_give_sklearn_on_the_binned_pooled_scores(case):
    scores, labels, index, counts = _pooled(case)
    found = metrics_from_counts(counts)
    assert found["test_ap"] == pytest.approx(average_precision_score(labels, index), abs=1e-12)
    assert found["test_auroc"] == pytest.approx(roc_auc_score(labels, index), abs=1e-12)
    # The raw (unbinned) pooled metrics lie within the stated bounds.
    raw_ap = average_precision_score(labels, scores)
    assert abs(raw_ap - found["test_ap"]) <= found["test_ap_error_bound"] + 1e-12
    raw_auc = roc_auc_score(labels, scores)
    assert abs(raw_auc - found["test_auroc"]) <= found["test_auroc_error_bound"] + 1e-12


@settings(max_examples=50, deadline=None)
@given(scored_parties())
@pytest.mark.kernels
def test_binned_pr_curve_is_sklearns_on_the_bin_indices(case):
    _, labels, index, counts = _pooled(case)
    precision, recall, thresholds = BinnedMetrics(counts).precision_recall_curve()
    expected = precision_recall_curve(labels, index)
    np.testing.assert_allclose(precision, expected[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(recall, expected[1], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(thresholds, expected[2])


def _one_exchange(case, riders=None):
    """Each party's exchange as :class:`FederatedEvaluation` makes it, every call to ``totals``
    recorded (the counts are sent as integers); the recorded payloads summed over the parties
    are what the sum gives each."""
    bins, blocks = case
    evaluation = FederatedEvaluation([], bins=bins)
    payloads: list[tuple[torch.Tensor, str]] = []

    def total(parts, what=""):
        assert parts[0].dtype == torch.int64 and parts[1].dtype == torch.float64
        payloads.append((torch.cat([p.reshape(-1).to(torch.float64) for p in parts]), what))
        return parts

    for s, y in blocks:
        evaluation.exchange(torch.tensor(s), torch.tensor(y), total, riders)
    assert len(payloads) == len(blocks)  # one sum per party, nothing else
    assert {what for _, what in payloads} == {"evaluation"}
    summed = sum(v for v, _ in payloads)
    counts = summed[: 2 * bins].view(2, bins)
    return evaluation, counts, summed[2 * bins :], [v for v, _ in payloads]


@settings(max_examples=100, deadline=None)
@given(scored_parties())
def test_one_sum_of_counts_on_the_public_grid_gives_the_pooled_metrics(case):
    """A party sends its ``(2, bins)`` counts on the public grid and the riders, in one sum;
    the metrics of the summed counts are those of all rows in one table, and scikit-learn's on
    the bin indices; the raw scores' AP and AUROC lie within the bounds."""
    scores, labels, index, dense = _pooled(case)
    riders = torch.tensor([1.5, -2.0], dtype=torch.float64)
    evaluation, counts, summed_riders, payloads = _one_exchange(case, riders)
    for (s, y), payload in zip(case[1], payloads, strict=True):
        own = binned_counts(torch.tensor(s), torch.tensor(y), case[0]).reshape(-1)
        torch.testing.assert_close(payload, torch.cat([own, riders]), rtol=0, atol=0)
    torch.testing.assert_close(counts, dense, rtol=0, atol=0)
    torch.testing.assert_close(summed_riders, riders * len(payloads), rtol=0, atol=0)
    found = evaluation.metrics(counts, True).values
    assert found["test_ap"] == pytest.approx(average_precision_score(labels, index), abs=1e-12)
    assert found["test_auroc"] == pytest.approx(roc_auc_score(labels, index), abs=1e-12)
    raw_ap = average_precision_score(labels, scores)
    assert abs(raw_ap - found["test_ap"]) <= found["test_ap_error_bound"] + 1e-12


def test_the_grid_is_fixed_symmetric_and_uniform_in_asinh():
    """The public edges from their formula: ``e_k = c sinh((2k/B - 1) asinh(L / c))`` with
    c = 0.5, L = 100; 0 in the middle, +-inf at the ends; about 1.5e-3 wide at logit 0 and 0.29
    at the range's end."""
    edges = grid_edges()
    assert len(edges) == DEFAULT_BINS + 1 == 4097
    assert edges[0] == -np.inf and edges[-1] == np.inf and edges[DEFAULT_BINS // 2] == 0.0
    inner = edges[1:-1]
    assert (np.diff(inner) > 0).all()
    np.testing.assert_array_equal(inner, -inner[::-1])
    k = np.array([1, 1000, 3000, 4095])
    expected = 0.5 * np.sinh((2 * k / 4096 - 1) * np.arcsinh(200.0))
    np.testing.assert_allclose(edges[k], expected, rtol=1e-15)
    assert inner[2048] - inner[2047] == pytest.approx(np.arcsinh(200.0) / 4096, rel=1e-5)
    assert 0.28 < inner[-1] - inner[-2] < 0.30
    assert inner[-1] < LOGIT_RANGE < inner[-1] + 0.3


@pytest.mark.parametrize("bins", [8, 64, DEFAULT_BINS])
def test_a_logit_is_in_bin_k_or_above_exactly_when_it_reaches_bin_ks_lower_edge(bins):
    """On the edges themselves, one float64 step below them, and random logits."""
    edges = grid_edges(bins)[1:-1]
    rng = np.random.default_rng(bins)
    logits = np.concatenate([edges, np.nextafter(edges, -np.inf), rng.normal(0, 30, 2000),
                             [-np.inf, np.inf, -1e300, 1e300]])  # fmt: skip
    index = bin_index(torch.from_numpy(logits), bins).numpy()
    for k in range(bins):
        np.testing.assert_array_equal(logits >= lower_edges(np.array([k]), bins)[0], index >= k)
    assert index.min() == 0 and index.max() == bins - 1


@pytest.mark.skipif(not HAVE_W7A, reason="needs the w7a files in shared/data")
def test_w7a_binned_ap_is_close_to_scikit_learns_raw_ap():
    """A logistic regression fit on w7a (binary features: many exactly tied logits, and
    logits past -30): the grid's AP is within 2e-4 of scikit-learn's AP of the raw logits,
    which lies inside the bound; split over 4 parties the sum gives the same numbers."""
    from sklearn.datasets import load_svmlight_file
    from sklearn.linear_model import LogisticRegression

    train_x, train_y = load_svmlight_file(str(SHARED / "w7a" / "w7a.gz"), n_features=300)
    test_x, test_y = load_svmlight_file(str(SHARED / "w7a" / "w7a.t.gz"), n_features=300)
    model = LogisticRegression(max_iter=2000).fit(train_x, train_y > 0)
    logits = model.decision_function(test_x)
    labels = (test_y > 0).astype(np.int64)
    assert logits.min() < -30 and len(np.unique(logits)) < 0.9 * len(logits)
    raw = average_precision_score(labels, logits)
    blocks = [(logits[r::4], labels[r::4]) for r in range(4)]
    evaluation, counts, _, _ = _one_exchange((DEFAULT_BINS, blocks))
    found = evaluation.metrics(counts, True)
    ap, bound = found.values["test_ap"], found.values["test_ap_error_bound"]
    assert abs(ap - raw) <= 2e-4 and abs(ap - raw) <= bound
    assert found.values["test_auroc"] == pytest.approx(roc_auc_score(labels, logits), abs=1e-4)
    assert found.warning is None


def test_bound_is_zero_when_every_bin_holds_one_class():
    scores = torch.tensor([-3.0, -1.0, 0.5, 2.0])
    labels = torch.tensor([0, 0, 1, 1])
    found = metrics_from_counts(binned_counts(scores, labels, 64))
    assert found["test_ap"] == 1.0 and found["test_ap_error_bound"] == 0.0
    assert found["test_auroc_error_bound"] == 0.0


def test_one_bin_bound_covers_the_best_and_the_worst_order():
    # All in one bin: 1 positive, 3 negatives. Best raw order gives AP 1, worst 1/4.
    counts = binned_counts(torch.zeros(4), torch.tensor([1, 0, 0, 0]), 8)
    ap, bound = BinnedMetrics(counts).average_precision()
    assert ap == pytest.approx(0.25)
    assert bound == pytest.approx(0.75)  # up to 1.0
    auc, auc_bound = BinnedMetrics(counts).auroc()
    assert auc == pytest.approx(0.5) and auc_bound == pytest.approx(0.5)


def test_logits_beyond_the_range_fall_into_the_end_bins():
    index = bin_index(torch.tensor([-1e9, -100.0, -99.0, 0.0, 99.0, 100.0, 1e9]), 8)
    assert index.tolist() == [0, 0, 0, 4, 7, 7, 7]
    edges = grid_edges()  # the end bins of the default grid begin just inside +-100
    index = bin_index(torch.tensor([-1e9, edges[1] - 1e-9, edges[1], 0.0, edges[-2], 1e9]))
    assert index.tolist() == [0, 0, 1, 2048, 4095, 4095]


def test_no_positive_is_an_error():
    with pytest.raises(ValueError, match="positive"):
        BinnedMetrics(binned_counts(torch.zeros(3), torch.zeros(3), 8)).average_precision()


def _federated_scores(logits: np.ndarray, labels: np.ndarray):
    evaluation = FederatedEvaluation([np.arange(len(labels))])
    return evaluation.score(
        torch.from_numpy(logits), torch.from_numpy(labels), lambda t, what="": t, is_main=True
    )


def test_scores_all_beyond_the_range_share_one_bin_and_the_run_is_warned():
    """Every logit above +100: one bin, so the binned AP is the positive rate although the
    raw scores rank perfectly (scikit-learn AP 1.0); the scores carry a warning."""
    labels = (np.arange(200) % 10 == 0).astype(np.int64)
    logits = 125.0 + labels * 5.0 + np.linspace(0, 1, 200)
    assert average_precision_score(labels, logits) == 1.0
    scores = _federated_scores(logits, labels)
    assert scores.values["test_ap"] == pytest.approx(labels.mean())
    assert scores.values["test_ap_error_bound"] > 0.5
    assert scores.warning is not None and "\n" not in scores.warning
    assert "100.0% of the test scores" in scores.warning
    assert "(0 below, 200 above)" in scores.warning
    assert "--lr" in scores.warning and "--standardize" in scores.warning


@pytest.mark.parametrize(("beyond", "warned"), [(0, False), (2, False), (3, True), (40, True)])
def test_the_warning_starts_above_one_percent_in_the_end_bins(beyond, warned):
    """200 rows, ``beyond`` of them below -100 (counted by hand): 2 (1%) is no warning, 3 is;
    the rest spread over +-99 (well inside the grid's range) are never counted there."""
    rng = np.random.default_rng(3)
    labels = (np.arange(200) % 4 == 0).astype(np.int64)
    logits = rng.uniform(-99, 99, 200)
    logits[:beyond] = -100.5 - rng.uniform(0, 1000, beyond)
    scores = _federated_scores(logits, labels)
    assert (scores.warning is not None) == warned
    if warned:
        assert f"{beyond / 200:.1%} of the test scores" in scores.warning
        assert f"({beyond} below, 0 above)" in scores.warning


def test_pooled_scores_are_exact_and_never_warned():
    from slate.training.evaluation import PooledEvaluation

    labels = (np.arange(200) % 10 == 0).astype(np.int64)
    logits = 25.0 + labels * 5.0
    scores = PooledEvaluation().score(
        torch.from_numpy(logits), torch.from_numpy(labels), lambda t, what="": t, is_main=True
    )
    assert scores.values["test_ap"] == 1.0 and scores.warning is None
