"""The training loop: default evaluation schedule, party APs, and a stop between chunks."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
from sklearn.metrics import average_precision_score

from slate.config import TrainConfig, resolve_config
from slate.errors import RunInterrupted
from slate.training import checkpoint
from slate.training.checks import (
    EVALUATION_BUDGET,
    evaluation_cost,
    evaluation_count,
    with_evaluation_defaults,
)
from slate.training.loop import train
from slate.training.run import Run


def config(**fields) -> TrainConfig:
    return resolve_config(TrainConfig(dataset="digits", **fields))


@pytest.mark.parametrize(
    ("iterations", "nodes", "batch", "n_test", "every", "party_ap"),
    [
        (10000, 20, 20, 12438, 500, True),  # w8a: T/20, evaluation is cheap
        (300, 20, 20, 10000, 150, False),  # MNIST: 8.33 iterations' work per evaluation
        (1000, 8, 20, 450, 50, True),  # digits
        (30, 4, 10, 100000, 30, False),  # never beyond the run's length
    ],
)
def test_default_evaluation_schedule(iterations, nodes, batch, n_test, every, party_ap) -> None:
    base = config(iterations=iterations, nodes=nodes, batch_size=batch, positives=2)
    filled = with_evaluation_defaults(base, n_test)
    assert filled.eval_every == every
    assert filled.party_ap is party_ap
    # The schedule keeps all evaluations within the budget (or evaluates only at both ends),
    # and T/20 would not have (unless T/20 is the default).
    cost = evaluation_cost(base, n_test)
    assert cost == pytest.approx(n_test / (3 * nodes * batch))
    evaluations = evaluation_count(iterations, every) + (nodes if party_ap else 0)
    if every < iterations:
        assert evaluations * cost <= EVALUATION_BUDGET * iterations
    if every > iterations // 20:
        assert evaluation_count(iterations, every - 1) * cost > EVALUATION_BUDGET * iterations


def test_explicit_evaluation_settings_are_kept() -> None:
    base = config(iterations=300, eval_every=7, party_ap=True)
    filled = with_evaluation_defaults(base, 10**6)
    assert (filled.eval_every, filled.party_ap) == (7, True)


@pytest.mark.kernels
def test_party_logits_equal_each_partys_own_model() -> None:
    run = Run(config(iterations=5, nodes=3))
    run.advance(5)
    features = run.evaluator.test_features
    logits = run.compute.party_logits(run.x, features)
    for p in range(3):
        own = run.compute.logits(run.x[p], features)
        assert logits[p].tolist() == own.tolist()
    aps = run.evaluator.party_aps(run.x)
    labels = run.evaluator.test_labels.numpy()
    expected = [average_precision_score(labels, row.numpy()) for row in logits]
    assert aps == pytest.approx(expected, abs=1e-12)


def test_without_party_ap_the_summary_says_none(tmp_path: Path) -> None:
    result = train(config(iterations=20, party_ap=False, out=str(tmp_path)), progress=False,
                   figures=False, log=lambda _: None)  # fmt: skip
    assert result.summary["party_ap_min"] is None and result.summary["party_ap_max"] is None
    assert math.isfinite(result.summary["test_ap"])


def test_stop_requested_between_chunks_adds_no_second_evaluation(tmp_path, monkeypatch) -> None:
    """A SIGINT landing after a chunk's evaluation and checkpoint, before the next chunk."""

    save = checkpoint.save_run

    def save_then_request_stop(run, out, elapsed, progress):
        save(run, out, elapsed, progress)
        run.stop_requested = True  # as the signal handler does

    monkeypatch.setattr(checkpoint, "save_run", save_then_request_stop)
    cfg = config(iterations=60, eval_every=20, checkpoint_every=20, out=str(tmp_path))
    with pytest.raises(RunInterrupted):
        train(cfg, progress=False, log=lambda _: None)
    state = checkpoint.load_checkpoint(checkpoint.simulator_checkpoint(tmp_path))
    iterations = [row["iteration"] for row in state["history"]]
    assert iterations == [0, 20]
    assert state["iteration"] == 20


@pytest.mark.parametrize(
    ("compile", "engine", "device", "iterations", "hidden", "expected"),
    [
        ("auto", "simulator", "cpu", 20000, 28, True),  # a long MLP run: compiled
        ("auto", "simulator", "cpu", 10000, 28, False),  # the paper's w8a: cold compile too dear
        ("auto", "simulator", "cpu", 20000, 400, False),  # 120k parameters: not overhead-bound
        ("auto", "distributed", "cpu", 20000, 28, False),
        ("auto", "simulator", "cuda", 20000, 28, False),
        ("on", "distributed", "cpu", 10, 28, True),
        ("off", "simulator", "cpu", 20000, 28, False),
    ],
)
def test_compile_choice(compile, engine, device, iterations, hidden, expected) -> None:
    import torch

    from slate.models import build_model
    from slate.training.checks import should_compile

    model = build_model("mlp", (300,), hidden=hidden)
    one_process = engine == "simulator"
    assert should_compile(compile, iterations, one_process, torch.device(device), model) is expected


def test_unknown_compile_value_is_a_config_error() -> None:
    from slate.errors import ConfigError

    with pytest.raises(ConfigError, match="--compile must be one of auto, on, off, got 'yes'"):
        Run(config(iterations=5, compile="yes"))


@functools.cache
def finished_run(algorithm: str, mode: str) -> Run:
    """40 iterations on 4 parties, compiled (``mode="on"``) or eager: computed once per process.
    The compiled SLATE run is both the eager comparison's and the resume test's whole run (a
    compiled run's cost is mostly its compilation). Callers only read it."""
    run = Run(config(iterations=40, nodes=4, algorithm=algorithm, compile=mode))
    run.advance(40)
    return run


@pytest.mark.processes
@pytest.mark.parametrize("algorithm", ["slate", "slate-m", "dpsgd", "coda"])
def test_compiled_runs_match_eager_runs(algorithm) -> None:
    """Every algorithm's objective compiles, and 40 compiled steps stay within float rounding."""
    import torch

    runs = {mode: finished_run(algorithm, mode) for mode in ("on", "off")}
    assert runs["on"].compute.compiled and not runs["off"].compute.compiled
    torch.testing.assert_close(runs["on"].x, runs["off"].x, rtol=1e-3, atol=1e-5)
    for key, value in runs["off"].algorithm.state.items():
        torch.testing.assert_close(runs["on"].algorithm.state[key], value, rtol=1e-3, atol=1e-5)


@pytest.mark.processes
def test_compiled_run_resumes_bit_identically() -> None:
    """The compiled path is deterministic: stop, restore into a fresh run, finish; same bits."""
    import torch

    cfg = config(iterations=40, nodes=4, algorithm="slate", compile="on")
    whole = finished_run("slate", "on")
    first = Run(cfg)
    first.advance(17)
    second = Run(cfg)
    second.load_state_dict(first.state_dict())
    second.advance(23)
    assert second.compute.compiled
    assert torch.equal(second.x, whole.x)
    assert torch.equal(second.loss_sum, whole.loss_sum)


def test_evaluation_time_is_counted_and_checkpointed() -> None:
    run = Run(config(iterations=10, nodes=3))
    assert run.evaluator.seconds == 0.0
    run.evaluator.evaluate(run.x, run.iteration)
    after_one = run.evaluator.seconds
    assert after_one > 0
    run.evaluator.party_aps(run.x)
    assert run.evaluator.seconds > after_one
    restored = Run(config(iterations=10, nodes=3))
    restored.load_state_dict(run.state_dict())
    assert restored.evaluator.seconds == run.evaluator.seconds


@pytest.mark.parametrize(("iterations", "every"), [(45, 20), (40, 20), (7, 7), (5, 1)])
def test_evaluation_count_is_the_number_of_history_rows(iterations, every) -> None:
    result = train(config(iterations=iterations, eval_every=every, nodes=2), progress=False,
                   write=False, log=lambda _: None)  # fmt: skip
    assert len(result.history) == evaluation_count(iterations, every)
