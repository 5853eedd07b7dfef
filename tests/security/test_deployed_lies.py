"""What a site deploys passes checks on its own rows, against a liar running modified code.

Three roster sites with their own w7a files; the liar's process is slate with one function
replaced by a small program (:data:`PREAMBLE`), as a site that edited its copy of slate would run
it. Two lies in the final average keep AP and change what a site deploys (a shifted output bias;
a push on one input's weights): every honest site refuses the average, names the check and saves
its own model; the shifted bias also under ``--dp-epsilon``, where the noise floor raises the
bounds in force. A lie in the evaluation counts (positive test rows declared, planted and put in the
top score bin, the totals exact) shapes the pooled curve: ``slate predict --at-recall 0.9`` at an
honest site chooses on its own rows by default and still reaches its recall there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from slate.inference.predict import predict
from tests.sites import (
    HAVE_W7A,
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

#: Three sites (a liar and two honest sites; no check needs a fourth). Measured margins, two runs:
#: own recall 0.91 and 0.95 (>= 0.85), the pooled one 0.22-0.26 below it (> 0.05); under DP the
#: mean_logit bound in force 0.67-0.69 (< 1.0) against a change of 5.0.
SITES, LIAR, ROWS, ITERATIONS = 3, 1, 300, 50
HONEST = [r for r in range(SITES) if r != LIAR]
FLAGS = [*SITE_FLAGS, "--iterations", str(ITERATIONS), "--eval-every", "25"]

#: The liar's program: it replaces what it contributes to the averaged model at the last
#: evaluation (the model every site saves) by ``n T - (n - 1) x``, so the average becomes
#: ``T = push(x)``; ``PUSH`` is filled in per test.
PREAMBLE = """
import sys
import slate.faults.lies as lies

def lying(self, x, iteration, n, output):
    if iteration < {last} or output is None:
        return x
    target = x.clone()
    PUSH
    return n * target - (n - 1) * x

lies.Lies.mean_input = lying
from slate.cli import main; sys.exit(main(sys.argv[1:]))
"""
#: +5 on the output bias (the last number of the output layer's span): AP exactly unchanged.
BIAS = "target[:, output.stop - 1] += 5.0"
#: Input FEATURE's weights into every hidden unit pushed by 4 along that unit's output weight,
#: so that its rows score higher.
FEATURE = """w2 = x[0, output.start:output.stop - 1]
    hidden = w2.numel()
    first = target[0, : hidden * 300].view(hidden, 300)
    first[:, FEATURE] += 4.0 * w2.sign()"""

#: The liar's evaluation counts: every positive it holds moved into the top score bin (its
#: totals exact, so the sum matches what it declared).
TOP_BIN = """
import sys
import slate.training.evaluation as evaluation

honest = evaluation.binned_counts

def lying(logits, labels, bins):
    counts = honest(logits, labels, bins).clone()
    counts[1, -1] += counts[1].sum() - counts[1, -1]
    counts[1, :-1] = 0
    return counts

evaluation.binned_counts = lying
from slate.cli import main; sys.exit(main(sys.argv[1:]))
"""


#: Under --dp-epsilon (tests/data/test_public_ranges_runs.py's private flags): a short run.
DP_ITERATIONS = 20
DP_FLAGS = [*SITE_FLAGS, "--iterations", str(DP_ITERATIONS), "--eval-every", "10", "--dp-epsilon",
            "8", "--positives", "1", "--batch-size", "8", "--lr", "0.05"]  # fmt: skip


def liar_program(push: str, last: int = ITERATIONS) -> list[str]:
    code = PREAMBLE.format(last=last).replace("PUSH", push)
    return [sys.executable, "-c", code]


def run(
    root: Path, roster: Path, program: list[str], flags: list[str] = FLAGS
) -> list[tuple[int, str]]:
    port = free_port()
    parties = [
        start_party(root, r, port, "--nodes", str(SITES), *flags, *identity_flags(roster, r),
                    program=program if r == LIAR else None)
        for r in range(SITES)
    ]  # fmt: skip
    return finish(parties, timeout=120)


@pytest.fixture
def sites(tmp_path: Path) -> tuple[Path, Path]:
    write_sites(tmp_path, parties=SITES, rows=ROWS)
    return tmp_path, make_roster(tmp_path, SITES)


def own_labels(site: Path) -> np.ndarray:
    lines = (site / "test.svm").read_text().splitlines()
    return np.array([int(float(line.split()[0]) > 0) for line in lines])


def refused_by_all(outputs: list[tuple[int, str]], root: Path) -> list[dict]:
    """Every honest site exited 2 naming the failed check, with its own model and a full
    summary; their ``final_average`` records."""
    records = []
    for rank in HONEST:
        code, text = outputs[rank]
        assert code == 2, f"site {rank} exited {code}: {text[-2000:]}"
        line = [x for x in text.splitlines() if x.startswith("slate: error:")]
        assert len(line) == 1 and "refused the final average" in line[0], text[-2000:]
        summary = json.loads((root / f"site{rank}" / "run" / "summary.json").read_text())
        check = summary["final_average"]
        assert check["saved"] == "own model" and check["failed"], check
        assert all(name in line[0] for name in check["failed"])
        assert (root / f"site{rank}" / "run" / "model.pt").is_file()
        assert summary["state"] == "done" and summary["threshold_curve"]["source"] == "own"
        records.append(check)
    return records


@pytest.mark.processes
def test_a_shifted_output_bias_is_refused_by_every_honest_site(sites):
    """Before: AP unchanged, so every site kept an average whose every score was shifted."""
    root, roster = sites
    for check in refused_by_all(run(root, roster, liar_program(BIAS)), root):
        assert "mean_logit" in check["failed"] and "log_loss" in check["failed"]
        assert abs(check["average_ap_own_rows"] - check["own_model_ap_own_rows"]) < 0.05


@pytest.mark.processes
def test_under_dp_a_shifted_output_bias_is_still_refused_by_every_honest_site(sites):
    """Under --dp-epsilon each bound in force is the stated one plus twice the noise floor the
    site measured (slate.training.final_measures): the noise's random direction moves the mean
    logit by a few hundredths, the lie by 5, so the lie is still refused, and the refusal
    names the bound in force and why."""
    root, roster = sites
    outputs = run(root, roster, liar_program(BIAS, DP_ITERATIONS), DP_FLAGS)
    for check in refused_by_all(outputs, root):
        assert "mean_logit" in check["failed"] and check["noise_floor"] is not None
        mean = next(c for c in check["checks"] if c["name"] == "mean_logit")
        assert mean["stated_bound"] == 0.5 and 0.5 <= mean["bound"] < 1.0 < mean["change"]
    for rank in HONEST:
        assert "in force under --dp-epsilon" in outputs[rank][1]


def frequent_feature(root: Path, rank: int = 6) -> int:
    """The 0-based index of the ``rank``-th most frequent w7a feature in the sites' test rows."""
    counts = np.zeros(300)
    for r in HONEST:
        for line in (root / f"site{r}" / "test.svm").read_text().splitlines():
            for pair in line.split()[1:]:
                counts[int(pair.split(":")[0]) - 1] += 1
    return int(np.argsort(-counts, kind="stable")[rank])


@pytest.mark.processes
def test_a_push_on_one_inputs_weights_is_refused_by_every_honest_site(sites):
    root, roster = sites
    push = FEATURE.replace("FEATURE", str(frequent_feature(root)))
    refused_by_all(run(root, roster, liar_program(push)), root)


def plant_positives(site: Path, rows: int = 2 * ROWS - 30) -> None:
    """The liar's test file with ``rows`` more rows, its positive rows repeated: declared and
    planted, within what a site may plausibly declare (test rows at most three times its
    training rows)."""
    lines = (site / "test.svm").read_text().splitlines(keepends=True)
    positives = [line for line in lines if float(line.split()[0]) > 0]
    planted = [positives[k % len(positives)] for k in range(rows)]
    (site / "test.svm").write_text("".join(lines + planted))


@pytest.mark.processes
def test_a_lie_in_the_evaluation_counts_does_not_move_an_honest_sites_threshold(sites):
    """Before: the threshold came from the pooled curve, where the liar's planted positives in
    the top bin stand for most of the recall; an honest site then flagged fewer of its own."""
    root, roster = sites
    plant_positives(root / f"site{LIAR}")
    program = [sys.executable, "-c", TOP_BIN]
    outputs = run(root, roster, program)
    for rank in HONEST:
        code, text = outputs[rank]
        assert code == 0, f"site {rank} exited {code}: {text[-2000:]}"
        site = root / f"site{rank}"
        info = json.loads((site / "run" / "model.json").read_text())["threshold_curve"]
        assert info["source"] == "own" and info["pooled_file"] == "pr_curve_pooled.csv"
        labels = own_labels(site)
        recalls = {}
        for curve in (None, "pooled"):
            out = predict(site / "run", site / "test.svm", at_recall_of=0.9, curve=curve)
            recalls[curve] = float(out.decisions[labels == 1].mean())
        assert recalls[None] >= 0.85, recalls
        assert recalls["pooled"] < recalls[None] - 0.05, recalls  # the lie moves the pooled one
        assert torch.load(site / "run" / "model.pt", weights_only=True)  # the saved model


def test_the_planted_file_holds_more_positives(tmp_path):
    """(The helper itself: the liar's rows grow by positive rows only.)"""
    (tmp_path / "test.svm").write_text("+1 1:1\n-1 2:1\n+1 3:1\n-1 4:1\n")
    plant_positives(tmp_path, rows=5)
    planted = (tmp_path / "test.svm").read_text().splitlines()
    assert len(planted) == 9 and sum(line.startswith("+1") for line in planted) == 7
