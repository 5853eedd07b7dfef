"""Tests of slate.studies.claims (``slate reproduce claims``) on tiny settings of digits."""

from __future__ import annotations

import csv
import functools
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from slate.cli import main
from slate.errors import ConfigError, DataError, TrainingDiverged
from slate.studies import claims as claims_module
from slate.studies.claims import (
    DIVERGED,
    ClaimsPlan,
    Outcome,
    RunSpec,
    best_step_size,
    claims,
    gradient_cost,
    gradient_evaluations,
    iterations_to_target,
    read_history,
    samples_drawn,
    spread,
)
from slate.training import loop

REPO = Path(__file__).resolve().parents[2]

PRESET = """\
dataset = "digits"
nodes = 4
topology = "ring"
iterations = 1000
batch_size = 20
lr = 0.05

[methods.slate]
positives = 4
margin = 0.5

[methods.slate-m]
positives = 4
margin = 0.5
alpha = 0.1
momentum = "storm"
"""

TINY = ClaimsPlan(
    iterations=12,
    speedup_nodes=(1, 2),
    speedup_lrs=(0.1, 0.05),  # sorted by the study; 0.05 is the preset's (the target's) step
    topology_nodes=4,
    topologies=("ring", "full"),
    # Dirichlet with alpha 0.01 leaves a party of two without b = 4 positives: cannot run.
    tracking_settings=((2, "stratified", None), (2, "dirichlet", 0.01)),
)


# --------------------------------------------------------------------------- measurements


def test_iterations_to_target_interpolates_the_first_crossing() -> None:
    steps, aps = [0, 10, 20, 30, 40], [0.1, 0.5, 0.7, 0.6, 0.9]
    # First evaluation at or above 0.6 is iteration 20 (0.7); the one before is 10 (0.5):
    # 10 + (0.6 - 0.5) / (0.7 - 0.5) * 10 = 15.
    assert iterations_to_target(steps, aps, 0.6) == pytest.approx(15.0)
    assert iterations_to_target(steps, aps, 0.7) == pytest.approx(20.0)  # reached exactly
    assert iterations_to_target(steps, aps, 0.05) == 0.0  # already there at iteration 0
    # 0.8 is first reached between 30 (0.6) and 40 (0.9), not between 20 and 30.
    assert iterations_to_target(steps, aps, 0.8) == pytest.approx(30 + 0.2 / 0.3 * 10)
    assert math.isnan(iterations_to_target(steps, aps, 0.95))


def test_gradient_evaluations_count_slate_m_initial_batch_and_two_per_step() -> None:
    steps = [0, 1, 2, 10]
    np.testing.assert_array_equal(gradient_evaluations(steps, 1), [0, 1, 2, 10])
    # B / b = 5 mini-batches at the first iteration, then 2 per iteration: 5 + 2 (t - 1).
    np.testing.assert_array_equal(gradient_evaluations(steps, 2, 5), [0, 5, 7, 23])


def test_samples_drawn_count_one_mini_batch_per_step_for_both_methods() -> None:
    steps = [0, 1, 2, 10]
    # SLATE: one mini-batch of m = 20 per iteration.
    np.testing.assert_array_equal(samples_drawn(steps, 20), [0, 20, 40, 200])
    # SLATE-M: B / b = 5 mini-batches at the first iteration, then one per iteration (its two
    # gradients of Alg. 2 line 10 share it): 20 (5 + t - 1) = 100, 120, 280; not 2 per step.
    np.testing.assert_array_equal(samples_drawn(steps, 20, 5), [0, 100, 120, 280])
    assert samples_drawn([10], 20, 5)[0] < 20 * gradient_evaluations([10], 2, 5)[0]  # 280 < 460


def _slate_m_outcome() -> Outcome:
    config = {
        "algorithm": "slate-m", "lr": 0.01, "momentum": "storm", "initial_batch": None,
        "positives": 2, "batch_size": 20,
    }  # fmt: skip
    history = {"iteration": np.array([0.0, 10.0, 20.0]), "test_ap": np.array([0.1, 0.5, 0.9])}
    return Outcome(RunSpec(method="slate-m"), [{"config": config}], [history])


def test_outcome_measures_slate_m_by_iterations_gradients_and_samples() -> None:
    outcome = _slate_m_outcome()
    # AP 0.7 is reached half way between iterations 10 and 20.
    assert outcome.to_target(0.7) == pytest.approx([15.0])
    # Gradient evaluations 5 + 2 (t - 1): 23 at t = 10, 43 at t = 20; half way: 33.
    assert outcome.to_target(0.7, x="gradients") == pytest.approx([33.0])
    # Samples drawn 20 (5 + t - 1): 280 at t = 10, 480 at t = 20; half way: 380 (not 33 * 20).
    assert outcome.to_target(0.7, x="samples") == pytest.approx([380.0])
    with pytest.raises(ValueError, match="samples"):
        outcome.to_target(0.7, x="seconds")


def test_outcome_gives_a_diverged_seed_no_time_to_target() -> None:
    outcome = _slate_m_outcome()
    outcome.diverged = {1: "Training diverged."}
    its = outcome.to_target(0.7)
    assert its[0] == pytest.approx(15.0) and math.isnan(its[1])
    assert spread(its).format(".0f") == "15 ± 0 (1/2 seeds)"


def test_best_step_size_needs_every_seed_at_the_target() -> None:
    nan = math.nan
    grid = {0.01: [100.0, 120.0], 0.04: [50.0, 70.0], 0.16: [40.0, nan], 0.64: [nan, nan]}
    # 0.16's one finished seed is the fastest, but its other seed never reached the target.
    assert best_step_size(grid) == 0.04
    assert best_step_size({0.02: [60.0, 60.0], 0.01: [50.0, 70.0]}) == 0.01  # tie: smaller
    assert best_step_size({0.16: [40.0, nan], 0.64: [nan, nan]}) is None
    assert best_step_size({0.01: []}) is None


@pytest.mark.parametrize(
    ("algorithm", "momentum", "initial_batch", "expected"),
    [
        ("slate", "storm", None, (1, 0)),
        ("slate-m", "storm", None, (2, 5)),  # default B = 5 b: 5 mini-batches of b = 2
        ("slate-m", "storm", 7, (2, 4)),  # B = 7 positives: ceil(7 / 2) = 4 mini-batches
        ("slate-m", "ema", None, (1, 0)),
    ],
)
def test_gradient_cost_from_a_resolved_config(algorithm, momentum, initial_batch, expected):
    config = {
        "algorithm": algorithm, "lr": 0.01, "momentum": momentum,
        "initial_batch": initial_batch, "positives": 2,
    }  # fmt: skip
    assert gradient_cost(config) == expected


def test_spread_formats_mean_std_and_missing_seeds() -> None:
    assert spread([1.0, 2.0, 3.0]).format(".1f") == "2.0 ± 1.0"
    partial = spread([10.0, math.nan, 20.0])
    assert (partial.mean, partial.count, partial.seeds) == (15.0, 2, 3)
    assert partial.format(".0f") == "15 ± 7 (2/3 seeds)"
    assert spread([math.nan]).format(".0f") == "not reached"
    assert spread([4.0]).format(".1f") == "4.0 ± 0.0"


def test_run_spec_key_names_every_varied_setting() -> None:
    spec = RunSpec(nodes=16, topology="torus", lr=0.16, iterations=10_000, eval_every=20)
    assert spec.key == "N16-torus-lr0.16-T10000-e20-stratified-gt0"
    skewed = RunSpec(nodes=4, partition="dirichlet", dirichlet_alpha=0.3, gradient_tracking=True)
    assert skewed.key == "N4-ring-lr0.01-T10000-e50-dirichlet0.3-gt1"


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def presets(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("configs")
    (folder / "digits.toml").write_text(PRESET)
    return folder


@pytest.fixture(scope="module")
def study(presets: Path, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("claims")
    with pytest.MonkeyPatch.context() as patch:  # no test reads a run's own figures
        patch.setattr(loop, "train", functools.partial(loop.train, figures=False))
        results = claims(None, out, seeds=(0,), dataset="digits", config_dir=presets, plan=TINY,
                         log=lambda _: None)  # fmt: skip
    return out, results


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_speedup_tunes_every_n_on_one_grid(study) -> None:
    out, results = study
    rows = results["speedup"]
    assert [(r["nodes"], r["lr"]) for r in rows] == [(1, 0.05), (1, 0.1), (2, 0.05), (2, 0.1)]
    # The target comes from N = 1 at the preset's eta, as before.
    reference = read_history(out / "digits/claims/slate/N1-full-lr0.05-T12-e1-stratified-gt0/seed0")
    assert rows[0]["target"] == pytest.approx(0.95 * reference["test_ap"][-1])
    for row in rows:
        folder = RunSpec(nodes=row["nodes"], topology="full", lr=row["lr"], iterations=12,
                         eval_every=1).key  # fmt: skip
        history = read_history(out / "digits/claims/slate" / folder / "seed0")
        expected = iterations_to_target(history["iteration"], history["test_ap"], row["target"])
        assert row["iterations_mean"] == pytest.approx(expected, nan_ok=True)
        assert row["samples_mean"] == pytest.approx(row["nodes"] * 20 * expected, nan_ok=True)
        assert (row["diverged"], row["seeds"]) == (0, 1)
    for n in (1, 2):  # each N's best eta: its fewest iterations among those that reach
        cells = {r["lr"]: [r["iterations_mean"]] for r in rows if r["nodes"] == n}
        assert [r["lr"] for r in rows if r["nodes"] == n and r["best"]] == (
            [best_step_size(cells)] if best_step_size(cells) is not None else []
        )
    # Speedup and efficiency against N = 1 at *its* best eta, not at a fixed one.
    tuned_1 = next(r for r in rows if r["nodes"] == 1 and r["best"])
    assert tuned_1["speedup"] == pytest.approx(1.0)
    for row in rows:
        if row["reached"] == row["seeds"]:
            speedup = tuned_1["iterations_mean"] / row["iterations_mean"]
            assert row["speedup"] == pytest.approx(speedup)
            assert row["efficiency"] == pytest.approx(speedup / row["nodes"])
        else:
            assert math.isnan(row["speedup"])
    assert len(_csv(out / "figures/claims_speedup.csv")) == 4
    report = (out / "claims.md").read_text()
    assert "η ∈ {0.05, 0.1}" in report and "| N | η = 0.05 | η = 0.1 |" in report
    assert "1 / (6 S_F)" in report  # Theorem 1's cap, which does not grow with N


def test_speedup_records_a_diverged_run_and_reuses_the_record(study, presets, tmp_path,
                                                              monkeypatch):  # fmt: skip
    """The speedup grid's cell N = 2, eta = 0.1 diverges: its row and the report say so, a
    marker records it, and a second call reuses the record instead of training again. The
    grid's other three runs are the module study's finished runs (same plan, same settings),
    copied into this folder: the study reuses them, so only the diverging cell trains."""
    key = RunSpec(nodes=2, topology="full", lr=0.1, iterations=12, eval_every=1).key
    finished = study[0] / "digits/claims/slate"
    for n, lr in ((1, 0.05), (1, 0.1), (2, 0.05)):
        other = RunSpec(nodes=n, topology="full", lr=lr, iterations=12, eval_every=1).key
        shutil.copytree(finished / other, tmp_path / "digits/claims/slate" / other)

    def diverging(config, **kwargs):  # as slate does at a step size too large for the model
        if config.nodes == 2 and config.lr == 0.1:
            raise TrainingDiverged("Training diverged: the loss of party 0 became non-finite.")
        raise AssertionError(f"trained {config.out}, a copied run")

    monkeypatch.setattr("slate.training.loop.train", diverging)
    run = {"seeds": (0,), "dataset": "digits", "config_dir": presets, "plan": TINY}
    rows = claims(None, tmp_path, studies=("speedup",), log=lambda _: None, **run)["speedup"]
    cell = next(r for r in rows if (r["nodes"], r["lr"]) == (2, 0.1))
    assert (cell["diverged"], cell["reached"], cell["best"]) == (1, 0, False)
    assert math.isnan(cell["speedup"])
    marker = tmp_path / "digits/claims/slate" / key / "seed0" / DIVERGED
    assert "non-finite" in marker.read_text()
    grid_row = next(line for line in (tmp_path / "claims.md").read_text().splitlines()
                    if line.startswith("| 2 | "))  # fmt: skip
    assert grid_row.endswith("| diverged |")  # N = 2's row of the grid table, column eta = 0.1

    def no_training(config, **kwargs):
        raise AssertionError(f"trained {config.out} again")

    monkeypatch.setattr("slate.training.loop.train", no_training)
    lines: list[str] = []
    again = claims(None, tmp_path, studies=("speedup",), log=lines.append, **run)["speedup"]
    assert any(line.endswith(": diverged") for line in lines)
    _assert_same_rows(again, rows)


def test_a_diverged_run_stops_a_study_that_needs_every_seed(presets, tmp_path, monkeypatch):
    def diverging(config, **kwargs):
        raise TrainingDiverged("Training diverged: the loss of party 0 became non-finite.")

    monkeypatch.setattr("slate.training.loop.train", diverging)
    with pytest.raises(TrainingDiverged, match="seed 0, diverged"):
        claims(None, tmp_path, studies=("momentum",), seeds=(0,), dataset="digits",
               config_dir=presets, plan=TINY, log=lambda _: None)  # fmt: skip


def test_topology_table_reports_lambda_and_consensus(study) -> None:
    out, results = study
    rows = results["topology"]
    # The preset's eta, then eta N at N = 4: 0.05 * 4 (the speedup study no longer runs it).
    assert "the speedup study's scaled" not in (out / "claims.md").read_text()
    assert [(r["topology"], round(r["lr"], 12)) for r in rows] == [
        ("ring", 0.05), ("full", 0.05), ("ring", 0.2), ("full", 0.2),
    ]  # fmt: skip
    by_name = {(r["topology"], round(r["lr"], 12)): r for r in rows}
    assert all(r["target"] == pytest.approx(results["speedup"][0]["target"]) for r in rows)
    assert by_name[("full", 0.05)]["lambda"] == pytest.approx(0.0, abs=1e-12)
    assert by_name[("ring", 0.05)]["lambda"] == pytest.approx(1 / 3)  # 4-cycle, weights 1/3
    # Exact averaging leaves every party on the mean: no consensus distance.
    assert by_name[("full", 0.2)]["consensus_mean"] == pytest.approx(0.0, abs=1e-10)
    assert by_name[("ring", 0.2)]["consensus_mean"] > 0


def test_tracking_reports_an_infeasible_partition_instead_of_failing(study) -> None:
    out, results = study
    feasible, starved = results["tracking"]
    assert feasible["setting"] == "N = 2, stratified"
    assert {"plain_ap_mean", "gt_ap_mean", "gt_consensus_mean"} <= set(feasible)
    assert "error" in starved and "positives" in starved["error"]
    assert "cannot run: seed 0" in (out / "claims.md").read_text()


def test_momentum_counts_gradient_evaluations(study) -> None:
    _, results = study
    slate, slate_m = results["momentum"]
    assert (slate["method"], slate_m["method"]) == ("slate", "slate-m")
    assert slate["gradients_total"] == 12
    assert slate_m["gradients_total"] == 5 + 2 * 11  # B / b = 20 / 4 = 5, then 2 per step
    if slate["reached"]:  # SLATE's curve: one gradient evaluation and m samples per iteration
        assert slate["gradients_mean"] == pytest.approx(slate["iterations_mean"])
        assert slate["samples_mean"] == pytest.approx(20 * slate["iterations_mean"])
    if slate_m["reached"] and slate_m["iterations_mean"] >= 1:  # m (B/b + t - 1), not 2 m per t
        assert slate_m["samples_mean"] == pytest.approx(20 * (5 + slate_m["iterations_mean"] - 1))
    assert {"samples_mean", "samples_std"} <= set(slate_m)


def test_report_and_figures_are_written(study) -> None:
    out, _ = study
    report = (out / "claims.md").read_text()
    for title in claims_module.STUDY_TITLES.values():
        assert f"## {title}" in report
    figures = sorted(p.name for p in (out / "figures").glob("claims_*.png"))
    assert figures == sorted([
        "claims_speedup_iterations.png", "claims_speedup_samples.png",
        "claims_speedup_curves.png", "claims_topology_curves.png",
        "claims_topology_consensus.png", "claims_tracking.png",
        "claims_tracking_consensus.png", "claims_momentum_iterations.png",
        "claims_momentum_gradients.png",
    ])  # fmt: skip
    for name in figures:  # every figure is linked from the report, relative to it
        assert f"(figures/{name})" in report


def test_second_call_reuses_every_run(study, presets, monkeypatch) -> None:
    out, results = study

    trained: list[str] = []

    def no_training(config, **kwargs):  # only the run that cannot run has no summary.json
        trained.append(config.out)
        raise DataError("Every party must hold at least b = 4 positives. Stub.")

    monkeypatch.setattr("slate.training.loop.train", no_training)
    lines: list[str] = []
    again = claims(None, out, seeds=(0,), dataset="digits", config_dir=presets, plan=TINY,
                   log=lines.append)  # fmt: skip
    assert trained and all("dirichlet0.01" in folder for folder in trained)
    # Distinct finished runs: speedup 4 (N = 1, 2 at eta 0.05, 0.1; the target's reference is
    # N = 1 at 0.05), topology 4, tracking 2 (stratified, without and with tracking), momentum
    # 1 (SLATE's run is topology's ring run at the preset's eta: same settings, same folder).
    assert sum(line.startswith("  reuse ") for line in lines) == 11
    for study in ("speedup", "topology", "momentum"):
        _assert_same_rows(again[study], results[study])


def _assert_same_rows(got: list[dict], expected: list[dict]) -> None:
    """Rows built from reused runs hold the same values, field by field (NaN equals NaN)."""
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert row.keys() == want.keys()
        for key, value in want.items():
            same_nan = isinstance(value, float) and math.isnan(value) and math.isnan(row[key])
            assert same_nan or row[key] == value, (key, row[key], value)


# --------------------------------------------------------------------------- command line


def test_cli_runs_one_study(presets: Path, tmp_path: Path, monkeypatch) -> None:
    # (no assertion reads a run's own figures)
    monkeypatch.setattr(loop, "train", functools.partial(loop.train, figures=False))
    code = main([
        "reproduce", "claims", "--studies", "momentum", "--seeds", "0", "--dataset", "digits",
        "--configs", str(presets), "--iterations", "4", "--out", str(tmp_path),
    ])  # fmt: skip
    assert code == 0
    rows = _csv(tmp_path / "figures/claims_momentum.csv")
    assert [r["method"] for r in rows] == ["slate", "slate-m"]
    assert "## 4. SLATE-M against SLATE" in (tmp_path / "claims.md").read_text()
    assert "## 1." not in (tmp_path / "claims.md").read_text()


def test_unknown_study_is_a_user_error(presets: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError, match="Unknown --studies"):
        claims(None, tmp_path, studies=("speed",), dataset="digits", config_dir=presets)
    assert main(["reproduce", "claims", "--studies", "speed", "--out", str(tmp_path)]) == 2
    assert "Unknown --studies" in capsys.readouterr().err


def test_docs_quote_the_claims_command_with_paths_relative_to_the_repository() -> None:
    text = (REPO / "docs/claims.md").read_text()
    commands = [line for line in text.splitlines() if "reproduce claims --" in line]
    assert commands and all("--data-dir ../shared/data" in line for line in commands)
    assert "/work/" not in text  # no one machine's absolute paths
