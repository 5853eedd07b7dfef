"""Which rows the deployed threshold's curve scores (slate.training.threshold_curve), and how
slate predict picks a curve from the record (slate.inference.predict)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from slate.errors import DataError
from slate.inference.predict import _chosen
from slate.training.evaluation import FederatedEvaluation, PooledEvaluation
from slate.training.threshold_curve import curves_of


def rows(n: int = 300, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=generator) < 0.2).long()
    logits = labels * 1.5 + torch.randn(n, generator=generator)
    return logits, labels


def pooled_scores(logits, labels):
    """The summed histograms' scores of these rows (one site's counts as the sum)."""
    evaluation = FederatedEvaluation([np.arange(len(labels))])
    state, _ = evaluation.exchange(logits, labels, lambda tensors, _: tensors, None)
    return evaluation.metrics(state, True)


def test_with_per_site_files_the_default_is_the_sites_own_exact_curve():
    logits, labels = rows()
    pooled = pooled_scores(logits, labels)
    curves = curves_of(True, logits, labels, pooled, pooled_positives=999)
    assert curves.source == "own" and curves.pooled is pooled
    assert curves.default.values["test_ap"] == pytest.approx(
        average_precision_score(labels, logits), abs=1e-12
    )
    record = curves.describe()
    assert record["file"] == "pr_curve.csv" and record["pooled_file"] == "pr_curve_pooled.csv"
    assert (record["positives"], record["pooled_positives"]) == (int(labels.sum()), 999)


def test_one_test_set_for_every_site_is_one_curve_and_says_so():
    logits, labels = rows()
    scores = PooledEvaluation().metrics((logits, labels), True)
    curves = curves_of(False, logits, labels, scores, int(labels.sum()))
    assert curves.source == "pooled" and curves.pooled is None and curves.default is scores
    assert "its own rows are the pooled rows" in curves.describe()["note"]


def test_a_site_without_positive_rows_falls_back_to_the_pooled_curve_and_says_why():
    logits, labels = rows()
    pooled = pooled_scores(logits, labels)
    curves = curves_of(True, logits, torch.zeros_like(labels), pooled, 40)
    assert curves.source == "pooled" and "do not hold both classes" in curves.note


def test_predict_chooses_the_recorded_curve_and_refuses_one_that_is_not_there():
    own = {"source": "own", "file": "pr_curve.csv", "pooled_file": "pr_curve_pooled.csv"}
    assert _chosen(own, None, "test") == ("pr_curve.csv", "own")
    assert _chosen(own, "pooled", "test") == ("pr_curve_pooled.csv", "pooled")
    assert _chosen({}, None, "test") == ("pr_curve.csv", "run")  # a run before the record
    refused = {"source": "own", "file": "pr_curve.csv", "pooled_file": None}
    with pytest.raises(DataError, match="no pooled test curve"):
        _chosen(refused, "pooled", "test")
    fallback = {"source": "pooled", "file": "pr_curve.csv", "pooled_file": "pr_curve.csv",
                "note": "no positives"}  # fmt: skip
    with pytest.raises(DataError, match="no own test curve: no positives"):
        _chosen(fallback, "own", "test")
