"""``slate reproduce communication`` on a tiny digits preset: the runs it makes, the counts its
table reports against the communication formulas, and the WAN estimate against its definition."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from slate.cli import main
from slate.gossip import EXCHANGE_GOODPUT, WanLink
from slate.studies.communication import (
    LINKS,
    Outcome,
    communication,
    read_history,
    settings_for,
    wan_seconds,
)

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
    results = communication(
        None, out, datasets=("digits",), seeds=(0, 1), config_dir=configs,
        iterations=ITERATIONS, log=lambda _: None,
    )  # fmt: skip
    return out, results, configs


def _summary(out: Path, key: str, seed: int = 0) -> dict:
    return json.loads((out / f"digits/communication/{key}/seed{seed}/summary.json").read_text())


def test_every_setting_runs_with_its_flags(study) -> None:
    out, results, _ = study
    keys = [s.key for s in settings_for("digits")]
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
    outcome = Outcome(settings_for("digits")[0], [_summary(out, "ring")], [read_history(folder)])
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
    assert sum(line.startswith("  reuse ") for line in lines) == 2 * len(settings_for("digits"))
    assert again == results


def test_cli_help_names_the_study(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["reproduce", "communication", "--help"])
    assert "--datasets" in capsys.readouterr().out
