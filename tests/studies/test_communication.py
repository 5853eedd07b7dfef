"""``slate reproduce communication`` on a tiny digits preset: the runs it makes, the counts its
table reports against the communication formulas, the WAN estimate against its definition, and
the no-gossip control every setting is set against."""

from __future__ import annotations

import csv
import functools
import json
import math
from pathlib import Path

import pytest

from slate.cli import main
from slate.communication.gossip import EXCHANGE_GOODPUT, WanLink
from slate.errors import ConfigError
from slate.studies.communication import (
    AP_TOLERANCE,
    CONTROL,
    LINKS,
    Comparison,
    Setting,
    SettingOutcome,
    _control_section,
    communication,
    compare_with_control,
    control_setting,
    read_history,
    settings_for,
    wan_seconds,
)
from slate.training import loop

PRESET = """
dataset = "digits"
nodes = 4
topology = "ring"
iterations = 50
batch_size = 8
lr = 0.05

[methods.slate]
positives = 2
margin = 0.5
"""
ITERATIONS = 50


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[Path, dict, Path]:
    configs = tmp_path_factory.mktemp("configs")
    (configs / "digits.toml").write_text(PRESET)
    out = tmp_path_factory.mktemp("communication")
    with pytest.MonkeyPatch.context() as patch:  # no test reads a run's own figures
        patch.setattr(loop, "train", functools.partial(loop.train, figures=False))
        results = communication(
            None, out, datasets=("digits",), seeds=(0, 1), config_dir=configs,
            iterations=ITERATIONS, log=lambda _: None,
        )  # fmt: skip
    return out, results, configs


def _summary(out: Path, key: str, seed: int = 0) -> dict:
    return json.loads((out / f"digits/communication/{key}/seed{seed}/summary.json").read_text())


def test_every_setting_runs_with_its_flags(study) -> None:
    out, results, _ = study
    keys = [s.key for s in settings_for("digits", ITERATIONS)]
    assert [r["setting"] for r in results["digits"]] == keys
    h = _summary(out, "ring-H5")
    assert h["gossip_every"] == 5 and h["rounds"] == ITERATIONS // 5
    squeezed = _summary(out, "base2-H10-int8")
    assert (squeezed["topology"], squeezed["gossip_every"], squeezed["compress"]) == (
        "base-2",
        10,
        "int8",
    )


def test_the_table_reports_rounds_and_bytes_against_the_ring(study) -> None:
    out, results, _ = study
    rows = {r["setting"]: r for r in results["digits"]}
    ring = _summary(out, "ring")
    d = 4 * ring["n_parameters"]
    # The ring: one round per iteration, two neighbours' float32 parameters each.
    assert rows["ring"]["rounds"] == ITERATIONS
    assert rows["ring"]["bytes_per_party"] == pytest.approx(2 * d * ITERATIONS)
    assert rows["ring-H25"]["fewer_rounds"] == pytest.approx(25)
    assert rows["ring-H25"]["fewer_bytes"] == pytest.approx(25)
    # Federated averaging: every q-th iteration is an all-reduce of 2 (N - 1) steps.
    q = 10
    assert rows[f"federated-q{q}"]["rounds"] == ITERATIONS // q * 2 * (4 - 1)
    assert rows[f"federated-q{q}"]["serverless"] is False
    with open(out / "figures/communication_digits.csv") as handle:
        assert [r["setting"] for r in csv.DictReader(handle)] == list(rows)


def test_the_report_recommends_a_setting_per_link(study) -> None:
    out, _, _ = study
    report = (out / "communication.md").read_text()
    assert "## digits" in report and "### Which flags for which link (digits)" in report
    for link in LINKS:
        assert f"| {link} | `" in report
    for name in ("bytes", "rounds"):
        assert (out / f"figures/communication_digits_{name}.png").stat().st_size > 0
        assert f"(figures/communication_digits_{name}.png)" in report


def test_wan_seconds_is_compute_plus_rtt_per_round_plus_bytes_over_bandwidth(study) -> None:
    out, _, _ = study
    folder = out / "digits/communication/ring/seed0"
    outcome = SettingOutcome(
        settings_for("digits", ITERATIONS)[0], [_summary(out, "ring")], [read_history(folder)]
    )
    link = WanLink(80.0, 10.0)
    gossip_bits = 8 * 2 * 4 * 1849 * ITERATIONS  # 2 neighbours, float32, every iteration
    expected = 0.002 * ITERATIONS + ITERATIONS * 0.080 + gossip_bits / (10e6 * EXCHANGE_GOODPUT)
    assert _summary(out, "ring")["n_parameters"] == 1849
    assert wan_seconds(outcome, link, 0.002) == pytest.approx(expected)
    assert math.isnan(wan_seconds(outcome, link, 0.002, target=2.0))  # AP never reaches 2


def test_a_second_call_reuses_every_run(study) -> None:
    out, results, configs = study
    lines: list[str] = []
    again = communication(
        None, out, datasets=("digits",), seeds=(0, 1), iterations=ITERATIONS,
        config_dir=configs, log=lines.append,
    )  # fmt: skip
    runs = 2 * len(settings_for("digits", ITERATIONS))
    assert sum(line.startswith("  reuse ") for line in lines) == runs
    assert again == results


def test_cli_help_names_the_study(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["reproduce", "communication", "--help"])
    assert "--datasets" in capsys.readouterr().out


def test_the_control_never_gossips(study) -> None:
    out, results, _ = study
    assert [s.key for s in settings_for("digits", ITERATIONS)][-1] == CONTROL
    for seed in (0, 1):
        alone = _summary(out, CONTROL, seed)
        assert alone["gossip_every"] == ITERATIONS + 1 and alone["iterations"] == ITERATIONS
        assert alone["rounds"] == 0 and alone["comm_bytes_per_party"] == 0
    row = next(r for r in results["digits"] if r["setting"] == CONTROL)
    assert row["vs_control"] == "control" and row["delta_control"] == 0


def test_each_settings_difference_from_the_control_is_read_from_its_runs(study) -> None:
    out, results, _ = study
    with open(out / "figures/communication_digits.csv") as handle:
        written = {r["setting"]: r for r in csv.DictReader(handle)}
    for row in results["digits"]:
        key = row["setting"]
        deltas = [
            _summary(out, key, seed)["test_ap"] - _summary(out, CONTROL, seed)["test_ap"]
            for seed in (0, 1)
        ]
        assert row["ap_control"] == pytest.approx(
            (_summary(out, CONTROL, 0)["test_ap"] + _summary(out, CONTROL, 1)["test_ap"]) / 2
        )
        assert row["delta_control"] == pytest.approx(sum(deltas) / 2)
        assert row["delta_control_std"] == pytest.approx(abs(deltas[0] - deltas[1]) / 2**0.5)
        per_seed = [float(v) for v in written[key]["delta_control_per_seed"].split(";")]
        assert per_seed == pytest.approx(deltas, abs=1e-6)
        assert float(written[key]["delta_control"]) == pytest.approx(sum(deltas) / 2)
    report = (out / "communication.md").read_text()
    assert "### Against no communication (digits)" in report
    ring = next(r for r in results["digits"] if r["setting"] == "ring")
    ring_ap = (_summary(out, "ring", 0)["test_ap"] + _summary(out, "ring", 1)["test_ap"]) / 2
    line = (
        f"| ring, H = 1 (the paper) | {ring_ap:.4f} | {ring['ap_control']:.4f} | "
        f"{ring['delta_control']:+.4f} ± {ring['delta_control_std']:.4f} |"
    )
    assert line in report
    assert f"`--gossip-every {ITERATIONS + 1}`" in report
    assert (out / "figures/communication_digits_control.png").stat().st_size > 0


def test_the_verdict_needs_the_tolerance_and_a_paired_interval_that_excludes_zero() -> None:
    steady = Comparison(0.8, 0.7, (0.10, 0.11, 0.12))
    assert steady.mean == pytest.approx(0.11) and steady.std == pytest.approx(0.01)
    # t_{0.975, 2} = 4.3027: the half width of a 95% interval over three seeds
    assert steady.half_width == pytest.approx(4.302653 * 0.01 / 3**0.5, rel=1e-5)
    assert steady.verdict == "better"
    assert Comparison(0.6, 0.7, (-0.02, -0.021)).verdict == "worse"
    assert Comparison(0.7, 0.7, (AP_TOLERANCE / 2,)).verdict == "not distinguishable"
    assert Comparison(0.7, 0.7, (2 * AP_TOLERANCE,)).verdict == "better"  # one seed: no spread
    noisy = Comparison(0.71, 0.7, (0.05, -0.04, 0.03))  # mean 0.0133, interval [-0.10, 0.13]
    assert noisy.half_width > abs(noisy.mean) > AP_TOLERANCE
    assert noisy.verdict == "not distinguishable"


def _fake(key: str, aps: dict[int, float]) -> SettingOutcome:
    summaries = [{"seed": k, "test_ap": v, "iterations": 100, "nodes": 4} for k, v in aps.items()]
    return SettingOutcome(Setting(key, key), summaries, [])


def test_a_run_where_the_ring_ties_the_control_says_so() -> None:
    control = _fake(CONTROL, {0: 0.950, 1: 0.952})
    ring = _fake("ring", {0: 0.951, 1: 0.952})
    sign = _fake("ring-sign", {0: 0.930, 1: 0.931})
    outcomes = [ring, sign, control]
    comparisons = {o.setting.key: compare_with_control(o, control) for o in outcomes}
    text = _control_section("flat", outcomes, control, comparisons)
    assert "talking during training does not change the final AP" in text
    assert "| ring | 0.9515 | 0.9510 | +0.0005 ± 0.0007 | +0.0010, +0.0000 |" in text
    assert "| ring-sign | 0.9305 | 0.9510 | -0.0205 ± 0.0007 | -0.0200, -0.0210 | worse |" in text
    better = _fake("ring", {0: 0.99, 1: 0.991})
    comparisons["ring"] = compare_with_control(better, control)
    text = _control_section("steep", [better, sign, control], control, comparisons)
    assert "Worse than no gossip: ring-sign." in text and "does not change" not in text


def test_bad_control_inputs_get_one_paragraph() -> None:
    assert control_setting(300).flags == {"gossip_every": 301}
    with pytest.raises(ConfigError, match="iteration count"):
        control_setting(0)
    with pytest.raises(ConfigError, match="same, non-empty, set of seeds"):
        compare_with_control(_fake("ring", {0: 0.9, 1: 0.9}), _fake(CONTROL, {0: 0.8}))
