"""slate.optim in a user's own loop, in real processes, against the simulator engine.

Each worker is started as ``torch.multiprocessing.spawn`` starts one (a fork of a server that
has loaded torch: tests/spawned.py) and joins a gloo group; it trains the
model with an ordinary PyTorch loop (its own forward, APLoss or BCE, backward, ``opt.step()``)
on exactly the batches the engine would draw for its party. The averaged parameters must equal
the simulator's, which runs the same algorithm with vmapped per-party gradients.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from slate import APLoss
from slate.config import TrainConfig, resolve_config
from slate.data.partition import make_partition
from slate.data.sampler import PartySampler
from slate.data.sources import load_dataset
from slate.models import build_model
from slate.training.loop import train
from tests import spawned

STEPS = 40


def config_for(nodes: int, algorithm: str, gradient_tracking: bool) -> TrainConfig:
    return resolve_config(TrainConfig(
        dataset="digits", nodes=nodes, algorithm=algorithm, iterations=STEPS, eval_every=STEPS,
        gradient_tracking=gradient_tracking, seed=7, lr=0.05,
    ))  # fmt: skip


def own_loop(rank, world, config, result_file):
    """Party ``rank``'s own loop under ``config``; rank 0 saves the averaged parameters."""
    import slate.optim

    data = load_dataset(config)
    parts = make_partition(data.y_train, world, config.partition, config.seed)
    sampler = PartySampler([parts[rank]], data.y_train, config.batch_size, config.positives,
                           config.seed, parties=[rank])  # fmt: skip
    features, labels = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    model = build_model("mlp", data.input_shape, hidden=config.hidden, seed=config.seed)
    cls = slate.optim.SLATE if config.algorithm == "slate" else slate.optim.DSGD
    opt = cls(model.parameters(), lr=config.lr, topology="ring",
              gradient_tracking=config.gradient_tracking)  # fmt: skip
    loss_fn = APLoss(config.margin)
    for idx in sampler.draw(STEPS)[:, 0]:
        opt.zero_grad()
        logits = model(features[idx])
        if config.algorithm == "slate":
            loss = loss_fn(torch.sigmoid(logits), labels[idx])
        else:
            loss = F.binary_cross_entropy_with_logits(logits, labels[idx].float())
        loss.backward()
        opt.step()
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    dist.all_reduce(flat)
    if rank == 0:
        torch.save(flat / world, result_file)
    dist.barrier()


def worker(rank, world, init_file, configs, result_files):
    """Every config's own loop in turn, in one gloo group (a fresh model and optimizer each)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)  # fmt: skip
    for config, result_file in zip(configs, result_files, strict=True):
        own_loop(rank, world, config, result_file)
    # Leave without the interpreter's shutdown, where gloo's threads can abort the process
    # (as slate's own workers do; see slate.training.party_process.exit_worker).
    os._exit(0)


#: (nodes, algorithm, gradient tracking): both of slate.optim's optimizers.
CASES = [(4, "slate", True), (4, "dpsgd", False)]


@pytest.fixture(scope="module")
def own_loops(tmp_path_factory) -> dict[tuple, torch.Tensor]:
    """Each case's averaged parameters from the users' loops: one start of the four worker
    processes runs both cases, one after the other (what each case checks is its own result)."""
    root = tmp_path_factory.mktemp("own_loops")
    configs = [config_for(*case) for case in CASES]
    results = [str(root / f"averaged{i}.pt") for i in range(len(CASES))]
    nodes = {case[0] for case in CASES}.pop()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    spawned.spawn(worker, (nodes, str(root / "init"), configs, results), nprocs=nodes)
    loaded = [torch.load(result, weights_only=True) for result in results]
    return dict(zip(CASES, loaded, strict=True))


@pytest.mark.processes
@pytest.mark.parametrize(("nodes", "algorithm", "gradient_tracking"), CASES)
def test_optimizer_in_own_loop_equals_the_engine(own_loops, nodes, algorithm, gradient_tracking):
    config = config_for(nodes, algorithm, gradient_tracking)
    ours = own_loops[(nodes, algorithm, gradient_tracking)]
    engine = train(config, progress=False, write=False, log=lambda _: None)
    torch.testing.assert_close(ours, engine.parameters.mean(0), rtol=0, atol=1e-5)
    # (a ring of 4 is not exact averaging, as rings of 2 and 3 are: the parties must differ)
    assert float((engine.parameters - engine.parameters.mean(0)).abs().max()) > 1e-6


def test_optimizer_needs_a_process_group():
    import slate.optim
    from slate.errors import ConfigError

    with pytest.raises(ConfigError, match="init_process_group"):
        slate.optim.SLATE([torch.zeros(2, requires_grad=True)], lr=0.1)


def test_learning_rate_is_validated():
    from slate.errors import ConfigError
    from slate.optim import validate_learning_rate

    for bad in (0, -1.0, float("inf"), float("nan"), "0.1"):
        with pytest.raises(ConfigError, match="lr"):
            validate_learning_rate(bad)
