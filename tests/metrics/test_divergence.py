"""Divergence between parties: the decision on constructed histories, the advice, and small real
runs (a party set that barely gossips warns; the dense ring does not)."""

from __future__ import annotations

import json
import math

import pytest

from slate.config import TrainConfig, resolve_config
from slate.metrics.divergence import (
    PARTY_SHORTFALL_LIMIT,
    RELATIVE_DISTANCE_LIMIT,
    TAIL_EVALUATIONS,
    advice_for,
    assess_divergence,
)
from slate.training.loop import train
from tests.sites import slate_here

NORM = 70.0  # the squared norm of w7a's averaged MLP after 10 000 iterations (measured)


def _history(last: list[float], rows: int = 21) -> list[float]:
    """Consensus distances of ``rows`` evaluations ending with ``last`` (iteration 0's first)."""
    return [0.0] + [1e-4] * (rows - 1 - len(last)) + last


def test_a_diverging_run_warns_with_its_numbers():
    # A reported topk:0.01 run on non-IID w7a parties (docs/outputs.md): consensus distance
    # 0.59, party APs 0.434-0.595, average 0.604.
    distances = _history([0.55, 0.57, 0.59])
    verdict = assess_divergence(distances, NORM, [0.434, 0.52, 0.595], 0.604, ["X"])
    assert verdict.tail_evaluations == TAIL_EVALUATIONS
    assert verdict.relative_distance == pytest.approx(0.59 / NORM)
    assert verdict.relative_distance_min == pytest.approx(0.55 / NORM)
    assert verdict.distance_trend == pytest.approx(0.59 / 0.55)
    assert verdict.party_ap_shortfall == pytest.approx(1 - 0.434 / 0.604)
    assert verdict.warned
    line = verdict.warning
    assert line.startswith("warning: the parties' models diverge")
    assert "0.59" in line and "8.43e-03" in line and "0.4340-0.5950" in line and "0.6040" in line
    assert line.endswith("Try: X.")
    summary = verdict.to_dict()
    assert summary["warned"] is True and summary["warning"] == line
    assert summary["relative_distance_limit"] == RELATIVE_DISTANCE_LIMIT


def test_under_dp_the_noises_distance_is_a_note_not_a_warning():
    # 4 parties on digits at --dp-epsilon 8, 30 iterations: rho 4.75e-03, all privacy noise
    distances = [0.0, 0.3, 0.31, 0.311]
    noisy = assess_divergence(distances, 65.5, [], 0.55, ["a better-connected --topology"],
                              noise=True)  # fmt: skip
    assert not noisy.warned and noisy.warning is None
    assert noisy.relative_distance == pytest.approx(0.311 / 65.5)
    assert noisy.noise_note.startswith("note: under --dp-epsilon")
    assert "--topology (" not in noisy.noise_note and "4.75e-03" in noisy.noise_note
    assert noisy.to_dict()["noise_note"] == noisy.noise_note
    plain = assess_divergence(distances, 65.5, [], 0.55, ["a better-connected --topology"])
    assert plain.warned and plain.noise_note is None  # the same numbers without noise warn


def test_a_healthy_run_does_not_warn():
    # The dense ring of the same measurement: distance 3.4e-4, party APs within 0.002.
    verdict = assess_divergence(_history([1.1e-4, 1.6e-4, 3.4e-4]), NORM, [0.7527, 0.7543], 0.7536)
    assert not verdict.warned and verdict.warning is None
    assert verdict.relative_distance == pytest.approx(3.4e-4 / NORM)
    assert verdict.party_ap_shortfall == pytest.approx(1 - 0.7527 / 0.7536)


def test_one_large_evaluation_is_not_a_distance_that_stays_large():
    spike = _history([1e-4, 1e-4, 1.0])  # only the last evaluation is far
    verdict = assess_divergence(spike, NORM, [], 0.7)
    assert verdict.relative_distance == pytest.approx(1.0 / NORM)
    assert verdict.relative_distance > RELATIVE_DISTANCE_LIMIT
    assert not verdict.warned
    stays = _history([1.0, 1.0, 1.0])
    assert assess_divergence(stays, NORM, [], 0.7).warned


@pytest.mark.parametrize("shortfall,warns", [(PARTY_SHORTFALL_LIMIT * 0.9, False),
                                             (PARTY_SHORTFALL_LIMIT * 1.1, True)])  # fmt: skip
def test_a_wide_party_ap_spread_warns_on_its_own(shortfall, warns):
    test_ap = 0.8
    aps = [test_ap * (1 - shortfall), test_ap]
    verdict = assess_divergence(_history([1e-4] * 3), NORM, aps, test_ap)
    assert verdict.party_ap_shortfall == pytest.approx(shortfall)
    assert verdict.warned is warns
    if warns:
        assert "the worst loses" in verdict.warning and "consensus distance" not in verdict.warning


def test_short_histories_and_missing_measurements():
    # Two evaluations: the tail is the last one alone, and there is no trend.
    verdict = assess_divergence([0.0, 0.5], NORM, [], 0.7)
    assert verdict.tail_evaluations == 1 and verdict.distance_trend is None and verdict.warned
    # One party, or distances not measured here (NaN): nothing to say.
    assert not assess_divergence([0.0, 0.5], 0.0, [], 0.7).warned
    nothing = assess_divergence([math.nan, math.nan], NORM, [], 0.7)
    assert nothing.relative_distance is None and not nothing.warned


def test_advice_follows_the_flags():
    below = advice_for("topk:0.01", 0.001, 0.04, 1)
    assert below[0] == "a larger --consensus-step, e.g. 0.04 (the default for --compress topk:0.01)"
    above = advice_for("sign", 0.9, 0.4, 1)
    assert above[0] == "a smaller --consensus-step, e.g. 0.4 (the default for --compress sign)"
    at = advice_for("topk:0.01", 0.04, 0.04, 4)
    assert at[0].startswith("less compression") and at[1] == "a smaller --consensus-step, e.g. 0.02"
    assert "more frequent gossip (--gossip-every 2)" in at
    dense = advice_for("none", None, None, 1)
    assert not any("consensus-step" in line or "compression" in line for line in dense)


def _digits(**fields) -> TrainConfig:
    return resolve_config(TrainConfig(dataset="digits", nodes=4, iterations=200, **fields))


def test_a_run_whose_parties_barely_gossip_warns(tmp_path):
    lines: list[str] = []
    config = _digits(compress="topk:0.01", consensus_step=0.001, out=str(tmp_path))
    result = train(config, progress=False, figures=False, log=lines.append)
    summary = result.summary
    divergence = summary["divergence"]
    assert divergence["warned"] and divergence["relative_distance_min"] > RELATIVE_DISTANCE_LIMIT
    xbar = result.parameters.double().mean(dim=0)[: summary["n_parameters"]]
    expected = summary["consensus_distance"] / float((xbar**2).sum())
    assert divergence["relative_distance"] == pytest.approx(expected, rel=1e-5)
    assert summary["party_ap_min"] is not None  # on by default with compression
    assert divergence["warning"] in lines
    assert "a larger --consensus-step" in divergence["warning"]


def test_the_dense_ring_does_not_warn(tmp_path):
    lines: list[str] = []
    config = _digits(party_ap=True, out=str(tmp_path))
    summary = train(config, progress=False, figures=False, log=lines.append).summary
    divergence = summary["divergence"]
    assert not divergence["warned"] and divergence["warning"] is None
    assert 0 < divergence["relative_distance"] < RELATIVE_DISTANCE_LIMIT / 10
    assert divergence["party_ap_shortfall"] < PARTY_SHORTFALL_LIMIT
    assert not any("diverge" in line for line in lines)


def test_a_clean_dp_run_on_the_simulator_prints_no_divergence_warning(tmp_path):
    """4 parties at --dp-epsilon 8: the noise alone puts the parties 4.7e-03 of the model's
    squared norm apart (over the limit 0.001, set without noise); the run prints the note about
    the noise, never the warning and its advice (and --party-ap's shortfall is noise too)."""
    done = slate_here("train", "--dataset", "digits", "--nodes", "4", "--iterations", "12",
                      "--eval-every", "6", "--lr", "0.05", "--dp-epsilon", "8", "--positives",
                      "1", "--batch-size", "8", "--party-ap", "--no-progress", "--no-plots",
                      "--out", tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    divergence = json.loads((tmp_path / "summary.json").read_text())["divergence"]
    assert divergence["relative_distance_min"] > RELATIVE_DISTANCE_LIMIT  # the noise's
    assert not divergence["warned"] and divergence["warning"] is None
    assert "diverge" not in done.stdout + done.stderr and "Try:" not in done.stdout
    assert divergence["noise_note"] in done.stdout
