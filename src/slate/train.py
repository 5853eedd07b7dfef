"""The training loop on the simulator: data, parties, algorithm, evaluation and run outputs.

``train(config)`` runs a whole experiment and writes its run folder:

* ``summary.json``: the final metrics and the whole resolved configuration;
* ``history.csv``: one row per evaluation (iteration, test_ap, test_auroc, train_loss,
  consensus_distance, elapsed_seconds);
* ``pr_curve.png`` and ``ap_curve.png``;
* ``model.pt``: the averaged model's ``state_dict`` (load it with ``weights_only=True``).

The hot loop has no Python loop over parties and no host synchronisation: indices are drawn for a
whole chunk of steps at once, losses are kept on the device, and the host looks at numbers only at
evaluation points (every ``--eval-every`` iterations).
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from slate import metrics, plots
from slate.algorithms import Algorithm, AlgorithmConfig, build_algorithm
from slate.config import TrainConfig, resolve_config
from slate.data.datasets import Dataset, load_dataset
from slate.data.partition import check_party_counts, make_partition
from slate.data.sampler import PartySampler, validate_batch_shape
from slate.engines.base import Communicator
from slate.engines.compute import Batch, PartyCompute
from slate.engines.simulator import SimulatorCommunicator
from slate.errors import ConfigError, TrainingDiverged
from slate.models import build_model
from slate.topology import build_topology

__all__ = ["HISTORY_COLUMNS", "Run", "RunResult", "resolve_device", "train"]

HISTORY_COLUMNS = (
    "iteration",
    "test_ap",
    "test_auroc",
    "train_loss",
    "consensus_distance",
    "elapsed_seconds",
)
MAX_CHUNK = 1000  # steps of indices drawn at once


@dataclass
class RunResult:
    """What a finished run returns: its summary, history rows, folder and final parameters."""

    summary: dict[str, Any]
    history: list[dict[str, float]]
    out_dir: Path | None
    parameters: Tensor = field(repr=False)


def resolve_device(name: str) -> torch.device:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:K``; CUDA must be present."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"--device {name!r} is not a device name (use cpu or cuda).") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"--device {name} was asked for, but this machine has no CUDA device that torch "
            f"{torch.__version__} can use. Run with --device cpu."
        )
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name!r} is not supported; use cpu or cuda.")
    return device


def _check_numbers(config: TrainConfig) -> None:
    validate_batch_shape(config.batch_size, config.positives)
    if config.iterations < 1:
        raise ConfigError(f"--iterations must be at least 1, got {config.iterations}.")
    if config.eval_every < 1:
        raise ConfigError(f"--eval-every must be at least 1, got {config.eval_every}.")
    if config.nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, got {config.nodes}.")
    if config.hidden < 1:
        raise ConfigError(f"--hidden must be at least 1, got {config.hidden}.")


class Run:
    """One experiment's state on the simulator, built from a resolved config."""

    def __init__(self, config: TrainConfig, data: Dataset | None = None) -> None:
        self.config = config
        _check_numbers(config)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        self.data = data if data is not None else load_dataset(config)
        self.parts = make_partition(
            self.data.y_train, config.nodes, config.partition, config.seed, config.dirichlet_alpha
        )
        check_party_counts(self.data.y_train, self.parts, config.positives, config.batch_size)
        self.sampler = PartySampler(
            self.parts, self.data.y_train, config.batch_size, config.positives, config.seed
        )
        self.topology = build_topology(
            config.topology, config.nodes, seed=config.seed, fed_period=config.fed_period
        )
        self.algorithm: Algorithm = build_algorithm(
            config.algorithm,
            AlgorithmConfig(
                lr=config.lr,
                margin=config.margin,
                gradient_tracking=config.gradient_tracking,
                alpha=config.alpha,
                initial_batch=config.initial_batch,
                momentum=config.momentum,
                lr_dual=config.lr_dual,
            ),
        )
        model = build_model(
            config.model, self.data.input_shape, hidden=config.hidden, seed=config.seed
        )
        self.model = model.to(self.device)
        self.labels = torch.from_numpy(self.data.y_train).to(self.device)
        self.compute = PartyCompute(
            self.model,
            self.algorithm.objective(),
            self.algorithm.n_extra,
            n_parties=config.nodes,
            context=self.algorithm.context([self.labels[p] for p in self.parts]),
        )
        self.comm: Communicator = SimulatorCommunicator(self.topology, self.device, torch.float32)
        self.features = torch.from_numpy(self.data.x_train).to(self.device)
        self.test_features = torch.from_numpy(self.data.x_test).to(self.device)
        self.test_labels = torch.from_numpy(self.data.y_test).to(self.device)
        self.x = self.initial_parameters()
        self.algorithm.init_state(self.x)
        self.iteration = 0

    def initial_parameters(self) -> Tensor:
        """Alg. 1 line 2: every party starts from the same model (plus algorithm variables)."""
        x0 = self.compute.layout.flatten(self.model)
        extra = self.algorithm.initial_extra(1, self.device, x0.dtype)[0]
        return torch.cat([x0, extra]).expand(self.config.nodes, -1).clone()

    def batch(self, indices: Tensor) -> Batch:
        """Gather every party's mini-batch for one step from indices ``(P, m)``."""
        return Batch(self.features[indices], self.labels[indices])

    def advance(self, steps: int) -> Tensor:
        """Run ``steps`` iterations; returns the parties' losses, shape ``(steps, P)``."""
        losses = torch.empty(steps, self.config.nodes, device=self.device)
        start = 0
        if self.iteration == 0 and self.algorithm.initial_batches(self.config.positives) > 0:
            losses[0] = self._first_step()
            start = 1
        indices = self.sampler.draw(steps - start, self.device)
        for k in range(start, steps):
            self.comm.set_iteration(self.iteration)
            self.x, losses[k] = self.algorithm.step(
                self.x, self.batch(indices[k - start]), self.comm, self.compute
            )
            self.iteration += 1
        self._guard_finite(losses, self.iteration - steps)
        return losses

    def _first_step(self) -> Tensor:
        """Iteration 0 of an algorithm with an initial batch (SLATE-M, Alg. 2 lines 3-5)."""
        blocks = self.sampler.draw(
            self.algorithm.initial_batches(self.config.positives), self.device
        )
        batch = Batch.stack(self.features[blocks], self.labels[blocks])
        self.comm.set_iteration(0)
        self.x, losses = self.algorithm.first_step(self.x, batch, self.comm, self.compute)
        self.iteration = 1
        return losses

    def _guard_finite(self, losses: Tensor, first_iteration: int) -> None:
        if bool(torch.isfinite(losses).all()) and bool(torch.isfinite(self.x).all()):
            return
        bad = (~torch.isfinite(losses)).nonzero()
        if len(bad):
            step, party = (int(v) for v in bad[0])
            where = f"the loss of party {party} at iteration {first_iteration + step}"
        else:
            party = int((~torch.isfinite(self.x)).any(dim=1).nonzero()[0])
            where = f"the parameters of party {party} by iteration {self.iteration}"
        raise TrainingDiverged(
            f"Training diverged: {where} became non-finite (NaN or inf) with --lr "
            f"{self.config.lr}. Try a lower learning rate, e.g. --lr {self.config.lr / 10:g}."
        )

    def averaged_parameters(self) -> Tensor:
        """The output model of Alg. 1: :math:`\\bar x = \\frac1N \\sum_n x_n`."""
        return self.x.mean(dim=0)

    def test_logits(self) -> Tensor:
        return self.compute.logits(self.averaged_parameters(), self.test_features)

    def evaluate(self) -> dict[str, float]:
        """AP and AUROC of the averaged model on the whole test set, and the consensus distance.

        AP is computed on the logits: the sigmoid is monotone, so the ranking (and AP) is that of
        the sigmoid scores, without the ties that float32 saturation of the sigmoid would add.
        """
        logits = self.test_logits()
        return {
            "test_ap": metrics.average_precision(logits, self.test_labels),
            "test_auroc": metrics.auroc(logits, self.test_labels),
            "consensus_distance": metrics.consensus_distance(self.x[:, : self.compute.layout.size]),
        }

    def party_aps(self) -> list[float]:
        """AP of every party's own model on the test set (the spread across parties)."""
        logits = self.compute.party_logits(self.x, self.test_features)
        return [metrics.average_precision(row, self.test_labels) for row in logits]


def _default_out_dir(config: TrainConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{config.dataset}-{config.algorithm}-{stamp}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def _write_outputs(
    run: Run, summary: dict[str, Any], history: list[dict[str, float]], out: Path
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "history.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=HISTORY_COLUMNS)
        writer.writeheader()
        writer.writerows(history)
    logits = run.test_logits()
    precision, recall, _ = metrics.precision_recall_curve(logits, run.test_labels)
    np.savetxt(
        out / "pr_curve.csv", np.column_stack([precision, recall]), delimiter=",",
        header="precision,recall", comments="", fmt="%.8g",
    )  # fmt: skip
    label = f"{run.config.algorithm} (N={run.config.nodes}, {run.config.topology})"
    plots.plot_pr_curves(
        {label: (precision, recall, summary["test_ap"])},
        out / "pr_curve.png",
        title=f"Precision-recall on {run.config.dataset} test set",
    )
    plots.plot_ap_curves(
        {label: ([r["iteration"] for r in history], [r["test_ap"] for r in history])},
        out / "ap_curve.png",
        title=f"Test AP of the averaged model on {run.config.dataset}",
    )
    run.compute.layout.load_into(
        run.model, run.averaged_parameters(), run.compute.averaged_buffers()
    )
    torch.save({k: v.detach().cpu() for k, v in run.model.state_dict().items()}, out / "model.pt")
    with open(out / "summary.json", "w") as handle:
        json.dump(summary, handle, indent=2)


def train(
    config: TrainConfig,
    *,
    progress: bool = True,
    write: bool = True,
    data: Dataset | None = None,
    log=print,
) -> RunResult:
    """Run one experiment on the simulator and (by default) write its run folder."""
    from tqdm.auto import tqdm

    config = resolve_config(config)
    run = Run(config, data=data)
    out = (Path(config.out) if config.out else _default_out_dir(config)) if write else None
    log(run.data.describe())
    log(
        f"{config.algorithm} on {config.nodes} parties, topology {config.topology} "
        f"(lambda = {run.topology.lam:.4f}), {config.iterations} iterations"
    )

    start = time.perf_counter()
    history = [
        {
            "iteration": 0,
            **run.evaluate(),
            "train_loss": math.nan,
            "elapsed_seconds": time.perf_counter() - start,
        }
    ]
    bar = tqdm(total=config.iterations, disable=not progress, unit="it", dynamic_ncols=True)
    try:
        while run.iteration < config.iterations:
            steps = min(config.eval_every, MAX_CHUNK, config.iterations - run.iteration)
            losses = run.advance(steps)
            bar.update(steps)
            if run.iteration % config.eval_every == 0 or run.iteration == config.iterations:
                row = {
                    "iteration": run.iteration,
                    **run.evaluate(),
                    "train_loss": float(losses.mean()),
                    "elapsed_seconds": time.perf_counter() - start,
                }
                history.append(row)
                bar.set_postfix(ap=f"{row['test_ap']:.4f}")
    finally:
        bar.close()
    wall = time.perf_counter() - start
    party_aps = run.party_aps()
    final = history[-1]
    summary = {
        "dataset": config.dataset,
        "algorithm": config.algorithm,
        "topology": config.topology,
        "nodes": config.nodes,
        "lambda": run.topology.lam,
        "spectral_gap": run.topology.spectral_gap,
        "iterations": run.iteration,
        "test_ap": final["test_ap"],
        "test_auroc": final["test_auroc"],
        "party_ap_min": min(party_aps),
        "party_ap_max": max(party_aps),
        "consensus_distance": final["consensus_distance"],
        "wall_seconds": wall,
        "test_split": run.data.test_split,
        "seed": config.seed,
        "n_train": len(run.data.y_train),
        "n_test": len(run.data.y_test),
        "n_parameters": run.compute.layout.size,
        "device": str(run.device),
        **run.comm.traffic(),
        "config": config.to_dict(),
    }
    if out is not None:
        _write_outputs(run, summary, history, out)
        summary["out_dir"] = str(out)
    log(
        f"test AP {summary['test_ap']:.4f}  AUROC {summary['test_auroc']:.4f}  "
        f"(party AP {summary['party_ap_min']:.4f}-{summary['party_ap_max']:.4f}) in {wall:.1f} s"
    )
    if out is not None:
        log(f"results written to {out}")
    return RunResult(summary, history, out, run.x)
