"""Changing the party set in the simulator (--drop-party), snapshots and rollback."""

from __future__ import annotations

import gzip
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from slate.config import TrainConfig, resolve_config
from slate.engines.distributed.control.membership import Change, PartyLost
from slate.errors import ConfigError
from slate.topology import build_topology, diameter, surviving_graph
from slate.training.checks import parse_drops
from slate.training.loop import train
from slate.training.recovery import (
    Snapshots,
    drift_rounds,
    rollback_rounds,
    snapshot_depth,
)
from slate.training.run import Run

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def config(**overrides) -> TrainConfig:
    base = dict(dataset="digits", nodes=5, topology="ring", iterations=60, eval_every=20,
                seed=4, algorithm="slate", gradient_tracking=True, party_ap=False)  # fmt: skip
    return resolve_config(TrainConfig(**{**base, **overrides}))


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (("2@10",), {10: [2]}),
        (("3@5", "1@5", "0@7"), {5: [1, 3], 7: [0]}),
        ((), {}),
    ],
)
def test_parse_drops(values, expected):
    assert parse_drops(values, nodes=5, iterations=20) == expected


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("2-10",), "not RANK@ITER"),
        (("x@10",), "not RANK@ITER"),
        (("5@10",), "rank 5 is not one of 0..4"),
        (("1@0",), "must lie in 1..19"),
        (("1@20",), "must lie in 1..19"),
        (("1@3", "1@5"), "names party 1 twice"),
        (tuple(f"{r}@3" for r in range(5)), "at least one must remain"),
    ],
)
def test_parse_drops_refuses(values, message):
    with pytest.raises(ConfigError, match=message):
        parse_drops(values, nodes=5, iterations=20)


def test_snapshots_keep_the_newest_per_position():
    snaps = Snapshots(depth=3)
    for position, marker in ((1, 10), (2, 20), (3, 30), (3, 31), (4, 40)):
        snaps.add(_fake_snapshot(position, marker))
    assert snaps.position == 4
    assert snaps.at(3).state.x.item() == 31  # the later snapshot of position 3 replaced the first
    with pytest.raises(PartyLost, match="resume from iteration 0, but this party holds"):
        snaps.at(1)  # fell out of the depth


def test_a_rollback_drops_the_abandoned_newer_snapshots():
    snaps = Snapshots(depth=5)
    for position in (1, 3, 5, 7, 9):
        snaps.add(_fake_snapshot(position, position))
    assert snaps.rollback(5).state.x.item() == 5
    assert [s.position for s in snaps._items] == [1, 3, 5]
    snaps.add(_fake_snapshot(7, 70))  # the course after the rollback
    snaps.add(_fake_snapshot(4, 40))  # an admission at an earlier position supersedes 5 and 7
    assert [(s.position, s.state.x.item()) for s in snaps._items] == [(1, 1), (3, 3), (4, 40)]


def _fake_snapshot(position: int, marker: int):
    from slate.training.recovery import Snapshot
    from slate.training.state import TrainingState

    t = torch.tensor(float(marker))
    return Snapshot(position, TrainingState(position // 2, t, {}, {}, {}, 0, t, 0, (0.0, 0.0), 0))


@pytest.mark.parametrize(("name", "n", "expected"), [("ring", 6, 3), ("ring", 7, 3),
                                                     ("full", 5, 1), ("star", 5, 2)])  # fmt: skip
def test_a_static_graph_drifts_its_diameter_and_keeps_one_snapshot_more_plus_three(
    name, n, expected
):
    topology = build_topology(name, n)
    assert diameter(topology.W) == expected == drift_rounds(topology)
    assert snapshot_depth(topology) == expected + 1 + 3


@pytest.mark.parametrize(
    ("name", "n", "rounds", "depth"),
    [
        ("base-2", 3, 4, 8),  # rounds 0-1, 0-2, 0-1: 1 -> 2 waits for a 0-1 round, then a 0-2
        ("base-2", 4, 2, 6),  # 0-1 2-3, then 0-2 1-3: any party to any in two rounds
        ("base-2", 6, 5, 9),
        ("one-peer-exponential", 8, 3, 7),
        ("federated", 4, 10, 5),  # only the exact average of every 10th round links parties
    ],
)
def test_a_time_varying_graph_drifts_its_temporal_diameter(name, n, rounds, depth):
    """Neither the union graph's diameter nor the cycle length: the most rounds information
    needs between two parties, one hop per round, from any round of the cycle on."""
    topology = build_topology(name, n)
    assert drift_rounds(topology) == rounds
    assert snapshot_depth(topology) == depth
    if name == "federated":
        assert rollback_rounds(topology) == (False,) * 9 + (True,)


def _programs(topology, every: int, iterations: int, ends: set[int]) -> list[list[tuple]]:
    """What each distributed party does, in order, as far as rollbacks are concerned: its
    snapshots ("snap", position), and its exchanges, each an ("enter", key) (its message is
    sent) and a ("leave", key, peers) that waits until every peer has entered ``key``. A chunk
    starts at 0 and at each of ``ends`` with a collective of every party (the stop check); step
    ``t`` ends with gossip round ``t // every`` when ``(t + 1) % every == 0``."""
    exchanging = rollback_rounds(topology)
    programs = []
    for p in range(topology.n):
        others = [q for q in range(topology.n) if q != p]
        acts: list[tuple] = [("snap", 0)]
        for t in range(iterations + 1):
            if t in ends or t in (0, iterations):  # a chunk's end, then the next one's start
                acts += [("snap", 2 * t), ("enter", ("sync", t)), ("leave", ("sync", t), others)]
                if t == iterations:
                    break
                acts.append(("snap", 2 * t + 1))
            if (t + 1) % every == 0:  # a gossip round: Run.advance, PartySet.snapshot_before_step
                r = t // every
                if exchanging[r % len(exchanging)]:
                    acts.append(("snap", 2 * t + 1))
                full = topology.is_full_average_at(r)
                peers = others if full else [q for q, _ in topology.neighbours_at(p, r)]
                if peers:
                    acts += [("enter", ("round", r)), ("leave", ("round", r), peers)]
        programs.append(acts)
    return programs


def _worst_rollbacks(topology, every: int, iterations: int, ends: set[int]) -> tuple[int, int]:
    """Brute force over every interleaving of the parties' programs (any party may stop, lost,
    at any point, and any survivor may check in with its newest snapshot at any point): the
    most positions a survivor's newest snapshot is ahead of another's, and the most snapshots
    a survivor must keep to hold the other's newest position. Also checks that it was taken."""
    programs = _programs(topology, every, iterations, ends)
    entered = [{a[1]: i for i, a in enumerate(acts) if a[0] == "enter"} for acts in programs]
    newest: list[list[int]] = []  # newest[p][pc]: p's newest snapshot once pc actions are done
    held: list[list[tuple[int, ...]]] = []
    for acts in programs:
        mine: list[int] = []
        kept: list[tuple[int, ...]] = []
        positions: tuple[int, ...] = ()
        for i in range(len(acts) + 1):
            mine.append(positions[-1] if positions else -1)
            kept.append(positions)
            if i < len(acts) and acts[i][0] == "snap" and acts[i][1] not in positions[-1:]:
                positions += (acts[i][1],)
        newest.append(mine)
        held.append(kept)
    start = (0,) * topology.n
    seen, todo = {start}, deque([start])
    ahead = depth = 0
    while todo:
        pcs = todo.popleft()
        for p, i in enumerate(pcs):
            for q, j in enumerate(pcs):
                if 0 <= newest[q][j] <= newest[p][i]:
                    assert newest[q][j] in held[p][i], (pcs, p, q)
                    ahead = max(ahead, newest[p][i] - newest[q][j])
                    depth = max(depth, sum(1 for x in held[p][i] if x >= newest[q][j]))
        for p, i in enumerate(pcs):
            if i == len(programs[p]):
                continue
            act = programs[p][i]
            if act[0] == "leave" and any(pcs[q] <= entered[q][act[1]] for q in act[2]):
                continue  # a peer has not sent its message (or entered the collective) yet
            after = (*pcs[:p], i + 1, *pcs[p + 1 :])
            if after not in seen:
                seen.add(after)
                todo.append(after)
    return ahead, depth


@pytest.mark.parametrize(
    ("name", "n", "every", "iterations", "ends"),
    [
        ("ring", 4, 1, 16, ()),
        ("ring", 4, 1, 16, (5, 9, 12)),
        ("ring", 5, 2, 24, ()),
        ("star", 4, 2, 20, (3, 6, 10)),
        ("base-2", 3, 2, 40, ()),
        ("base-2", 3, 3, 40, (7, 20, 29)),
        ("base-2", 4, 3, 36, ()),
        ("base-2", 4, 2, 30, (4, 9, 15, 20)),
        ("federated", 3, 2, 30, ()),
    ],
)
def test_the_snapshot_depth_covers_every_drift_the_exchanges_allow(name, n, every, iterations,
                                                                   ends):  # fmt: skip
    """With local steps a party is at most H iterations per hop ahead (H = --gossip-every),
    2 H drift_rounds positions, reached when no chunk's end holds it back; and it never needs
    more snapshots than snapshot_depth to hold the slowest survivor's newest position."""
    topology = build_topology(name, n, fed_period=3)
    ahead, needed = _worst_rollbacks(topology, every, iterations, set(ends))
    bound = 2 * every * drift_rounds(topology)
    assert ahead == bound if not ends else ahead <= bound
    assert needed <= snapshot_depth(topology)
    assert needed <= drift_rounds(topology) + 2  # (the depth's three at chunk ends are loose)


def test_a_drop_keeps_the_survivors_rows_streams_and_mixes_over_the_surviving_graph():
    run = Run(config())
    run.advance(10)
    before_x = run.x.clone()
    reference = Run(config())  # the same run without a drop: the survivors' batches must match
    reference.advance(10)
    run.party_set.drops = {10: [1, 3]}
    assert run.party_set.apply_drops() == [1, 3]
    survivors = [0, 2, 4]
    assert run.party_set.members == survivors and run.engine.local_parties == survivors
    assert run.engine.n_parties == 3 and run.x.shape[0] == 3
    torch.testing.assert_close(run.x, before_x[survivors], rtol=0, atol=0)
    np.testing.assert_array_equal(
        run.topology.W, surviving_graph(build_topology("ring", 5).W, survivors).W
    )
    drawn = run.sampler.draw(4)
    expected = reference.sampler.draw(4)[:, survivors]
    torch.testing.assert_close(drawn, expected, rtol=0, atol=0)
    assert run.party_set.party_events == [
        {"rank": 1, "iteration": 10, "event": "lost", "reason": "--drop-party"},
        {"rank": 3, "iteration": 10, "event": "lost", "reason": "--drop-party"},
    ]


def test_gradient_tracking_is_re_anchored_so_the_tracker_follows_the_survivors_mean():
    """With tracking, mean(v) = mean(u) over the parties; a drop would break it for good."""
    run = Run(config())
    run.advance(15)
    u, v = run.algorithm.state["u"], run.algorithm.state["v"]
    torch.testing.assert_close(v.mean(0), u.mean(0), rtol=0, atol=1e-5)
    run.party_set.drops = {15: [2]}
    run.party_set.apply_drops()
    for _ in range(5):
        run.advance(1)
        u, v = run.algorithm.state["u"], run.algorithm.state["v"]
        torch.testing.assert_close(v.mean(0), u.mean(0), rtol=0, atol=1e-5)
    assert u.shape[0] == 4  # the dropped party's row is gone


def test_drop_party_run_records_the_loss_and_its_history(tmp_path):
    result = train(config(drop_party=("1@20", "3@40"), out=str(tmp_path / "run")),
                   progress=False, figures=False, log=lambda _: None)  # fmt: skip
    alive = [row["parties_alive"] for row in result.history]
    assert [row["iteration"] for row in result.history] == [0, 20, 40, 60]
    assert alive == [5, 5, 4, 3]  # drops happen after that iteration's evaluation
    summary = result.summary
    assert summary["members"] == [0, 2, 4] and summary["parties_alive"] == 3
    assert [e["iteration"] for e in summary["graph_changes"]] == [20, 40]
    assert summary["lambda"] == pytest.approx(build_topology("ring", 5).lam)


def test_the_drop_only_changes_the_run_from_its_iteration(tmp_path):
    """Up to the drop, the run is the run without it, bit for bit."""
    dropped = train(config(drop_party=("2@40",)), write=False, progress=False,
                    log=lambda _: None)  # fmt: skip
    plain = train(config(), write=False, progress=False, log=lambda _: None)

    def timeless(rows):
        return [{k: v for k, v in row.items() if k != "elapsed_seconds"} for row in rows]

    assert timeless(dropped.history[:3]) == timeless(plain.history[:3])  # iterations 0, 20, 40
    assert dropped.history[3]["test_ap"] != plain.history[3]["test_ap"]


def write_party_files(root: Path, parties: int = 3, rows: int = 500) -> None:
    for source, name in (("w7a.gz", "train{rank}.svm"), ("w7a.t.gz", "test{rank}.svm")):
        with gzip.open(SHARED / "w7a" / source, "rt") as handle:
            lines = [line for line, _ in zip(handle, range(parties * rows), strict=False)]
        for r in range(parties):
            (root / name.format(rank=r)).write_text("".join(lines[r::parties]))


@pytest.mark.skipif(not (SHARED / "w7a" / "w7a.gz").is_file(), reason="w7a not in shared")
def test_a_dropped_party_takes_its_own_test_rows_with_it(tmp_path):
    write_party_files(tmp_path)
    files = dict(dataset="libsvm", train=str(tmp_path / "train{rank}.svm"), n_features=300,
                 test=str(tmp_path / "test{rank}.svm"), nodes=3, iterations=40,
                 eval_every=20)  # fmt: skip
    dropped = train(config(**files, drop_party=("1@20",)), write=False, progress=False,
                    log=lambda _: None)  # fmt: skip
    assert set(dropped.summary["party_test_ap"]) == {"0", "2"}
    survivors_only = train(config(**{**files, "iterations": 20}), write=False, progress=False,
                           log=lambda _: None)  # fmt: skip
    assert survivors_only.summary["party_test_ap"].keys() == {"0", "1", "2"}
    run = Run(config(**files, drop_party=("1@20",)))
    n_test = [len(p) for p in run.evaluator.evaluation.test_parts]
    run.party_set.drops = {0: [1]}
    run.party_set.apply_drops()
    assert len(run.evaluator.test_labels) == n_test[0] + n_test[2]
    assert [len(p) for p in run.evaluator.evaluation.test_parts] == [n_test[0], n_test[2]]


def _longest_shortest_path(W: np.ndarray) -> int:
    """Brute force (Floyd-Warshall) over the edges ``w_ij > 0``: the most hops between two
    connected nodes."""
    n = len(W)
    hops = np.where((W > 0) | (W.T > 0), 1.0, np.inf)
    np.fill_diagonal(hops, 0.0)
    for k in range(n):
        hops = np.minimum(hops, hops[:, [k]] + hops[[k], :])
    return int(hops[np.isfinite(hops)].max())


def _hold_positions(run: Run, iterations: range) -> None:
    for t in iterations:
        run.iteration = t
        run.party_set.snapshot_before_step()


def _recovering(run: Run) -> None:
    """Give a simulator run the snapshots a distributed ``continue`` party keeps."""
    parties = run.party_set
    parties.snapshots = Snapshots(snapshot_depth(run.topology))
    parties._rollback_rounds = rollback_rounds(run.topology)
    parties.snapshot(after_evaluation=False)  # as Run.__init__ does


def test_the_snapshot_depth_follows_the_surviving_graph_after_each_loss():
    """A ring of 8 (diameter 4) loses party 0: a path of 7 (diameter 6), on which a second
    loss may need a rollback of 6 gossip rounds plus the positions at a chunk's end; then
    party 1, an end of the path: a path of 6 (diameter 5). The held snapshots survive each
    change."""
    run = Run(config(nodes=8, iterations=200))
    parties = run.party_set
    _recovering(run)
    assert parties.snapshots.depth == 4 + 1 + 3
    _hold_positions(run, range(10))
    held = [s.position for s in parties.snapshots._items]
    assert held == [2 * t + 1 for t in range(2, 10)]  # one per gossip round (every step)

    for lost, survivors, longest in ((0, range(1, 8), 6), (1, range(2, 8), 5)):
        parties.change_parties([p for p in parties.members if p != lost])
        assert parties.members == list(survivors)
        assert _longest_shortest_path(run.topology.W) == longest
        assert parties.snapshots.depth == longest + 1 + 3
        assert [s.position for s in parties.snapshots._items][-1] == held[-1]  # still held
        if lost == 0:  # on the path of 7 a party may have to roll back 6 rounds and more
            _hold_positions(run, range(10, 20))
            newest = parties.snapshots.position
            assert parties.snapshots.at(newest - 18).position == newest - 18
            with pytest.raises(PartyLost):  # the depth is not unbounded either
                parties.snapshots.at(newest - 20)
            held = [s.position for s in parties.snapshots._items]
    assert [s.position for s in parties.snapshots._items] == held[-parties.snapshots.depth :]


def test_under_local_steps_only_gossip_rounds_and_chunk_ends_are_kept():
    """--gossip-every 5 on base-2: a snapshot before each gossip round's step (iterations 4,
    9, ...) and at each chunk's end, not one per step."""
    run = Run(config(nodes=4, topology="base-2", gossip_every=5, gradient_tracking=False))
    _recovering(run)
    run.party_set.snapshot(after_evaluation=True)
    run.advance(20)
    assert [s.position for s in run.party_set.snapshots._items] == [1, 9, 19, 29, 39, 40]


def test_a_rollback_under_local_steps_with_compressed_gossip_continues_as_the_drop(monkeypatch):
    """The survivors agree on a position 10 iterations back (before the gossip round of
    iteration 29): the rollback restores that state and restarts CHOCO's public copies on the
    surviving graph, so the run goes on exactly as the simulator's --drop-party 1@29."""
    settings = dict(nodes=4, topology="base-2", gossip_every=5, compress="int8",
                    gradient_tracking=False, iterations=60)  # fmt: skip
    run = Run(config(**settings))
    _recovering(run)
    run.party_set.snapshot(after_evaluation=True)
    run.advance(40)
    assert run.comm.choco.sent.abs().sum() > 0
    change = Change(generation=1, members=(0, 2, 3), lost=(1,), position=2 * 29 + 1)
    monkeypatch.setattr(run.engine, "leave_generation", lambda position: change, raising=False)
    assert run.party_set.recover() is change
    assert run.iteration == 29 and run.party_set.snapshots.position == 2 * 29 + 1
    assert run.comm.choco.sent.abs().sum() == 0 and run.comm.choco.received.abs().sum() == 0
    run.advance(31)

    reference = Run(config(**settings, drop_party=("1@29",)))
    reference.advance(29)
    assert reference.party_set.apply_drops() == [1]
    reference.advance(31)
    torch.testing.assert_close(run.x, reference.x, rtol=0, atol=0)
    assert run.party_set.party_events == [
        {"rank": 1, "iteration": 29, "event": "lost", "reason": "lost"}
    ]
