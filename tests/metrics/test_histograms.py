"""Federated AP and AUROC from summed histograms against scikit-learn, on random cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

from slate.metrics.histograms import (
    BinnedMetrics,
    SegmentTable,
    bin_index,
    binned_counts,
    metrics_from_counts,
    positive_bins_bitmap,
)


@st.composite
def scored_parties(draw):
    """Scores and labels of 1-5 parties (both classes present overall), and a bin count."""
    bins = draw(st.sampled_from([4, 16, 256, 1 << 17]))
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


@settings(max_examples=150, deadline=None)
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
def test_binned_pr_curve_is_sklearns_on_the_bin_indices(case):
    _, labels, index, counts = _pooled(case)
    precision, recall, thresholds = BinnedMetrics(counts).precision_recall_curve()
    expected = precision_recall_curve(labels, index)
    np.testing.assert_allclose(precision, expected[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(recall, expected[1], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(thresholds, expected[2])


def _exchanged(case):
    """What the parties' exchange gives: the OR of their bitmaps, then their summed counts."""
    bins, blocks = case
    words = [positive_bins_bitmap(torch.tensor(s), torch.tensor(y), bins) for s, y in blocks]
    union = words[0]
    for w in words[1:]:
        union = union | w
    table = SegmentTable(union, bins)
    counts = sum(table.counts(torch.tensor(s), torch.tensor(y)) for s, y in blocks)
    return table, counts


@settings(max_examples=150, deadline=None)
@given(scored_parties())
def test_the_segment_exchange_gives_the_dense_tables_metrics_exactly(case):
    _, labels, index, dense = _pooled(case)
    table, counts = _exchanged(case)
    found = metrics_from_counts(counts, table.row_bins)
    expected = metrics_from_counts(dense)
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, abs=1e-12), key
    assert found["test_ap"] == pytest.approx(average_precision_score(labels, index), abs=1e-12)
    # The end bins are rows of their own, with the dense table's counts.
    np.testing.assert_array_equal(counts[:, 0].numpy(), dense[:, 0].numpy())
    np.testing.assert_array_equal(counts[:, -1].numpy(), dense[:, -1].numpy())
    assert int(counts.sum()) == len(labels)


@settings(max_examples=80, deadline=None)
@given(scored_parties())
def test_each_segment_curve_point_flags_the_rows_of_a_dense_curve_point(case):
    """Every point of the exchanged curve is a point of scikit-learn's curve on the bin
    indices: the rows at or above its threshold are those of one of sklearn's thresholds, with
    its precision and recall. Only points of negatives between two positive bins are left
    out, so every recall level is still there."""
    _, labels, index, _ = _pooled(case)
    table, counts = _exchanged(case)
    precision, recall, thresholds = BinnedMetrics(counts, table.row_bins).precision_recall_curve()
    ref_p, ref_r, ref_t = precision_recall_curve(labels, index)
    for p, r, t in zip(precision[:-1], recall[:-1], thresholds, strict=True):
        flagged = index >= t
        # sklearn's point whose threshold flags the same rows: the lowest bin at or above t.
        k = int(np.searchsorted(ref_t, index[flagged].min()))
        assert ref_t[k] >= t and not ((index >= t) & (index < ref_t[k])).any()
        assert p == pytest.approx(ref_p[k], abs=1e-12) and r == pytest.approx(ref_r[k], abs=1e-12)
    assert set(np.round(recall, 12)) == set(np.round(ref_r, 12))


def test_the_exchange_is_a_16_kib_bitmap_and_a_few_counts():
    rng = np.random.default_rng(0)
    labels = torch.from_numpy((rng.random(5000) < 0.03).astype(np.int64))
    logits = torch.from_numpy(rng.normal(0, 3, 5000))
    words = positive_bins_bitmap(logits, labels)
    assert words.dtype == torch.int64 and words.numel() * 8 == 16 * 1024
    table = SegmentTable(words)
    counts = table.counts(logits, labels)
    assert counts.shape[1] <= 2 * (int(labels.sum()) + 2) - 1
    assert int(counts[1].sum()) == int(labels.sum()) and int(counts.sum()) == 5000


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
    index = bin_index(torch.tensor([-1e9, -20.0, 0.0, 19.9999, 1e9]), 8)
    assert index.tolist() == [0, 0, 4, 7, 7]


def test_no_positive_is_an_error():
    with pytest.raises(ValueError, match="positive"):
        BinnedMetrics(binned_counts(torch.zeros(3), torch.zeros(3), 8)).average_precision()


def _federated_scores(logits: np.ndarray, labels: np.ndarray):
    from slate.training.evaluation import FederatedEvaluation

    evaluation = FederatedEvaluation([np.arange(len(labels))])
    return evaluation.score(
        torch.from_numpy(logits), torch.from_numpy(labels), lambda t, what="": t, is_main=True
    )


def test_scores_all_beyond_the_range_share_one_bin_and_the_run_is_warned():
    """Every logit above +20: one bin, so the binned AP is the positive rate although the
    raw scores rank perfectly (scikit-learn AP 1.0); the scores carry a warning."""
    labels = (np.arange(200) % 10 == 0).astype(np.int64)
    logits = 25.0 + labels * 5.0 + np.linspace(0, 1, 200)
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
    """200 rows, ``beyond`` of them below -20 (counted by hand): 2 (1%) is no warning, 3 is."""
    rng = np.random.default_rng(3)
    labels = (np.arange(200) % 4 == 0).astype(np.int64)
    logits = rng.uniform(-5, 5, 200)
    logits[:beyond] = -20.5 - rng.uniform(0, 100, beyond)
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
