"""The accountant and its ledger of mechanisms (:mod:`slate.training.accountant`), against
``dp-accounting`` called here directly: the neighbouring relation, the composition of
heterogeneous segments, a plan made against a recorded history (calibrated, cut, or refused
before its first step), and ledgers that cannot be composed (refused, naming file and line)."""

from __future__ import annotations

import json
from dataclasses import replace

import dp_accounting as dpa
import pytest
from dp_accounting.pld import pld_privacy_accountant

from slate.errors import SlateError
from slate.training.accountant import (
    LEDGER,
    MIN_SHARE,
    RELATION,
    Z_CEILING,
    PrivacyBudgetSpent,
    PrivacyLedger,
    PrivacyLedgerInvalid,
    _epsilon,
    calibrate,
    epsilon_pld,
    folder_history,
    plan_privacy,
    read_ledger,
)
from slate.training.ledger_file import sensitivity_of
from tests.training.test_privacy_runs import _pld

DELTA = 1e-5
COUNTS = [(0, 40, 900)]  # one party: 40 positives, 900 negatives


def _event(q: float, z: float, steps: int):
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)


def _composed(events, relation=dpa.NeighboringRelation.REPLACE_ONE) -> float:
    """dp-accounting's PLD accountant at its own default (finer) discretisation, not slate's.

    Under replace-one, the accountant's own steps with each segment's PLD made once per test
    process (``tests.training.test_privacy_runs._pld``, the accountant's ε bit for bit, checked
    there): the tests here compose the same segments again, and making one costs seconds."""
    if relation == dpa.NeighboringRelation.REPLACE_ONE:
        return _pld(*events, delta=DELTA)
    accountant = pld_privacy_accountant.PLDAccountant(relation)
    accountant.compose(dpa.ComposedDpEvent([_event(q, z, n) for q, z, n in events]))
    return accountant.get_epsilon(DELTA)


def _plan(groups: int = 8, releases: int = 30, epsilon: float = 8.0, history=(), ledger=None):
    return plan_privacy(epsilon, DELTA, 1.0, groups, 10, "group", releases, COUNTS, 16, 1,
                        history=history, ledger=ledger)  # fmt: skip


def test_the_relation_is_replace_one_and_doubles_epsilon_at_equal_z():
    """ε is dp-accounting's under REPLACE_ONE (not ADD_OR_REMOVE_ONE): about twice the
    add/remove ε for the same z, as the design expected."""
    schedule = [(0.2, 3.0, 200)]
    ours = epsilon_pld(schedule, DELTA)
    assert ours == pytest.approx(_composed(schedule), rel=0.01)
    add_remove = _composed(schedule, dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    assert 1.6 * add_remove < ours < 2.4 * add_remove
    assert RELATION == "replace-one row within its class"


@pytest.mark.parametrize("interval", [1e-3, 1e-2])  # DISCRETISATION and the coarse bracket's
def test_the_composition_is_pld_accountants_bit_for_bit(interval):
    """slate composes each segment's PLD (made once per process) onto the identity in order;
    that is what ``PLDAccountant(REPLACE_ONE)`` does with the same events at the same
    discretisation, and gives its ε exactly, for one segment and for histories of several, a
    second call (from the caches) included."""
    histories = [((0.2, 3.0, 200),),
                 ((0.05, 1.01, 205), (0.05, 4.14, 281)),
                 ((0.2, 1.96, 38), (0.5, 2.68, 52), (1.0, 4.94, 273))]  # fmt: skip
    for events in histories:
        accountant = pld_privacy_accountant.PLDAccountant(
            dpa.NeighboringRelation.REPLACE_ONE, value_discretization_interval=interval
        )
        accountant.compose(dpa.ComposedDpEvent([_event(*e) for e in events]))
        truth = accountant.get_epsilon(DELTA)
        assert _epsilon(events, DELTA, interval) == truth
        _epsilon.cache_clear()  # (the segments' PLDs stay cached)
        assert _epsilon(events, DELTA, interval) == truth


def test_heterogeneous_segments_compose_as_dp_accounting_does():
    """Two segments with other rates and multipliers: the ledger's ε for a positive and a
    negative row is dp-accounting's composition of both segments (within 1%), larger than
    either alone, and larger than the old count-based ledger's (old releases at the new q)."""
    first = _plan(groups=32, releases=40, epsilon=6.0)
    later = _plan(groups=8, releases=60, epsilon=9.0, history=(first.segment(0, 40),))
    ledger = PrivacyLedger(later)
    assert ledger.admit(40, 60) == (60, None)
    summary = ledger.summary()
    a, b = first.parties[0], later.parties[0]
    assert (a.q_pos, b.q_pos) == pytest.approx((0.8, 0.2)) and a.z != b.z
    for key, (qa, qb) in (("epsilon_positives", (a.q_pos, b.q_pos)),
                          ("epsilon_negatives", (a.q_neg, b.q_neg))):  # fmt: skip
        truth = _composed([(qa, a.z, 40), (qb, b.z, 60)])
        assert summary[key] == pytest.approx(truth, rel=0.01)
        assert truth > max(_composed([(qa, a.z, 40)]), _composed([(qb, b.z, 60)]))
    assert summary["epsilon"] <= 9.0
    recounted = _composed([(b.q_pos, a.z, 40), (b.q_pos, b.z, 60)])  # the old ledger's bug
    assert summary["epsilon_positives"] > recounted + 0.1
    assert summary["releases"] == 60 and summary["ledger_releases"] == 100
    assert summary["epsilon_before_run"] == pytest.approx(_composed([(a.q_pos, a.z, 40)]),
                                                          rel=0.01)  # fmt: skip


def test_a_run_is_planned_against_what_the_history_left(tmp_path):
    """z of the new plan is the smallest that keeps history + plan within the budget, by
    dp-accounting directly: 1% less noise would exceed it."""
    first = _plan(groups=16, releases=20, epsilon=5.0)  # (a run under a smaller budget)
    history = (first.segment(0, 20),)
    plan = _plan(groups=8, releases=50, epsilon=8.0, history=history)
    p, h = plan.parties[0], first.parties[0]
    assert plan.releases == plan.requested == 50 and plan.note is None
    total = _composed([(h.q_pos, h.z, 20), (p.q_pos, p.z, 50)])
    assert total <= 8.0 * 1.01
    assert _composed([(h.q_pos, h.z, 20), (p.q_pos, 0.99 * p.z, 50)]) > 8.0
    assert p.z > calibrate(p.q_pos, 50, 8.0, DELTA)  # more noise than on a fresh ledger


def test_a_spent_budget_is_refused_before_the_first_step(tmp_path):
    """A history that spent the budget: the plan is refused with one paragraph (a SlateError,
    so the command line prints it and exits 2), and the ledger gets no line."""
    first = _plan(groups=32, releases=30)
    ledger = PrivacyLedger.open(first, tmp_path, None)
    assert ledger.admit(0, 30) == (30, None)
    lines = (tmp_path / LEDGER).read_text()
    history = read_ledger(tmp_path / LEDGER)
    assert epsilon_pld([s.event(0, True) for s in history], DELTA) > 8.0 * (1 - MIN_SHARE)
    with pytest.raises(PrivacyBudgetSpent) as refused:
        _plan(groups=8, releases=600, history=history, ledger=tmp_path / LEDGER)
    message = str(refused.value)
    assert isinstance(refused.value, SlateError) and "\n" not in message
    assert str(tmp_path / LEDGER) in message and "No step was taken" in message
    assert (tmp_path / LEDGER).read_text() == lines


def test_a_plan_the_remainder_cannot_pay_is_cut_and_says_so():
    """Where the remainder pays for the planned steps only above z = Z_CEILING, the plan is
    cut to the steps it affords; the ledger admits exactly those and stops the run there."""
    first = _plan(groups=8, releases=25, epsilon=7.5)
    history = (first.segment(0, 25),)
    plan = _plan(groups=32, releases=100_000, history=history)
    assert 0 < plan.releases < 100_000 and plan.requested == 100_000
    assert f"pays for {plan.releases} of the 100000 planned releases" in plan.note
    assert plan.parties[0].z <= Z_CEILING
    h, p = first.parties[0], plan.parties[0]
    assert _composed([(h.q_pos, h.z, 25), (p.q_pos, p.z, plan.releases)]) <= 8.0 * 1.01
    ledger = PrivacyLedger(plan)
    steps, stop_at = ledger.admit(25, 100_000)
    assert plan.releases <= steps < 100_000 and stop_at == 25 + steps
    assert epsilon_pld(ledger.events(0, True), DELTA) <= 8.0


def test_the_ledger_stops_at_the_last_release_within_the_budget(tmp_path):
    """Past the planned releases (re-runs), the ledger admits exactly the releases whose ε
    stays within the budget, recorded before they are made and read back by a new opening."""
    plan = _plan()
    ledger = PrivacyLedger.open(plan, tmp_path, None)
    assert ledger.admit(0, 20) == (20, None)
    q, z = plan.parties[0].q, plan.parties[0].z
    steps, stop_at = ledger.admit(20, 200)  # (10 planned, then re-runs)
    total = 20 + steps
    assert stop_at == total and steps >= 10
    assert epsilon_pld([(q, z, total)], DELTA) <= 8.0 < epsilon_pld([(q, z, total + 1)], DELTA)
    segments = read_ledger(tmp_path / LEDGER)
    assert [(s.start, s.steps) for s in segments] == [(0, 20), (20, steps)]
    segment = segments[0]
    assert (segment.clip, segment.sensitivity, segment.clipping_unit) == (1.0, 2.0, "group")
    assert segment.relation == RELATION
    assert segment.parties[0].noise_std == pytest.approx(2.0 * z)
    message = ledger.exhausted_message(total)
    assert f"records {total} releases" in message and str(tmp_path / LEDGER) in message


def _segment_line(tmp_path) -> dict:
    ledger = PrivacyLedger.open(_plan(), tmp_path, None)
    ledger.admit(0, 10)
    return json.loads((tmp_path / LEDGER).read_text().splitlines()[1])


def test_an_old_ledger_or_a_missing_field_is_refused_naming_file_and_line(tmp_path):
    """A ledger line of an earlier slate (z per release, no rates) and a segment without its
    z are refused, never guessed; the message names the file, the line and the field."""
    old = tmp_path / "old" / LEDGER
    old.parent.mkdir()
    old.write_text(
        json.dumps({"opened": {"epsilon": 8}})
        + "\n"
        + json.dumps({"from_iteration": 0, "steps": 300, "z": [3.7], "released": 300})
        + "\n"
    )
    with pytest.raises(PrivacyLedgerInvalid, match=r"old/privacy-ledger.jsonl, line 1, lacks "):
        read_ledger(old)
    line = _segment_line(tmp_path)
    for field, where in (("z", "parties"), ("relation", None), ("steps", None)):
        broken = json.loads(json.dumps(line))
        del (broken["segment"]["parties"][0] if where else broken["segment"])[field]
        path = tmp_path / field / LEDGER
        path.parent.mkdir()
        path.write_text(json.dumps({"format": 2, "opened": {}}) + "\n" + json.dumps(broken) + "\n")
        with pytest.raises(PrivacyLedgerInvalid) as refused:
            read_ledger(path)
        assert f"{path}, line 2, lacks the field '{field}'" in str(refused.value)
        assert "\n" not in str(refused.value)
    odd = json.loads(json.dumps(line))
    odd["segment"]["parties"][0]["noise_std"] *= 0.5  # not 2C z
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / LEDGER).write_text(json.dumps(odd) + "\n")
    with pytest.raises(PrivacyLedgerInvalid, match="not its sensitivity times z"):
        read_ledger(tmp_path / "odd" / LEDGER)


def test_a_history_of_other_parties_is_refused(tmp_path):
    """Releases recorded for another deal of the rows (other parties or class sizes) cannot be
    composed with this run's: refused."""
    history = (replace(_plan().segment(0, 10)),)
    with pytest.raises(PrivacyLedgerInvalid, match="rows are dealt otherwise"):
        plan_privacy(8.0, DELTA, 1.0, 8, 10, "group", 30, [(0, 41, 899)], 16, 1,
                     history=history, ledger=tmp_path / LEDGER)  # fmt: skip


def test_a_folder_with_the_other_engines_ledger_is_refused(tmp_path):
    """The simulator's ledger beside a site's (or the reverse) records releases of the same
    rows that one process cannot tell apart: refused. Sites of one run share a folder."""
    ledger = PrivacyLedger.open(_plan(), tmp_path, None)  # the simulator's
    ledger.admit(0, 5)
    with pytest.raises(PrivacyLedgerInvalid, match=r"privacy-ledger\.jsonl besides this"):
        folder_history(tmp_path, 1)
    assert [s.steps for s in folder_history(tmp_path, None)] == [5]
    site = tmp_path / "site"
    for rank in (0, 1):
        PrivacyLedger.open(_plan(), site, rank).admit(0, 3)
    assert [s.steps for s in folder_history(site, 1)] == [3]
    with pytest.raises(PrivacyLedgerInvalid, match=r"privacy-ledger-rank0\.jsonl besides this"):
        folder_history(site, None)


def test_rows_are_noised_for_a_shift_of_c_and_groups_for_2c(tmp_path):
    """Groups of one row (D-PSGD, CODA): a slot without the row holds nothing and the row's
    clipped gradient lies in the ball of radius C, so one draw shifts the sum by C at most; a
    larger group's clipped gradient without the row lies in that ball too, so 2C. The noise is
    the sensitivity times z, and a ledger that records the other unit's sensitivity is
    refused."""
    clip = 1.5
    assert sensitivity_of("row", clip) == clip and sensitivity_of("group", clip) == 2 * clip
    rows = plan_privacy(8.0, DELTA, clip, 175, 1, "row", 30, COUNTS, 16, 1)
    groups = plan_privacy(8.0, DELTA, clip, 8, 10, "group", 30, COUNTS, 16, 1)
    assert rows.noise_std() == pytest.approx((clip * rows.parties[0].z,), rel=1e-12)
    assert groups.noise_std() == pytest.approx((2 * clip * groups.parties[0].z,), rel=1e-12)
    line = {"format": 2, "segment": rows.segment(0, 5).to_json()}
    path = tmp_path / LEDGER
    path.write_text(json.dumps(line) + "\n")
    assert read_ledger(path)[0].sensitivity == clip
    line["segment"]["sensitivity"] = 2 * clip
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(PrivacyLedgerInvalid, match=r"other than C for C = 1\.5 and the unit 'row'"):
        read_ledger(path)
