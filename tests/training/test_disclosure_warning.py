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
from slate.training.loop import train


def _digits(**flags) -> TrainConfig:
    values = dict(dataset="digits", nodes=4, iterations=20, lr=0.05, positives=1,
                  batch_size=16, eval_every=10, party_ap=False, compile="off")  # fmt: skip
    return TrainConfig(**{**values, **flags})


def _warnings(config: TrainConfig) -> list[str]:
    lines: list[str] = []
    train(config, progress=False, write=False, log=lines.append)
    return [line for line in lines if "gives single sites' models away" in line]


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
    """Keeps every gossip round's messages, ``z = x - lr * direction``, by iteration."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: dict[int, Tensor] = {}

    def _gossip_step(self, x, direction, lr, r):
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
