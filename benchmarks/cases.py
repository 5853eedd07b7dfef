"""One timed case per call, run in a fresh process so that peak memory (RSS) is its own.

``python -m benchmarks.cases CASE ARGS...`` prints one JSON line: seconds per iteration and the
process's peak RSS. Every case runs the same math: SLATE without gradient tracking (Alg. 1
lines 7 and 9) on the paper's models, m = 20, b = 2, lr = 0.01, margin 0.1, a ring.
"""

from __future__ import annotations

import copy
import json
import resource
import sys
import time

import numpy as np
import torch

from slate import APLoss
from slate.algorithms import AlgorithmConfig, build_algorithm
from slate.algorithms.compute import Batch, PartyCompute
from slate.cli.memory import keep_freed_memory
from slate.engines.simulator import SimulatorCommunicator, _gossip_matrix
from slate.models import build_model
from slate.topology import build_topology

M, B, LR, MARGIN = 20, 2, 0.01, 0.1
SHAPES = {"mlp": (300,), "mnist-cnn": (1, 28, 28)}


def _data(model: str, n_parties: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features and labels for ``steps`` batches of every party: (steps, N, m, ...)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(steps, n_parties, M, *SHAPES[model], generator=gen)
    y = torch.zeros(steps, n_parties, M, dtype=torch.long)
    y[..., :B] = 1
    return x, y


def _time(step, steps: int, warmup: int, segments: int = 5) -> float:
    """Seconds per step: the fastest of ``segments`` timed runs of ``steps / segments`` steps.

    The minimum discards the segments that other tenants of a shared machine slowed down.
    """
    for k in range(warmup):
        step(k)
    per_segment = max(1, steps // segments)
    best = float("inf")
    for _ in range(segments):
        start = time.perf_counter()
        for k in range(per_segment):
            step(k)
        best = min(best, (time.perf_counter() - start) / per_segment)
    return best


def simulator(model: str, n_parties: int, steps: int, compile: bool = False) -> float:
    """slate's simulator: one batched gradient call and one fused step-and-mix per iteration.

    With ``compile``, the gradient is ``torch.compile``'d; compilation happens in the warm-up
    steps and is not timed (``slate train --compile`` pays it once per process).
    """
    module = build_model(model, SHAPES[model])
    algorithm = build_algorithm("slate", AlgorithmConfig(lr=LR, margin=MARGIN))
    compute = PartyCompute(module, algorithm.objective(), n_parties=n_parties, compile=compile)
    comm = SimulatorCommunicator(build_topology("ring", n_parties), torch.device("cpu"),
                                 torch.float32)  # fmt: skip
    state = {"x": compute.layout.flatten(module).expand(n_parties, -1).clone()}
    algorithm.init_state(state["x"])
    x, y = _data(model, n_parties, 8)

    def step(k: int) -> None:
        state["x"], _ = algorithm.step(state["x"], Batch(x[k % 8], y[k % 8]), comm, compute)

    return _time(step, steps, warmup=5)


def naive_loop(model: str, n_parties: int, steps: int) -> float:
    """One nn.Module and one SGD optimizer per party, mixing by a loop over neighbours."""
    base = build_model(model, SHAPES[model])
    modules = [copy.deepcopy(base) for _ in range(n_parties)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in modules]
    topology = build_topology("ring", n_parties)
    neighbours = [topology.neighbours(n) for n in range(n_parties)]
    loss_fn = APLoss(MARGIN, validate_args=False)
    x, y = _data(model, n_parties, 8)

    def step(k: int) -> None:
        for n, (module, opt) in enumerate(zip(modules, optimizers, strict=True)):
            opt.zero_grad()
            loss_fn(torch.sigmoid(module(x[k % 8, n])), y[k % 8, n]).backward()
            opt.step()
        with torch.no_grad():
            current = [[p.clone() for p in m.parameters()] for m in modules]
            for n, module in enumerate(modules):
                w_self = float(topology.W[n, n])
                for j, p in enumerate(module.parameters()):
                    p.mul_(w_self)
                    for r, w in neighbours[n]:
                        p.add_(current[r][j], alpha=w)

    return _time(step, steps, warmup=3)


def hand_mlp_step(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, W: torch.Tensor,
                  hidden: int = 28, gradient=None) -> torch.Tensor:  # fmt: skip
    """One SLATE iteration of the MLP by hand: bmm forward, closed-form backward, one mix.

    ``flat`` (N, d) uses slate's layout (hidden.weight (h, in), hidden.bias, out.weight, out.bias).
    ``gradient`` defaults to :func:`hand_mlp_gradient` (a compiled version may be passed).
    """
    grad = (gradient or hand_mlp_gradient)(flat, x, y, hidden)
    return W @ torch.add(flat, grad, alpha=-LR)


def hand_mlp_gradient(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                      hidden: int = 28) -> torch.Tensor:  # fmt: skip
    """Every party's gradient of the AP surrogate (eq. 6 in closed form); no autograd, no vmap."""
    n, d_in = x.shape[0], x.shape[-1]
    W1, b1, w2, b2 = flat.split([hidden * d_in, hidden, hidden, 1], dim=1)
    W1 = W1.view(n, hidden, d_in)
    pre = torch.baddbmm(b1.unsqueeze(1), x, W1.transpose(1, 2))
    act = pre.clamp_min(0)
    h = torch.sigmoid(torch.bmm(act, w2.unsqueeze(2)).squeeze(-1) + b2)
    pos = y.to(h.dtype)
    hinge = (MARGIN - h.unsqueeze(2) + h.unsqueeze(1)).clamp_min(0)  # s - (h_i - h_j)
    sq = hinge * hinge
    g1 = (sq * pos.unsqueeze(1)).mean(2)
    g2 = sq.mean(2)
    weight = pos / pos.sum(1, keepdim=True)  # the mean over the batch's positives i
    coef = (weight / (M * g2 * g2)).unsqueeze(2) * (
        g1.unsqueeze(2) - g2.unsqueeze(2) * pos.unsqueeze(1)
    )  # d loss / d l_ij (eq. 6)
    dl = coef * 2 * hinge
    dz = (dl.sum(1) - dl.sum(2)) * h * (1 - h)
    dw2 = torch.bmm(dz.unsqueeze(1), act).squeeze(1)
    db2 = dz.sum(1, keepdim=True)
    dpre = dz.unsqueeze(2) * w2.unsqueeze(1) * (pre > 0)
    dW1 = torch.bmm(dpre.transpose(1, 2), x)
    return torch.cat([dW1.flatten(1), dpre.sum(1), dw2, db2], dim=1)


def hand_batched_mlp(n_parties: int, steps: int, compile: bool = False) -> float:
    """The limit: :func:`hand_mlp_step` on the same data as the simulator.

    With ``compile``, the hand-written gradient goes through ``torch.compile`` too (fused
    elementwise kernels), the limit for the compiled simulator.
    """
    gradient = torch.compile(hand_mlp_gradient, dynamic=False) if compile else None
    module = build_model("mlp", SHAPES["mlp"])
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    state = {"x": flat.expand(n_parties, -1).clone()}
    # The best product available for this W: CSR for a sparse ring, as the simulator uses.
    W = _gossip_matrix(build_topology("ring", n_parties).W, torch.float32, torch.device("cpu"))
    x, y = _data("mlp", n_parties, 8)

    def step(k: int) -> None:
        state["x"] = hand_mlp_step(state["x"], x[k % 8], y[k % 8], W, gradient=gradient)

    return _time(step, steps, warmup=5)


def main(argv: list[str]) -> None:
    case, model, n_parties, steps, threads = (
        argv[0],
        argv[1],
        int(argv[2]),
        int(argv[3]),
        int(argv[4]),
    )
    torch.set_num_threads(threads)
    keep_freed_memory()  # as `slate train` does; every case alike
    if case == "simulator":
        seconds = simulator(model, n_parties, steps)
    elif case == "compiled":
        seconds = simulator(model, n_parties, steps, compile=True)
    elif case == "naive":
        seconds = naive_loop(model, n_parties, steps)
    elif case == "hand":
        seconds = hand_batched_mlp(n_parties, steps)
    elif case == "hand-compiled":
        seconds = hand_batched_mlp(n_parties, steps, compile=True)
    else:
        raise SystemExit(f"unknown case {case}")
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {"case": case, "model": model, "nodes": n_parties, "threads": threads,
              "seconds_per_iteration": seconds, "peak_rss_mb": peak_kb / 1024}  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main(sys.argv[1:])
