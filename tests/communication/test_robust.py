"""Attacks (tests only), the watch on received values and ``--robust clip``
(:mod:`slate.security.robust`) against independent references."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from slate.algorithms.compute import FlatParameters
from slate.communication.compression import INT8_LEVELS, Int8Compressor
from slate.config import TrainConfig
from slate.engines.simulator import SimulatorCommunicator
from slate.errors import ConfigError, TrainingDiverged
from slate.faults import FaultPlan
from slate.faults.attacks import Attack, Attacker, corrupt, drift_message, parse_attacks
from slate.models.cnn import MnistCNN
from slate.models.mlp import MLP
from slate.models.resnet import ResNet18
from slate.security.guards import message_guard
from slate.security.robust import (
    ClippingGuard,
    MessageGuard,
    accusation_lines,
    events_from_records,
)
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
    slate_here,
    start_party,
    write_sites,
)


def brute_force_clip(x: np.ndarray, W: np.ndarray, x0: np.ndarray) -> np.ndarray:
    """x_i + sum_j w_ij clip(x_j - x_i, tau_i), tau_i = 2 |x_i - x0_i| (one round of own
    movement: its lower median), non-finite messages dropped."""
    n = len(x)
    out = x.copy()
    for i in range(n):
        tau = 2 * float(np.linalg.norm(x[i] - x0[i]))
        for j in range(n):
            if j == i or W[i, j] == 0 or not np.isfinite(x[j]).all():
                continue
            v = x[j] - x[i]
            norm = np.linalg.norm(v)
            out[i] += W[i, j] * (v * min(1.0, tau / norm) if norm > 0 else v)
    return out


@pytest.mark.parametrize("topology", ["ring", "torus", "exponential"])
def test_simulator_clipped_mix_equals_a_loop_over_edges(topology):
    n, d = 9, 7
    top = build_topology(topology, n)
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=(n, d))
    x = x0 + 0.3 * rng.normal(size=(n, d))  # each party's own steps since the start
    x[4] *= 50.0  # one far party: clipped by its neighbours
    x[2] = np.nan  # one non-finite: dropped
    guard = message_guard("clip", n, list(range(n)))
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64, guard=guard)
    guard.begin(torch.from_numpy(x0))
    got = comm.mix(torch.from_numpy(x)).numpy()
    want = brute_force_clip(x, np.array(top.matrix_at(0)), x0)
    honest = [i for i in range(n) if i != 2]
    np.testing.assert_allclose(got[honest], want[honest], rtol=1e-12, atol=1e-12)
    events = {e["rank"]: e for e in guard.events()}
    assert events[2]["dropped"] == events[2]["received"] > 0
    assert events[4]["clipped"] == events[4]["far"] == events[4]["received"] > 0


def test_nothing_is_mixed_before_a_party_has_moved():
    """tau is 0 while a party's window of own movement is empty: an attacker's first message
    cannot pass unclipped."""
    n, d = 4, 3
    top = build_topology("ring", n)
    x = torch.randn(n, d, dtype=torch.float64)
    guard = message_guard("clip", n, list(range(n)))
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64, guard=guard)
    guard.begin(x)
    torch.testing.assert_close(comm.mix(x), x)


def brute_force_rounds(xs: list[np.ndarray], W: np.ndarray, x0: np.ndarray):
    """Round by round, with the memory of module ``robust`` written out plainly: tau_i = 2 x
    the lower median of party i's own movement since its last mix over its last 16 rounds
    (0 while none); a message refused when non-finite or farther than |x_i| / 2 from x_i; a
    sender refused at a moving rate r <- r + (b - r) / 8 of at least 0.8 after 16 messages is
    excluded from the next round."""
    n = len(x0)
    window: list[list[float]] = [[] for _ in range(n)]
    rate, seen = np.zeros((n, n)), np.zeros((n, n), dtype=int)
    excluded = np.zeros((n, n), dtype=bool)
    last, outs = x0.copy(), []
    for x in xs:
        out = x.copy()
        now_excluded = excluded.copy()
        for i in range(n):
            moved = float(np.linalg.norm(x[i] - last[i]))
            window[i] = (window[i] + ([moved] if moved > 0 else []))[-16:]
            ordered = sorted(window[i])
            tau = 2 * ordered[(len(ordered) - 1) // 2] if ordered else 0.0
            for j in range(n):
                if j == i or W[i, j] == 0 or now_excluded[i, j]:
                    continue
                refused = not np.isfinite(x[j]).all()
                if not refused:
                    v = x[j] - x[i]
                    norm = np.linalg.norm(v)
                    out[i] += W[i, j] * (v * tau / norm if norm > tau else v)
                    refused = bool(norm > 0.5 * np.linalg.norm(x[i]))
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
    x0 = rng.normal(size=(n, d)) + 10.0
    guard = message_guard("clip", n, list(range(n)))
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64, guard=guard)
    guard.begin(torch.from_numpy(x0))
    xs, got, previous = [], [], x0
    for t in range(rounds):
        x = previous + 0.3 * rng.normal(size=(n, d))
        x[4] = -3.0 * x[4] if t >= 2 else x[4]  # a far party from round 2 on
        x[2] = np.nan if t >= 5 else x[2]  # a non-finite one from round 5 on
        # a party a little farther than its clipping radius, never half a model away
        x[6] = x[6] + 0.2 * np.linalg.norm(x[6]) * np.ones(d) / np.sqrt(d) if t >= 1 else x[6]
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
        assert events[sender]["accused_by"] == by
    good = [i for i in range(n) if i not in (2, 4)]  # (2 and 4 hold broken rows themselves)
    assert not excluded[np.ix_(good, good)].any()
    assert events[6]["clipped"] > events[6]["received"] / 2  # clipped, yet not accused
    assert not set(events[6]["accused_by"]) & set(good)
    # Accepted for rounds 0-4, then dropped: r = 1 - (7/8)^(t - 4) reaches 0.8 at round 17.
    first = min(t for t in range(15, 40) if 1 - (7 / 8) ** (t - 4) >= 0.8)
    assert {a["excluded_at"] for a in events[2]["accusations"] if a["by"] in good} == {first}


def test_without_clip_or_attack_the_guarded_mix_is_w_times_x():
    n, d = 6, 5
    top = build_topology("ring", n)
    x = torch.randn(n, d, dtype=torch.float64)
    attacker = Attacker(list(range(n)), [Attack(1, 0, "scale", 1.0)])
    guard = message_guard("none", n, list(range(n)), attacker)
    assert type(guard) is MessageGuard and guard.edge_by_edge  # mixed edge by edge
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64, guard=guard)
    W = torch.tensor(np.array(top.matrix_at(0)))
    torch.testing.assert_close(comm.mix(x), W @ x)


def test_attack_parsing():
    assert parse_attacks("2@10:nan, 0@0:scale:1e30,1@5:signflip,3@1:zeros,1@7:drift:1.5") == [
        Attack(2, 10, "nan"), Attack(0, 0, "scale", 1e30), Attack(1, 5, "signflip"),
        Attack(3, 1, "zeros"), Attack(1, 7, "drift", 1.5),
    ]  # fmt: skip
    assert parse_attacks("") == [] and parse_attacks(None) == []
    for bad, why in (
        ("x@1:nan", "RANK@ITER:KIND"), ("1@:nan", "RANK@ITER:KIND"), ("1@2", "RANK@ITER:KIND"),
        ("1@2:boom", "impute:F, not 'boom'"), ("1@2:scale", r"scale takes a factor \(scale:F\)"),
        ("1@2:scale:abc", "'abc' is not a number"), ("1@2:nan:3", "nan takes no factor"),
        ("1@2:drift", r"drift takes a factor \(drift:F\)"),
        ("1@2:drift:k", "'k' is not a number"),
        ("1@2:drift:-1", "finite number >= 0, not '-1'"),
        ("1@2:drift:inf", "finite number >= 0, not 'inf'"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=r"SLATE_ATTACK: bad part") as err:
            parse_attacks(f"0@0:zeros,{bad}")
        assert repr(bad) in str(err.value)
        assert re.search(why, str(err.value)), str(err.value)


def test_drift_needs_a_model_with_a_linear_layer():
    with pytest.raises(ConfigError, match=r"SLATE_ATTACK: drift negates the model's output"):
        FaultPlan.from_environment({"SLATE_ATTACK": "1@0:drift:1"}).attacker([1], None)
    assert FaultPlan(attacks=(Attack(1, 0, "drift", 1.0),)).attacker([2], None) is None  # not here


def test_the_last_linear_layer_is_found_in_the_flat_layout():
    for model, name in ((MLP(300, 28), "out"), (MnistCNN(), "head.2"), (ResNet18(3, 8), "fc")):
        layout = FlatParameters(model)
        start, stop = layout.last_linear(model)
        flat = layout.flatten(model)
        layer = dict(model.named_modules())[name]
        want = torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach()])
        torch.testing.assert_close(flat[start:stop], want)
        assert stop - start == want.numel()
    assert FlatParameters(torch.nn.Conv2d(1, 2, 3)).last_linear(torch.nn.Conv2d(1, 2, 3)) is None


def drift_by_hand(x: np.ndarray, distance: float, k: float, start: int, stop: int) -> np.ndarray:
    """x + k D (T - x) / |T - x|, T = x with x[start:stop] negated, written out."""
    target = x.copy()
    target[start:stop] = -target[start:stop]
    direction = target - x
    return x + k * distance * direction / np.linalg.norm(direction)


def test_the_drift_message_is_the_formula():
    n, d, span = 4, 10, (6, 10)
    rng = np.random.default_rng(3)
    x0 = rng.normal(size=(n, d))
    (attack,) = parse_attacks("1@2:drift:1.5")
    guard = MessageGuard(n, list(range(n)), Attacker(list(range(n)), [attack], span))
    guard.begin(torch.from_numpy(x0))
    x = x0 + 0.1 * rng.normal(size=(n, d))
    guard.iteration = 1
    torch.testing.assert_close(guard.sent(torch.from_numpy(x)).numpy(), x)  # not yet
    guard.iteration = 2
    # Nothing received yet: D is its own movement since the start.
    sent = guard.sent(torch.from_numpy(x)).numpy()
    moved = float(np.linalg.norm(x[1] - x0[1]))
    np.testing.assert_allclose(sent[1], drift_by_hand(x[1], moved, 1.5, *span), rtol=1e-12)
    np.testing.assert_array_equal(sent[[0, 2, 3]], x[[0, 2, 3]])
    # A simulator round on a ring: party 1 hears 0 and 2; D is the median of the two distances
    # (their mean), and party 1's own row stays honest.
    top = build_topology("ring", n)
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64, guard=guard)
    comm.set_iteration(2)
    mixed = comm.mix(torch.from_numpy(x)).numpy()
    W = np.array(top.matrix_at(0))
    np.testing.assert_allclose(mixed[1], W[1] @ x, rtol=1e-12)
    want_0 = W[0, 0] * x[0] + W[0, 1] * sent[1] + W[0, 3] * x[3]
    np.testing.assert_allclose(mixed[0], want_0, rtol=1e-12)
    heard = np.mean([np.linalg.norm(x[j] - x[1]) for j in (0, 2)])
    y = mixed + 0.05 * rng.normal(size=(n, d))
    sent = guard.sent(torch.from_numpy(y)).numpy()
    np.testing.assert_allclose(sent[1], drift_by_hand(y[1], heard, 1.5, *span), rtol=1e-12)
    np.testing.assert_allclose(
        sent[1], drift_message(torch.from_numpy(y[1]), torch.tensor(heard), 1.5, span).numpy()
    )


@pytest.mark.parametrize("kind", ["nan", "scale:3", "signflip", "zeros"])
def test_each_attack_corrupts_what_is_sent_and_not_the_attackers_state(kind):
    n, d = 4, 5
    x = torch.randn(n, d, dtype=torch.float64) + 1.0
    before = x.clone()
    (attack,) = parse_attacks(f"1@3:{kind}")
    guard = MessageGuard(n, list(range(n)), Attacker(list(range(n)), [attack]))
    guard.iteration = 2
    assert guard.sent(x) is x  # not yet
    guard.iteration = 3
    sent = guard.sent(x)
    torch.testing.assert_close(x, before)  # the attacker's own copy is honest
    torch.testing.assert_close(sent[[0, 2, 3]], x[[0, 2, 3]])
    expected = {"nan": torch.full((d,), float("nan"), dtype=x.dtype), "scale:3": 3 * x[1],
                "signflip": -x[1], "zeros": torch.zeros(d, dtype=x.dtype)}[kind]  # fmt: skip
    torch.testing.assert_close(sent[1], expected, equal_nan=True)
    torch.testing.assert_close(corrupt(x[1], attack), expected, equal_nan=True)
    # In a simulator round the others receive the corrupted row; the attacker mixes its own.
    top = build_topology("ring", n)
    comm = SimulatorCommunicator(top, torch.device("cpu"), torch.float64, guard=guard)
    comm.set_iteration(3)
    mixed = comm.mix(x)
    W = torch.tensor(np.array(top.matrix_at(0)))
    sent_rows = sent.clone()
    want_1 = W[1, 1] * x[1] + W[1, 0] * x[0] + W[1, 2] * x[2]
    torch.testing.assert_close(mixed[1], want_1)
    want_0 = W[0, 0] * x[0] + W[0, 1] * sent_rows[1] + W[0, 3] * x[3]
    torch.testing.assert_close(mixed[0], want_0, equal_nan=True)


SMALL = dict(dataset="digits", nodes=4, topology="ring", iterations=60, eval_every=30, seed=3)


def small_run(tmp_path, name, attack=None, **flags):
    faults = FaultPlan.from_environment({"SLATE_ATTACK": attack} if attack else {})
    config = TrainConfig(**{**SMALL, **flags, "out": str(tmp_path / name)})
    quiet = dict(progress=False, log=lambda _: None, figures=False)  # (no test reads a figure)
    return train(config, faults=faults, **quiet).summary


@pytest.mark.parametrize("compress", ["none", "int8"])
def test_nan_attack_without_robust_names_the_attacker(compress, tmp_path):
    with pytest.raises(TrainingDiverged, match=r"Party 2 sent non-finite") as err:
        small_run(tmp_path, "nan", "2@5:nan", compress=compress)
    assert "learning rate" not in str(err.value)


def test_a_huge_scale_without_robust_names_the_attacker(tmp_path):
    with pytest.raises(TrainingDiverged, match=r"Party 2 sent .* at iteration 5:") as err:
        small_run(tmp_path, "scale", "2@5:scale:1e30")
    assert "learning rate" not in str(err.value)


@pytest.fixture(scope="module")
def clean_ap(tmp_path_factory):
    """AP of the small run under ``--robust clip`` without an attacker, per ``--compress``."""
    return {
        compress: small_run(tmp_path_factory.mktemp(compress), "clean", robust="clip",
                            compress=compress)["test_ap"]
        for compress in ("none", "int8")
    }  # fmt: skip


def assert_accused_only_by_its_neighbours(summary, attacker=1, neighbours=(0, 2)):
    named = {e["rank"]: e for e in summary["party_events"] if e["event"] == "robust"}
    assert named[attacker]["accused_by"] == list(neighbours)
    assert [a["by"] for a in named[attacker]["accusations"]] == list(neighbours)
    refused = named[attacker]["dropped"] + named[attacker]["far"]
    assert refused > named[attacker]["received"] / 2
    assert all(e["accused_by"] == [] for rank, e in named.items() if rank != attacker)


@pytest.mark.parametrize("compress", ["none", "int8"])
@pytest.mark.parametrize("kind", ["nan", "scale:1e30", "signflip", "zeros"])
def test_robust_clip_holds_against_each_attack(kind, compress, clean_ap, tmp_path):
    summary = small_run(tmp_path, "attacked", f"1@0:{kind}", robust="clip",
                        compress=compress)  # fmt: skip
    assert summary["test_ap"] >= clean_ap[compress] - 0.05
    assert_accused_only_by_its_neighbours(summary)


@pytest.mark.parametrize("factor", ["0.5", "1", "1.5", "3"])
def test_a_drift_never_gets_an_honest_party_excluded_or_accused(factor, tmp_path):
    """A drifting neighbour stays plausible: it is clipped, and nobody is excluded; an honest
    party dragged by it is not either (a rule that excluded senders clipped again and again
    excluded honest neighbours here)."""
    summary = small_run(tmp_path, "drift", f"1@0:drift:{factor}", robust="clip",
                        iterations=300, eval_every=300)  # fmt: skip
    events = {e["rank"]: e for e in summary["party_events"] if e["event"] == "robust"}
    assert all(e["accused_by"] == [] and e["far"] == 0 for e in events.values())
    # the drifting party may be suspected of its pull (security.pulls), never excluded; no
    # honest party is accused or suspected
    lines = accusation_lines(summary["party_events"])
    assert [line for line in lines if "suspects party 1:" not in line] == [], lines
    assert all("not excluded" in line for line in lines)
    assert events[1]["clipped"] > 0  # what it sent was clipped


def test_the_report_names_only_the_accusing_receivers():
    """Receiver 0 excluded sender 1; receiver 2 only clipped it; sender 3 clipped by 2; and a
    lying party 1 accuses party 2: each accusation is printed as its accuser's."""
    records = [
        [0, 1, 16, 0, 16, 14, 1984, 15],
        [2, 1, 2000, 0, 300, 0, 0, -1],
        [2, 3, 2000, 0, 20, 0, 0, -1],
        [1, 2, 40, 0, 0, 0, 1960, 39],
    ]
    events = {e["rank"]: e for e in events_from_records(records, 2000)}
    assert events[1]["accused_by"] == [0] and events[1]["seen_by"] == [0, 2]
    accusation = {"by": 0, "received": 16, "dropped": 0, "clipped": 16, "far": 14,
                  "ignored": 1984, "excluded_at": 15}  # fmt: skip
    assert events[1]["accusations"] == [accusation]
    assert [r["by"] for r in events[1]["reports"]] == [0, 2]
    assert events[1]["reports"][1]["excluded_at"] is None
    assert (events[1]["received"], events[1]["clipped"], events[1]["far"]) == (2016, 316, 14)
    assert events[3]["accused_by"] == [] and "no party excluded it" in events[3]["reason"]
    assert events[2]["accused_by"] == [1]
    assert accusation_lines(list(events.values())) == [
        "party 0 accuses party 1: --robust clip excluded it from iteration 15: 14 of the 16 "
        "messages it received from it were non-finite or farther than half its own model; "
        "1984 later messages ignored",
        "party 1 accuses party 2: --robust clip excluded it from iteration 39: 0 of the 40 "
        "messages it received from it were non-finite or farther than half its own model; "
        "1960 later messages ignored",
    ]
    # A record written before the far count (7 numbers) reads with none.
    (old,) = events_from_records([[0, 1, 16, 0, 16, 1984, 15]], 2000)
    assert old["accusations"][0] == {"by": 0, "received": 16, "dropped": 0, "clipped": 16,
                                     "far": 0, "ignored": 1984, "excluded_at": 15}  # fmt: skip


@pytest.mark.parametrize("attack", ["1@0:signflip", "1@0:drift:3"])
def test_robust_clip_resumes_bit_identically(attack):
    """The clipping window, the exclusions and the drift's memory are checkpointed: stop,
    resume, same bits."""
    faults = FaultPlan.from_environment({"SLATE_ATTACK": attack})
    config = TrainConfig(**{**SMALL, "robust": "clip", "iterations": 40})
    whole = Run(config, faults=faults)
    assert isinstance(whole.guard, ClippingGuard)
    whole.advance(40)
    first = Run(config, faults=faults)
    first.advance(13)  # before the exclusion (iteration 15)
    second = Run(config, faults=faults)
    second.load_state_dict(first.state_dict())
    second.advance(27)
    assert torch.equal(second.x, whole.x)
    assert second.guard.events() == whole.guard.events()
    if "signflip" in attack:
        assert_accused_only_by_its_neighbours({"party_events": whole.guard.events()})


CLIPPED_CASES = [("int8", "1@5:signflip"), ("none", "1@5:drift:2")]  # (compress, SLATE_ATTACK)

#: Both distributed runs, one after the other in one fresh interpreter (``slate.cli.main``
#: twice): a worker takes the launcher's environment as it is when it starts, so each run's
#: sites see its own ``SLATE_ATTACK``; the launcher's forkserver, started by the first run, serves
#: the second (it has only imported, under the same ``ATEN_CPU_CAPABILITY``).
_BOTH_RUNS = """
import json, os, sys
from slate.cli import main
for attack, *argv in json.loads(sys.argv[1]):
    os.environ["SLATE_ATTACK"] = attack
    code = main(argv)
    if code:
        sys.exit(code)
"""


def clipped_flags(compress: str) -> list[str]:
    return ["--compress", compress, "--dataset", "digits", "--nodes", "4", "--topology", "ring",
            "--iterations", "30", "--eval-every", "15", "--seed", "3", "--no-progress",
            "--robust", "clip", "--no-plots"]  # fmt: skip


@pytest.fixture(scope="module")
def distributed_clipped(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Each case's distributed run under ``ATEN_CPU_CAPABILITY=default`` (no SIMD), both in one
    fresh interpreter (the variable is read as torch loads): case -> its output folder."""
    root = tmp_path_factory.mktemp("clipped")
    runs = [[attack, "train", *clipped_flags(compress), "--engine", "distributed", "--out",
             str(root / compress)] for compress, attack in CLIPPED_CASES]  # fmt: skip
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    done = subprocess.run([sys.executable, "-c", _BOTH_RUNS, json.dumps(runs)],
                          capture_output=True, text=True, timeout=400, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {case: root / case[0] for case in CLIPPED_CASES}


@pytest.mark.processes
@pytest.mark.parametrize("compress, attack", CLIPPED_CASES)
def test_distributed_clipped_mix_equals_the_simulator(
    compress, attack, distributed_clipped, tmp_path, monkeypatch
):
    """The engines on different CPU kernels, as sites on different machines would be: the
    distributed run under ``ATEN_CPU_CAPABILITY=default`` (no SIMD), the simulator under this
    machine's own. Their float32 arithmetic then differs in the last bits.

    Bounded, not exact. Without compression the models agree to float32 rounding (1e-5). With
    ``int8`` a rounding difference can flip a code across a quantization boundary: the received
    difference moves by one step ``s`` of its block, the consensus step passes that to the
    parameters with a weight ``gamma w <= 1``, and error feedback takes it out of the public
    copy in the next round. So a value agrees within ``1e-5 + 2 s`` (``s`` the median step of
    the run's messages: a coordinate may flip twice), and flips are rare (at most 5% of the
    values beyond 1e-5). Measured on an AMD EPYC (AVX2 against no SIMD): 25 of 1 792 values
    beyond 1e-5, the largest 2.5e-5, with ``s`` 2.7e-5 (an AVX-512 machine showed 23 values, 2.5e-5
    at most, against the simulator on its own kernels); without compression 1.9e-7 at most."""
    common = clipped_flags(compress)
    out = distributed_clipped[(compress, attack)]
    sim = tmp_path / "sim"
    monkeypatch.setenv("SLATE_ATTACK", attack)
    steps = _recorded_int8_steps(monkeypatch)
    done_sim = slate_here("train", *common, "--out", str(sim))  # the simulator, in this process
    assert done_sim.returncode == 0, done_sim.stderr
    ours = torch.load(out / "model.pt", weights_only=True)
    theirs = torch.load(sim / "model.pt", weights_only=True)
    gap = torch.cat([(ours[name] - value).abs().reshape(-1) for name, value in theirs.items()])
    if compress == "none":
        assert not steps
        assert gap.max() <= 1e-5
    else:
        step = float(np.median(steps))
        assert 0 < step < 1e-3
        assert gap.max() <= 1e-5 + 2 * step, (float(gap.max()), step)
        assert (gap > 1e-5).float().mean() <= 0.05
    summary = json.loads((out / "summary.json").read_text())
    assert any(e["event"] == "robust" and e["rank"] == 1 for e in summary["party_events"])


def _recorded_int8_steps(monkeypatch) -> list[float]:
    """The quantization step of every row that ``int8`` encodes in this process, as it runs:
    the largest magnitude of the row over 127 (the widest block's step)."""
    steps: list[float] = []
    encode = Int8Compressor._encode

    def recording(self, rows):
        steps.extend((rows.abs().amax(dim=1) / INT8_LEVELS).tolist())
        return encode(self, rows)

    monkeypatch.setattr(Int8Compressor, "_encode", recording)
    return steps


def run_sites(tmp_path, monkeypatch, attack: str, iterations: int) -> list[tuple[int, str]]:
    """Four sites with their own small w7a files, under a roster, on a ring with --robust
    clip; site 1 runs with ``SLATE_ATTACK=attack``."""
    write_sites(tmp_path, parties=4, rows=300)
    roster = make_roster(tmp_path, 4)
    port = free_port()
    server = serve(port, "--roster", str(roster))
    flags = ["--nodes", "4", "--external-store", *SITE_FLAGS, "--iterations", str(iterations),
             "--topology", "ring", "--robust", "clip"]  # fmt: skip
    parties = []
    for rank in range(4):
        if rank == 1:
            monkeypatch.setenv("SLATE_ATTACK", attack)
        parties.append(start_party(tmp_path, rank, port, *flags, *identity_flags(roster, rank)))
        monkeypatch.delenv("SLATE_ATTACK", raising=False)
    done = finish(parties, timeout=300)
    server.kill()
    server.communicate()
    return done


def site_summary(tmp_path, rank: int) -> dict:
    return json.loads((tmp_path / f"site{rank}" / "run" / "summary.json").read_text())


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")
def test_every_site_reports_the_accusations_of_an_attackers_neighbours_under_a_roster(
    tmp_path, monkeypatch
):
    """Four sites with their own files, sealed: site 1 flips its sign; its neighbours 0 and 2
    exclude it, and every honest site's summary and log report their accusations, as theirs,
    site 3 (not its neighbour) included."""
    done = run_sites(tmp_path, monkeypatch, "1@0:signflip", 40)  # excluded at 15
    for rank in (0, 2, 3):
        code, text = done[rank]
        assert code == 0, text[-3000:]
        summary = site_summary(tmp_path, rank)
        assert_accused_only_by_its_neighbours(summary)
        assert "party 0 accuses party 1: --robust clip excluded it from iteration 15" in text
        assert "party 2 accuses party 1: --robust clip excluded it from iteration 15" in text
        assert "party 3 accuses" not in text and "misbehaving" not in text
    (event,) = [e for e in summary["party_events"] if e["event"] == "robust" and e["rank"] == 1]
    assert event["seen_by"] == [0, 2] and event["received"] == 2 * 16  # then excluded


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")
def test_a_drifting_site_gets_no_honest_site_accused_under_a_roster(tmp_path, monkeypatch):
    """Four sites with their own files, sealed: site 1 drifts (K = 3) for 300 iterations. The
    run ends; no honest site is excluded or accused anywhere, and every honest site's summary
    lists the same receivers' reports, each as its receiver made it (here: clips, and no
    accusation at all)."""
    done = run_sites(tmp_path, monkeypatch, "1@0:drift:3", 300)
    reports = {}
    for rank in (0, 1, 2, 3):
        code, text = done[rank]
        assert code == 0, text[-3000:]
        assert "accuses" not in text
        events = [e for e in site_summary(tmp_path, rank)["party_events"]
                  if e["event"] == "robust"]  # fmt: skip
        assert all(e["accused_by"] == [] and e["accusations"] == [] for e in events)
        reports[rank] = {e["rank"]: e["reports"] for e in events}
    assert reports[0] == reports[1] == reports[2] == reports[3]
    # Each report is the one its receiver kept: party 1's messages were seen by 0 and 2 only,
    # 300 each, and clipped there.
    assert [r["by"] for r in reports[0][1]] == [0, 2]
    assert all(r["received"] == 300 and r["clipped"] > 0 for r in reports[0][1])
