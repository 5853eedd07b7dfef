"""Changing the party set in the simulator (--drop-party), snapshots and rollback."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from slate.config import TrainConfig, resolve_config
from slate.engines.membership import PartyLost
from slate.errors import ConfigError
from slate.recovery import Snapshots, parse_drops, snapshot_depth
from slate.run import Run
from slate.topology import build_topology, diameter, surviving_graph
from slate.train import train

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


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
    assert snaps.at(3).x.item() == 31  # the later snapshot of position 3 replaced the first
    with pytest.raises(PartyLost, match="resume from iteration 0, but this party holds"):
        snaps.at(1)  # fell out of the depth


def _fake_snapshot(position: int, marker: int):
    from slate.recovery import Snapshot

    t = torch.tensor(float(marker))
    return Snapshot(position, t, {}, {}, {}, 0, t, 0, (0.0, 0.0), 0)


@pytest.mark.parametrize(("name", "n", "expected"), [("ring", 6, 3), ("ring", 7, 3),
                                                     ("full", 5, 1), ("star", 5, 2)])  # fmt: skip
def test_diameter_and_snapshot_depth(name, n, expected):
    assert diameter(build_topology(name, n).W) == expected
    assert snapshot_depth(expected) == 2 * expected + 6


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
                   progress=False, log=lambda _: None)  # fmt: skip
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
        run.party_set.snapshot(after_evaluation=False)
        run.party_set.snapshot(after_evaluation=True)


def test_the_snapshot_depth_follows_the_surviving_graph_after_each_loss():
    """A ring of 8 (diameter 4) loses party 0: a path of 7 (diameter 6), on which a second
    loss may need a rollback of 2 * 6 positions plus the evaluation positions; then party 1,
    an end of the path: a path of 6 (diameter 5). The held snapshots survive each change."""
    run = Run(config(nodes=8, iterations=200))
    parties = run.party_set
    parties.snapshots = Snapshots(snapshot_depth(diameter(run.topology.W)))  # as with recovery
    assert parties.snapshots.depth == 2 * 4 + 6
    _hold_positions(run, range(10))
    held = [s.position for s in parties.snapshots._items]
    assert held == list(range(6, 20))

    for lost, survivors, longest in ((0, range(1, 8), 6), (1, range(2, 8), 5)):
        parties.change_parties([p for p in parties.members if p != lost])
        assert parties.members == list(survivors)
        assert _longest_shortest_path(run.topology.W) == longest
        assert parties.snapshots.depth == 2 * longest + 6
        assert [s.position for s in parties.snapshots._items][-1] == held[-1]  # still held
        if lost == 0:  # on the path of 7 a party may have to roll back 2 * 6 + 5 positions
            _hold_positions(run, range(10, 20))
            newest = parties.snapshots.position
            assert parties.snapshots.at(newest - 17).position == newest - 17
            with pytest.raises(PartyLost):  # the depth is not unbounded either
                parties.snapshots.at(newest - 18)
            held = [s.position for s in parties.snapshots._items]
    assert [s.position for s in parties.snapshots._items] == held[-parties.snapshots.depth :]
