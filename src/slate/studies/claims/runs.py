"""The runs of ``slate reproduce claims``: a setting (:class:`RunSpec`), its runs over the seeds
(:class:`Outcome`, made by :class:`Runner`), what the studies run (:class:`ClaimsPlan`) and the
context every study receives (:class:`Context`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slate.config import TrainConfig
from slate.errors import DataError, TrainingDiverged
from slate.studies.claims.measures import (
    Spread,
    gradient_cost,
    gradient_evaluations,
    iterations_to_target,
    read_history,
    samples_drawn,
    spread,
)
from slate.studies.reproduce import run_or_reuse, train_config

__all__ = ["DIVERGED", "ClaimsPlan", "Context", "Outcome", "RunSpec", "Runner", "ratio", "require"]

DIVERGED = "diverged.txt"  # in a seed's run folder: the run diverged; holds slate's message


@dataclass(frozen=True)
class RunSpec:
    """One training configuration of a study, run once per seed (the rest from the preset)."""

    method: str = "slate"
    nodes: int = 20
    topology: str = "ring"
    lr: float = 0.01
    iterations: int = 10_000
    eval_every: int = 50
    partition: str = "stratified"
    dirichlet_alpha: float | None = None
    gradient_tracking: bool = False

    @property
    def key(self) -> str:
        """Folder name: every field that studies vary, e.g. ``N16-ring-lr0.16-T10000-e20-...``."""
        part = self.partition
        if self.dirichlet_alpha is not None:
            part += f"{self.dirichlet_alpha:g}"
        return (
            f"N{self.nodes}-{self.topology}-lr{self.lr:g}-T{self.iterations}-e{self.eval_every}"
            f"-{part}-gt{int(self.gradient_tracking)}"
        )


@dataclass
class Outcome:
    """A :class:`RunSpec`'s runs over the seeds, or why it could not run.

    ``summaries`` and ``histories`` hold the seeds that finished; ``diverged`` maps each seed
    whose run stopped with :class:`~slate.errors.TrainingDiverged` to slate's message.
    """

    spec: RunSpec
    summaries: list[dict[str, Any]]
    histories: list[dict[str, np.ndarray]]
    error: str | None = None
    diverged: dict[int, str] = dataclasses.field(default_factory=dict)

    def final(self, key: str) -> Spread:
        """Spread of a ``summary.json`` value (``test_ap``, ...) over the finished seeds."""
        return spread([float(s[key]) for s in self.summaries])

    def to_target(self, target: float, x: str = "iterations") -> list[float]:
        """Per seed: when the test AP first reaches ``target``; NaN if never (or diverged).

        Args:
            target: the test AP to reach.
            x: the unit: ``"iterations"``, ``"gradients"`` (one party's mini-batch gradient
                evaluations, :func:`gradient_evaluations`) or ``"samples"`` (one party's samples
                drawn, :func:`samples_drawn`).

        Returns:
            One value per finished seed, then a NaN per diverged seed.
        """
        values = []
        for summary, history in zip(self.summaries, self.histories, strict=True):
            config, steps = summary["config"], history["iteration"]
            if x == "gradients":
                steps = gradient_evaluations(steps, *gradient_cost(config))
            elif x == "samples":
                initial = gradient_cost(config)[1]
                steps = samples_drawn(steps, int(config["batch_size"]), initial)
            elif x != "iterations":
                raise ValueError(f"x must be iterations, gradients or samples, not {x!r}")
            values.append(iterations_to_target(steps, history["test_ap"], target))
        return values + [math.nan] * len(self.diverged)

    def mean_curve(self, column: str = "test_ap") -> tuple[np.ndarray, np.ndarray]:
        """Iterations and the seeds' mean of a ``history.csv`` column."""
        steps = self.histories[0]["iteration"]
        return steps, np.mean([h[column] for h in self.histories], axis=0)


class Runner:
    """Runs (or reuses) a :class:`RunSpec` for every seed; remembers outcomes within a call."""

    def __init__(
        self,
        preset: dict[str, Any],
        data_dir: str | None,
        out: Path,
        seeds: Sequence[int],
        device: str = "cpu",
        log: Callable[[str], None] = print,
    ) -> None:
        self.preset, self.data_dir, self.out = preset, data_dir, out
        self.seeds, self.device, self.log = list(seeds), device, log
        self._done: dict[RunSpec, Outcome] = {}

    def config(self, spec: RunSpec, seed: int) -> TrainConfig:
        """The run's :class:`TrainConfig`: the preset's method settings with ``spec``'s fields."""
        fields = dataclasses.asdict(spec)
        method = fields.pop("method")
        return train_config(
            self.preset, method, seed, data_dir=self.data_dir, device=self.device, **fields
        )

    def folder(self, spec: RunSpec, seed: int) -> Path:
        """``OUT/<dataset>/claims/<method>/<key>/seed<k>``: the run folder of one seed."""
        return self.out / self.preset["dataset"] / "claims" / spec.method / spec.key / f"seed{seed}"

    def __call__(self, spec: RunSpec) -> Outcome:
        if spec in self._done:
            return self._done[spec]
        summaries, histories = [], []
        errors: dict[str, list[int]] = {}  # reason -> seeds
        diverged: dict[int, str] = {}
        for seed in self.seeds:
            folder = self.folder(spec, seed)
            self.log(f"{spec.method} {spec.key} seed {seed}")
            marker = folder / DIVERGED
            if marker.is_file():  # diverged before: the same seed and settings diverge again
                diverged[seed] = marker.read_text().strip()
                self.log(f"  reuse {folder}: diverged")
                continue
            try:
                summary = run_or_reuse(self.config(spec, seed), folder, self.log)
            except DataError as err:  # e.g. a Dirichlet partition that starves a party
                reason = str(err).split(". ")[0]
                errors.setdefault(reason, []).append(seed)
                self.log(f"  cannot run: {reason}")
                continue
            except TrainingDiverged as err:  # e.g. a step size too large: recorded, not fatal
                diverged[seed] = str(err)
                folder.mkdir(parents=True, exist_ok=True)
                marker.write_text(f"{err}\n")
                self.log(f"  diverged: {str(err).split('. ')[0]}")
                continue
            summaries.append(summary)
            histories.append(read_history(folder))
            self.log(f"  test AP {summary['test_ap']:.4f} ({summary['wall_seconds']:.1f} s)")
        error = "; ".join(
            f"seed{'s' * (len(k) > 1)} {', '.join(map(str, k))}: {reason}"
            for reason, k in errors.items()
        )
        outcome = Outcome(spec, summaries, histories, error or None, diverged)
        self._done[spec] = outcome
        return outcome


@dataclass(frozen=True)
class ClaimsPlan:
    """What the four studies run. Defaults: ``docs/claims.md``; ``None`` takes the preset's.

    Attributes:
        iterations: iterations of every run (the paper's 10 000 on w7a).
        target_fraction: the target test AP is this share of a reference run's mean final AP.
        fine_evaluations: evaluations per run in the speedup and topology studies
            (``eval_every = iterations // fine_evaluations``), where targets are reached early.
        evaluations: evaluations per run in the tracking and momentum studies.
        speedup_nodes: the values of N; the smallest is the reference of the target and of the
            speedup.
        speedup_lrs: the step-size grid that every N of the speedup study runs, the smallest N
            included; each N's speedup is taken at its best step size (:func:`best_step_size`).
            The default spans 0.01 (the paper's w7a step for N = 20) to 10.24 in factors of 4.
        speedup_topology: the topology of the speedup study.
        topology_nodes: N of the topology study.
        topologies: the topologies compared.
        tracking_settings: ``(N, partition, dirichlet_alpha)`` of the tracking study.
        tracking_topology: its topology.
        lr: the base step size (``None``: the preset's).
    """

    iterations: int = 10_000
    target_fraction: float = 0.95
    fine_evaluations: int = 500
    evaluations: int = 200
    speedup_nodes: tuple[int, ...] = (1, 4, 8, 16, 32)
    speedup_lrs: tuple[float, ...] = (0.01, 0.04, 0.16, 0.64, 2.56, 10.24)
    speedup_topology: str = "full"
    topology_nodes: int = 16
    topologies: tuple[str, ...] = ("ring", "torus", "exponential", "full")
    tracking_settings: tuple[tuple[int, str, float | None], ...] = (
        (20, "stratified", None),
        (20, "dirichlet", 1.0),
        (4, "stratified", None),
        (4, "dirichlet", 1.0),
        (4, "dirichlet", 0.3),
        (4, "dirichlet", 0.1),
    )
    tracking_topology: str = "ring"
    lr: float | None = None

    def every(self, evaluations: int) -> int:
        """The evaluation interval that gives ``evaluations`` evaluations per run (at least 1)."""
        return max(1, self.iterations // evaluations)


@dataclass
class Context:
    """What every study receives: the runner, the plan, the preset's resolved SLATE run and the
    folder of the figures and CSVs."""

    run: Runner
    plan: ClaimsPlan
    base: TrainConfig  # the preset's SLATE run, resolved
    figures: Path

    @property
    def lr(self) -> float:
        """The base step size: the plan's, else the preset's."""
        return self.plan.lr if self.plan.lr is not None else float(self.base.lr)

    def reference(self) -> tuple[Outcome, float]:
        """The smallest-N speedup run at the base step size, and the target AP derived from it."""
        plan = self.plan
        spec = RunSpec(
            nodes=min(plan.speedup_nodes), topology=plan.speedup_topology, lr=self.lr,
            iterations=plan.iterations, eval_every=plan.every(plan.fine_evaluations),
        )  # fmt: skip
        outcome = require(self.run(spec))
        return outcome, plan.target_fraction * outcome.final("test_ap").mean


def require(outcome: Outcome, diverged_ok: bool = False) -> Outcome:
    """``outcome`` if every seed could run (and, unless ``diverged_ok``, none diverged)."""
    if outcome.error is not None:
        raise DataError(f"The run {outcome.spec.key} cannot run: {outcome.error}.")
    if outcome.diverged and not diverged_ok:
        seed, message = next(iter(outcome.diverged.items()))
        raise TrainingDiverged(f"The run {outcome.spec.key}, seed {seed}, diverged: {message}")
    return outcome


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when the denominator is 0 or NaN."""
    return numerator / denominator if denominator and not math.isnan(denominator) else math.nan
