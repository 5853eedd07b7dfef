"""Tests of slate.claims (``slate reproduce claims``) on tiny settings of the digits dataset."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from slate import claims as claims_module
from slate.claims import (
    ClaimsPlan,
    RunSpec,
    claims,
    gradient_cost,
    gradient_evaluations,
    iterations_to_target,
    read_history,
    spread,
)
from slate.cli import main
from slate.errors import ConfigError, DataError

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
    results = claims(
        None, out, seeds=(0,), dataset="digits", config_dir=presets, plan=TINY, log=lambda _: None
    )
    return out, results


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_speedup_table_rows_step_sizes_and_targets(study) -> None:
    out, results = study
    rows = results["speedup"]
    assert [(r["step_size"], r["nodes"]) for r in rows] == [
        ("fixed", 1), ("fixed", 2), ("scaled", 1), ("scaled", 2),
    ]  # fmt: skip
    assert [r["lr"] for r in rows] == pytest.approx([0.05, 0.05, 0.05, 0.10])
    reference = read_history(out / "digits/claims/slate/N1-full-lr0.05-T12-e1-stratified-gt0/seed0")
    assert rows[0]["target"] == pytest.approx(0.95 * reference["test_ap"][-1])
    for row in rows:
        folder = RunSpec(nodes=row["nodes"], topology="full", lr=row["lr"], iterations=12,
                         eval_every=1).key  # fmt: skip
        history = read_history(out / "digits/claims/slate" / folder / "seed0")
        expected = iterations_to_target(history["iteration"], history["test_ap"], row["target"])
        assert row["iterations_mean"] == pytest.approx(expected, nan_ok=True)
        assert row["samples_mean"] == pytest.approx(row["nodes"] * 20 * expected, nan_ok=True)
    assert rows[0]["speedup"] == pytest.approx(1.0)
    assert len(_csv(out / "figures/claims_speedup.csv")) == 4


def test_topology_table_reports_lambda_and_consensus(study) -> None:
    _, results = study
    rows = results["topology"]
    # The preset's eta, then the speedup study's scaled eta at N = 4: 0.05 * 4.
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
    if slate["reached"]:  # SLATE's curve: one gradient evaluation per iteration
        assert slate["gradients_mean"] == pytest.approx(slate["iterations_mean"])


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

    monkeypatch.setattr("slate.train.train", no_training)
    lines: list[str] = []
    again = claims(None, out, seeds=(0,), dataset="digits", config_dir=presets, plan=TINY,
                   log=lines.append)  # fmt: skip
    assert trained and all("dirichlet0.01" in folder for folder in trained)
    # Distinct finished runs: speedup 3 (N = 1 is both step sizes' first), topology 4, tracking
    # 2 (stratified, without and with tracking), momentum 1 (SLATE's run is topology's ring
    # run at the preset's eta: same settings, same folder).
    assert sum(line.startswith("  reuse ") for line in lines) == 10
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


def test_cli_runs_one_study(presets: Path, tmp_path: Path) -> None:
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
