"""docs/extending.md's recipes, run as the page prints them, and checked against references
computed here: the algorithm's steps against the rule by hand with W from the topology, the
compressor against its formula in NumPy, the data source against the archive the test writes,
the guard against a brute-force mix with a planted outlier. Every registration a recipe makes is
undone after its test (the ``registries`` fixture), so no name outlives it."""

from __future__ import annotations

import math
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from slate.algorithms import (
    ALGORITHMS,
    AlgorithmConfig,
    build_algorithm,
    register_algorithm,
    unregister_algorithm,
)
from slate.algorithms.compute import Batch, PartyCompute
from slate.communication.compression import (
    COMPRESSORS,
    compress_help,
    parse_compressor,
    unregister_compressor,
)
from slate.config import TrainConfig, agreed
from slate.data.datasets import NAMED_LOADERS, dataset_names, unregister_dataset
from slate.data.spec import DataSpec
from slate.engines.simulator import SimulatorCommunicator
from slate.errors import ConfigError, DataError, TrainingDiverged
from slate.faults import FaultPlan
from slate.faults.attacks import parse_attacks
from slate.security.guards import GUARDS, message_guard, unregister_guard
from slate.topology import build_topology
from slate.training.loop import train
from slate.training.run import Run
from tests.sites import slate_here

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
FENCE = re.compile(r"^```python recipe-([\w-]+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
RECIPES = ("algorithm", "compressor", "data", "guard")
QUIET = {"write": False, "progress": False, "log": lambda *_: None}


def blocks_of(name: str) -> list[str]:
    """The code blocks of recipe ``name`` (```python recipe-NAME), in the page's order."""
    return [code for recipe, code in FENCE.findall(DOC.read_text()) if recipe == name]


def run_recipe(name: str) -> types.ModuleType:
    """Every block of recipe ``name`` executed, in order, as the body of one module (what a
    user's ``my_slate_ext`` module and script would do)."""
    module = types.ModuleType(f"recipe_{name.replace('-', '_')}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        for number, code in enumerate(blocks_of(name)):
            exec(compile(code, f"{DOC}:recipe-{name}[{number}]", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


REGISTRIES = (
    (ALGORITHMS, unregister_algorithm),
    (COMPRESSORS, unregister_compressor),
    (NAMED_LOADERS, unregister_dataset),
    (GUARDS, unregister_guard),
)


@pytest.fixture
def registries():
    """Each registry as it was before the test, restored after it through the public
    ``unregister_...`` functions (and checked)."""
    before = [dict(registry) for registry, _ in REGISTRIES]
    yield
    for (registry, unregister), kept in zip(REGISTRIES, before, strict=True):
        for name in set(registry) - set(kept):
            unregister(name)
        assert registry == kept


def test_the_page_has_every_recipe_with_its_code_and_its_run() -> None:
    found = {recipe for recipe, _ in FENCE.findall(DOC.read_text())}
    assert found == set(RECIPES)
    for name in RECIPES:
        definition, usage = blocks_of(name)
        assert "register_" in definition and "train(" in usage


# ---------------------------------------------------------------------------- 1. an algorithm


class LinearScore(nn.Module):
    """A linear score ``X w + b``: the flat parameters are ``[w_1 .. w_d, b]``."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, 1, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).squeeze(-1)


def bce_by_hand(x: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Every party's mean binary cross-entropy of ``X w + b`` and its gradient, by the
    closed form: ``(sigmoid(z) - y) / m`` times ``[X, 1]``."""
    losses, grads = [], []
    for p in range(x.shape[0]):
        features, labels = batch.features[p], batch.labels[p].double()
        z = features @ x[p, :-1] + x[p, -1]
        prob = 1 / (1 + torch.exp(-z))
        losses.append(-(labels * torch.log(prob) + (1 - labels) * torch.log(1 - prob)).mean())
        residual = (prob - labels) / len(labels)
        grads.append(torch.cat([features.T @ residual, residual.sum()[None]]))
    return torch.stack(losses), torch.stack(grads)


def test_the_algorithm_steps_as_the_rule_by_hand_and_trains(registries) -> None:
    recipe = run_recipe("algorithm")
    summary = recipe.result.summary
    assert summary["algorithm"] == "dpsgd-decay" and summary["iterations"] == 30
    # digits' test set is about half positives: a model that learned nothing scores about 0.5
    assert summary["test_ap"] > 0.7

    torch.manual_seed(0)
    n, d, m, lr, decay = 4, 5, 6, 0.3, 0.5
    topology = build_topology("ring", n)
    W = torch.tensor(np.array(topology.matrix_at(0)), dtype=torch.float64)
    assert W[0].tolist() == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3])
    algorithm = build_algorithm("dpsgd-decay", AlgorithmConfig(lr=lr), recipe.DecayParams(decay))
    compute = PartyCompute(LinearScore(d), algorithm.objective(), n_parties=n)
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float64)
    x = torch.randn(n, d + 1, dtype=torch.float64)
    algorithm.init_state(x)
    for t in range(3):
        batch = Batch(torch.randn(n, m, d, dtype=torch.float64), torch.randint(0, 2, (n, m)))
        losses_expected, grads = bce_by_hand(x, batch)
        expected = W @ (x - lr / (1 + decay * t) * grads)  # eta_t = lr / (1 + decay t)
        x, losses = algorithm.step(x, batch, comm, compute)
        assert losses.tolist() == pytest.approx(losses_expected.tolist(), rel=1e-12)
        assert torch.allclose(x, expected, rtol=1e-12, atol=1e-14)
    assert algorithm.state["t"].tolist() == [3.0] * n

    with pytest.raises(ConfigError, match="decay must be >= 0"):
        build_algorithm("dpsgd-decay", AlgorithmConfig(lr=lr), recipe.DecayParams(-1.0))
    with pytest.raises(ConfigError, match="does not track gradients"):
        build_algorithm("dpsgd-decay", AlgorithmConfig(lr=lr, gradient_tracking=True))


def test_register_algorithm_refuses_what_would_break_a_run(registries) -> None:
    from dataclasses import dataclass

    recipe = run_recipe("algorithm")
    with pytest.raises(ValueError, match="registered already"):
        register_algorithm(recipe.DPSGDDecay)
    with pytest.raises(ValueError, match="built in"):
        unregister_algorithm("slate")

    @dataclass(frozen=True)
    class FlagWithoutSlot:
        warmup: int = agreed(10, help="iterations of warm-up")

    class Warm(recipe.DPSGDDecay):
        name = "warm"
        Params = FlagWithoutSlot

    with pytest.raises(TypeError, match=r"--warmup.*warmup: int \| None = agreed\(None\)"):
        register_algorithm(Warm)

    @dataclass(frozen=True)
    class Unclassified:
        warmup: int = 10

    Warm.Params = Unclassified
    with pytest.raises(TypeError, match="not classified"):
        register_algorithm(Warm)

    @dataclass(frozen=True)
    class OtherMargin:  # --margin is AlgorithmConfig's, declared otherwise
        margin: float = agreed(0.5, help="another margin")

    Warm.Params = OtherMargin
    with pytest.raises(TypeError, match="--margin is declared differently"):
        register_algorithm(Warm)
    assert "warm" not in ALGORITHMS  # refused before or rolled back after
    with pytest.raises(TypeError, match="subclass of Algorithm"):
        register_algorithm(object)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- 2. a compression operator


def levels_by_formula(x: np.ndarray, levels: int) -> np.ndarray:
    """s = max |x| per row, q = round(x / (s / L)) half to even, C(x) = q (s / L); float32."""
    rows = x.astype(np.float32)
    step = np.abs(rows).max(axis=1, keepdims=True) / np.float32(levels)
    codes = np.rint(rows / np.where(step > 0, step, np.float32(1)))
    return (codes.astype(np.float32) * step).astype(np.float64)


def test_the_compressor_is_its_formula_and_gossips(registries) -> None:
    recipe = run_recipe("compressor")
    summary = recipe.result.summary
    assert summary["compress"] == "levels:15" and summary["consensus_step"] == 0.5
    # one payload of d int8 codes and a float32 scale per message
    assert summary["comm_bytes_per_party"] == summary["messages_per_party"] * (
        summary["n_parameters"] + 4
    )
    assert math.isfinite(summary["test_ap"]) and summary["test_ap"] > 0.7

    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 301)) * rng.uniform(0.01, 100, size=(6, 1))
    x[4] = 0.0  # a zero row has scale 0 and decodes to zeros
    for levels in (1, 15, 127):
        operator = parse_compressor(f"levels:{levels}")
        assert operator.name == f"levels:{levels}" and parse_compressor(operator.name) == operator
        payload = operator.encode(torch.from_numpy(x))
        assert payload.shape == (6, 301 + 4) and payload.dtype == torch.uint8
        out = operator.compress(torch.from_numpy(x)).numpy()
        np.testing.assert_array_equal(out, levels_by_formula(x, levels))
        # each entry off by at most s / 2L (and float32 rounding)
        assert np.all(np.abs(out - x).max(axis=1) <= np.abs(x).max(axis=1) / (2 * levels) * 1.001)
    assert "levels:LEVELS (e.g. levels:15)" in compress_help()
    for bad, said in (("levels", "takes 1 value"), ("levels:x", "LEVELS must be int"),
                      ("levels:0", "1 <= L <= 127"), ("levels:1:2", "takes 1 value")):  # fmt: skip
        with pytest.raises(ConfigError, match=said):
            parse_compressor(bad)


# ------------------------------------------------------------------------------ 3. a data source


def write_archive(folder: Path) -> dict[str, np.ndarray]:
    """``folder/demo-npz.npz``: 200 training rows (30 positives), 80 test rows (20)."""
    rng = np.random.default_rng(7)
    y_train = np.r_[np.ones(30), np.zeros(170)].astype(np.int64)
    y_test = np.r_[np.ones(20), np.zeros(60)].astype(np.int64)
    arrays = {
        "x_train": rng.normal(size=(200, 6)) + y_train[:, None],  # float64 on disk
        "y_train": y_train,
        "x_test": rng.normal(size=(80, 6)) + y_test[:, None],
        "y_test": y_test,
    }
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "demo-npz.npz", **arrays)
    return arrays


def sorted_rows(x: np.ndarray) -> np.ndarray:
    return x[np.lexsort(x.T[::-1])]


def test_the_data_source_reads_the_archive_into_the_parties_rows(
    registries, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the page's run reads data/demo-npz.npz
    arrays = write_archive(tmp_path / "data")
    recipe = run_recipe("data")
    summary = recipe.result.summary
    assert summary["dataset"] == "demo-npz" and (summary["n_train"], summary["n_test"]) == (
        200, 80
    )  # fmt: skip
    assert summary["test_ap"] > 20 / 80  # above the test set's positive share
    assert "demo-npz" in dataset_names()

    data = recipe.load_demo_npz(DataSpec(data_dir=str(tmp_path / "data")))
    for name in ("x_train", "y_train", "x_test", "y_test"):
        got = getattr(data, name)
        assert got.dtype == (np.float32 if name.startswith("x") else np.int64)
        np.testing.assert_array_equal(got, arrays[name].astype(got.dtype))

    # Through the whole data line: the 4 parties' rows are the archive's training rows, cut
    # (stratified) and not changed; the scored rows are its test rows.
    run = Run(TrainConfig(dataset="demo-npz", data_dir="data", nodes=4, iterations=5))
    local = run.data
    assert len(local.parts) == 4 and sum(len(p) for p in local.parts) == 200
    train = np.c_[arrays["x_train"].astype(np.float32), arrays["y_train"]]
    np.testing.assert_array_equal(sorted_rows(np.c_[local.x_train, local.y_train]),
                                  sorted_rows(train))  # fmt: skip
    for part in local.parts:  # 30 positives over 4 parties, stratified
        assert int(local.y_train[part].sum()) in (7, 8)
    np.testing.assert_array_equal(local.x_test, arrays["x_test"].astype(np.float32))
    np.testing.assert_array_equal(local.y_test, arrays["y_test"])


def test_the_data_source_names_the_file_it_cannot_use(registries, tmp_path) -> None:
    recipe = run_recipe_without_run("data")
    spec = DataSpec(data_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"demo-npz.npz, which does not exist: give --data-dir"):
        recipe.load_demo_npz(spec)
    np.savez(tmp_path / "demo-npz.npz", x_train=np.zeros((2, 1)), y_train=np.array([0, 1]))
    with pytest.raises(DataError, match="lacks the arrays x_test, y_test"):
        recipe.load_demo_npz(spec)
    np.savez(tmp_path / "demo-npz.npz", x_train=np.zeros((2, 1)), y_train=np.array([0, 2]),
             x_test=np.zeros((2, 1)), y_test=np.array([0, 1]))  # fmt: skip
    with pytest.raises(DataError, match="y_train must hold the labels 0 and 1 only"):
        recipe.load_demo_npz(spec)


def run_recipe_without_run(name: str) -> types.ModuleType:
    """Only the first block of recipe ``name``: its definition and registration."""
    module = types.ModuleType(f"recipe_{name}_definition")
    sys.modules[module.__name__] = module
    try:
        exec(compile(blocks_of(name)[0], f"{DOC}:recipe-{name}[0]", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


# ---------------------------------------------------------------------------------- 4. a defence


def mix_by_brute_force(x: torch.Tensor, W: np.ndarray, bound: float) -> torch.Tensor:
    """Party by party, neighbour by neighbour: a message farther than ``bound |x_i|`` from
    ``x_i`` counts as ``x_i``."""
    out = torch.zeros_like(x)
    for i in range(len(W)):
        out[i] = W[i, i] * x[i]
        for j in range(len(W)):
            if j != i and W[i, j] > 0:
                far = torch.linalg.norm(x[j] - x[i]) > bound * torch.linalg.norm(x[i])
                out[i] += W[i, j] * (x[i] if far else x[j])
    return out


def test_the_guard_drops_a_planted_outlier_as_brute_force_does(registries) -> None:
    recipe = run_recipe("guard")
    assert math.isfinite(recipe.result.summary["test_ap"])

    n = 5
    topology = build_topology("ring", n)
    W = np.array(topology.matrix_at(0))
    torch.manual_seed(1)
    x = torch.randn(1, 40, dtype=torch.float64) + 0.05 * torch.randn(n, 40, dtype=torch.float64)
    x[2] *= 100.0  # the outlier: far from both of its neighbours
    guard = message_guard("bound", n, list(range(n)))
    assert isinstance(guard, recipe.NormBoundGuard)
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float64, guard=guard)
    mixed = comm.mix(x.clone())
    expected = mix_by_brute_force(x, W, recipe.NormBoundGuard.BOUND)
    assert torch.allclose(mixed, expected, rtol=1e-13, atol=1e-13)
    # party 2's neighbours mixed as if it had sent their own rows, and it kept its own
    for i in (1, 3):
        others = [j for j in (i - 1, i + 1) if j != 2]
        own = (W[i, i] + W[i, 2]) * x[i] + sum(W[i, j] * x[j] for j in others)
        assert torch.allclose(mixed[i], own, rtol=1e-13)
    assert torch.allclose(mixed[2], x[2], rtol=1e-13)
    # with nothing far it is plain gossip, W x
    calm = x.clone()
    calm[2] /= 100.0
    plain = torch.tensor(W) @ calm
    assert torch.allclose(comm.mix(calm), plain, rtol=1e-13, atol=1e-13)


def test_the_guard_trains_on_where_plain_gossip_stops(registries) -> None:
    run_recipe_without_run("guard")
    attacked = FaultPlan(attacks=tuple(parse_attacks("1@0:scale:1e7")))  # from iteration 0
    config = {"dataset": "digits", "algorithm": "dpsgd", "nodes": 4, "iterations": 30, "lr": 0.5}
    with pytest.raises(TrainingDiverged, match="Party 1 sent"):
        train(TrainConfig(**config), faults=attacked, **QUIET)
    result = train(TrainConfig(**config, robust="bound"), faults=attacked, **QUIET)
    assert result.summary["test_ap"] > 0.7
    with pytest.raises(ConfigError, match="--robust must be one of none, clip, bound"):
        train(TrainConfig(**config, robust="bounded"), **QUIET)


# --------------------------------------------------------------------- all four, from the command


def test_the_command_in_this_process_takes_every_registered_name(registries, tmp_path) -> None:
    """What a user's own script does: import the extensions, then ``slate.cli.main``."""
    write_archive(tmp_path / "data")
    for name in RECIPES:
        run_recipe_without_run(name)
    out = tmp_path / "run"
    done = slate_here(
        "train", "--dataset", "demo-npz", "--data-dir", tmp_path / "data", "--nodes", "4",
        "--iterations", "20", "--algorithm", "dpsgd-decay", "--compress", "levels:15",
        "--robust", "bound", "--lr", "0.5", "--out", out, "--no-plots",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    import json

    summary = json.loads((out / "summary.json").read_text())
    flags = summary["config"]
    assert (flags["dataset"], flags["algorithm"], flags["compress"], flags["robust"]) == (
        "demo-npz", "dpsgd-decay", "levels:15", "bound"
    )  # fmt: skip
    assert summary["n_train"] == 200 and math.isfinite(summary["test_ap"])
    with pytest.raises(SystemExit) as refused:  # argparse's refusal of a name not registered
        slate_here("train", "--robust", "bounded", "--iterations", "1")
    assert refused.value.code == 2
