"""A site on the roster that lies in a masked sum with MODIFIED CODE, on real processes: three
w7a sites with a roster, the liar's process started by a small program that monkeypatches slate
in that process only, then runs ``slate train``. Every honest site must name a lie in a sum
(never blame itself), exit 2, and keep its own model with a full ``summary.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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

SITES, LIAR = 3, 1
HONEST = [r for r in range(SITES) if r != LIAR]
FLAGS = [*SITE_FLAGS, "--iterations", "20", "--eval-every", "10"]
_MAIN = "\nfrom slate.cli import main\nsys.exit(main(sys.argv[1:]))\n"

# The liar changes what it adds to the evaluation's sum: riders[0] is its consensus-distance
# term, riders[1] its non-finite flag (slate.training.evaluation.Evaluator._evaluate).
_RIDERS = """
import sys
from slate.training import evaluation
original = evaluation.Evaluator._exchange
def lying(self, logits, iteration, riders):
    if riders is not None:
        riders = riders.clone()
        riders[{index}] = {value}
    return original(self, logits, iteration, riders)
evaluation.Evaluator._exchange = lying
"""
# The liar sends the next member a different masked contribution in the first evaluation sum.
_EQUIVOCATE = """
import sys
from slate.engines.distributed.wire import sealed_wire
original = sealed_wire.SealedWire.seal
done = []
def seal(self, tensor, peer):
    if self.kind == "evaluation" and not done and peer == (self.index + 1) % len(self.members):
        done.append(peer)
        tensor = tensor.clone()
        tensor[0] += 1
    return original(self, tensor, peer)
sealed_wire.SealedWire.seal = seal
"""
EQUIVOCATE = _EQUIVOCATE + _MAIN


def riders(index: int, value: str) -> str:
    return _RIDERS.format(index=index, value=value) + _MAIN


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sum-lies")
    write_sites(root, parties=SITES, rows=200)
    return root, make_roster(root, SITES)


def run_with_liar(sites: tuple[Path, Path], code: str, tmp: Path) -> list[tuple[int, str]]:
    """Every site's exit code and output; the liar's process runs ``code``."""
    root, roster = sites
    port = free_port()
    parties = [
        start_party(root, r, port, "--nodes", str(SITES), *FLAGS, "--out", str(tmp / f"run{r}"),
                    *identity_flags(roster, r),
                    program=[sys.executable, "-c", code] if r == LIAR else None)
        for r in range(SITES)
    ]  # fmt: skip
    return finish(parties, timeout=60)


def honest_sites_keep_their_own_model(outputs, tmp: Path, phrase: str) -> list[str]:
    """Every honest site exited 2 with one paragraph holding ``phrase`` and kept its own model
    with a full summary; their paragraphs."""
    lines = []
    for rank in HONEST:
        code, text = outputs[rank]
        assert code == 2, f"site {rank} exited {code}: {text[-2000:]}"
        assert "Traceback" not in text
        errors = [line for line in text.splitlines() if line.startswith("slate: error:")]
        assert len(errors) == 1 and phrase in errors[0], text[-2000:]
        assert f"Party {rank} kept its own model" in errors[0]
        run = tmp / f"run{rank}"
        assert (run / "model.pt").is_file()
        summary = json.loads((run / "summary.json").read_text())
        assert summary["state"] == "done"
        assert summary["final_average"]["saved"] == "own model"
        assert summary["test_ap"] == pytest.approx(summary["party_test_ap"][str(rank)])
        lines.append(errors[0])
    return lines


@pytest.mark.processes
@pytest.mark.parametrize(
    ("value", "phrase"),
    [("-1000.0", "negative"), ("1e30", "another site's evaluation holds a value")],
)
def test_a_lie_in_the_consensus_distance_is_named_and_every_site_keeps_its_model(
    sites, tmp_path, value, phrase
):
    """Before: a negative distance went into history.csv as the run's consensus distance; a
    value no masked sum carries (1e30) ended every site with no model.pt and no summary.json."""
    outputs = run_with_liar(sites, riders(0, value), tmp_path)
    for line in honest_sites_keep_their_own_model(outputs, tmp_path, phrase):
        assert "lie" in line or "lied" in line


@pytest.mark.processes
def test_a_raised_overflow_flag_is_never_blamed_on_the_honest_site(sites, tmp_path):
    """Before: every honest site stopped with 'the parameters of party R (itself) reach ...,
    try a lower --lr'."""
    outputs = run_with_liar(sites, riders(1, "1.0"), tmp_path)
    lines = honest_sites_keep_their_own_model(outputs, tmp_path, "another party's contribution")
    for rank, line in zip(HONEST, lines, strict=True):
        assert "Training diverged" not in line and f"party {rank} at" not in line
        assert "not this site" in line and "--lr" not in line


@pytest.mark.processes
def test_an_equivocating_sender_is_named_at_every_honest_site(sites, tmp_path):
    """Before: the member that got the other contribution ended with another total, and no
    check compared the totals."""
    outputs = run_with_liar(sites, EQUIVOCATE, tmp_path)
    phrase = f"Party {LIAR} sent different contributions to different members"
    for line in honest_sites_keep_their_own_model(outputs, tmp_path, phrase):
        assert "The masked sum of the evaluation was dropped" in line
