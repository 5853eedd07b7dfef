"""Masked sums in a real 3-site run under a roster: no message any site opened holds another
site's own statistics, counts or model, and the run's outputs are those of the same run with
its sums sent unmasked (``SLATE_UNMASKED_SUMS``, the comparison switch), whose messages do hold
them: the check can fail."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    finish,
    free_port,
    identity_flags,
    make_roster,
    serve,
    slate_here,
    start_party,
    write_sites,
)

pytestmark = pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")

FLAGS = ["--nodes", "3", *SITE_FLAGS, "--iterations", "30", "--topology", "ring",
         "--standardize"]  # fmt: skip
TRAIN_ROWS, TEST_ROWS, PLANTED = 271, 233, 4242.5  # site 1's unusual counts and its column


def plant(site: Path) -> None:
    """Site 1 keeps 271 training and 233 test rows, and its feature 300 is 4242.5 on every
    training row (so its standardisation sums hold 271.0 and 4242.5 * 271 in float64)."""
    lines = (site / "train.svm").read_text().splitlines()[:TRAIN_ROWS]
    planted = []
    for line in lines:
        label, *cells = line.split()
        cells = [c for c in cells if not c.startswith("300:")] + [f"300:{PLANTED}"]
        planted.append(" ".join([label, *cells]))
    (site / "train.svm").write_text("\n".join(planted) + "\n")
    tests = (site / "test.svm").read_text().splitlines()[:TEST_ROWS]
    (site / "test.svm").write_text("\n".join(tests) + "\n")


def run(root: Path, unmasked: bool) -> list[tuple[int, str]]:
    write_sites(root, parties=3, rows=300)
    plant(root / "site1")
    roster = make_roster(root, 3)
    env = {"SLATE_RECORD_OPENED": str(root / "opened")}
    if unmasked:
        env["SLATE_UNMASKED_SUMS"] = "1"
    port = free_port()
    parties = [
        start_party(root, r, port, *FLAGS, *identity_flags(roster, r), env=env) for r in range(3)
    ]
    return finish(parties, timeout=120)


def count_prefix(payload: bytes, rows: int) -> bool:
    """Whether ``payload`` read as float64 starts with non-negative integers (an evaluation's
    per-bin counts) of which some prefix sums to ``rows``."""
    if len(payload) % 8:
        return False
    values = np.frombuffer(payload, dtype="<f8")
    total = 0.0
    for v in values:
        if not (np.isfinite(v) and v >= 0 and v == int(v)):
            return False
        total += v
        if total == rows:
            return True
    return False


def entropy(data: bytes) -> float:
    frequency = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256) / len(data)
    frequency = frequency[frequency > 0]
    return float(-(frequency * np.log2(frequency)).sum())


def revealed(opened: Path) -> dict[str, list[str]]:
    """Per kind of check, the payloads from site 1 that show one of its own values."""
    rows, column = np.float64(TRAIN_ROWS).tobytes(), np.float64(PLANTED * TRAIN_ROWS).tobytes()
    found: dict[str, list[str]] = {"statistics": [], "evaluation": [], "average": []}
    for path in sorted(opened.glob("rank*/from1-*.bin")):
        payload, kind = path.read_bytes(), path.stem.split("-", 2)[2]
        if kind == "gossip":
            continue  # a neighbour's model each round: disclosed by design
        if rows in payload or column in payload:
            found["statistics"].append(path.name)
        if count_prefix(payload, TEST_ROWS):
            found["evaluation"].append(path.name)
        if kind == "average" and entropy(payload) < 7.5:
            found["average"].append(path.name)
    return found


def outputs(root: Path, rank: int) -> tuple[dict, dict]:
    run_dir = root / f"site{rank}" / "run"
    state = torch.load(run_dir / "model.pt", weights_only=False)
    tensors = state if isinstance(state, dict) else {"x": state}
    model = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    return model, json.loads((run_dir / "summary.json").read_text())


@pytest.mark.processes
def test_no_opened_sum_shows_a_sites_own_values_and_the_outputs_are_unchanged(tmp_path):
    masked, plain = tmp_path / "masked", tmp_path / "plain"
    for code, text in run(masked, False) + run(plain, True):
        assert code == 0, text[-3000:]
    shown = revealed(plain / "opened")  # the control: unmasked, every check finds its value
    assert all(shown.values()), shown
    hidden = revealed(masked / "opened")
    assert not any(hidden.values()), hidden
    kinds = {p.stem.split("-", 2)[2] for p in (masked / "opened").glob("rank*/from1-*.bin")}
    assert {"standardisation-sums", "evaluation", "average", "gossip"} <= kinds, kinds
    for rank in range(3):
        a, summary_a = outputs(masked, rank)
        b, summary_b = outputs(plain, rank)
        assert a.keys() == b.keys() and a
        for name in a:
            assert torch.allclose(a[name].double(), b[name].double(), rtol=0, atol=1e-6), name
        # The averaged model differs by a float32 rounding (the masked sum is exact, then
        # rounded once; the unmasked one adds in rank order), so a test row on a histogram
        # bin's edge may change bins: the AP agrees to 1e-4, the counts exactly.
        assert abs(summary_a["test_ap"] - summary_b["test_ap"]) <= 1e-4
        for key in ("n_train", "n_test", "test_positives", "party_rows"):
            assert summary_a[key] == summary_b[key], key
        assert summary_a["party_rows"][1]["train"] == TRAIN_ROWS


def positives_and_scores(root: Path, sites: list[int], tmp: Path) -> tuple[np.ndarray, list[str]]:
    """The labels of ``sites``' test rows, and the scores ``slate predict`` gives them with
    site 0's saved model (in the order of the rows)."""
    rows = [line for r in sites for line in (root / f"site{r}" / "test.svm").read_text().split("\n")
            if line.strip()]  # fmt: skip
    (tmp / "survivors.svm").write_text("\n".join(rows) + "\n")
    done = slate_here("predict", "--run", str(root / "site0" / "run"), "--data",
                      str(tmp / "survivors.svm"), "--out", str(tmp / "scores.csv"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    labels = np.array([float(line.split()[0]) > 0 for line in rows])
    return labels, (tmp / "scores.csv").read_text().split()[1:]


@pytest.mark.processes
def test_a_site_dying_half_way_through_a_masked_sum_leaves_every_published_sum_exact(tmp_path):
    """Site 2 dies inside the evaluation sum at iteration 10, having sent its masked words to
    site 0 only (``SLATE_DIE_IN_SUM``): site 0 could add up a complete sum, site 1 could not.
    Under ``--on-party-loss continue`` the survivors drop that sum, name site 2, redo the
    evaluation between the two of them, and publish the same history; every total is that of
    their own rows: the test rows and positives exactly, the AP that of scikit-learn on the
    saved model's scores within its stated bound."""
    from sklearn.metrics import average_precision_score

    root = tmp_path / "sites"
    root.mkdir()
    write_sites(root, parties=3, rows=300)
    roster = make_roster(root, 3)
    port = free_port()
    server = serve(port, "--linger", "0", "--roster", str(roster))
    # Masked sums of a party: the first evaluation's two (average; counts with the flags),
    # then one gossip average per step (a ring of 3 mixes with J): sum 13 is the counts at
    # iteration 10.
    env = {"SLATE_DIE_IN_SUM": "2@13", "SLATE_RECORD_OPENED": str(root / "opened")}
    flags = ["--nodes", "3", "--external-store", *SITE_FLAGS, "--iterations", "30",
             "--eval-every", "10", "--topology", "ring", "--on-party-loss", "continue"]  # fmt: skip
    try:
        parties = [
            start_party(root, r, port, *flags, *identity_flags(roster, r), env=env)
            for r in range(3)
        ]
        ends = finish(parties, timeout=120)
        server.communicate(timeout=60)
    finally:
        server.kill()
    assert ends[2][0] == -signal.SIGKILL
    # Site 0 opened site 2's masked counts of iteration 10 (a complete set of words)...
    assert list((root / "opened" / "rank0").glob("from2-*-evaluation.bin"))
    for rank in (0, 1):
        code, text = ends[rank]
        assert code == 0 and "Traceback" not in text, text[-3000:]
        assert "party 2 lost at iteration 10" in text
    # ...and yet both survivors publish one history: that sum was dropped, then redone.
    histories = [(root / f"site{r}" / "run" / "history.csv").read_text() for r in (0, 1)]
    rows = [line.split(",") for line in histories[0].splitlines()[1:]]
    assert [r[0] for r in rows] == ["0", "10", "20", "30"]
    assert [r[6] for r in rows] == ["3", "2", "2", "2"]  # parties_alive
    without_times = [
        [",".join(r[:5] + r[6:]) for r in (line.split(",") for line in h.splitlines())]
        for h in histories
    ]  # (the elapsed seconds differ)
    assert without_times[0] == without_times[1]
    (a, summary_a), (b, summary_b) = outputs(root, 0), outputs(root, 1)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    labels, scores = positives_and_scores(root, [0, 1], tmp_path)
    for key in ("members", "party_events", "test_ap", "n_test", "test_positives"):
        assert summary_a[key] == summary_b[key], key
    assert summary_a["members"] == [0, 1]
    assert summary_a["n_test"] == len(labels) == 600
    assert summary_a["test_positives"] == int(labels.sum())
    reference = average_precision_score(labels, np.array(scores, dtype=np.float64))
    assert abs(summary_a["test_ap"] - reference) <= summary_a["test_ap_error_bound"] + 1e-9
