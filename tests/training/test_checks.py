"""The settings derived before a run is built: the party-AP default of compressed runs, and
``--threads``' default (one thread for a small model, where more threads only add overhead)."""

from __future__ import annotations

import pytest
import torch

from slate.config import TrainConfig, resolve_config
from slate.training.checks import (
    SMALL_STEP_WORK,
    compressed,
    default_threads,
    step_work,
    with_evaluation_defaults,
    with_thread_default,
)

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


# (model, input shape, its parameters): the default digits MLP, w7a's MLP, MNIST's CNN.
DIGITS_MLP = ("mlp", (64,), 64 * 28 + 28 + 28 + 1)
W7A_MLP = ("mlp", (300,), 300 * 28 + 28 + 28 + 1)
MNIST_CNN = ("mnist-cnn", (1, 28, 28), 20 * 25 + 20 + 50 * 20 * 25 + 50 + 800 * 500 + 500 + 501)


def _threads(model, shape, nodes, batch_size=20, threads=None) -> int:
    config = resolve_config(
        TrainConfig(dataset="csv", model=model, nodes=nodes, batch_size=batch_size,
                    threads=threads)
    )  # fmt: skip
    return with_thread_default(config, shape, nodes).threads


@pytest.mark.parametrize(
    ("model", "nodes"), [(DIGITS_MLP, 8), (DIGITS_MLP, 20), (W7A_MLP, 20), (MNIST_CNN, 20)]
)
def test_the_thread_default_follows_the_measured_rule(model, nodes):
    """One thread below SMALL_STEP_WORK (parameters x parties x m), torch's count from there."""
    name, shape, parameters = model
    work = parameters * nodes * 20
    assert step_work(parameters, nodes, 20) == work
    expected = 1 if work < SMALL_STEP_WORK else torch.get_num_threads()
    assert _threads(name, shape, nodes) == expected == default_threads(parameters, nodes, 20)


def test_small_models_take_one_thread_and_large_ones_torchs_count():
    assert _threads(*DIGITS_MLP[:2], nodes=8) == 1  # 1849 x 8 x 20 = 0.30 M
    assert _threads(*DIGITS_MLP[:2], nodes=20) == 1  # 0.74 M
    assert _threads(*W7A_MLP[:2], nodes=20) == 1  # 3.4 M: at most 13% faster on 2 threads
    assert _threads(*MNIST_CNN[:2], nodes=20) == torch.get_num_threads()  # 172 M
    assert _threads(*MNIST_CNN[:2], nodes=4) == torch.get_num_threads()  # 34 M
    assert _threads(*W7A_MLP[:2], nodes=20, batch_size=100) == torch.get_num_threads()  # 17 M
    # The crossover itself: the same MLP with a batch just below and just at it.
    rows = (SMALL_STEP_WORK - 1) // (DIGITS_MLP[2] * 8)
    assert _threads(*DIGITS_MLP[:2], nodes=8, batch_size=rows) == 1
    assert _threads(*DIGITS_MLP[:2], nodes=8, batch_size=rows + 1) == torch.get_num_threads()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_an_explicit_threads_wins(threads):
    assert _threads(*DIGITS_MLP[:2], nodes=8, threads=threads) == threads
    assert _threads(*MNIST_CNN[:2], nodes=20, threads=threads) == threads
