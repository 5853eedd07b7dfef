"""The start-up warning of a graph whose evaluation average gives a site's model away
(:mod:`slate.training.disclosure_warning`), and the algebra it states, on real simulator runs.

The algebra: at the evaluation of iteration T, site i opens the average of x_T = W z, where z are
the models the sites sent in iteration T - 1's round; N times the average, minus its own z_i and
its neighbours' z_j, is the sum of the unheard sites' z. On a ring of 4 that is one site's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from slate.config import TrainConfig
from slate.engines.simulator import SimulatorCommunicator, SimulatorEngine
from slate.topology import build_topology
from slate.training.configuration import resolve_and_check
from slate.training.disclosure_warning import disclosure_warning
from slate.training.loop import train
from slate.training.run import Run
from tests.sites import HAVE_W7A, write_sites


def _digits(**flags) -> TrainConfig:
    values = dict(dataset="digits", nodes=4, iterations=20, lr=0.05, positives=1,
                  batch_size=16, eval_every=10, party_ap=False, compile="off")  # fmt: skip
    return TrainConfig(**{**values, **flags})


def _lines(config: TrainConfig) -> list[str]:
    """The start-up warning of ``config``'s run as a site holding its own rows would print it
    (a run of one dataset cut into parties prints none: below)."""
    text = disclosure_warning(Run(resolve_and_check(config)))
    return [] if text is None else [text]


def _printed(config: TrainConfig) -> list[str]:
    lines: list[str] = []
    train(config, progress=False, write=False, log=lines.append)
    return [line for line in lines if "models away" in line]


def test_one_dataset_cut_into_parties_prints_no_warning():
    """One operator holds every party's rows: no site learns another's model."""
    assert _lines(_digits()) != [] and _printed(_digits()) == []


@pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")
def test_sites_with_their_own_files_print_the_warning(tmp_path):
    write_sites(tmp_path, parties=4, rows=200)
    template = str(tmp_path / "site{rank}")
    config = TrainConfig(dataset="libsvm", train=f"{template}/train.svm",
                         test=f"{template}/test.svm", n_features=300, nodes=4, iterations=4,
                         eval_every=2, positives=1, batch_size=8, lr=0.05,
                         compile="off")  # fmt: skip
    (line,) = _printed(config)
    assert line.startswith("warning: on topology ring without --dp-epsilon")


def _warnings(config: TrainConfig) -> list[str]:
    return [line for line in _lines(config) if "gives single sites' models away" in line]


def test_a_ring_of_4_warns_once_naming_who_recovers_whom():
    (line,) = _warnings(_digits())
    assert line.startswith("warning: on topology ring without --dp-epsilon")
    assert ("site 0 recovers site 2's model; site 1 recovers site 3's model; site 2 recovers "
            "site 0's model; site 3 recovers site 1's model.") in line  # fmt: skip


@pytest.mark.parametrize(
    "flags",
    [
        {"dp_epsilon": 8.0},  # the recovered model is DP: covered by epsilon
        {"nodes": 5},  # a ring of 5: each site misses two, and learns their sum only
        {"topology": "full"},  # one exact average per round: nobody heard, three unheard
        {"topology": "base-2"},  # one peer per round: two unheard
        {"gossip_every": 3, "eval_every": 10},  # after a local step: three unheard
    ],
    ids=["dp-epsilon", "ring-of-5", "full", "base-2", "local-steps"],
)
def test_no_warning_where_no_site_isolates_another(flags):
    assert _warnings(_digits(**flags)) == []


class _Recording(SimulatorCommunicator):
    """Keeps every gossip round's messages by iteration: the models ``z = x - lr * direction``
    in ``sent``, what a plain ``mix`` gossips (gradient tracking's directions) in ``mixed``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: dict[int, Tensor] = {}
        self.mixed: dict[int, Tensor] = {}

    def _gossip_step(self, x, direction, lr, r):
        if direction is None:  # (the simulator's mix)
            self.mixed[self.iteration] = x.double().clone()
        else:
            self.sent[self.iteration] = torch.add(x, direction, alpha=-lr).double().clone()
        return super()._gossip_step(x, direction, lr, r)


class _RecordingEngine(SimulatorEngine):
    """Keeps its communicator, and each evaluation's models and their average."""

    def communicator(self, topology, device, settings=None, x0=None, guard=None):
        self.recording = _Recording(topology, device, torch.float32, settings, x0, guard)
        return self.recording

    def mean_parameters(self, x):
        mean = super().mean_parameters(x)
        self.averages = [*getattr(self, "averages", []), (x.double().clone(), mean.double())]
        return mean


def _run(nodes: int) -> tuple[_RecordingEngine, np.ndarray]:
    engine = _RecordingEngine(nodes)
    train(_digits(nodes=nodes), progress=False, write=False, engine=engine, log=lambda _: None)
    return engine, np.array(build_topology("ring", nodes).W)


def _relative(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_on_a_ring_of_4_site_0_recovers_site_2s_model_and_every_evaluated_model():
    """At the evaluations of iterations 10 and 20, site 0 holds its own message z_0, hears z_1
    and z_3, and opens the average: 4 * average - z_0 - z_1 - z_3 is site 2's message, to
    float rounding (measured 1.8e-7 relative); with it, W z gives every site's evaluated model
    (site 2's and site 3's included), which site 0 never received (measured 3.4e-8 to
    5.3e-8)."""
    engine, W = _run(4)
    sent = engine.recording.sent
    (x10, avg10), (x20, avg20) = engine.averages[1:3]  # (the first: iteration 0's)
    for T, x, average in ((10, x10, avg10), (20, x20, avg20)):
        z = sent[T - 1]
        recovered = 4 * average - z[0] - z[1] - z[3]
        assert _relative(recovered, z[2]) < 1e-6
        known = torch.stack([z[0], z[1], recovered, z[3]])
        models = torch.from_numpy(W) @ known
        for k in range(4):
            assert _relative(models[k], x[k]) < 1e-6
        assert _relative(z[2], z[1]) > 1e-4  # (measured 1.1e-3: the sites' models differ)


def test_on_a_ring_of_5_site_0_learns_a_sum_and_the_models_it_spans():
    """On a ring of 5 site 0 misses sites 2 and 3 and learns z_2 + z_3 only. With the ring's
    equal weights (1/3) that still gives site 2's and site 3's evaluated models, each a third of
    three messages (x_2 = (z_1 + z_2 + z_3) / 3): what security.md says, checked."""
    engine, W = _run(5)
    assert np.allclose(W[2, 1:4], 1 / 3) and np.allclose(W[3, 2:5], 1 / 3)
    x, average = engine.averages[1]
    z = engine.recording.sent[9]
    pair = 5 * average - z[0] - z[1] - z[4]
    assert _relative(pair, z[2] + z[3]) < 1e-6
    assert _relative(pair / 3 + z[1] / 3, x[2]) < 1e-6
    assert _relative(pair / 3 + z[4] / 3, x[3]) < 1e-6


def _recovered(rows: list[np.ndarray], values: list[Tensor], target: np.ndarray) -> Tensor | None:
    """``target``'s combination of the known rows applied to their known values, or None when
    ``target`` is not in their span."""
    known = np.stack(rows)
    c, *_ = np.linalg.lstsq(known.T, target, rcond=None)
    if np.linalg.norm(known.T @ c - target) > 1e-9:
        return None
    return sum(float(w) * v for w, v in zip(c, values, strict=True))


def _traced(name: str, n: int, tracking: bool) -> tuple[_RecordingEngine, dict[int, Tensor]]:
    engine = _RecordingEngine(n)
    config = _digits(nodes=n, topology=name, gradient_tracking=tracking)
    train(config, progress=False, write=False, engine=engine, log=lambda _: None)
    averages = {T: mean for T, (_, mean) in zip((0, 10, 20), engine.averages, strict=False)}
    return engine, averages


@pytest.mark.parametrize(("name", "n"), [("ring", 4), ("star", 3), ("exponential", 6)])
def test_every_pair_the_warning_names_is_recovered_from_a_real_run(name, n):
    """For each site i and each site k the warning names, from the run's own messages at
    iteration 9 (site i's own, its neighbours') and the average at 10: N times the average minus
    them is k's message, to float rounding."""
    from slate.topology.disclosure import run_exposures

    topology = build_topology(name, n)
    claimed = run_exposures(topology, 20, 10)
    assert any(claimed)
    engine, averages = _traced(name, n, tracking=False)
    z, W = engine.recording.sent[9], np.asarray(topology.W)
    for i, sites in enumerate(claimed):
        heard = [j for j in range(n) if j != i and W[i, j] > 0]
        for k in sites:
            recovered = n * averages[10] - z[i] - sum(z[j] for j in heard)
            assert _relative(recovered, z[k]) < 1e-6, (i, k)


@pytest.mark.parametrize(("name", "n"), [("ring", 5), ("ring", 7), ("ring", 8)])
def test_under_gradient_tracking_every_named_pair_is_recovered_from_a_real_run(name, n):
    """Gradient tracking: site i knows its own z_t and q_{t+1}, each neighbour's z_t, q_{t+1}
    and z_{t+1} (= W z_t - lr W q_{t+1}), and the evaluation sums at t + 1 and t + 2. Every pair
    the analysis names is recovered, from a real run's messages, in one of the windows t = 8, 9,
    18 (the sums of iterations 10 and 20 fall there), to float rounding; a ring of 5 and of 8
    from gossip alone."""
    from slate.topology.disclosure import tracking_exposures

    topology = build_topology(name, n)
    claimed = tracking_exposures(topology, 20, 10)
    assert any(claimed)
    engine, averages = _traced(name, n, tracking=True)
    sent, mixed, W, lr = engine.recording.sent, engine.recording.mixed, np.array(topology.W), 0.05
    eye, ones, zeros = np.eye(n), np.ones(n), np.zeros(n)
    message = np.hstack([W, -lr * W])
    shown: set[tuple[int, int]] = set()
    for t in (8, 9, 18):
        for i in range(n):
            heard = [j for j in range(n) if j != i and W[i, j] > 0]
            rows = [np.hstack([eye[i], zeros]), np.hstack([zeros, eye[i]])]
            values = [sent[t][i], mixed[t + 1][i]]
            for j in heard:
                rows += [np.hstack([eye[j], zeros]), np.hstack([zeros, eye[j]]), message[j]]
                values += [sent[t][j], mixed[t + 1][j], sent[t + 1][j]]
            if t + 1 in averages:
                rows.append(np.hstack([ones, zeros]))
                values.append(n * averages[t + 1])
            if t + 2 in averages:
                rows.append(np.hstack([ones, -lr * ones]))
                values.append(n * averages[t + 2])
            for k in set(range(n)) - {i, *heard}:
                for target, truth in ((np.hstack([eye[k], zeros]), sent[t][k]),
                                      (message[k], sent[t + 1][k])):  # fmt: skip
                    got = _recovered(rows, values, target)
                    if got is not None:
                        assert _relative(got, truth) < 1e-5, (t, i, k)
                        shown.add((i, k))
    assert shown == {(i, k) for i, sites in enumerate(claimed) for k in sites}


def test_gradient_tracking_has_its_own_warning():
    (line,) = [
        line
        for line in _lines(_digits(nodes=5, gradient_tracking=True))
        if "computes models that other sites sent" in line
    ]
    assert "site 0 recovers the models of sites 2 and 3" in line
    assert not any("models" in line for line in _lines(_digits(nodes=9, gradient_tracking=True))
                   if line.startswith("warning"))  # fmt: skip


class _Copies(_Recording):
    """Also keeps, after each CHOCO round, site 0's copies of what sites 1 and 3 sent it."""

    def _gossip_step(self, x, direction, lr, r):
        out = super()._gossip_step(x, direction, lr, r)
        choco, self.copies = self.choco, getattr(self, "copies", {})
        slot = choco.edges.slot_of  # (i, j): i's copy of what j sent it is received[slot]
        self.copies[self.iteration] = {j: choco.received[slot[(0, j)]].double() for j in (1, 3)}
        return out


class _CopiesEngine(_RecordingEngine):
    def communicator(self, topology, device, settings=None, x0=None, guard=None):
        self.recording = _Copies(topology, device, torch.float32, settings, x0, guard)
        return self.recording


@pytest.mark.parametrize(("compress", "bound"), [("int8", 1e-4), ("sign", 1.0)])
def test_under_compression_site_0_gets_site_2s_model_up_to_its_neighbours_residuals(
    compress, bound
):
    """CHOCO's round keeps the sum, so 4 * average - z_0 - (site 0's copies of z_1 and z_3) is
    z_2 plus the two neighbours' compression residuals, which the warning says: with int8 a
    relative 1.4e-5 (the average itself is 5e-4 to 8e-4 away from z_2), with sign more than the
    average's distance (measured 2e-3 to 4e-3 against 1.4e-3 to 1.8e-3)."""
    engine = _CopiesEngine(4)
    train(_digits(compress=compress), progress=False, write=False, engine=engine,
          log=lambda _: None)  # fmt: skip
    (line,) = [line for line in _lines(_digits(compress=compress)) if "up to compression" in line]
    assert f"--compress {compress}" in line and "site 0 recovers site 2's model" in line
    for index, T in ((1, 10), (2, 20)):
        _, average = engine.averages[index]
        z, copies = engine.recording.sent[T - 1], engine.recording.copies[T - 1]
        recovered = 4 * average - z[0] - copies[1] - copies[3]
        error = _relative(recovered, z[2])
        assert error < bound
        if compress == "int8":
            assert error < _relative(average, z[2]) / 10
