"""Under ``--dp-epsilon`` no set-up exchange depends on a training row's values: four roster
sites on their own LIBSVM files, site 1 holding one planted positive row whose feature is
4242.5, and the audit hook (:mod:`slate.faults.opened`) records every sealed message each site
opens, gossip included. No payload that another site opened holds the planted value, searched
as JSON text, int64 (its roundings, and the masked sums' fixed point), float32 and float64
(both byte orders). The planted site clips the cell into the public range and says so in its
own output only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.payloads import holding
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

pytestmark = pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")

PARTIES, PLANTED, SITE = 4, 4242.5, 1
# no range flag and no --n-features: the defaults under --dp-epsilon
WIDTH = SITE_FLAGS.index("--features")
FLAGS = ["--nodes", str(PARTIES), *SITE_FLAGS[:WIDTH], *SITE_FLAGS[WIDTH + 2 :], "--iterations",
         "6", "--eval-every", "3", "--topology", "ring", "--dp-epsilon", "8", "--positives", "1",
         "--batch-size", "8", "--lr", "0.05"]  # fmt: skip


def plant(site: Path) -> str:
    """Site ``site``'s first positive training row gets feature 5 = 4242.5 (an index w7a's rows
    use, so the files' width does not change); the planted line is returned."""
    lines = (site / "train.svm").read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if line.split()[0] == "+1")
    label, *cells = lines[k].split()
    cells = sorted([c for c in cells if not c.startswith("5:")] + [f"5:{PLANTED}"],
                   key=lambda c: int(c.split(":")[0]))  # fmt: skip
    lines[k] = " ".join([label, *cells])
    (site / "train.svm").write_text("\n".join(lines) + "\n")
    return lines[k]


def run(root: Path) -> list[tuple[int, str]]:
    write_sites(root, parties=PARTIES, rows=300)
    plant(root / f"site{SITE}")
    roster = make_roster(root, PARTIES)
    env = {"SLATE_RECORD_OPENED": str(root / "opened")}
    port = free_port()
    parties = [
        start_party(root, r, port, *FLAGS, *identity_flags(roster, r), env=env)
        for r in range(PARTIES)
    ]
    return finish(parties, timeout=240)


@pytest.mark.processes
def test_a_planted_value_reaches_no_other_site_under_dp(tmp_path):
    done = run(tmp_path)
    for rank, (code, text) in enumerate(done):
        assert code == 0, f"site {rank}: {text[-3000:]}"
    opened = tmp_path / "opened"
    kinds = {p.stem.split("-", 2)[2] for p in opened.glob("rank*/*.bin")}
    assert {"gossip", "gathered", "evaluation"} <= kinds, kinds  # gossip and set-up recorded
    assert sum(1 for _ in opened.glob("rank0/*.bin")) > 0
    assert holding(opened, PLANTED, SITE) == []
    # the planted site says (to itself) that it clipped one cell; no other site mentions it
    assert "clipped" in done[SITE][1] and "4242.5" in done[SITE][1]
    for rank in set(range(PARTIES)) - {SITE}:
        assert "4242.5" not in done[rank][1] and "clipped" not in done[rank][1]
    # without --n-features every site says that its width is sent
    assert all("Give --n-features" in " ".join(text.split()) for _, text in done)
