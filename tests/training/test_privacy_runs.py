"""``--dp-epsilon`` runs (:mod:`slate.training.accountant`, :mod:`slate.training.private_run`):
the noise multiplier against ``dp-accounting`` computed here, runs of one folder composed by its
ledger (a resume, a new run with other flags, a run refused before its first step), the
refusals, and what the run folder records."""

from __future__ import annotations

import copy
import functools
import json
import shutil
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution

from slate import SlateClassifier
from slate.config import TrainConfig
from slate.errors import ConfigError
from slate.faults import FaultPlan
from slate.training.accountant import (
    LEDGER,
    RELATION,
    PrivacyBudgetSpent,
    calibrate,
    epsilon_pld,
    read_ledger,
    sampling_rates,
)
from slate.training.configuration import resolve_and_check
from slate.training.loop import train
from slate.training.private_run import plan_against_ledger, refuse_batch_norm
from slate.training.run import Run
from tests.sites import run_command, slate_here


def _event(q: float, z: float, steps: int):
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)


def _pld(*events: tuple[float, float, int], delta: float = 1e-5) -> float:
    """dp-accounting's PLD accountant under replace-one at its finest default discretisation
    (not slate's), over the composition of ``(q, z, steps)`` events.

    The accountant's own steps (``PLDAccountant._maybe_compose``: the identity, then each
    Poisson-sampled Gaussian's PLD self-composed ``steps`` times and composed in order), with
    each event's PLD made once per test process (:func:`_segment_pld`): tests compose the same
    segments again (a first run at ε 4, parties with the same rates), and making one costs
    seconds. The result is the accountant's, bit for bit (checked below)."""
    composed = privacy_loss_distribution.identity(value_discretization_interval=FINEST)
    for q, z, steps in events:
        if q > 0 and steps > 0:
            composed = composed.compose(_segment_pld(q, z, steps))
    return composed.get_epsilon_for_delta(delta)


#: ``PLDAccountant``'s default discretisation (slate's is coarser: accountant.DISCRETISATION).
FINEST = 1e-4


@functools.cache
def _gaussian_pld(q: float, z: float):
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=z, value_discretization_interval=FINEST, sampling_prob=q,
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE,
    )  # fmt: skip


@functools.cache
def _segment_pld(q: float, z: float, steps: int):
    return _gaussian_pld(q, z).self_compose(steps)


def _accountant_epsilon(*events: tuple[float, float, int], delta: float = 1e-5) -> float:
    """The same composition by ``PLDAccountant`` itself."""
    accountant = pld_privacy_accountant.PLDAccountant(dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dpa.ComposedDpEvent([_event(*e) for e in events]))
    return accountant.get_epsilon(delta)


def test_the_cached_reference_is_the_accountant_bit_for_bit():
    """Two segments of other rates and multipliers: ``_pld`` (cached) gives the accountant's ε
    exactly. (z of 4 and 6: the same steps as at smaller z, with PLDs 3x cheaper to make.)"""
    events = ((0.2, 4.0, 7), (0.05, 6.0, 11))
    assert _pld(*events) == _accountant_epsilon(*events)
    assert _pld(events[1]) == _accountant_epsilon(events[1])


def test_the_noise_multiplier_meets_epsilon_by_an_independent_pld_accountant():
    """The design's schedule (G = 8, T = 500, q+ = 0.217) under replace-one: z = 5.81 for
    epsilon 8 (3.03 under add/remove-one); slate's z gives epsilon <= 8 by dp-accounting's own
    PLD accountant, and 1% less noise would not."""
    z = calibrate(0.217, 500, 8.0, 1e-5)
    assert z == pytest.approx(5.81, abs=0.01)
    assert _pld((0.217, z, 500)) <= 8.0
    assert _pld((0.217, 0.99 * z, 500)) > 8.0
    # The paper's schedule (b = 2, T = 10 000, q+ = 0.054, z = 3.54): 7.40 under add/remove,
    # 17.0 under replace-one.
    assert epsilon_pld(((0.054, 3.54, 10_000),), 1e-5) == pytest.approx(17.0, abs=0.02)


def test_rates_come_from_the_declared_class_sizes():
    assert sampling_rates(8, 16, 1, 37, 1198) == pytest.approx((8 / 37, 8 * 15 / 1198))
    assert sampling_rates(8, 20, 2, 10, 50) == (1.0, 1.0)  # capped at every row


def _digits(tmp_path: Path | None, **flags) -> TrainConfig:
    values = dict(dataset="digits", nodes=2, iterations=20, lr=0.05,
                  dp_epsilon=8.0, positives=1, batch_size=16, checkpoint_every=10,
                  eval_every=10, party_ap=False, compile="off")  # fmt: skip
    if tmp_path is not None:
        values["out"] = str(tmp_path)
    return TrainConfig(**{**values, **flags})


def _train(config: TrainConfig, log=lambda _: None, **flags):
    """``train`` without a progress bar, a log or figures (no test here reads one)."""
    return train(config, progress=False, figures=False, log=log, **flags)


@pytest.fixture(scope="module")
def first_at_4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[dict]]:
    """The first run of the folder tests below (epsilon 4, 20 steps, checkpoint at 10), made
    once per module: its folder, its summary's privacy and its history. Each test copies the
    folder into its own and runs there what it tests (runs of one folder see only its files).
    Shared, the tests also share one worker, so the reference PLDs of these segments are made
    once."""
    folder = tmp_path_factory.mktemp("first_at_4")
    result = _train(_digits(folder, dp_epsilon=4.0))
    return folder, result.summary["privacy"], result.history


def _after_first(first_at_4: tuple[Path, dict, list[dict]], tmp_path: Path) -> dict:
    """The first run's folder copied into ``tmp_path``; its summary's privacy (a copy)."""
    folder, privacy, _ = first_at_4
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    return copy.deepcopy(privacy)


def _segments_epsilon(folder: Path, party: int, positive: bool) -> float:
    """dp-accounting's composition of every segment recorded in the folder's ledger."""
    segments = read_ledger(folder / LEDGER)
    return _pld(*(segment.event(party, positive) for segment in segments))


def test_a_run_records_its_guarantee_and_a_resume_of_a_spent_budget_is_refused(
    first_at_4, tmp_path
):
    """A finished run's folder (``first_at_4``'s, at epsilon 4): the ledger, summary.json's
    and model.json's privacy (epsilon for positives and negatives as dp-accounting computes
    them here, the relation). Its checkpoint is that of iteration 10: resuming would re-run
    steps 10-19, but the ledger's history has spent the budget, so the resume is refused
    before its first step."""
    privacy = _after_first(first_at_4, tmp_path)
    history = first_at_4[2]
    party = privacy["parties"][0]
    assert privacy["releases"] == privacy["ledger_releases"] == 20
    assert privacy["planned_releases"] == 20 and privacy["epsilon_before_run"] == 0
    assert privacy["neighbouring_relation"] == RELATION and privacy["sensitivity"] == 2.0
    assert party["q_positives"] == pytest.approx(8 / party["positives"])
    for key, q in (("epsilon_positives", party["q_positives"]),
                   ("epsilon_negatives", party["q_negatives"])):  # fmt: skip
        assert party[key] == pytest.approx(_pld((q, party["z"], 20)), rel=0.01)
    # z is calibrated on the larger rate (here the negatives': digits is half positive)
    assert 3.9 < privacy["epsilon"] <= 4.0
    saved = json.loads((tmp_path / "model.json").read_text())["privacy"]
    assert saved["epsilon_positives"] == privacy["epsilon_positives"]
    assert all(row["train_loss"] != row["train_loss"] for row in history)  # NaN: unsent
    ledger = (tmp_path / LEDGER).read_text()
    with pytest.raises(PrivacyBudgetSpent) as refused:
        _train(_digits(tmp_path, dp_epsilon=4.0), resume=True)
    assert "No step was taken" in str(refused.value) and "\n" not in str(refused.value)
    assert (tmp_path / LEDGER).read_text() == ledger  # not one line more


def test_a_new_run_with_other_flags_composes_the_folder_history(first_at_4, tmp_path):
    """Run 1 at epsilon 4 with 8 groups (``first_at_4``'s folder), then run 2 in that folder
    at epsilon 8 with 4 groups: run 2 is planned against run 1's releases, and its summary.json
    gives the ε of both runs' segments as dp-accounting composes them (within 1%, never above
    8) with run 2's own rates, z and releases."""
    one = _after_first(first_at_4, tmp_path)
    two = _train(_digits(tmp_path, dp_groups=4)).summary["privacy"]
    written = json.loads((tmp_path / "summary.json").read_text())["privacy"]
    assert written == json.loads(json.dumps(two))  # the run that wrote it
    assert two["groups"] == 4 and two["releases"] == 20 and two["ledger_releases"] == 40
    assert two["q_positives"] == pytest.approx(one["q_positives"] / 2)
    assert two["epsilon_before_run"] == pytest.approx(one["epsilon"])
    for party in two["parties"]:
        for positive, key in ((True, "epsilon_positives"), (False, "epsilon_negatives")):
            truth = _segments_epsilon(tmp_path, party["party"], positive)
            assert party[key] == pytest.approx(truth, rel=0.01)
            assert party[key] <= 8.0
    assert 7.9 < two["epsilon"] <= 8.0


def test_a_resume_is_planned_again_for_its_steps_left_and_noised_at_its_new_z(first_at_4, tmp_path):
    """A run at epsilon 4 (20 steps, checkpoint at 10: ``first_at_4``) resumed at epsilon 8:
    the resume has 10 steps left, planned against the 20 recorded ones, and draws its noise at
    that plan's 2 C z, not at the set-up's (a run built on the folder and moved to iteration 10
    shows it); its ε is dp-accounting's composition of all 30 releases (within 1%, never above
    8)."""
    _after_first(first_at_4, tmp_path)
    run = Run(resolve_and_check(_digits(tmp_path)))
    at_set_up = run.compute.noise.std.clone()
    run.iteration = 10
    run.ledger = plan_against_ledger(run, tmp_path, lambda _: None)  # (adds no release)
    plan = run.ledger.plan
    assert plan.releases == 10 and plan.history == read_ledger(tmp_path / LEDGER)
    expected = torch.tensor(plan.noise_std(), dtype=torch.float64)
    torch.testing.assert_close(run.compute.noise.std, expected)
    assert not torch.equal(at_set_up, expected)
    resumed = _train(_digits(tmp_path), resume=True)
    privacy = resumed.summary["privacy"]
    assert privacy["releases"] == privacy["planned_releases"] == 10
    assert privacy["z"] == pytest.approx(max(p.z for p in plan.parties))
    assert privacy["ledger_releases"] == 30 and privacy["epsilon_before_run"] > 3.9
    for party in privacy["parties"]:
        for positive, key in ((True, "epsilon_positives"), (False, "epsilon_negatives")):
            truth = _segments_epsilon(tmp_path, party["party"], positive)
            assert party[key] == pytest.approx(truth, rel=0.01) and party[key] <= 8.0


def test_a_plan_the_remainder_cannot_pay_is_cut_and_the_run_ends_there(
    first_at_4, tmp_path, monkeypatch
):
    """With the largest multiplier lowered to 1.5 (so that a digits run reaches it), a second
    run whose 20 steps the remainder cannot pay at z <= 1.5 is cut: it says so, ends after the
    steps it affords with its summary written, and its ε (dp-accounting's composition of both
    runs' segments) stays within the budget."""
    from slate.training import accountant

    _after_first(first_at_4, tmp_path)
    monkeypatch.setattr(accountant, "Z_CEILING", 1.5)
    accountant._calibrate.cache_clear()  # (its results depend on the ceiling)
    lines: list[str] = []
    try:
        result = _train(_digits(tmp_path, eval_every=5), log=lines.append)
    finally:
        accountant._calibrate.cache_clear()
    privacy = result.summary["privacy"]
    cut = privacy["planned_releases"]
    assert 0 < cut < 20 and privacy["requested_releases"] == 20
    assert privacy["releases"] == cut and privacy["z"] <= 1.5
    assert result.history[-1]["iteration"] == cut  # (its last evaluation: the end)
    assert any(f"pays for {cut} of the 20 planned releases" in line for line in lines)
    written = json.loads((tmp_path / "summary.json").read_text())["privacy"]
    assert written["planned_releases"] == cut
    for party in privacy["parties"]:
        for positive, key in ((True, "epsilon_positives"), (False, "epsilon_negatives")):
            truth = _segments_epsilon(tmp_path, party["party"], positive)
            assert party[key] == pytest.approx(truth, rel=0.01) and party[key] <= 8.0


def test_the_command_line_refuses_a_spent_budget_before_the_first_step(tmp_path):
    """The second run of a folder whose budget is spent: one paragraph, exit code 2, no
    release (the ledger and the run folder's summary are unchanged)."""
    flags = ["train", "--dataset", "digits", "--nodes", "2", "--iterations", "10", "--lr",
             "0.05", "--dp-epsilon", "4", "--positives", "1", "--batch-size", "16",
             "--eval-every", "10", "--no-progress", "--no-party-ap", "--compile", "off",
             "--no-plots", "--out", tmp_path]  # fmt: skip
    assert slate_here(*flags).returncode == 0
    ledger, summary = (tmp_path / LEDGER).read_text(), (tmp_path / "summary.json").read_text()
    done = slate_here(*flags[:-2], "--dp-groups", "2", "--out", tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("slate: error: Refused under --dp-epsilon 4")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert (tmp_path / LEDGER).read_text() == ledger
    assert (tmp_path / "summary.json").read_text() == summary


def test_a_run_in_a_folder_with_an_old_ledger_is_refused_naming_its_line(tmp_path):
    """A ledger line of an earlier slate (z per chunk, no rates) is never guessed: the run is
    refused before its first step, one paragraph naming the file and the line, exit code 2."""
    old = {"from_iteration": 0, "steps": 300, "z": [3.7], "released": 300}
    (tmp_path / LEDGER).write_text(json.dumps({"format": 2, "opened": {}}) + "\n"
                                   + json.dumps(old) + "\n")  # fmt: skip
    done = slate_here("train", "--dataset", "digits", "--nodes", "2", "--iterations", "4",
                      "--dp-epsilon", "4", "--no-progress", "--compile", "off",
                      "--out", tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert f"The privacy ledger {tmp_path / LEDGER}, line 2, lacks the field 'format'" in (
        done.stderr
    )
    assert done.stderr.count("\n") == 1 and not (tmp_path / "summary.json").exists()


def test_the_test_seed_reproduces_sample_and_noise_and_secret_runs_differ():
    """Two runs under one test seed draw the same sample and noise; a secret run differs. (At
    epsilon 1 over 20 steps: the calibration's z is large, and its PLDs cheap to make: about
    0.5 s of CPU against 3 s at epsilon 8 over 4 steps. Two steps are taken either way.)"""
    config = resolve_and_check(_digits(None, dp_epsilon=1.0))
    runs = [Run(config, faults=FaultPlan(dp_test_seed=s)) for s in (3, 3, None)]
    for run in runs:
        run.advance(2)
    torch.testing.assert_close(runs[0].x, runs[1].x)
    assert not torch.equal(runs[0].x, runs[2].x)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"lr": "auto"}, "--lr auto"),
        ({"early_stopping": 2, "validation_fraction": 0.2}, "--early-stopping"),
        ({"standardize": True}, "--standardize"),
        (
            {"dataset": "csv", "train": "rows.csv", "label_column": "y", "standardize": False},
            "--dataset csv",
        ),
        ({"algorithm": "slate-m", "momentum": "storm"}, "--momentum storm"),
        ({"dp_epsilon": -1.0}, "--dp-epsilon must be a positive number"),
        ({"dp_delta": 1.0}, "--dp-delta must lie"),
        ({"dp_groups": 0}, "--dp-groups must be at least 1"),
    ],
)
def test_refusals_under_dp_epsilon(flags, words):
    with pytest.raises(ConfigError, match=words.replace("-", r"\-")) as refused:
        resolve_and_check(_digits(None, **flags))
    assert "\n" not in str(refused.value)


def test_slate_m_takes_the_ema_estimator_by_default_under_dp():
    assert resolve_and_check(_digits(None, algorithm="slate-m")).flags.momentum == "ema"


def test_batch_norm_the_test_seed_under_a_roster_and_tune_are_refused():
    with pytest.raises(ConfigError, match="BatchNorm"):
        refuse_batch_norm(torch.nn.Sequential(torch.nn.BatchNorm1d(3)), "resnet18")
    with pytest.raises(ConfigError, match="SLATE_DP_TEST_SEED"):
        FaultPlan(dp_test_seed=1).privacy_seed(under_roster=True)
    assert FaultPlan(dp_test_seed=1).privacy_seed(under_roster=False) == 1
    from slate.training.tune import tune

    with pytest.raises(ConfigError, match="slate tune"):
        tune(_digits(None))


def test_the_command_line_refuses_in_one_paragraph_with_exit_2(tmp_path):
    done = slate_here("train", "--dataset", "digits", "--dp-epsilon", "4", "--lr", "auto",
                      "--out", tmp_path / "run")  # fmt: skip
    assert done.returncode == 2
    assert "Refused under --dp-epsilon 4: --lr auto" in done.stderr
    assert "Traceback" not in done.stderr


def test_dpsgd_and_coda_clip_per_row_and_the_estimator_reports_epsilon():
    """D-PSGD's and CODA's losses are sums over rows: groups of one row, as many slots as the
    expected rows' rare highs; the estimator carries the guarantee in privacy_."""
    for algorithm in ("dpsgd", "coda"):  # (epsilon 1 over 20 steps: a cheap calibration)
        run = Run(resolve_and_check(_digits(None, algorithm=algorithm, dp_epsilon=1.0)))
        groups, size = run.compute.groups.groups, run.compute.groups.group_size
        assert size == 1 and groups > 8 * 16
        # The accountant composes the rates the sampler draws at: --dp-groups (8) groups'
        # expected rows, not one per slot (which overstated q about 20-fold, and so the noise).
        for (_, n_pos, n_neg), party in zip(run.private_sampling.counts, run.ledger.plan.parties,
                                            strict=True):  # fmt: skip
            drawn = sampling_rates(8, 16, 1, n_pos, n_neg)
            assert (party.q_pos, party.q_neg) == pytest.approx(drawn, rel=1e-12)
            assert drawn[0] < 0.5
        assert run.advance(2) == 2 and bool(torch.isfinite(run.x).all())
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 5)).astype(np.float32)
    y = (X[:, 0] + 0.5 * rng.normal(size=400) > 1.2).astype(int)
    model = SlateClassifier(n_parties=2, iterations=10, positives=1, batch_size=8,
                            dp_epsilon=1.0).fit(X, y)  # fmt: skip
    assert model.privacy_["epsilon_positives"] <= 1.0 and model.privacy_["releases"] == 10
    with pytest.raises(ValueError, match="standardize=True"):
        SlateClassifier(n_parties=2, iterations=10, dp_epsilon=5.0, standardize=True).fit(X, y)


@pytest.mark.processes
def test_both_engines_compute_the_same_guarantee(tmp_path):
    """The same run on the simulator and on two processes of the distributed engine: party
    0's rates, z and epsilons are equal (the mechanism and the accountant are shared code),
    and each process keeps its own ledger."""
    import sys

    flags = ["train", "--dataset", "digits", "--nodes", "2", "--iterations", "6", "--lr", "0.05",
             "--dp-epsilon", "4", "--positives", "1", "--batch-size", "8", "--eval-every", "6",
             "--no-progress", "--no-party-ap", "--no-plots"]  # fmt: skip
    assert slate_here(*flags, "--out", tmp_path / "sim").returncode == 0
    done = run_command(
        [sys.executable, "-m", "slate", *flags, "--out", str(tmp_path / "dist"), "--engine",
         "distributed", "--timeout", "30"], timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    simulated = json.loads((tmp_path / "sim" / "summary.json").read_text())["privacy"]
    distributed = json.loads((tmp_path / "dist" / "summary.json").read_text())["privacy"]
    assert distributed["parties"][0]["party"] == 0 and len(distributed["parties"]) == 1
    assert distributed["parties"][0] == simulated["parties"][0]
    assert distributed["releases"] == simulated["releases"] == 6
    assert sorted(p.name for p in (tmp_path / "dist").glob("privacy-ledger*")) == [
        "privacy-ledger-rank0.jsonl",
        "privacy-ledger-rank1.jsonl",
    ]
