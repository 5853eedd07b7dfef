"""A site on the roster that lies in a sum, tried as an insider would, on real processes: three
sites with their own w7a files and a roster, one of them lying through ``SLATE_ATTACK``
(:mod:`slate.faults.lies`). Every honest site must either finish with a ``model.pt`` whose AP
on its own test file (``slate evaluate``) is the one its summary states, or stop with one
paragraph naming the failed check; never a summary that differs from its own model.
"""

from __future__ import annotations

import gzip
import json
import stat
import sys
from pathlib import Path

import pytest
import torch

from slate.cli import main
from tests.sites import (
    HAVE_W7A,
    SHARED,
    SITE_FLAGS,
    finish,
    free_port,
    identity_flags,
    make_roster,
    start_party,
    write_sites,
)

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo on Linux"),
    pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared"),
]

#: Three sites: each check is every honest site's own (a liar among them, two honest sites to
#: refuse it), and no check depends on a fourth.
SITES, LIAR = 3, 1
#: The final-average and evaluation runs: two evaluations, the liar acting at the first (planted
#: counts) or the last (the final average, the model every site saves).
ITERATIONS, EVERY = 50, 25
HONEST = [r for r in range(SITES) if r != LIAR]
FEATURES = 40  # CSV sites: the first 40 w7a features, a text column and a numeric one
CSV_FLAGS = ["--dataset", "csv", "--train", "train.csv", "--test", "test.csv", "--label-column",
             "label", "--positive-label", "1", "--out", "run", "--seed", "1", "--no-progress",
             "--no-plots",
             "--timeout", "30", "--checkpoint-every", "100"]  # fmt: skip


def write_csv_sites(root: Path, rows: int = 300) -> None:
    """Each site's CSV files: w7a's first features, ``ward`` (text, 5 wards) and ``lab``
    (numeric around 13, every 7th cell missing)."""
    header = [f"f{j}" for j in range(1, FEATURES + 1)] + ["ward", "lab", "label"]
    for source, name in (("w7a.gz", "train.csv"), ("w7a.t.gz", "test.csv")):
        with gzip.open(SHARED / "w7a" / source, "rt") as handle:
            lines = [line for line, _ in zip(handle, range(SITES * rows), strict=False)]
        for r in range(SITES):
            out = [",".join(header)]
            for k, line in enumerate(lines[r::SITES]):
                label, *pairs = line.split()
                dense = ["0"] * FEATURES
                for pair in pairs:
                    index, value = pair.split(":")
                    if int(index) <= FEATURES:
                        dense[int(index) - 1] = value
                lab = "" if k % 7 == 0 else f"{12 + (k % 5) * 0.5:.1f}"
                out.append(",".join([*dense, f"ward_{k % 5}", lab, str(int(float(label) > 0))]))
            (root / f"site{r}").mkdir(parents=True, exist_ok=True)
            (root / f"site{r}" / name).write_text("\n".join(out) + "\n")


def run_sites(root: Path, roster: Path, flags: list[str], monkeypatch, attack: str = ""):
    """The sites' exit codes and outputs, ``SLATE_ATTACK`` set to ``attack``."""
    monkeypatch.setenv("SLATE_ATTACK", attack)
    port = free_port()
    parties = [start_party(root, r, port, "--nodes", str(SITES), *flags,
                           *identity_flags(roster, r)) for r in range(SITES)]  # fmt: skip
    return finish(parties, timeout=180)


@pytest.fixture(scope="module")
def svm_sites(tmp_path_factory):
    """w7a sites (300 rows each) and their roster, shared by this module's runs."""
    root = tmp_path_factory.mktemp("svm")
    write_sites(root, parties=SITES, rows=300)
    return root, make_roster(root, SITES)


@pytest.fixture(scope="module")
def csv_sites(tmp_path_factory):
    root = tmp_path_factory.mktemp("csv")
    write_csv_sites(root)
    return root, make_roster(root, SITES)


def own_ap(site: Path) -> float:
    """``slate evaluate`` of the site's ``model.pt`` on its own test file."""
    out = site / "evaluated"
    code = main(["evaluate", "--run", str(site / "run"), "--data", str(site / "test.svm"),
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    return json.loads((out / "evaluation.json").read_text())["ap"]


def stops_naming(outputs, phrase: str) -> None:
    """Every honest site stopped with exit 2 and one paragraph holding ``phrase``."""
    for rank in HONEST:
        code, text = outputs[rank]
        assert code == 2, f"site {rank} exited {code}: {text[-2000:]}"
        assert "Traceback" not in text
        lines = [line for line in text.splitlines() if line.startswith("slate: error:")]
        assert len(lines) == 1 and phrase in lines[0], text[-2000:]


@pytest.mark.processes
def test_a_poisoned_final_average_is_refused_and_each_site_keeps_its_own_model(
    svm_sites, monkeypatch
):
    """Before: every summary said AP 0.6953 while every model.pt scored 0.0153 on its site's
    own test file, and nobody was named."""
    root, roster = svm_sites
    flags = [*SITE_FLAGS, "--iterations", str(ITERATIONS), "--eval-every", str(EVERY)]
    outputs = run_sites(root, roster, flags, monkeypatch, f"{LIAR}@{ITERATIONS}:final-poison")
    stops_naming(outputs, "refused the final average")
    for rank in HONEST:
        site = root / f"site{rank}"
        summary = json.loads((site / "run" / "summary.json").read_text())
        check = summary["final_average"]
        assert check["accepted"] is False and check["saved"] == "own model"
        assert check["average_ap_own_rows"] < check["own_model_ap_own_rows"] - check["bound"]
        # model.pt is the site's own model, and the summary states its AP on the own rows
        assert abs(own_ap(site) - summary["test_ap"]) < 1e-6
        assert summary["party_test_ap"][str(rank)] == pytest.approx(summary["test_ap"])


@pytest.mark.processes
def test_the_saved_model_is_the_evaluated_model(svm_sites, monkeypatch, tmp_path):
    """An honest run: every site accepts the average, and its model.pt scores on its own test
    file exactly the AP its summary gives for its own rows."""
    root, roster = svm_sites
    flags = [*SITE_FLAGS, "--iterations", str(ITERATIONS), "--eval-every", str(EVERY), "--out",
             str(tmp_path) + "/run{rank}"]  # fmt: skip
    outputs = run_sites(root, roster, flags, monkeypatch)
    for rank in range(SITES):
        code, text = outputs[rank]
        assert code == 0, text[-2000:]
        run = tmp_path / f"run{rank}"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["final_average"]["accepted"] is True
        out = tmp_path / f"evaluated{rank}"
        assert main(["evaluate", "--run", str(run), "--data",
                     str(root / f"site{rank}" / "test.svm"), "--out", str(out)]) == 0  # fmt: skip
        evaluated = json.loads((out / "evaluation.json").read_text())["ap"]
        assert abs(evaluated - summary["party_test_ap"][str(rank)]) < 1e-6
        assert abs(evaluated - summary["final_average"]["average_ap_own_rows"]) < 1e-6


@pytest.mark.processes
def test_planted_evaluation_counts_stop_every_site(svm_sites, monkeypatch):
    """Before: every site reported AP 0.9985 (positives planted) or 0.0170 (negatives), where
    the honest value was 0.6953. With ``--on-party-loss stop`` every site stops at the first
    planted evaluation."""
    root, roster = svm_sites
    flags = [*SITE_FLAGS, "--iterations", str(ITERATIONS), "--eval-every", str(EVERY),
             "--on-party-loss", "stop"]  # fmt: skip
    outputs = run_sites(root, roster, flags, monkeypatch, f"{LIAR}@{EVERY}:eval-deflate")
    stops_naming(outputs, f"The evaluation at iteration {EVERY} was refused")
    assert "20" in outputs[HONEST[0]][1] and "negative test rows" in outputs[HONEST[0]][1]


@pytest.mark.processes
def test_under_continue_planted_counts_are_dropped_and_the_average_refused(svm_sites, monkeypatch):
    """With ``--on-party-loss continue`` (the sites' default) the planted evaluations are
    dropped (NaN, a warning) and training goes on; the last one is the final average's, so every
    honest site keeps its own model and stops naming the counts."""
    root, roster = svm_sites
    flags = [*SITE_FLAGS, "--iterations", str(ITERATIONS), "--eval-every", str(EVERY)]
    outputs = run_sites(root, roster, flags, monkeypatch, f"{LIAR}@{EVERY}:eval-inflate")
    stops_naming(outputs, "final evaluation's counts broke the sites' declarations")
    for rank in HONEST:
        assert f"evaluation at iteration {EVERY} was dropped" in outputs[rank][1]
        site = root / f"site{rank}"
        summary = json.loads((site / "run" / "summary.json").read_text())
        assert [r["iteration"] for r in summary["refused_evaluations"]] == [EVERY, ITERATIONS]
        assert summary["final_average"]["saved"] == "own model"
        assert abs(own_ap(site) - summary["test_ap"]) < 1e-6


@pytest.mark.processes
@pytest.mark.parametrize(
    ("kind", "phrase"),
    [
        ("rows:1e9", "rows of the standardisation sums"),
        ("stats-scale:1e10", "a variance of"),
    ],
)
def test_lies_in_the_standardisation_sums_stop_every_site(svm_sites, monkeypatch, kind, phrase):
    """Before: rows x 1e9 took the AP from 0.7350 to 0.2618 with a warning blaming --lr; squares
    x 1e10 silenced the features (0.7350 to 0.6793)."""
    root, roster = svm_sites
    flags = [*SITE_FLAGS, "--iterations", "50", "--standardize"]
    outputs = run_sites(root, roster, flags, monkeypatch, f"{LIAR}@0:{kind}")
    stops_naming(outputs, phrase)
    assert all("participant lied" in outputs[r][1] for r in HONEST)


@pytest.mark.processes
@pytest.mark.parametrize(
    ("kind", "phrase"),
    [
        ("fake-categories", "category counts of column 'ward'"),
        ("impute:1e9", "imputation sums of column"),
        ("rows:3", "rows of the column statistics"),
    ],
)
def test_lies_in_a_tables_statistics_stop_every_site(csv_sites, monkeypatch, kind, phrase):
    """Before: 60 made-up categories of count 10^6 replaced the real ones in every site's
    encoder; 1e9 added to an imputation sum imputed 133 063 for a column whose mean is 13.1."""
    root, roster = csv_sites
    flags = [*CSV_FLAGS, "--iterations", "50", "--standardize"]
    outputs = run_sites(root, roster, flags, monkeypatch, f"{LIAR}@0:{kind}")
    stops_naming(outputs, phrase)


@pytest.mark.processes
def test_an_honest_table_run_passes_every_check(csv_sites, monkeypatch, tmp_path):
    root, roster = csv_sites
    flags = [*CSV_FLAGS, "--iterations", "50", "--standardize", "--out",
             str(tmp_path) + "/run{rank}"]  # fmt: skip
    outputs = run_sites(root, roster, flags, monkeypatch)
    for rank in range(SITES):
        assert outputs[rank][0] == 0, outputs[rank][1][-2000:]
        run = tmp_path / f"run{rank}"
        model = json.loads((run / "model.json").read_text())
        assert "ward" in json.dumps(model)
        # a site's folder and its files (set-up record, checkpoints, debug log) are private
        assert stat.S_IMODE(run.stat().st_mode) == 0o700
        files = [p for p in run.rglob("*") if p.is_file()]
        assert {p.name for p in files} >= {"model.pt", f"setup-rank{rank}.pt", "summary.json"}
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), files
    state = torch.load(tmp_path / "run0" / "model.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
