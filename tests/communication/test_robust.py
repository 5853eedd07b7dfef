"""Attacks (tests only), the watch on received values and ``--robust clip``
(:mod:`slate.communication.robust`) against independent references."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from slate.communication.robust import Attack, MessageGuard, corrupt, parse_attacks
from slate.config import TrainConfig
from slate.engines.simulator import SimulatorCommunicator
from slate.errors import ConfigError, TrainingDiverged
from slate.topology import build_topology
from slate.training.loop import train
from slate.training.run import Run
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


def brute_force_clip(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """x_i + sum_j w_ij clip(x_j - x_i, tau_i), tau_i = 2 x the lower median distance."""
    n = len(x)
    out = x.copy()
    for i in range(n):
        neighbours = [j for j in range(n) if j != i and W[i, j] > 0]
        finite = [j for j in neighbours if np.isfinite(x[j]).all()]
        dists = sorted(float(np.linalg.norm(x[j] - x[i])) for j in finite)
        tau = 2 * dists[(len(dists) - 1) // 2] if dists else np.inf
        for j in finite:
            v = x[j] - x[i]
            norm = np.linalg.norm(v)
            out[i] += W[i, j] * (v * min(1.0, tau / norm) if norm > 0 else v)
    return out


@pytest.mark.parametrize("topology", ["ring", "torus", "exponential"])
def test_simulator_clipped_mix_equals_a_loop_over_edges(topology):
    n, d = 9, 7
    top = build_topology(topology, n)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, d))
    x[4] *= 50.0  # one far party: clipped by its neighbours
    x[2] = np.nan  # one non-finite: dropped
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64)
    guard = MessageGuard(n, list(range(n)), "clip")
    comm.set_guard(guard)
    got = comm.mix(torch.from_numpy(x)).numpy()
    want = brute_force_clip(x, np.array(top.matrix_at(0)))
    honest = [i for i in range(n) if i != 2]
    np.testing.assert_allclose(got[honest], want[honest], rtol=1e-12, atol=1e-12)
    events = {e["rank"]: e for e in guard.events()}
    assert events[2]["dropped"] == events[2]["received"] > 0
    assert events[4]["clipped"] > 0


def brute_force_rounds(xs: list[np.ndarray], W: np.ndarray, x0: np.ndarray):
    """Round by round, with the memory of module ``robust`` written out plainly: tau_i = 2 x
    the lower median of the last 16 distances (each round's, ascending, plus the party's own
    movement since its last mix); a sender refused (dropped or clipped) at a moving rate
    r <- r + (b - r) / 8 of at least 0.8 after 16 messages is excluded from the next round."""
    n = len(x0)
    window: list[list[float]] = [[] for _ in range(n)]
    rate, seen = np.zeros((n, n)), np.zeros((n, n), dtype=int)
    excluded = np.zeros((n, n), dtype=bool)
    last, outs = x0.copy(), []
    for x in xs:
        out = x.copy()
        now_excluded = excluded.copy()
        for i in range(n):
            senders = [j for j in range(n) if j != i and W[i, j] > 0 and not now_excluded[i, j]]
            finite = [j for j in senders if np.isfinite(x[j]).all()]
            pushed = [float(np.linalg.norm(x[j] - x[i])) for j in finite]
            moved = float(np.linalg.norm(x[i] - last[i]))
            pushed += [moved] if np.isfinite(moved) and moved > 0 else []
            window[i] = (window[i] + sorted(pushed))[-16:]
            ordered = sorted(window[i])
            tau = 2 * ordered[(len(ordered) - 1) // 2] if ordered else np.nan
            for j in senders:
                refused = j not in finite
                if not refused:
                    v = x[j] - x[i]
                    norm = np.linalg.norm(v)
                    refused = bool(norm > tau)
                    out[i] += W[i, j] * (v * tau / norm if refused else v)
                rate[i, j] += (float(refused) - rate[i, j]) / 8
                seen[i, j] += 1
                excluded[i, j] |= seen[i, j] >= 16 and rate[i, j] >= 0.8
        last = out.copy()
        outs.append(out)
    return outs, excluded


@pytest.mark.parametrize("topology", ["ring", "exponential"])
def test_clipping_over_rounds_with_exclusion_equals_a_brute_force_loop(topology):
    n, d, rounds = 9, 6, 40
    top = build_topology(topology, n)
    W = np.array(top.matrix_at(0))
    rng = np.random.default_rng(7)
    x0 = rng.normal(size=(n, d))
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64)
    guard = MessageGuard(n, list(range(n)), "clip")
    comm.set_guard(guard)
    guard.begin(torch.from_numpy(x0))
    xs, got, previous = [], [], x0
    for t in range(rounds):
        x = previous + 0.3 * rng.normal(size=(n, d))
        x[4] = -3.0 * x[4] if t >= 2 else x[4]  # a far party from round 2 on
        x[2] = np.nan if t >= 5 else x[2]  # a non-finite one from round 5 on
        xs.append(x)
        comm.set_iteration(t)
        previous = comm.mix(torch.from_numpy(x)).numpy()
        got.append(previous)
    want, excluded = brute_force_rounds(xs, W, x0)
    honest = [i for i in range(n) if i != 2]
    for t in range(rounds):
        np.testing.assert_allclose(got[t][honest], want[t][honest], rtol=1e-10, atol=1e-10)
    events = {e["rank"]: e for e in guard.events()}
    for sender in (2, 4):
        by = sorted(int(i) for i in np.nonzero(excluded[:, sender])[0])
        assert by == [i for i in range(n) if W[i, sender] > 0 and i not in (2, sender)]
        assert events[sender]["excluded_by"] == by
    assert not excluded[:, [i for i in range(n) if i not in (2, 4)]].any()
    # Accepted for rounds 0-4, then dropped: r = 1 - (7/8)^(t - 4) reaches 0.8 at round 17.
    assert events[2]["excluded_at"] == min(
        t for t in range(15, 40) if 1 - (7 / 8) ** (t - 4) >= 0.8
    )


def test_without_clip_or_attack_the_guarded_mix_is_w_times_x():
    n, d = 6, 5
    top = build_topology("ring", n)
    x = torch.randn(n, d, dtype=torch.float64)
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64)
    comm.set_guard(MessageGuard(n, list(range(n)), "none", [Attack(1, 0, "scale", 1.0)]))
    W = torch.tensor(np.array(top.matrix_at(0)))
    torch.testing.assert_close(comm.mix(x), W @ x)


def test_attack_parsing():
    assert parse_attacks("2@10:nan, 0@0:scale:1e30,1@5:signflip,3@1:zeros") == [
        Attack(2, 10, "nan"), Attack(0, 0, "scale", 1e30), Attack(1, 5, "signflip"),
        Attack(3, 1, "zeros"),
    ]  # fmt: skip
    assert parse_attacks("") == [] and parse_attacks(None) == []
    for bad in ("x@1:nan", "1@:nan", "1@2", "1@2:boom", "1@2:scale", "1@2:scale:abc",
                "1@2:nan:3"):  # fmt: skip
        with pytest.raises(ConfigError, match=r"SLATE_ATTACK: bad part") as err:
            parse_attacks(f"0@0:zeros,{bad}")
        assert repr(bad) in str(err.value)


@pytest.mark.parametrize("kind", ["nan", "scale:3", "signflip", "zeros"])
def test_each_attack_corrupts_what_is_sent_and_not_the_attackers_state(kind):
    n, d = 4, 5
    x = torch.randn(n, d, dtype=torch.float64) + 1.0
    before = x.clone()
    (attack,) = parse_attacks(f"1@3:{kind}")
    guard = MessageGuard(n, list(range(n)), "none", [attack])
    guard.iteration = 2
    assert guard.sent_view(x) is x  # not yet
    guard.iteration = 3
    sent = guard.sent_view(x)
    torch.testing.assert_close(x, before)  # the attacker's own copy is honest
    torch.testing.assert_close(sent[[0, 2, 3]], x[[0, 2, 3]])
    expected = {"nan": torch.full((d,), float("nan"), dtype=x.dtype), "scale:3": 3 * x[1],
                "signflip": -x[1], "zeros": torch.zeros(d, dtype=x.dtype)}[kind]  # fmt: skip
    torch.testing.assert_close(sent[1], expected, equal_nan=True)
    torch.testing.assert_close(corrupt(x[1], attack), expected, equal_nan=True)
    # In a simulator round the others receive the corrupted row; the attacker mixes its own.
    top = build_topology("ring", n)
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64)
    comm.set_guard(guard)
    comm.set_iteration(3)
    mixed = comm.mix(x)
    W = torch.tensor(np.array(top.matrix_at(0)))
    sent_rows = sent.clone()
    want_1 = W[1, 1] * x[1] + W[1, 0] * x[0] + W[1, 2] * x[2]
    torch.testing.assert_close(mixed[1], want_1)
    want_0 = W[0, 0] * x[0] + W[0, 1] * sent_rows[1] + W[0, 3] * x[3]
    torch.testing.assert_close(mixed[0], want_0, equal_nan=True)


SMALL = dict(dataset="digits", nodes=4, topology="ring", iterations=60, eval_every=30, seed=3)


def small_run(tmp_path, name, monkeypatch, attack=None, **flags):
    if attack:
        monkeypatch.setenv("SLATE_ATTACK", attack)
    else:
        monkeypatch.delenv("SLATE_ATTACK", raising=False)
    config = TrainConfig(**{**SMALL, **flags, "out": str(tmp_path / name)})
    return train(config, progress=False, log=lambda _: None).summary


@pytest.mark.parametrize("compress", ["none", "int8"])
def test_nan_attack_without_robust_names_the_attacker(compress, tmp_path, monkeypatch):
    with pytest.raises(TrainingDiverged, match=r"Party 2 sent non-finite") as err:
        small_run(tmp_path, "nan", monkeypatch, "2@5:nan", compress=compress)
    assert "learning rate" not in str(err.value)


def test_a_huge_scale_without_robust_names_the_attacker(tmp_path, monkeypatch):
    with pytest.raises(TrainingDiverged, match=r"Party 2 sent .* at iteration 5:") as err:
        small_run(tmp_path, "scale", monkeypatch, "2@5:scale:1e30")
    assert "learning rate" not in str(err.value)


@pytest.fixture(scope="module")
def clean_ap(tmp_path_factory):
    """AP of the small run under ``--robust clip`` without an attacker, per ``--compress``."""
    mp = pytest.MonkeyPatch()
    try:
        return {
            compress: small_run(tmp_path_factory.mktemp(compress), "clean", mp, robust="clip",
                                compress=compress)["test_ap"]
            for compress in ("none", "int8")
        }  # fmt: skip
    finally:
        mp.undo()


def assert_excluded_by_its_neighbours(summary, attacker=1, neighbours=(0, 2)):
    named = {e["rank"]: e for e in summary["party_events"] if e["event"] == "robust"}
    assert named[attacker]["excluded_by"] == list(neighbours)
    assert named[attacker]["dropped"] + named[attacker]["clipped"] > named[attacker]["received"] / 2
    assert all("excluded_by" not in e for rank, e in named.items() if rank != attacker)


@pytest.mark.parametrize("compress", ["none", "int8"])
@pytest.mark.parametrize("kind", ["nan", "scale:1e30", "signflip", "zeros"])
def test_robust_clip_holds_against_each_attack(kind, compress, clean_ap, tmp_path, monkeypatch):
    summary = small_run(tmp_path, "attacked", monkeypatch, f"1@0:{kind}", robust="clip",
                        compress=compress)  # fmt: skip
    assert summary["test_ap"] >= clean_ap[compress] - 0.05
    assert_excluded_by_its_neighbours(summary)


def test_robust_clip_resumes_bit_identically(monkeypatch):
    """The clipping window and the exclusions are checkpointed: stop, resume, same bits."""
    monkeypatch.setenv("SLATE_ATTACK", "1@0:signflip")
    config = TrainConfig(**{**SMALL, "robust": "clip", "iterations": 40})
    whole = Run(config)
    whole.advance(40)
    first = Run(config)
    first.advance(13)  # before the exclusion (iteration 15)
    second = Run(config)
    second.load_state_dict(first.state_dict())
    second.advance(27)
    assert torch.equal(second.x, whole.x)
    assert second.guard.events() == whole.guard.events()
    assert_excluded_by_its_neighbours({"party_events": whole.guard.events()})


@pytest.mark.parametrize("compress", ["none", "int8"])
def test_distributed_clipped_mix_equals_the_simulator(compress, tmp_path):
    common = ["--compress", compress, "--dataset", "digits", "--nodes", "4", "--topology",
              "ring", "--iterations", "30", "--eval-every", "15", "--seed", "3", "--no-progress",
              "--robust", "clip"]  # fmt: skip
    out = tmp_path / "dist"
    env = {**__import__("os").environ, "SLATE_ATTACK": "1@5:signflip"}
    done = subprocess.run(
        [sys.executable, "-m", "slate", "train", *common, "--engine", "distributed",
         "--out", str(out)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sim = tmp_path / "sim"
    done_sim = subprocess.run(
        [sys.executable, "-m", "slate", "train", *common, "--out", str(sim)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done_sim.returncode == 0, done_sim.stderr
    ours = torch.load(out / "model.pt", weights_only=True)
    theirs = torch.load(sim / "model.pt", weights_only=True)
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=0, atol=1e-5)
    summary = json.loads((out / "summary.json").read_text())
    assert any(e["event"] == "robust" and e["rank"] == 1 for e in summary["party_events"])


@pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")
def test_every_site_names_an_excluded_attacker_under_a_roster(tmp_path, monkeypatch):
    """Four sites with their own files, sealed: site 1 flips its sign; its neighbours 0 and 2
    exclude it, and every honest site's summary and log name it, site 3 (not its neighbour)
    included."""
    write_sites(tmp_path, parties=4, rows=300)
    roster = make_roster(tmp_path, 4)
    port = free_port()
    server = serve(port, "--roster", str(roster))
    flags = ["--nodes", "4", "--external-store", *SITE_FLAGS, "--iterations", "60",
             "--topology", "ring", "--robust", "clip"]  # fmt: skip
    parties = []
    for rank in range(4):
        if rank == 1:
            monkeypatch.setenv("SLATE_ATTACK", "1@0:signflip")
        parties.append(start_party(tmp_path, rank, port, *flags, *identity_flags(roster, rank)))
        monkeypatch.delenv("SLATE_ATTACK", raising=False)
    done = finish(parties, timeout=300)
    server.kill()
    server.communicate()
    for rank in (0, 2, 3):
        code, text = done[rank]
        assert code == 0, text[-3000:]
        summary = json.loads((tmp_path / f"site{rank}" / "run" / "summary.json").read_text())
        assert_excluded_by_its_neighbours(summary)
        assert "party 1 is misbehaving or far from its neighbours" in text
    (event,) = [e for e in summary["party_events"] if e["event"] == "robust" and e["rank"] == 1]
    assert event["seen_by"] == [0, 2] and event["received"] == 2 * 16  # then excluded
