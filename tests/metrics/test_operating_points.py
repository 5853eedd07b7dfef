"""Operating points against brute force over every threshold, the federated bin edges, and the
marks on the PR plot."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slate import metrics
from slate.metrics.histograms import bin_index, lower_edges
from slate.metrics.operating_points import (
    at_precision,
    at_recall,
    at_threshold,
    marks,
    operating_points,
    probability,
)
from slate.metrics.plots import pr_curves_figure
from slate.training.evaluation import FederatedEvaluation, PooledEvaluation


def _case(seed: int, n: int = 400):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.15).astype(np.int64)
    y[0] = 1
    s = np.round(rng.normal(size=n) + 1.5 * y, 1).astype(np.float32)  # many ties
    return torch.from_numpy(s), torch.from_numpy(y)


def _brute(s: np.ndarray, y: np.ndarray):
    """(precision, recall, threshold) of "s >= t" for every distinct score t."""
    rows = []
    for t in np.unique(s):
        flagged = s >= t
        tp = (flagged & (y == 1)).sum()
        rows.append((tp / flagged.sum(), tp / y.sum(), float(t)))
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_points_are_the_best_thresholds_by_brute_force(seed):
    s, y = _case(seed)
    precision, recall, thresholds = metrics.precision_recall_curve(s, y)
    edges = np.append(thresholds.astype(np.float64), np.inf)
    brute = _brute(s.numpy(), y.numpy())
    for target in (0.3, 0.5, 0.8, 0.9, 0.95, 1.0):
        point = at_recall(precision, recall, edges, target)
        best = max((p, r, t) for p, r, t in brute if r >= target)
        assert (point.precision, point.recall, point.logit) == pytest.approx(best)
        point = at_precision(precision, recall, edges, target)
        meeting = [(r, p, t) for p, r, t in brute if p >= target]
        if not meeting:
            assert not point.reachable and point.to_dict()["threshold"] is None
            continue
        best = max(meeting)
        assert (point.recall, point.precision, point.logit) == pytest.approx(best)
        flagged = s.numpy() >= point.logit  # the logit threshold reproduces the point exactly
        assert y.numpy()[flagged].mean() == pytest.approx(point.precision, abs=0)


def test_the_point_that_flags_nothing_is_never_chosen():
    precision = np.array([0.5, 0.6, 1.0])
    recall = np.array([1.0, 0.5, 0.0])
    logits = np.array([-1.0, 0.5, np.inf])
    assert not at_precision(precision, recall, logits, 0.9).reachable
    assert at_recall(precision, recall, logits, 0.4).logit == 0.5


def test_table_rows_and_probability_thresholds():
    s, y = _case(7)
    scores = PooledEvaluation().score(s, y, lambda t, what="": t, True)
    precision, recall = scores.pr_curve()
    assert scores.thresholds[-1] == np.inf and len(scores.thresholds) == len(precision)
    table = operating_points(precision, recall, scores.thresholds)
    assert [p.describe() for p in table] == [
        "recall >= 0.50", "recall >= 0.80", "recall >= 0.90", "recall >= 0.95",
        "precision >= 0.50", "precision >= 0.80", "precision >= 0.90",
    ]  # fmt: skip
    for point in table:
        if point.reachable:
            assert point.threshold == float(torch.sigmoid(torch.tensor(point.logit)))
    assert probability(0.0) == 0.5


def test_federated_thresholds_are_the_bins_lower_edges():
    """'logit >= edge of bin k' flags exactly the rows of bins k and above, and the federated
    curve's points are those of the decisions at its thresholds."""
    rng = np.random.default_rng(3)
    logits = torch.from_numpy(rng.normal(scale=8, size=3000).astype(np.float32))
    labels = torch.from_numpy((rng.random(3000) < 0.3).astype(np.int64))
    bins = 64
    index = bin_index(logits, bins)
    for k in range(bins):
        edge = lower_edges(np.array([k]), bins)[0]
        assert torch.equal(logits.double() >= edge, index >= k)
    scores = FederatedEvaluation([np.arange(3000)], bins=bins).score(
        logits, labels, lambda t, what="": t, True
    )
    precision, recall = scores.pr_curve()
    for p, r, t in zip(precision[:-1], recall[:-1], scores.thresholds[:-1], strict=True):
        flagged = logits.double() >= t
        tp = int((flagged & (labels == 1)).sum())
        assert p == pytest.approx(tp / int(flagged.sum()))
        assert r == pytest.approx(tp / int(labels.sum()))
    assert scores.thresholds[0] == -np.inf or scores.thresholds[0] > -100


def test_pr_plot_marks_the_reachable_points():
    s, y = _case(1)
    scores = PooledEvaluation().score(s, y, lambda t, what="": t, True)
    precision, recall = scores.pr_curve()
    table = operating_points(precision, recall, scores.thresholds, precisions=(0.5, 1.01))
    points = marks(table)
    assert len(points) == len(table) - 1  # precision >= 1.01 is never reached
    figure = pr_curves_figure({"m": (precision, recall, 0.5)}, "t", points=points)
    (ax,) = figure.axes
    marker = next(line for line in ax.get_lines() if line.get_label() == "operating points")
    np.testing.assert_array_equal(marker.get_xdata(), [p[0] for p in points])
    np.testing.assert_array_equal(marker.get_ydata(), [p[1] for p in points])
    assert [t.get_text() for t in ax.texts] == [p[2] for p in points]
    assert points[0][2] == "R≥0.50"


def _wilson_by_search(successes: int, trials: int, z: float = 1.959963984540054):
    """The Wilson interval from its definition: every p0 with |p_hat - p0| <= z sd(p0)."""
    grid = np.linspace(0.0, 1.0, 2_000_001)
    inside = np.abs(successes / trials - grid) <= z * np.sqrt(grid * (1 - grid) / trials)
    return grid[inside].min(), grid[inside].max()


@pytest.mark.parametrize(("successes", "trials"), [(8, 10), (1, 1), (0, 5), (37, 120), (3, 3)])
def test_wilson_interval_matches_its_definition(successes, trials):
    from slate.metrics.operating_points import wilson_interval

    low, high = wilson_interval(successes, trials)
    ref_low, ref_high = _wilson_by_search(successes, trials)
    assert low == pytest.approx(ref_low, abs=2e-6) and high == pytest.approx(ref_high, abs=2e-6)


def test_points_carry_counts_and_a_warning_comes_below_thirty_positives():
    from slate.metrics.operating_points import few_positives_warning

    rng = np.random.default_rng(3)
    y = np.r_[np.ones(9), np.zeros(200)]
    logits = rng.normal(size=len(y)) + 2 * y
    precision, recall, thresholds = metrics.precision_recall_curve(
        torch.tensor(logits), torch.tensor(y)
    )
    table = operating_points(precision, recall, np.r_[thresholds, np.inf], positives=9)
    for point in (p for p in table if p.reachable):
        flagged = int((logits >= point.logit).sum())
        true_positives = int(((logits >= point.logit) & (y == 1)).sum())
        assert (point.flagged, point.true_positives, point.positives) == (
            flagged, true_positives, 9)  # fmt: skip
        low, high = point.recall_interval
        assert low <= point.recall <= high
        assert point.to_dict()["precision_interval"] == list(point.precision_interval)
    assert "only 9 positives" in few_positives_warning(9)
    assert few_positives_warning(30) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_threshold_from_other_rows_is_read_off_the_curve_by_counting(seed):
    """at_threshold: the precision and recall of "logit >= t" for any t (chosen on other rows),
    counted; above every score nothing is flagged."""
    s, y = _case(seed)
    precision, recall, thresholds = metrics.precision_recall_curve(s, y)
    edges = np.append(thresholds.astype(np.float64), np.inf)
    rng = np.random.default_rng(seed)
    for t in [*rng.normal(size=40), float(s.min()), float(s.max()), -50.0]:
        point = at_threshold(precision, recall, edges, t, "precision_at_recall", 0.9)
        flagged = s.double().numpy() >= t
        tp = int((flagged & (y.numpy() == 1)).sum())
        assert point.recall == pytest.approx(tp / int(y.sum()), abs=1e-12)
        assert point.precision == pytest.approx(tp / int(flagged.sum()), abs=1e-12)
    above = at_threshold(precision, recall, edges, float(s.max()) + 1, "precision_at_recall", 0.9)
    assert above.precision is None and above.recall == 0.0 and not above.reachable


def test_a_threshold_on_a_histogram_curve_reads_the_edge_at_or_above_it():
    rng = np.random.default_rng(5)
    logits = torch.from_numpy(rng.normal(scale=4, size=2000).astype(np.float32))
    labels = torch.from_numpy((rng.random(2000) < 0.2).astype(np.int64))
    scores = FederatedEvaluation([np.arange(2000)], bins=64).score(
        logits, labels, lambda t, what="": t, True
    )
    precision, recall = scores.pr_curve()
    edges = scores.thresholds
    for t in (-3.3, -0.01, 0.0, 1.7, 6.2):
        point = at_threshold(precision, recall, edges, t, "recall_at_precision", 0.5)
        real = edges[edges < np.inf]
        edge = real[real >= t].min()
        assert point.logit == edge
        flagged = logits.double() >= edge
        tp = int((flagged & (labels == 1)).sum())
        assert point.recall == pytest.approx(tp / int(labels.sum()))
