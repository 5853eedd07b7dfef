"""The settings derived before a run is built: the party-AP default of compressed runs."""

from __future__ import annotations

import pytest

from slate.config import TrainConfig, resolve_config
from slate.training.checks import compressed, with_evaluation_defaults

# MNIST's shape: 300 iterations cannot afford N more evaluations of 10 000 test images.
EXPENSIVE = {"iterations": 300, "nodes": 20, "batch_size": 20, "positives": 2}
N_TEST = 10_000


def _config(**fields) -> TrainConfig:
    return resolve_config(TrainConfig(dataset="digits", **{**EXPENSIVE, **fields}))


@pytest.mark.parametrize("spec", ["int8", "topk:0.01", "sign", " Sign "])
def test_compressed_runs_score_each_partys_model_by_default(spec):
    assert with_evaluation_defaults(_config(), N_TEST).party_ap is False  # over the budget
    assert compressed(_config(compress=spec))
    assert with_evaluation_defaults(_config(compress=spec), N_TEST).party_ap is True


def test_an_explicit_no_party_ap_wins_in_a_compressed_run():
    filled = with_evaluation_defaults(_config(compress="topk:0.01", party_ap=False), N_TEST)
    assert filled.party_ap is False


def test_per_party_files_never_score_each_partys_model():
    config = _config(compress="int8")
    assert with_evaluation_defaults(config, N_TEST, party_ap_possible=False).party_ap is False


def test_uncompressed_runs_keep_the_budget_rule():
    assert not compressed(_config(compress="none"))
    cheap = with_evaluation_defaults(_config(compress="none"), 100)
    assert cheap.party_ap is True  # N more evaluations of 100 rows fit in the budget
