"""A site on the roster that declares rows it does not hold, with MODIFIED CODE: four w7a
sites, the liar's process started by a small program that changes the counts its schema
declares, then runs ``slate train`` (its own check names it too: a liar that skips it only
keeps the honest sites waiting for it until its next sum fails).
Every honest site must name it at set-up (exit 2); the rules pass honest uneven partitions;
the clamp of the federated scaling bounds what a lie within the rules can steer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from slate.data.declared import Declared
from slate.data.partition import dirichlet_partition, stratified_partition
from slate.data.plausible import SetupBounds, bound_moments, plausibility_problems
from slate.data.preprocess import Standardizer
from slate.data.schema import PartyCounts
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

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo on Linux")
SITES, LIAR = 4, 3
HONEST = [r for r in range(SITES) if r != LIAR]

_LIE = """
import sys
from slate.data import schema
original = schema.Schema.to_json
def lying(self):
    raw = original(self)
    raw["counts"] = dict(raw["counts"], {counts})
    return raw
schema.Schema.to_json = lying
from slate.cli import main
sys.exit(main(sys.argv[1:]))
"""


def honest_counts(parts: list[np.ndarray], labels: np.ndarray, seed: int) -> list[PartyCounts]:
    """Each site's rows split 75/25 into training and test rows, class by class, at random."""
    rng = np.random.default_rng(seed)
    counts = []
    for part in parts:
        positives = int(labels[part].sum())
        negatives = len(part) - positives
        test_pos, test_neg = rng.binomial(positives, 0.25), rng.binomial(negatives, 0.25)
        counts.append(PartyCounts(train=len(part) - test_pos - test_neg,
                                  train_positives=positives - test_pos,
                                  test=test_pos + test_neg, test_positives=test_pos))  # fmt: skip
    return counts


W7A_LABELS = np.r_[np.ones(740, int), np.zeros(23952, int)]  # w7a: 24 692 rows, 3.0% positive


@pytest.mark.parametrize("sites", [20, 10])
def test_honest_uneven_partitions_pass_the_plausibility_rules(sites):
    """Dirichlet (alpha 0.5) and stratified splits of w7a-sized data, 50 seeds each."""
    for seed in range(50):
        for parts in (dirichlet_partition(W7A_LABELS, sites, 0.5, seed),
                      stratified_partition(W7A_LABELS, sites, seed)):  # fmt: skip
            counts = honest_counts(parts, W7A_LABELS, seed)
            assert plausibility_problems(counts) == {}, (seed, counts)


def test_the_measured_lies_break_a_rule_and_name_their_site():
    honest = [PartyCounts(6173, 185, 6264, 190)] * 3
    planted = [*honest, PartyCounts(6173, 185, 40000, 39000)]
    problems = plausibility_problems(planted)
    assert list(problems) == [3] and len(problems[3]) == 2  # test_ratio, rate
    deflated = [*honest, PartyCounts(6173, 185, 40000, 0)]
    assert list(plausibility_problems(deflated)) == [3]
    million = [*honest, PartyCounts(1_000_000, 30000, 6264, 190)]
    assert "share" in " ".join(plausibility_problems(million)[3])
    assert plausibility_problems(million, SetupBounds.parse("share=1000")) == {}


def test_a_steered_variance_is_clamped_by_the_sites_own_rows():
    """A liar within the share rule (40 times a site's rows) steers two features' variance to
    1e-6; the site's scaling stays within 20 times its own std, and it says so."""
    rng = np.random.default_rng(0)
    own = (rng.random((500, 5)) < 0.3).astype(np.float64)
    rows = 500 * 40

    def total(value: torch.Tensor, what: str = "") -> torch.Tensor:
        lie = torch.zeros_like(value)
        if what == "standardisation sums":
            lie[0], lie[1:] = rows, 0.3 * rows
        else:
            mean = (value.new_tensor(own.sum(0)) + 0.3 * rows) / (500 + rows)
            lie[:] = (0.3 - mean) ** 2 * rows + 0.21 * rows
            lie[:2] = 1e-6 * (500 + rows) - value[:2]
        return value + lie

    declared = Declared.of([PartyCounts(500, 150), PartyCounts(rows, 6000)],
                           [{"": [0.0, 1.0]}] * 2, scale_bound=20.0)  # fmt: skip
    fitted = Standardizer.fit([own], total, centre=False, declared=declared)
    own_std = own.std(axis=0)
    assert np.all(fitted.scale >= own_std / 20 - 1e-12)
    assert fitted.scale[2:] == pytest.approx(np.sqrt(0.21 + 0.0), rel=0.1)
    assert len(declared.notes) == 1 and "(index 0, 1)" in declared.notes[0]
    _, std, note = bound_moments([own], own.mean(0), own.std(0), 20.0)
    assert note is None and np.array_equal(std, own.std(0))


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> tuple[Path, Path]:
    if not HAVE_W7A:
        pytest.skip("w7a not in shared")
    root = tmp_path_factory.mktemp("declared-lies")
    write_sites(root, parties=SITES, rows=200)
    return root, make_roster(root, SITES)


def run_with_liar(sites: tuple[Path, Path], counts: str, tmp: Path) -> list[tuple[int, str]]:
    """Every honest site's exit code and output; the liar declares ``counts`` (a dict's items)
    and is stopped once every honest site has ended."""
    root, roster = sites
    port = free_port()
    program = [sys.executable, "-c", _LIE.format(counts=counts)]
    parties = [
        start_party(root, r, port, "--nodes", str(SITES), *SITE_FLAGS, "--iterations", "20",
                    "--standardize", "--out", str(tmp / f"run{r}"), "--timeout", "10",
                    *identity_flags(roster, r),
                    program=program if r == LIAR else None)
        for r in range(SITES)
    ]  # fmt: skip
    outputs = finish(parties[:LIAR] + parties[LIAR + 1 :], timeout=60)
    parties[LIAR].kill()
    finish([parties[LIAR]], timeout=10)
    return outputs


def named_at_set_up(outputs: list[tuple[int, str]], rule: str) -> None:
    for rank, (code, text) in zip(HONEST, outputs, strict=True):
        assert code == 2, f"site {rank} exited {code}: {text[-2000:]}"
        assert "Traceback" not in text
        errors = [line for line in text.splitlines() if line.startswith("slate: error:")]
        assert len(errors) == 1, text[-2000:]
        assert "Implausible row counts" in errors[0] and f"party {LIAR} declared" in errors[0]
        assert rule in errors[0] and "nothing was trained" in errors[0]


@LINUX
@pytest.mark.processes
def test_planted_test_rows_and_a_million_training_rows_are_named_at_set_up(sites, tmp_path):
    """Before: 40 000 planted test rows (39 000 positive) moved the pooled AP at every site
    from 0.715 to 0.998; 1 000 000 training rows with consistent standardisation sums moved
    the AP from 0.707 to 0.661. One liar declares both (one run of processes)."""
    lie = "train=1000000, train_positives=30000, test=40000, test_positives=39000"
    outputs = run_with_liar(sites, lie, tmp_path)
    named_at_set_up(outputs, "1000000 training rows")
    named_at_set_up(outputs, "(39000 of 40000)")


def test_the_headline_is_the_sites_own_ap_with_the_pooled_ap_labelled_beside_it():
    from types import SimpleNamespace

    from slate.training.evaluation import TestScores
    from slate.training.outputs import headline, headline_text

    counts = [PartyCounts(100, 3, 100, 3)] * 3 + [PartyCounts(100, 3, 40000, 39000)]
    run = SimpleNamespace(data=SimpleNamespace(counts=counts, federated=True, validated=False),
                          party_set=SimpleNamespace(members=[0, 1, 2, 3], party_events=[]),
                          validated=False)  # fmt: skip
    found = headline(run, [0.7], TestScores({"test_ap": 0.998}))
    assert found["own_test_ap"] == 0.7 and found["headline_ap"] == "own"
    assert found["pooled_test_ap"] == 0.998
    assert found["pooled_test_shares"]["3"] == pytest.approx(40000 / 40300)
    text = headline_text(found)
    assert text.startswith("AP 0.7000 on this site's own test rows (the headline); pooled AP "
                           "0.9980") and "site 3 99%" in text  # fmt: skip
    assert headline(run, [0.7, 0.6], TestScores({"test_ap": 0.9}))["headline_ap"] == "pooled"
