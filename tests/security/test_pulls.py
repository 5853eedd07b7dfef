"""``--robust clip``'s watch for a persistent pull (:mod:`slate.security.pulls`): on synthetic
message streams (who is named, and that honest streams never are), then on real processes: four
roster sites, one of which runs MODIFIED CODE that adds a constant pull of 0.45 times its model's
norm to every message; each of its honest neighbours names it as suspected, nobody is excluded,
and no honest site is named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from slate.security.accusations import accusation_lines, events_from_records
from slate.security.pulls import PullRule, PullWatch
from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    finish,
    free_port,
    identity_flags,
    make_roster,
    serve,
    start_party,
    write_sites,
)

D, SENDERS, ROUNDS = 20, 4, 400


def stream(clip_rates: list[float], pulled: int | None, seed: int) -> PullWatch:
    """One receiver hearing ``SENDERS`` senders for ``ROUNDS`` rounds: sender ``j``'s message is
    clipped with probability ``clip_rates[j]`` in a fresh random direction, except ``pulled``'s,
    whose difference is a constant direction plus a little noise."""
    gen = torch.Generator().manual_seed(seed)
    watch = PullWatch(1, SENDERS, D, torch.device("cpu"), torch.float64)
    pull = torch.randn(D, generator=gen, dtype=torch.float64)
    receivers, senders = torch.zeros(SENDERS, dtype=torch.long), torch.arange(SENDERS)
    for it in range(ROUNDS):
        diff = torch.randn(SENDERS, D, generator=gen, dtype=torch.float64)
        if pulled is not None:
            diff[pulled] = 0.1 * diff[pulled] + pull
        rates = torch.tensor(clip_rates, dtype=torch.float64)
        clipped = torch.rand(SENDERS, generator=gen, dtype=torch.float64) < rates
        dist = torch.linalg.vector_norm(diff, dim=1)
        watch.observe(receivers, senders, diff, dist, clipped, torch.ones_like(clipped), it)
    return watch


def named(watch: PullWatch) -> dict[int, list[str]]:
    """Sender -> the reasons it was suspected for, through the records every site reads."""
    rows = [[0, j, ROUNDS, 0, 0, 0, 0, -1, *watch.columns(0, j)] for j in range(SENDERS)]
    events = events_from_records(rows, ROUNDS)
    return {e["rank"]: s["pull"]["reasons"] for e in events for s in e["suspicions"]}


@pytest.mark.parametrize(("rate", "seed"), [(0.3, 0), (0.7, 1), (0.95, 2)])
def test_honest_streams_are_never_named(seed, rate):
    """Random directions, each sender clipped as often as the others (also 95% of the time,
    as on a fast-moving run): nobody is suspected."""
    assert named(stream([rate] * SENDERS, None, seed)) == {}


def test_a_constant_pull_is_named_for_its_direction():
    """A pulling sender is clipped always, in one direction; honest senders 70% of the time in
    random ones: only the puller is named, for its direction as soon as the window is full
    (its share, 1 against 0.7, is not yet 5 standard errors above the others' there)."""
    watch = stream([0.7, 0.7, 0.7, 1.0], pulled=3, seed=3)
    assert named(watch) == {3: ["one direction"]}
    assert int(watch.suspected_at[0, 3]) == PullRule().window - 1


def test_a_sender_clipped_far_more_often_is_named_for_its_share():
    """Random directions for all; one sender always clipped, the others 60% of the time: it is
    named for its clipped share alone. With everyone clipped 95% of the time, one sender at
    100% is within the margin: not named (clipping alone is not evidence)."""
    assert named(stream([0.6, 0.6, 0.6, 1.0], None, seed=4)) == {3: ["clipped more often"]}
    assert named(stream([0.95, 0.95, 0.95, 1.0], None, seed=5)) == {}


def test_the_suspicion_is_one_line_with_its_evidence():
    """The line printed at every site names accuser, suspect, the round and the evidence."""
    watch = stream([0.7, 0.7, 0.7, 1.0], pulled=3, seed=6)
    rows = [[0, 3, ROUNDS, 0, ROUNDS, 0, 0, -1, *watch.columns(0, 3)]]
    (line,) = accusation_lines(events_from_records(rows, ROUNDS))
    assert line.startswith("party 0 suspects party 3: --robust clip suspected of a persistent "
                           "pull at iteration 63 (")  # fmt: skip
    assert "one direction): 64 of the 64 messages" in line and line.endswith("not excluded")


# The liar's process: every message it sends is its model plus 0.45 times its norm in a fixed
# direction (slate.security.robust.MessageGuard.sent, the gossip sender), then slate's CLI.
PULLING = """
import sys, torch
from slate.security import robust
original = robust.MessageGuard.sent
def pulled(self, x):
    x = original(self, x)
    u = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(7))
    u = (u / u.norm()).to(x.device, x.dtype)
    return x + 0.45 * x.norm(dim=1, keepdim=True) * u
robust.MessageGuard.sent = pulled
from slate.cli import main
sys.exit(main(sys.argv[1:]))
"""
#: Each neighbour hears the liar once an iteration, clipped every time: it is suspected when the
#: window of 64 messages is full (iteration 63, as measured), 37 iterations before the end.
LIAR, ITERATIONS = 1, 100


@pytest.mark.processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo on Linux")
@pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")
def test_honest_neighbours_name_a_pulling_site(tmp_path: Path):
    """Four roster sites on a ring under --robust clip, site 1 running the pulling code: the run
    ends at every site; its neighbours 0 and 2 suspect it (every site's summary says so, and
    prints each suspicion once); no site is excluded and no honest site suspected."""
    write_sites(tmp_path, parties=4, rows=200)
    roster = make_roster(tmp_path, 4)
    port = free_port()
    server = serve(port, "--roster", str(roster))
    flags = ["--nodes", "4", "--external-store", *SITE_FLAGS, "--iterations", str(ITERATIONS),
             "--topology", "ring", "--robust", "clip", "--eval-every", str(ITERATIONS)]  # fmt: skip
    liar = [sys.executable, "-c", PULLING]
    parties = [start_party(tmp_path, r, port, *flags, *identity_flags(roster, r),
                           program=liar if r == LIAR else None) for r in range(4)]  # fmt: skip
    done = finish(parties, timeout=120)
    server.kill()
    server.communicate()
    for rank in (0, 2, 3):
        code, text = done[rank]
        assert code == 0, text[-3000:]
        assert "accuses" not in text
        for accuser in (0, 2):
            assert text.count(f"party {accuser} suspects party {LIAR}: --robust clip") == 1
        summary = json.loads((tmp_path / f"site{rank}" / "run" / "summary.json").read_text())
        events = {e["rank"]: e for e in summary["party_events"] if e["event"] == "robust"}
        assert events[LIAR]["suspected_by"] == [0, 2]
        assert all(e["suspected_by"] == [] for r, e in events.items() if r != LIAR)
        assert all(e["accused_by"] == [] for e in events.values())
        for suspicion in events[LIAR]["suspicions"]:
            pull = suspicion["pull"]
            assert "one direction" in pull["reasons"] and pull["consistency"] > 0.99
            assert pull["counted_clipped"] == pull["counted"] >= PullRule().window
