"""The model zoo against REFERENCE.md, and PartyCompute / the simulator against per-party loops.

Every architecture's parameter count is recomputed by hand from the layer list in REFERENCE.md;
batched per-party losses, gradients and BatchNorm statistics are compared in float64 with a plain
loop over ``copy.deepcopy`` modules and ordinary autograd.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from slate import APLoss
from slate.algorithms import SLATE, AlgorithmConfig
from slate.algorithms.compute import Batch, PartyCompute
from slate.engines.simulator import SimulatorCommunicator
from slate.errors import ConfigError
from slate.models import MODEL_NAMES, ResNet18, build_model, seeded
from slate.objectives import bce_objective, sigmoid_ap_objective
from slate.topology import build_topology

# Input shape of every model; resnet18 at 32x32 to keep it fast.
INPUT_SHAPES = {
    "mlp": (300,),
    "mnist-cnn": (1, 28, 28),
    "fashion-mnist-cnn": (1, 28, 28),
    "cifar10-cnn": (3, 32, 32),
    "resnet18": (3, 32, 32),
}
# Per-party batch sizes of the gradient checks (resnet18 is the expensive one).
BATCH_SIZES = {"mlp": 8, "mnist-cnn": 6, "fashion-mnist-cnn": 6, "cifar10-cnn": 6, "resnet18": 4}
XAVIER_MODELS = ("mlp", "mnist-cnn", "fashion-mnist-cnn", "cifar10-cnn")
P = 3


def conv(c_in: int, c_out: int, k: int, bias: bool = True) -> int:
    return c_in * c_out * k * k + (c_out if bias else 0)


def linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def resnet18_count(in_channels: int, width: int) -> int:
    """BasicBlock ResNet-18, [2, 2, 2, 2], no conv biases, BN (weight, bias), one output."""
    bn = 2  # weight and bias per channel
    total = conv(in_channels, width, 7, bias=False) + bn * width  # stem
    c_in = width
    for k in range(4):
        c_out = width * 2**k
        for j in range(2):
            block = conv(c_in, c_out, 3, bias=False) + bn * c_out
            block += conv(c_out, c_out, 3, bias=False) + bn * c_out
            if c_in != c_out or (k > 0 and j == 0):
                block += conv(c_in, c_out, 1, bias=False) + bn * c_out  # projection shortcut
            total += block
            c_in = c_out
    return total + linear(c_in, 1)


EXPECTED_COUNTS = {
    # Linear(300, 28), ReLU, Linear(28, 1)
    "mlp": linear(300, 28) + linear(28, 1),
    # Conv(1,20,k5) ... Conv(20,50,k5) ... Linear(800,500), Linear(500,1)
    "mnist-cnn": 20 * 1 * 25 + 20 + 50 * 20 * 25 + 50 + 800 * 500 + 500 + 500 + 1,
    # Conv(1,5,k3) ... Conv(5,10,k3) ... Linear(250,100), Linear(100,1)
    "fashion-mnist-cnn": 5 * 1 * 9 + 5 + 10 * 5 * 9 + 10 + 250 * 100 + 100 + 100 + 1,
    # Conv(3,16,k3) Conv(16,32,k3) Conv(32,64,k3), Linear(1024,512), (512,64), (64,1)
    "cifar10-cnn": conv(3, 16, 3)
    + conv(16, 32, 3)
    + conv(32, 64, 3)
    + linear(1024, 512)
    + linear(512, 64)
    + linear(64, 1),
    "resnet18": resnet18_count(3, 64),
}


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def flat_params(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def flat_grad(module: nn.Module, loss: torch.Tensor) -> torch.Tensor:
    grads = torch.autograd.grad(loss, list(module.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


@pytest.fixture(scope="module")
def models() -> dict[str, nn.Module]:
    return {name: build_model(name, INPUT_SHAPES[name], seed=0) for name in MODEL_NAMES}


def test_every_model_is_covered() -> None:
    assert set(MODEL_NAMES) == set(INPUT_SHAPES)


# --------------------------------------------------------------------------------------------
# architecture and initialisation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("batch", [1, 5])
def test_output_is_one_logit_per_sample(models, name: str, batch: int) -> None:
    model = models[name].eval()
    with torch.no_grad():
        out = model(torch.randn(batch, *INPUT_SHAPES[name]))
    assert out.shape == (batch,)
    assert out.dtype == torch.float32
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_parameter_count_matches_reference_architecture(models, name: str) -> None:
    assert n_params(models[name]) == EXPECTED_COUNTS[name]


def test_resnet18_count_is_the_standard_one() -> None:
    # torchvision's resnet18 has 11,689,512 parameters with its 512 -> 1000 head.
    assert resnet18_count(3, 64) == 11_689_512 - (512 * 1000 + 1000) + 513
    assert n_params(ResNet18(in_channels=1, width=8)) == resnet18_count(1, 8)
    assert n_params(ResNet18(in_channels=3, width=16)) == resnet18_count(3, 16)


def test_hidden_width_of_mlp() -> None:
    assert n_params(build_model("mlp", (300,), hidden=7)) == linear(300, 7) + linear(7, 1)
    # Inputs are flattened: a (2, 5, 5) input counts 50 features.
    model = build_model("mlp", (2, 5, 5), hidden=3)
    assert n_params(model) == linear(50, 3) + linear(3, 1)
    assert model(torch.randn(4, 2, 5, 5)).shape == (4,)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_build_model_is_deterministic_per_seed(name: str) -> None:
    shape = INPUT_SHAPES[name]
    a = build_model(name, shape, seed=7).state_dict()
    b = build_model(name, shape, seed=7).state_dict()
    c = build_model(name, shape, seed=8).state_dict()
    assert a.keys() == b.keys() == c.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_build_model_leaves_global_rng_alone(name: str) -> None:
    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    build_model(name, INPUT_SHAPES[name], seed=3)
    after = torch.random.get_rng_state()
    assert torch.equal(before, after)
    # ... and the next draws are those of the untouched stream.
    drawn = torch.rand(5)
    torch.manual_seed(1234)
    torch.testing.assert_close(drawn, torch.rand(5), rtol=0, atol=0)


def test_seeded_restores_rng_even_after_an_error() -> None:
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    with pytest.raises(RuntimeError), seeded(0):
        torch.rand(3)
        raise RuntimeError("boom")
    assert torch.equal(before, torch.random.get_rng_state())


def _fans(weight: torch.Tensor) -> tuple[int, int]:
    receptive = math.prod(weight.shape[2:])
    return weight.shape[1] * receptive, weight.shape[0] * receptive


@pytest.mark.parametrize("name", XAVIER_MODELS)
def test_xavier_normal_weights_and_bias_one_over_numel(models, name: str) -> None:
    layers = [m for m in models[name].modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    assert layers
    for layer in layers:
        bias = layer.bias.detach()
        torch.testing.assert_close(bias, torch.full_like(bias, 1.0 / bias.numel()))
        weight = layer.weight.detach().double()
        n = weight.numel()
        if n < 100:
            continue  # too few draws for a meaningful spread
        fan_in, fan_out = _fans(weight)
        expected = math.sqrt(2.0 / (fan_in + fan_out))
        # The sample std of n normal draws has relative spread ~ 1 / sqrt(2 n): allow 6 of them.
        tolerance = 6.0 / math.sqrt(2.0 * n)
        assert abs(float(weight.std()) / expected - 1.0) < tolerance, (layer, weight.std())
        assert abs(float(weight.mean())) < 6.0 * expected / math.sqrt(n), layer


def test_xavier_std_differs_from_pytorch_default() -> None:
    """The check above can tell Xavier-normal from PyTorch's default (Kaiming-uniform, a=sqrt5)."""
    layer = nn.Linear(800, 500)
    fan_in, fan_out = _fans(layer.weight)
    default_std = float(layer.weight.detach().std())
    assert abs(default_std / math.sqrt(2.0 / (fan_in + fan_out)) - 1.0) > 6.0 / math.sqrt(8e5)


def test_resnet18_init(models) -> None:
    model = models["resnet18"]
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d):
            assert layer.bias is None
            weight = layer.weight.detach().double()
            _, fan_out = _fans(weight)
            expected = math.sqrt(2.0 / fan_out)  # Kaiming-normal, fan_out, ReLU
            tolerance = 6.0 / math.sqrt(2.0 * weight.numel())
            assert abs(float(weight.std()) / expected - 1.0) < tolerance, layer
        elif isinstance(layer, nn.BatchNorm2d):
            assert bool((layer.weight == 1).all())
            assert bool((layer.bias == 0).all())
            assert bool((layer.running_mean == 0).all())
            assert bool((layer.running_var == 1).all())


def test_build_model_rejects_bad_names_and_shapes() -> None:
    with pytest.raises(ConfigError, match="Unknown model"):
        build_model("vgg", (3, 32, 32))
    with pytest.raises(ConfigError, match="mnist-cnn"):
        build_model("mnist-cnn", (3, 32, 32))
    with pytest.raises(ConfigError, match="resnet18"):
        build_model("resnet18", (300,))


# --------------------------------------------------------------------------------------------
# batched per-party losses and gradients against a per-party loop
# --------------------------------------------------------------------------------------------


def party_inputs(name: str, base: nn.Module, seed: int = 0):
    """Three different parameter vectors and three different batches (each with both classes)."""
    gen = torch.Generator().manual_seed(seed)
    m = BATCH_SIZES[name]
    x0 = flat_params(base)
    scale = x0.abs().mean()
    x = x0 + 0.1 * scale * torch.randn(P, x0.numel(), generator=gen, dtype=torch.float64)
    features = torch.randn(P, m, *INPUT_SHAPES[name], generator=gen, dtype=torch.float64)
    labels = torch.zeros(P, m, dtype=torch.int64)
    for p in range(P):
        positives = torch.randperm(m, generator=gen)[: 1 + p % (m // 2)]
        labels[p, positives] = 1
    features = features + 0.5 * labels.view(P, m, *[1] * len(INPUT_SHAPES[name]))
    return x, features, labels


def per_party_loop(base: nn.Module, objective, x, features, labels):
    """Ordinary autograd on a deepcopy per party, in train mode. Returns losses, grads, modules."""
    losses, grads, modules = [], [], []
    empty = torch.zeros(0, dtype=torch.float64)
    for p in range(x.shape[0]):
        module = copy.deepcopy(base)
        torch.nn.utils.vector_to_parameters(x[p].clone(), module.parameters())
        module.train()
        loss = objective(module(features[p]), labels[p], empty)
        grads.append(flat_grad(module, loss))
        losses.append(loss.detach())
        modules.append(module)
    return torch.stack(losses), torch.stack(grads), modules


OBJECTIVES = {"ap": sigmoid_ap_objective(0.1), "bce": bce_objective}


# The vmapped float64 ResNet-18 at full width (11M parameters) takes 30-45 s per call on a
# 2-core CPU; the batched checks use the same class at width 16 (same layers, same code path).
RESNET_CHECK_WIDTH = 16


@pytest.fixture(scope="module")
def double_models(models) -> dict[str, nn.Module]:
    out = {name: copy.deepcopy(model).double() for name, model in models.items()}
    with seeded(0):
        out["resnet18"] = ResNet18(in_channels=3, width=RESNET_CHECK_WIDTH).double()
    return out


@pytest.mark.parametrize("objective_name", sorted(OBJECTIVES))
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_batched_gradients_equal_per_party_loop(double_models, name, objective_name) -> None:
    base = double_models[name]
    objective = OBJECTIVES[objective_name]
    x, features, labels = party_inputs(name, base)
    before = flat_params(base)
    compute = PartyCompute(base, objective, n_parties=P)
    assert compute.dim == n_params(base)
    losses, grads = compute(x, Batch(features, labels))
    ref_losses, ref_grads, _ = per_party_loop(base, objective, x, features, labels)
    assert losses.shape == (P,)
    assert grads.shape == (P, compute.dim)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-9, atol=1e-9)
    # The parties really differ (otherwise a mix-up of parties would pass unnoticed).
    assert float((ref_grads[0] - ref_grads[1]).abs().max()) > 1e-6
    # The module's own parameters are not modified by the functional call.
    assert torch.equal(flat_params(base), before)


@pytest.fixture(scope="module")
def resnet_batched(double_models):
    base = double_models["resnet18"]
    objective = OBJECTIVES["ap"]
    x, features, labels = party_inputs("resnet18", base, seed=1)
    compute = PartyCompute(base, objective, n_parties=P)
    initial = {k: v.clone() for k, v in compute.buffers.items()}
    compute(x, Batch(features, labels))
    _, _, modules = per_party_loop(base, objective, x, features, labels)
    return compute, x, features, modules, initial


def test_resnet_buffers_are_per_party_and_updated_like_train_mode(resnet_batched) -> None:
    compute, _, _, modules, initial = resnet_batched
    names = [name for name, _ in modules[0].named_buffers()]
    assert set(compute.buffers) == set(names)
    assert any(n.endswith("running_mean") for n in names)
    assert any(n.endswith("num_batches_tracked") for n in names)
    for name in names:
        stacked = compute.buffers[name]
        assert stacked.shape[0] == P
        for p, module in enumerate(modules):
            expected = dict(module.named_buffers())[name]
            torch.testing.assert_close(stacked[p], expected, rtol=1e-9, atol=1e-12)
        if name.endswith("num_batches_tracked"):
            assert bool((stacked == 1).all())
        else:
            # They moved away from their initial values, and differently for each party.
            assert not torch.equal(stacked[0], initial[name][0])
            assert not torch.equal(stacked[0], stacked[1])


def test_resnet_averaged_buffers_are_the_party_mean(resnet_batched) -> None:
    compute, _, _, modules, _ = resnet_batched
    averaged = compute.averaged_buffers()
    for name, value in averaged.items():
        per_party = [dict(m.named_buffers())[name] for m in modules]
        if value.is_floating_point():
            expected = torch.stack(per_party).mean(dim=0)
            torch.testing.assert_close(value, expected, rtol=1e-9, atol=1e-12)
        else:
            assert torch.equal(value, per_party[0])


def test_resnet_logits_use_averaged_parameters_and_buffers_in_eval_mode(resnet_batched) -> None:
    compute, x, features, modules, _ = resnet_batched
    xbar = x.mean(dim=0)
    feats = features.reshape(-1, *features.shape[2:])  # every party's samples, 12 images
    reference = copy.deepcopy(modules[0])
    compute.layout.load_into(reference, xbar, compute.averaged_buffers())
    reference.eval()
    with torch.no_grad():
        expected = reference(feats)
    torch.testing.assert_close(compute.logits(xbar, feats), expected, rtol=1e-9, atol=1e-9)
    # Chunking does not change anything.
    torch.testing.assert_close(compute.logits(xbar, feats, chunk=5), expected, rtol=1e-9, atol=1e-9)
    # Eval mode really used the running statistics: train mode would give other logits.
    reference.train()
    with torch.no_grad():
        assert not torch.allclose(reference(feats), expected)
    # Evaluation does not touch the parties' buffers.
    for name, buf in compute.buffers.items():
        for p, module in enumerate(modules):
            torch.testing.assert_close(buf[p], dict(module.named_buffers())[name])


def test_party_logits_use_each_partys_own_buffers(resnet_batched) -> None:
    compute, x, features, modules, _ = resnet_batched
    feats = features[0]
    logits = compute.party_logits(x, feats)
    assert logits.shape == (P, feats.shape[0])
    for p, module in enumerate(modules):
        reference = copy.deepcopy(module).eval()  # party p's parameters and buffers
        with torch.no_grad():
            torch.testing.assert_close(logits[p], reference(feats), rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------------------------
# SLATE on the simulator against a per-party reference loop, with BatchNorm
# --------------------------------------------------------------------------------------------

SIM_STEPS, SIM_M, SIM_B, SIM_LR = 3, 4, 2, 0.2


@pytest.mark.parametrize("topology_name", ["ring", "star"])
def test_simulator_slate_resnet_equals_reference_loop(topology_name: str) -> None:
    # On N = 3 the ring is the full average; the star has unequal weights, so the mixing
    # matrix itself (and which party gets which row) matters too.
    with seeded(0):
        model = ResNet18(in_channels=3, width=8).double()
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(SIM_STEPS, P, SIM_M, 3, 16, 16, generator=gen, dtype=torch.float64)
    labels = torch.zeros(SIM_STEPS, P, SIM_M, dtype=torch.int64)
    labels[..., :SIM_B] = 1  # the sampler puts the b positives first
    features[..., :SIM_B, :, :, :] += 0.3

    topology = build_topology(topology_name, P)
    algorithm = SLATE(AlgorithmConfig(lr=SIM_LR, margin=0.1))
    compute = PartyCompute(model, algorithm.objective(), n_parties=P)
    comm = SimulatorCommunicator(topology, torch.device("cpu"), torch.float64)
    x = compute.layout.flatten(model).expand(P, -1).clone()
    x_initial = x.clone()
    algorithm.init_state(x)
    for t in range(SIM_STEPS):
        comm.set_iteration(t)
        x, losses = algorithm.step(x, Batch(features[t], labels[t]), comm, compute)
        assert losses.shape == (P,)

    # Reference: one module per party, autograd on APLoss, explicit sums with W's entries.
    W = topology.W
    loss_fn = APLoss(0.1)
    party_models = [copy.deepcopy(model) for _ in range(P)]
    for t in range(SIM_STEPS):
        current, grads = [], []
        for n, module in enumerate(party_models):
            module.train()
            loss = loss_fn(torch.sigmoid(module(features[t, n])), labels[t, n])
            grads.append(flat_grad(module, loss))
            current.append(flat_params(module))
        for n, module in enumerate(party_models):
            new = sum(float(W[n, r]) * (current[r] - SIM_LR * grads[r]) for r in range(P))
            torch.nn.utils.vector_to_parameters(new, module.parameters())
    reference = torch.stack([flat_params(m) for m in party_models])

    torch.testing.assert_close(x, reference, rtol=1e-9, atol=1e-9)
    assert float((x - x_initial).abs().max()) > 1e-4  # the steps did something
    if topology_name == "star":
        assert float((x[1] - x[2]).abs().max()) > 1e-6  # parties disagree
    for name, stacked in compute.buffers.items():
        for n, module in enumerate(party_models):
            expected = dict(module.named_buffers())[name]
            torch.testing.assert_close(stacked[n], expected, rtol=1e-9, atol=1e-12)
        if name.endswith("num_batches_tracked"):
            assert bool((stacked == SIM_STEPS).all())
