"""What each site publishes for ``slate status`` and ``slate rendezvous``: a roster run watched
from start to end, and a site started alone that says for whom it waits."""

from __future__ import annotations

import json
import sys

import pytest

from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    finish,
    free_port,
    identity_flags,
    make_roster,
    read_until,
    serve,
    start,
    start_party,
    write_sites,
)

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a"),
]

FLAGS = ["--external-store", *SITE_FLAGS, "--iterations", "300", "--eval-every", "50",
         "--topology", "ring"]  # fmt: skip


def frames(text: str) -> list[list[list[str]]]:
    """The site lines of each frame of ``slate status --watch`` (split into columns)."""
    found: list[list[list[str]]] = []
    for line in text.splitlines():
        cells = line.split()
        if cells[:1] == ["rank"]:
            found.append([])
        elif found and cells and cells[0].isdigit():
            found[-1].append(cells)
    return found


def training(frame: list[list[str]], sites: int) -> bool:
    """Every site in state training at an iteration above 0."""
    return len(frame) == sites and all(
        row[2] == "training" and row[3].split("/")[0].isdigit() and int(row[3].split("/")[0]) > 0
        for row in frame
    )


def test_status_shows_every_site_training_then_done_and_the_rendezvous_each_join(tmp_path):
    write_sites(tmp_path, parties=2)
    roster = make_roster(tmp_path, 2)
    port = free_port()
    server = serve(port, "--roster", str(roster))
    read_until(server, "serving one run")
    watch = start(
        [
            sys.executable,
            "-m",
            "slate",
            "status",
            f"127.0.0.1:{port}",
            "--roster",
            str(roster),
            "--watch",
            "0.25",
        ]
    )  # fmt: skip (watching before any site starts)
    parties = [start_party(tmp_path, r, port, "--nodes", "2", *FLAGS, *identity_flags(roster, r))
               for r in range(2)]  # fmt: skip
    done = finish(parties, timeout=120)
    assert [code for code, _ in done] == [0, 0], done
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    shown = frames(out)
    assert any(training(frame, 2) for frame in shown), out
    assert [row[:3] for row in shown[-1]] == [["0", "site0", "done"], ["1", "site1", "done"]]
    assert "records ignored" not in out
    for rank in range(2):  # a site's AP on its own test rows never leaves its folder
        summary = json.loads((tmp_path / f"site{rank}" / "run" / "summary.json").read_text())
        own, pooled = f"{summary['own_test_ap']:.4f}", f"{summary['pooled_test_ap']:.4f}"
        assert own == pooled or own not in out, (own, out)
    said, _ = server.communicate(timeout=30)
    for rank in range(2):
        assert said.count(f"site {rank} (site{rank}) joined") == 1, said
        assert said.count(f"site {rank} (site{rank}) left: done at iteration 300") == 1, said
    assert len(said.splitlines()) <= 6, said  # a line per event, no more


def test_a_site_started_alone_says_for_whom_it_waits(tmp_path):
    write_sites(tmp_path, parties=3, rows=50)
    port = free_port()
    server = serve(port)
    read_until(server, "serving one run")
    party = start_party(tmp_path, 0, port, "--nodes", "3", *FLAGS)
    try:
        said = read_until(party, "party 0: waiting for sites 1, 2 (", timeout=60)
    finally:
        party.kill()
        server.kill()
        party.communicate()
        server.communicate()
    assert said.count("waiting for") == 1
