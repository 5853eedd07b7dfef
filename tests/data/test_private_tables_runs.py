"""Private runs on a public table (scikit-learn's bundled breast-cancer rows as CSV, with its
``--schema``): the ledger of a folder composes its whole history on a table as it does on
LIBSVM, and four roster sites on the distributed engine, one holding a planted row (area
4242.5, size ``planted-zz9``), exchange nothing that holds the planted value or category:
every payload each other site opened (:mod:`slate.faults.opened`), gossip included, searched
in every encoding (:mod:`tests.payloads`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slate.config import TrainConfig
from slate.training.accountant import LEDGER, PrivacyBudgetSpent, read_ledger
from slate.training.loop import train
from tests.data.test_private_tables import (
    PLANTED_CATEGORY,
    PLANTED_VALUE,
    write_schema,
    write_table,
)
from tests.payloads import holding
from tests.sites import finish, free_port, identity_flags, make_roster, start_party
from tests.training.test_privacy_runs import _pld

PARTIES, SITE = 4, 1
QUIET = dict(progress=False, figures=False, log=lambda _: None)  # (no test reads a figure)


def _composed(folder: Path, party: int, positive: bool) -> float:
    """dp-accounting's PLD composition (replace-one) of every segment of the folder's ledger
    (each segment's PLD made once per process: ``tests.training.test_privacy_runs._pld``)."""
    return _pld(*(s.event(party, positive) for s in read_ledger(folder / LEDGER)))


def _table_run(tmp_path: Path, out: Path, **flags) -> TrainConfig:
    values = dict(dataset="csv", train=str(tmp_path / "t.csv"), schema=str(tmp_path / "s.json"),
                  dp_epsilon=8.0, nodes=2, iterations=30, lr=0.05, positives=1, batch_size=16,
                  eval_every=10, checkpoint_every=10, party_ap=False, compile="off",
                  out=str(out))  # fmt: skip
    return TrainConfig(**{**values, **flags})


def test_a_table_s_ledger_composes_its_history_and_refuses_a_spent_budget(tmp_path):
    """Run 1 at ε 4 with 8 groups, run 2 in the folder at ε 8 with 4 groups (ε the
    composition of both runs' segments, within 1% of dp-accounting's, never above 8), then a
    third run with 2 groups: refused before its first step, the ledger unchanged."""
    write_table(tmp_path / "t.csv", np.arange(569))
    write_schema(tmp_path / "s.json")
    out = tmp_path / "run"
    train(_table_run(tmp_path, out, dp_epsilon=4.0), **QUIET)
    second = train(_table_run(tmp_path, out, dp_groups=4), **QUIET)
    privacy = second.summary["privacy"]
    assert privacy["ledger_releases"] == 60 and 7.9 < privacy["epsilon"] <= 8.0
    for party in privacy["parties"]:
        for positive, key in ((True, "epsilon_positives"), (False, "epsilon_negatives")):
            truth = _composed(out, party["party"], positive)
            assert party[key] == pytest.approx(truth, rel=0.01) and party[key] <= 8.0
    ledger = (out / LEDGER).read_text()
    with pytest.raises(PrivacyBudgetSpent, match="No step was taken"):
        train(_table_run(tmp_path, out, dp_groups=2), **QUIET)
    assert (out / LEDGER).read_text() == ledger


def _write_sites(root: Path) -> list[str]:
    """Site r's train.csv and test.csv: every 4th row of the table's first and last parts; site
    1's training file holds the planted row. The flags every site runs with."""
    write_schema(root / "schema.json")
    train_rows, test_rows = np.arange(0, 440), np.arange(440, 569)
    for r in range(PARTIES):
        site = root / f"site{r}"
        site.mkdir()
        write_table(site / "train.csv", train_rows[r::PARTIES], plant=r == SITE)
        write_table(site / "test.csv", test_rows[r::PARTIES])
    return ["--dataset", "csv", "--train", "train.csv", "--test", "test.csv", "--schema",
            str(root / "schema.json"), "--nodes", str(PARTIES), "--dp-epsilon", "8",
            "--iterations", "6", "--eval-every", "3", "--topology", "ring", "--positives", "1",
            "--batch-size", "8", "--lr", "0.05", "--out", "run", "--seed", "1",
            "--no-progress", "--timeout", "30", "--checkpoint-every", "100",
            "--no-plots"]  # fmt: skip


@pytest.mark.processes
def test_a_planted_cell_and_category_reach_no_other_site_under_dp(tmp_path):
    flags = _write_sites(tmp_path)
    roster = make_roster(tmp_path, PARTIES)
    env = {"SLATE_RECORD_OPENED": str(tmp_path / "opened")}
    port = free_port()
    parties = [start_party(tmp_path, r, port, *flags, *identity_flags(roster, r), env=env)
               for r in range(PARTIES)]  # fmt: skip
    done = finish(parties, timeout=240)
    for rank, (code, text) in enumerate(done):
        assert code == 0, f"site {rank}: {text[-3000:]}"
    opened = tmp_path / "opened"
    kinds = {p.stem.split("-", 2)[2] for p in opened.glob("rank*/*.bin")}
    assert {"gossip", "gathered", "evaluation"} <= kinds, kinds  # gossip and set-up recorded
    assert holding(opened, PLANTED_VALUE, SITE) == []
    assert holding(opened, PLANTED_CATEGORY, SITE) == []
    # the search finds what is there: the public ranges every site declares
    assert holding(opened, 2510.0, SITE) != []
    # the planted site says (to itself) that it clipped the cell; no other site mentions it
    assert "clipped" in done[SITE][1] and "4242.5" in done[SITE][1]
    for rank in set(range(PARTIES)) - {SITE}:
        assert "4242.5" not in done[rank][1] and PLANTED_CATEGORY not in done[rank][1]
    summary = json.loads((tmp_path / "site0" / "run" / "summary.json").read_text())
    assert 0 < summary["privacy"]["epsilon"] <= 8.0
