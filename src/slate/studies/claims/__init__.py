r"""``slate reproduce claims``: the paper's theoretical claims, measured (``docs/claims.md``).

Four studies, each an average over seeds of ordinary ``slate train`` runs (one folder per run,
reused when it holds a ``summary.json``, like ``slate reproduce table2``):

``speedup``
    Corollaries 1-2 (Section 5): SLATE needs :math:`T = O(N^{-1}\varepsilon^{-4})` iterations
    and SLATE-M :math:`T = O(N^{-1}\varepsilon^{-3})` to reach an :math:`\varepsilon`-stationary
    point, a *linear speedup* in the number of parties :math:`N`. Measured: iterations and samples
    (:math:`N m T`) until the test AP first reaches a fixed target, for every :math:`N` of
    :attr:`ClaimsPlan.speedup_nodes` at a fixed per-party batch, with exact averaging (``full``,
    :math:`\lambda = 0`) so that the topology does not change with :math:`N`. Every :math:`N`,
    the smallest included, runs every step size of one grid (:attr:`ClaimsPlan.speedup_lrs`),
    and the speedup compares each :math:`N` at its best step size with the smallest :math:`N`
    at *its* best (:func:`best_step_size`): Corollary 1 prescribes
    :math:`\eta = O(\sqrt{N/T})`, but Theorem 1 caps :math:`\eta` at
    :math:`\min\{(1 - \lambda^2) / (24 \lambda^2 S_F), 1 / (6 S_F)\}` for every :math:`N`, so
    a baseline run at a step chosen for another :math:`N` overstates the speedup.
``topology``
    Theorems 1-2: the consensus error, and with it the iterations needed, grow with
    :math:`\lambda = \Vert W - J \Vert_2` (terms in :math:`\lambda^2 / (1 - \lambda^2)^k`).
    Measured at one :math:`N` for ring, torus, exponential and full: :math:`\lambda`, iterations
    to the same target, the final consensus distance.
``tracking``
    Algorithm 1 line 8 (gradient tracking), which the paper's analysis includes and its
    experiments skip. Measured: SLATE with and without tracking on stratified (IID) and Dirichlet
    label-skewed partitions. A setting that leaves some party without ``b`` positives (or without
    negatives) cannot run and is reported as such.
``momentum``
    Corollary 2 against Corollary 1: SLATE-M's variance-reduced estimator against SLATE, by
    iteration, by gradient evaluations (SLATE-M evaluates two mini-batch gradients per step,
    plus ``B / b`` for its initial estimate) and by samples drawn (one mini-batch of ``m`` per
    step for both, since SLATE-M's two gradients share theirs, plus SLATE-M's initial batch:
    :func:`samples_drawn`).

"Iterations to target" is measured on each seed's ``history.csv``: the first evaluation at or
above the target, linearly interpolated with the evaluation before it
(:func:`iterations_to_target`). Runs go to ``OUT/<dataset>/claims/<method>/<key>/seed<k>/``,
where the key names every setting that differs between runs (:attr:`RunSpec.key`), so a run
shared by two studies (e.g. the ``full`` run at :math:`N = 16`) is trained once. The report is
``OUT/claims.md`` with its tables as ``OUT/figures/claims_<study>.csv`` and its figures as
``OUT/figures/claims_*.png``.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slate import plots
from slate.config import TrainConfig, resolve_config
from slate.errors import ConfigError, DataError, TrainingDiverged
from slate.reproduce import (
    METHOD_LABELS,
    _dataset_available,
    _mean_std,
    _train_config,
    default_config_dir,
    load_preset,
    run_or_reuse,
)

__all__ = [
    "DIVERGED",
    "STUDIES",
    "ClaimsPlan",
    "Outcome",
    "RunSpec",
    "best_step_size",
    "claims",
    "gradient_cost",
    "gradient_evaluations",
    "iterations_to_target",
    "read_history",
    "samples_drawn",
    "spread",
]

STUDIES = ("speedup", "topology", "tracking", "momentum")
FIGURES = "figures"  # subfolder of OUT with the CSVs and PNGs, as docs/figures
DIVERGED = "diverged.txt"  # in a seed's run folder: the run diverged; holds slate's message


# --------------------------------------------------------------------------- measurements


def iterations_to_target(steps: Sequence[float], values: Sequence[float], target: float) -> float:
    """When a curve first reaches ``target``, linearly interpolated between evaluations.

    With evaluations :math:`(t_i, a_i)` and :math:`i` the first index with
    :math:`a_i \\ge` ``target``, the result is
    :math:`t_{i-1} + (\\text{target} - a_{i-1}) (t_i - t_{i-1}) / (a_i - a_{i-1})`, or
    :math:`t_0` when :math:`i = 0`.

    Args:
        steps: increasing x values (iterations, or gradient evaluations).
        values: the metric at each step (test AP).
        target: the level to reach.

    Returns:
        The interpolated step, or NaN when no value reaches ``target``.
    """
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    hits = np.flatnonzero(y >= target)
    if hits.size == 0:
        return math.nan
    i = int(hits[0])
    if i == 0:
        return float(x[0])
    return float(x[i - 1] + (target - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))


def gradient_evaluations(
    steps: Sequence[float], per_step: int, initial_batches: int = 0
) -> np.ndarray:
    """Mini-batch gradients one party has evaluated after each iteration in ``steps``.

    A gradient evaluation is one forward and backward pass on a party's mini-batch of ``m``
    samples. SLATE evaluates one per iteration (:math:`g(t) = t`). SLATE-M (STORM, Alg. 2)
    spends its first iteration on ``initial_batches`` mini-batches (lines 3-5, :math:`B / b` of
    them) and then two per iteration, at :math:`x_t` and :math:`x_{t-1}` on the same samples
    (line 10): :math:`g(t) = B/b + 2 (t - 1)` for :math:`t \\ge 1`.

    Args:
        steps: iterations (0 before training).
        per_step: gradient evaluations per ordinary iteration.
        initial_batches: mini-batches of the first iteration, 0 if it is an ordinary one.
    """
    t = np.asarray(steps, dtype=float)
    if initial_batches == 0:
        return per_step * t
    return np.where(t <= 0, 0.0, initial_batches + per_step * (t - 1))


def gradient_cost(config: dict[str, Any]) -> tuple[int, int]:
    """``(per_step, initial_batches)`` of a run from its resolved config (``summary["config"]``)."""
    from slate.algorithms import AlgorithmConfig, build_algorithm

    algorithm = build_algorithm(
        config["algorithm"],
        AlgorithmConfig(
            lr=config["lr"], momentum=config["momentum"], initial_batch=config["initial_batch"]
        ),
    )
    storm = config["algorithm"] == "slate-m" and config["momentum"] == "storm"
    return (2 if storm else 1), algorithm.initial_batches(config["positives"])


def samples_drawn(steps: Sequence[float], batch_size: int, initial_batches: int = 0) -> np.ndarray:
    """Samples one party has drawn after each iteration in ``steps``.

    SLATE (Alg. 1) draws one mini-batch of :math:`m` samples per iteration (its :math:`b`
    positives among them): :math:`s(t) = m t`. SLATE-M (Alg. 2) draws :math:`B / b` mini-batches
    at its first iteration (lines 3-5, ``initial_batches``) and one per iteration after it: line
    10 evaluates the gradients at :math:`x_t` and :math:`x_{t-1}` on the *same* samples
    :math:`\\xi_{n,t}, \\mathcal B_{n,t}`, so its two gradient evaluations per step draw
    :math:`m` samples, not :math:`2 m`: :math:`s(t) = m (B/b + t - 1)` for :math:`t \\ge 1`.
    That is :func:`gradient_evaluations` with one evaluation per step, times :math:`m`.

    Args:
        steps: iterations (0 before training).
        batch_size: :math:`m`, the samples of one mini-batch.
        initial_batches: mini-batches of the first iteration, 0 if it is an ordinary one.
    """
    return batch_size * gradient_evaluations(steps, 1, initial_batches)


def best_step_size(iterations: Mapping[float, Sequence[float]]) -> float | None:
    """The step size that reaches the target in the fewest iterations, mean over seeds.

    Only a step size at which *every* seed reaches the target competes: a NaN (a seed that never
    reached it, or diverged) rules it out, since a mean over the seeds that did reach it would
    favour a step that fails on the others. Ties go to the smaller step.

    Args:
        iterations: per step size, the seeds' iterations to the target (NaN: not reached).

    Returns:
        The best step size, or None when no step size reaches the target on every seed.
    """
    means = {
        lr: float(np.mean(values))
        for lr, values in iterations.items()
        if len(values) and not any(math.isnan(v) for v in values)
    }
    if not means:
        return None
    return min(means, key=lambda lr: (means[lr], lr))


def read_history(folder: Path) -> dict[str, np.ndarray]:
    """Every column of a run's ``history.csv`` as a float array."""
    with open(folder / "history.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {key: np.array([float(r[key]) for r in rows]) for key in rows[0]}


@dataclass(frozen=True)
class Spread:
    """Mean and sample standard deviation over the seeds where a value exists (not NaN)."""

    mean: float
    std: float
    count: int
    seeds: int

    def format(self, spec: str) -> str:
        """``mean ± std`` with ``spec`` (e.g. ``".4f"``), the count when not every seed has one."""
        if self.count == 0:
            return "not reached"
        text = f"{self.mean:{spec}} ± {self.std:{spec}}"
        return text if self.count == self.seeds else f"{text} ({self.count}/{self.seeds} seeds)"


def spread(values: Sequence[float]) -> Spread:
    """:class:`Spread` of ``values``; NaNs (e.g. a target never reached) are left out."""
    finite = [float(v) for v in values if not math.isnan(v)]
    mean, std = _mean_std(finite) if finite else (math.nan, math.nan)
    return Spread(mean, std, len(finite), len(values))


# --------------------------------------------------------------------------- runs


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
        return _train_config(
            self.preset, method, seed, data_dir=self.data_dir, device=self.device, **fields
        )

    def folder(self, spec: RunSpec, seed: int) -> Path:
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


# --------------------------------------------------------------------------- the plan


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
        return max(1, self.iterations // evaluations)


@dataclass
class _Context:
    run: Runner
    plan: ClaimsPlan
    base: TrainConfig  # the preset's SLATE run, resolved
    figures: Path

    @property
    def lr(self) -> float:
        return self.plan.lr if self.plan.lr is not None else float(self.base.lr)

    def reference(self) -> tuple[Outcome, float]:
        """The smallest-N speedup run at the base step size, and the target AP derived from it."""
        plan = self.plan
        spec = RunSpec(
            nodes=min(plan.speedup_nodes), topology=plan.speedup_topology, lr=self.lr,
            iterations=plan.iterations, eval_every=plan.every(plan.fine_evaluations),
        )  # fmt: skip
        outcome = _require(self.run(spec))
        return outcome, plan.target_fraction * outcome.final("test_ap").mean


def _require(outcome: Outcome, diverged_ok: bool = False) -> Outcome:
    """``outcome`` if every seed could run (and, unless ``diverged_ok``, none diverged)."""
    if outcome.error is not None:
        raise DataError(f"The run {outcome.spec.key} cannot run: {outcome.error}.")
    if outcome.diverged and not diverged_ok:
        seed, message = next(iter(outcome.diverged.items()))
        raise TrainingDiverged(f"The run {outcome.spec.key}, seed {seed}, diverged: {message}")
    return outcome


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator and not math.isnan(denominator) else math.nan


# --------------------------------------------------------------------------- studies


def speedup_study(ctx: _Context) -> tuple[list[dict[str, Any]], str]:
    r"""Corollaries 1-2: iterations to the target AP against N, each N at its best step size.

    Every :math:`N` runs every :math:`\eta` of ``plan.speedup_lrs``. With :math:`T_N(\eta)` the
    mean iterations to the target and :math:`\eta_N^*` the best step size of :math:`N`
    (:func:`best_step_size`), the speedup is :math:`T_{N_0}(\eta_{N_0}^*) / T_N(\eta_N^*)` and
    the efficiency is the speedup times :math:`N_0 / N` (:math:`N_0` the smallest :math:`N`; an
    efficiency of 1 is a linear speedup).
    Theorem 1 holds for :math:`\eta \le \min\{(1 - \lambda^2) / (24 \lambda^2 S_F),
    1 / (6 S_F)\}`, a cap that does not grow with :math:`N`; Corollary 1's
    :math:`\eta = O(\sqrt{N/T})` gives its speedup only while it stays under that cap, so each
    :math:`N` is compared at the step that suits it, not at a step chosen for another :math:`N`.
    """
    plan = ctx.plan
    reference, target = ctx.reference()
    m = int(reference.summaries[0]["config"]["batch_size"])
    nodes, grid = list(plan.speedup_nodes), sorted(set(plan.speedup_lrs))
    smallest = min(nodes)
    outcomes: dict[tuple[int, float], Outcome] = {}
    for n in nodes:
        for lr in grid:
            spec = RunSpec(
                nodes=n, topology=plan.speedup_topology, lr=lr, iterations=plan.iterations,
                eval_every=plan.every(plan.fine_evaluations),
            )  # fmt: skip
            outcomes[n, lr] = _require(ctx.run(spec), diverged_ok=True)
    reached = {key: outcome.to_target(target) for key, outcome in outcomes.items()}
    best = {n: best_step_size({lr: reached[n, lr] for lr in grid}) for n in nodes}
    base = best[smallest]
    base_iterations = math.nan if base is None else spread(reached[smallest, base]).mean
    rows: list[dict[str, Any]] = []
    for (n, lr), outcome in outcomes.items():
        its = spread(reached[n, lr])
        samples = spread([n * m * t for t in reached[n, lr]])
        ap = outcome.final("test_ap")
        complete = its.count == its.seeds  # every seed reached the target
        speedup = _ratio(base_iterations, its.mean) if complete else math.nan
        rows.append({
            "nodes": n, "lr": lr, "target": target, "ap_mean": ap.mean, "ap_std": ap.std,
            "iterations_mean": its.mean, "iterations_std": its.std,
            "samples_mean": samples.mean, "samples_std": samples.std, "reached": its.count,
            "diverged": len(outcome.diverged), "seeds": its.seeds, "best": lr == best[n],
            "speedup": speedup, "efficiency": speedup * smallest / n,
            "_its": its, "_samples": samples, "_ap": ap,
        })  # fmt: skip
    _write_csv(rows, ctx.figures / "claims_speedup.csv")
    by_cell = {(r["nodes"], r["lr"]): r for r in rows}
    tuned = [by_cell[n, best[n]] if best[n] is not None else None for n in nodes]
    _speedup_figures(ctx, rows, tuned, outcomes, target)
    text = (
        f"SLATE, m = {m} samples per party and step, topology `{plan.speedup_topology}` "
        f"(λ = {reference.summaries[0]['lambda']:g}, the same for every N), "
        f"{plan.iterations} iterations, test AP every {plan.every(plan.fine_evaluations)} "
        f"iterations. Target: {plan.target_fraction:g} × the final test AP of N = {smallest} at "
        f"η = {ctx.lr:g} ({reference.final('test_ap').mean:.4f}) = **{target:.4f}**. Every N "
        f"runs every step size of the grid η ∈ {{{', '.join(f'{lr:g}' for lr in grid)}}}. "
        "Best η of an N (bold): the fewest mean iterations to the target among the step sizes "
        "at which every seed reaches it; a seed that diverges (slate stops it with "
        "`TrainingDiverged`) or never reaches the target rules its η out. Speedup = iterations "
        f"of N = {smallest} at its best η / iterations of N at its best η (means); efficiency = "
        f"speedup × {smallest} / N (1 is a linear speedup). Samples = N · m · iterations. "
        "Theorem 1 admits η ≤ min{(1 − λ²) / (24 λ² S_F), 1 / (6 S_F)} at every N (with λ = 0: "
        "1 / (6 S_F)); the cap does not grow with N.\n\n"
        f"{_speedup_grid_table(rows, nodes, grid)}\n\n"
        f"{_speedup_best_table(nodes, grid, tuned)}\n\n"
        "![iterations to target](figures/claims_speedup_iterations.png)\n"
        "![samples to target](figures/claims_speedup_samples.png)\n"
        "![test AP curves, best step size](figures/claims_speedup_curves.png)\n"
    )
    return _strip(rows), text


def _speedup_cell(row: dict[str, Any]) -> str:
    """A grid cell: iterations to target (mean ± std), or why a seed has none."""
    its: Spread = row["_its"]
    if row["diverged"] == row["seeds"]:
        return "diverged"
    text = its.format(".0f")
    if row["diverged"]:
        text += f", {row['diverged']}/{row['seeds']} diverged"
    return f"**{text}**" if row["best"] else text


def _speedup_grid_table(rows: list[dict[str, Any]], nodes: list[int], grid: list[float]) -> str:
    """Rows N, columns η: iterations to target of every run of the grid, best η in bold."""
    by_cell = {(r["nodes"], r["lr"]): r for r in rows}
    return _table(
        ["N", *(f"η = {lr:g}" for lr in grid)],
        [[n, *(_speedup_cell(by_cell[n, lr]) for lr in grid)] for n in nodes],
    )


def _speedup_best_table(
    nodes: list[int], grid: list[float], tuned: list[dict[str, Any] | None]
) -> str:
    """Per N: its best η (flagged at the grid's edge), AP, iterations, speedup, efficiency."""
    cells = []
    for n, row in zip(nodes, tuned, strict=True):
        if row is None:
            cells.append([n, "none reaches the target on every seed", "", "", "", "", ""])
            continue
        edge = " (edge of the grid)" if row["lr"] in (grid[0], grid[-1]) and len(grid) > 1 else ""
        cells.append([
            n, f"{row['lr']:g}{edge}", row["_ap"].format(".4f"), row["_its"].format(".0f"),
            row["_samples"].format(".3g"), f"{row['speedup']:.2f}", f"{row['efficiency']:.2f}",
        ])  # fmt: skip
    return _table(
        ["N", "best η", "final test AP", "iterations to target", "samples to target",
         "speedup", "efficiency"],
        cells,
    )  # fmt: skip


def _speedup_figures(
    ctx: _Context,
    rows: list[dict[str, Any]],
    tuned: list[dict[str, Any] | None],
    outcomes: dict[tuple[int, float], Outcome],
    target: float,
) -> None:
    """Iterations and samples to target against N (log-log), and the best runs' AP curves."""
    plan = ctx.plan
    nodes, grid = list(plan.speedup_nodes), sorted(set(plan.speedup_lrs))
    by_cell = {(r["nodes"], r["lr"]): r for r in rows}

    def pick(key: str, chosen: list[dict[str, Any] | None]) -> tuple[list[float], list[float]]:
        """Means and stds of ``key``; NaN (left out) where some seed did not reach the target."""
        done = [r if r is not None and r["reached"] == r["seeds"] else None for r in chosen]
        return (
            [r[f"{key}_mean"] if r else math.nan for r in done],
            [r[f"{key}_std"] if r else math.nan for r in done],
        )

    first = tuned[nodes.index(min(nodes))]
    for key, what in (("iterations", "iterations"), ("samples", "samples (N m T)")):
        series = {"best η of each N": pick(key, tuned)}
        if key == "iterations":
            for lr in grid:
                series[f"η = {lr:g}"] = pick(key, [by_cell[n, lr] for n in nodes])
        start = first[f"{key}_mean"] if first is not None else math.nan
        scale = [min(nodes) / n if key == "iterations" else 1.0 for n in nodes]
        ideal = (f"linear speedup from N = {min(nodes)} at its best η", [start * f for f in scale])
        plots.plot_scaling(
            nodes, series, ctx.figures / f"claims_speedup_{key}.png",
            title=f"{what} to test AP {target:.4f} (mean ± std over seeds)",
            xlabel="parties N", ylabel=what, reference=ideal,
        )  # fmt: skip
    curves = {
        f"N = {n}, η = {row['lr']:g}": outcomes[n, row["lr"]].mean_curve()
        for n, row in zip(nodes, tuned, strict=True)
        if row is not None
    }
    curves[f"target {target:.4f}"] = (np.array([1.0, plan.iterations]), np.array([target] * 2))
    plots.plot_ap_curves(
        curves, ctx.figures / "claims_speedup_curves.png",
        title=f"test AP at each N's best η, {plan.speedup_topology} (mean over seeds)", logx=True,
    )  # fmt: skip


def topology_study(ctx: _Context) -> tuple[list[dict[str, Any]], str]:
    """Theorems 1-2: iterations to the target and consensus distance against lambda."""
    plan = ctx.plan
    _, target = ctx.reference()
    n = plan.topology_nodes
    rows: list[dict[str, Any]] = []
    consensus: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    ap_curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    scaled = ctx.lr * n / min(plan.speedup_nodes)
    for lr in dict.fromkeys((ctx.lr, scaled)):
        full_iterations = math.nan
        for topology in plan.topologies:
            spec = RunSpec(
                nodes=n, topology=topology, lr=lr, iterations=plan.iterations,
                eval_every=plan.every(plan.fine_evaluations),
            )  # fmt: skip
            outcome = _require(ctx.run(spec))
            its = spread(outcome.to_target(target))
            if topology == "full":
                full_iterations = its.mean
            ap, distance = outcome.final("test_ap"), outcome.final("consensus_distance")
            lam = float(outcome.summaries[0]["lambda"])
            rows.append({
                "lr": lr, "topology": topology, "nodes": n, "lambda": lam, "target": target,
                "ap_mean": ap.mean, "ap_std": ap.std, "iterations_mean": its.mean,
                "iterations_std": its.std, "reached": its.count, "seeds": its.seeds,
                "consensus_mean": distance.mean, "consensus_std": distance.std,
                "_its": its, "_ap": ap, "_distance": distance,
            })  # fmt: skip
            if lam > 0:  # exact averaging: zero up to rounding, left out of the log plot
                consensus[f"{topology}, η = {lr:g}"] = outcome.mean_curve("consensus_distance")
            if lr == scaled:
                ap_curves[f"{topology} (λ = {lam:.3f})"] = outcome.mean_curve()
        for row in rows:
            if row["lr"] == lr:
                row["slowdown"] = _ratio(row["iterations_mean"], full_iterations)
    _write_csv(rows, ctx.figures / "claims_topology.csv")
    ap_curves[f"target {target:.4f}"] = (np.array([1.0, plan.iterations]), np.array([target] * 2))
    plots.plot_ap_curves(
        ap_curves, ctx.figures / "claims_topology_curves.png",
        title=f"test AP, N = {n}, η = {scaled:g} (mean over seeds)", logx=True,
    )  # fmt: skip
    figures = "![test AP by topology](figures/claims_topology_curves.png)\n"
    if consensus:
        plots.plot_ap_curves(
            consensus, ctx.figures / "claims_topology_consensus.png",
            title=f"consensus distance, N = {n}, λ > 0 (mean over seeds)",
            ylabel="(1/N) Σ ||x_n - x̄||²", logy=True,
        )  # fmt: skip
        figures += "![consensus distance by topology](figures/claims_topology_consensus.png)\n"
    table = _table(
        ["η", "topology", "λ", "final test AP", "iterations to target", "vs full",
         "final consensus distance"],
        [[f"{r['lr']:g}", r["topology"], f"{r['lambda']:.4f}", r["_ap"].format(".4f"),
          r["_its"].format(".0f"), f"{r['slowdown']:.2f}", r["_distance"].format(".2e")]
         for r in rows],
    )  # fmt: skip
    text = (
        f"SLATE, N = {n}, the speedup study's target **{target:.4f}** and evaluation schedule; "
        f"the preset's η = {ctx.lr:g} and η = {ctx.lr:g} N = {scaled:g} (Corollary 1's η ∝ N at "
        f"a fixed accuracy, from the preset's step). λ = "
        '‖W − J‖₂ of the gossip matrix (as `slate topology` prints it); "vs full" = iterations '
        "to target / those of `full` at the same η; consensus distance = (1/N) Σₙ ‖xₙ − x̄‖² "
        "of the final weights.\n\n"
        f"{table}\n\n{figures}"
    )
    return _strip(rows), text


def tracking_study(ctx: _Context) -> tuple[list[dict[str, Any]], str]:
    """Alg. 1 line 8: SLATE with and without gradient tracking, IID and label-skewed parties."""
    plan = ctx.plan
    rows: list[dict[str, Any]] = []
    cells: list[list[str]] = []
    heat: list[list[float]] = []
    heat_labels: list[str] = []
    consensus: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    largest = max(n for n, _, _ in plan.tracking_settings)
    for n, partition, alpha in plan.tracking_settings:
        setting = f"N = {n}, " + (partition if alpha is None else f"Dirichlet α = {alpha:g}")
        outcomes = {}
        for gt in (False, True):
            spec = RunSpec(
                nodes=n, topology=plan.tracking_topology, lr=ctx.lr, iterations=plan.iterations,
                eval_every=plan.every(plan.evaluations), partition=partition,
                dirichlet_alpha=alpha, gradient_tracking=gt,
            )  # fmt: skip
            outcomes[gt] = ctx.run(spec)
        error = outcomes[False].error or outcomes[True].error
        if error is not None:
            rows.append({"setting": setting, "nodes": n, "partition": partition,
                         "dirichlet_alpha": alpha, "error": error})  # fmt: skip
            cells.append([setting, "—", f"cannot run: {error}", "", "", "", "", ""])
            continue
        target = plan.target_fraction * outcomes[False].final("test_ap").mean
        row: dict[str, Any] = {
            "setting": setting, "nodes": n, "partition": partition, "dirichlet_alpha": alpha,
            "lambda": float(outcomes[False].summaries[0]["lambda"]), "target": target,
        }  # fmt: skip
        stats = {}
        for gt, outcome in outcomes.items():
            tag = "gt" if gt else "plain"
            ap, its = outcome.final("test_ap"), spread(outcome.to_target(target))
            distance = outcome.final("consensus_distance")
            stats[gt] = (ap, its, distance)
            row.update({
                f"{tag}_ap_mean": ap.mean, f"{tag}_ap_std": ap.std,
                f"{tag}_iterations_mean": its.mean, f"{tag}_iterations_std": its.std,
                f"{tag}_reached": its.count, f"{tag}_consensus_mean": distance.mean,
                f"{tag}_consensus_std": distance.std,
            })  # fmt: skip
            if n == largest:
                label = f"{setting}, {'with' if gt else 'no'} GT"
                consensus[label] = outcome.mean_curve("consensus_distance")
        rows.append(row)
        heat.append([stats[False][0].mean, stats[True][0].mean])
        heat_labels.append(f"N={n} " + ("IID" if alpha is None else f"α={alpha:g}"))
        cells.append([
            setting, f"{row['lambda']:.4f}", stats[False][0].format(".4f"),
            stats[True][0].format(".4f"), stats[False][1].format(".0f"),
            stats[True][1].format(".0f"), stats[False][2].format(".2e"),
            stats[True][2].format(".2e"),
        ])  # fmt: skip
    _write_csv(rows, ctx.figures / "claims_tracking.csv")
    figures = ""
    if heat:
        plots.plot_heatmap(
            np.array(heat), heat_labels, ["without", "with"],
            ctx.figures / "claims_tracking.png", title="final test AP",
            xlabel="gradient tracking", ylabel="parties, partition",
        )  # fmt: skip
        figures += "![final AP with and without tracking](figures/claims_tracking.png)\n"
    if consensus:
        plots.plot_ap_curves(
            consensus, ctx.figures / "claims_tracking_consensus.png",
            title=f"consensus distance, N = {largest} (mean over seeds)",
            ylabel="(1/N) Σ ||x_n - x̄||²", logy=True,
        )  # fmt: skip
        figures += "![consensus distance with and without tracking]"
        figures += "(figures/claims_tracking_consensus.png)\n"
    table = _table(
        ["setting", "λ", "AP without GT", "AP with GT", "iterations to target without",
         "with", "consensus distance without", "with"],
        cells,
    )  # fmt: skip
    text = (
        f"SLATE, topology `{plan.tracking_topology}`, η = {ctx.lr:g}, {plan.iterations} "
        f"iterations, test AP every {plan.every(plan.evaluations)}. Target per setting: "
        f"{plan.target_fraction:g} × the final AP without tracking. Dirichlet: each class's "
        "samples are split by proportions drawn from Dir(α · 1_N) (`--partition dirichlet`); a "
        "setting where some party holds fewer than b positives or no negative cannot run.\n\n"
        f"{table}\n\n{figures}"
    )
    return rows, text


def momentum_study(ctx: _Context) -> tuple[list[dict[str, Any]], str]:
    """Corollary 2 vs 1: SLATE-M against SLATE by iteration and by gradient evaluations."""
    plan = ctx.plan
    n, topology = int(ctx.base.nodes), ctx.base.topology
    outcomes = {}
    for method in ("slate", "slate-m"):
        spec = RunSpec(
            method=method, nodes=n, topology=topology, lr=ctx.lr, iterations=plan.iterations,
            eval_every=plan.every(plan.evaluations),
        )  # fmt: skip
        outcomes[method] = _require(ctx.run(spec))
    target = plan.target_fraction * outcomes["slate"].final("test_ap").mean
    rows, cells = [], []
    by_iteration, by_gradient = {}, {}
    for method, outcome in outcomes.items():
        config = outcome.summaries[0]["config"]
        per_step, initial = gradient_cost(config)
        ap = outcome.final("test_ap")
        its = spread(outcome.to_target(target))
        grads = spread(outcome.to_target(target, x="gradients"))
        samples = spread(outcome.to_target(target, x="samples"))  # drawn: not gradients × m
        seconds = outcome.final("wall_seconds")
        total = float(gradient_evaluations([plan.iterations], per_step, initial)[0])
        rows.append({
            "method": method, "ap_mean": ap.mean, "ap_std": ap.std,
            "iterations_mean": its.mean, "iterations_std": its.std,
            "gradients_mean": grads.mean, "gradients_std": grads.std, "reached": its.count,
            "samples_mean": samples.mean, "samples_std": samples.std, "gradients_total": total,
            "seconds_mean": seconds.mean, "seconds_std": seconds.std,
        })  # fmt: skip
        label = METHOD_LABELS[method]
        cells.append([
            label, ap.format(".4f"), its.format(".0f"), grads.format(".0f"),
            samples.format(".0f"), f"{total:.0f}", seconds.format(".1f"),
        ])  # fmt: skip
        steps, values = outcome.mean_curve()
        by_iteration[label] = (steps, values)
        by_gradient[label] = (gradient_evaluations(steps, per_step, initial), values)
    _write_csv(rows, ctx.figures / "claims_momentum.csv")
    plots.plot_ap_curves(
        by_iteration, ctx.figures / "claims_momentum_iterations.png",
        title=f"test AP by iteration, N = {n} {topology} (mean over seeds)",
    )  # fmt: skip
    plots.plot_ap_curves(
        by_gradient, ctx.figures / "claims_momentum_gradients.png",
        title=f"test AP by gradient evaluations per party, N = {n} {topology}",
        xlabel="mini-batch gradient evaluations per party",
    )  # fmt: skip
    table = _table(
        ["method", "final test AP", "iterations to target", "gradient evaluations to target",
         "samples per party to target", f"gradient evaluations in {plan.iterations} iterations",
         "wall seconds"],
        cells,
    )  # fmt: skip
    slate_m = outcomes["slate-m"].summaries[0]["config"]
    text = (
        f"The preset's runs: N = {n}, `{topology}`, η = {ctx.lr:g}, m = {ctx.base.batch_size}, "
        f"b = {ctx.base.positives}; SLATE-M with α = {slate_m['alpha']:g} and the `"
        f"{slate_m['momentum']}` estimator. {plan.iterations} iterations, test AP every "
        f"{plan.every(plan.evaluations)}. Target: {plan.target_fraction:g} × SLATE's final AP = "
        f"**{target:.4f}**. A gradient evaluation is one party's forward and backward pass on its "
        "m-sample mini-batch: SLATE spends 1 per iteration; SLATE-M spends B/b on its first "
        "iteration (the initial estimate) and 2 per iteration after it. Samples are those one "
        "party draws: m per iteration for both methods, since SLATE-M evaluates its two "
        "gradients on the same mini-batch (Alg. 2, line 10), and B/b mini-batches of m at "
        "SLATE-M's first iteration. Wall seconds include the evaluations.\n\n"
        f"{table}\n\n"
        "![test AP by iteration](figures/claims_momentum_iterations.png)\n"
        "![test AP by gradient evaluations](figures/claims_momentum_gradients.png)\n"
    )
    return rows, text


STUDY_FUNCTIONS: dict[str, Callable[[_Context], tuple[list[dict[str, Any]], str]]] = {
    "speedup": speedup_study,
    "topology": topology_study,
    "tracking": tracking_study,
    "momentum": momentum_study,
}
STUDY_TITLES = {
    "speedup": "1. Speedup in the number of parties (Corollaries 1-2)",
    "topology": "2. Topology: slowdown with λ (Theorems 1-2)",
    "tracking": "3. Gradient tracking under heterogeneity (Algorithm 1, line 8)",
    "momentum": "4. SLATE-M against SLATE (Corollary 2 against Corollary 1)",
}


def claims(
    data_dir: str | None,
    out: Path,
    studies: Sequence[str] = STUDIES,
    seeds: Sequence[int] = (0, 1, 2),
    dataset: str = "w7a",
    config_dir: Path | None = None,
    device: str = "cpu",
    iterations: int | None = None,
    plan: ClaimsPlan | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, list[dict[str, Any]]]:
    """Run (or reuse) the studies' runs, then write ``OUT/claims.md``, CSVs and figures.

    Args:
        data_dir: folder of the datasets (``DIR/w7a/...``).
        out: output folder; run folders under ``OUT/<dataset>/claims/``, the report in
            ``OUT/claims.md`` and ``OUT/figures/claims_*``.
        studies: some of :data:`STUDIES`, in that order in the report.
        seeds: the seeds of every setting.
        dataset: the dataset, with a preset in ``config_dir``.
        config_dir: folder of the TOML presets (default: the repository's ``configs/``).
        device: torch device of the runs.
        iterations: overrides ``plan.iterations`` (evaluation intervals follow it).
        plan: the studies' settings (default :class:`ClaimsPlan`).
        log: receives one line per run.

    Returns:
        Each study's table rows, as written to its CSV.
    """
    unknown = sorted(set(studies) - set(STUDIES))
    if unknown or not studies:
        raise ConfigError(f"Unknown --studies {unknown}; expected some of {', '.join(STUDIES)}.")
    if not seeds:
        raise ConfigError("--seeds must name at least one seed.")
    plan = plan or ClaimsPlan()
    if iterations is not None:
        plan = dataclasses.replace(plan, iterations=iterations)
    if plan.iterations < 1:
        raise ConfigError(f"--iterations must be at least 1, got {plan.iterations}.")
    preset = load_preset(dataset, config_dir or default_config_dir())
    reason = _dataset_available(preset, data_dir)
    if reason is not None:
        raise DataError(f"Dataset {dataset} is not present: {reason}.")
    base = resolve_config(_train_config(preset, "slate", seeds[0], data_dir=data_dir))
    figures = out / FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    ctx = _Context(Runner(preset, data_dir, out, seeds, device, log), plan, base, figures)
    results, sections = {}, []
    for study in (s for s in STUDIES if s in studies):
        rows, text = STUDY_FUNCTIONS[study](ctx)
        results[study] = rows
        sections.append(f"## {STUDY_TITLES[study]}\n\n{text}")
    seed_list = ", ".join(str(s) for s in seeds)
    report = (
        f"<!-- written by slate reproduce claims: {dataset}, seeds {seed_list} -->\n\n"
        f"Dataset {dataset}; every number is the mean ± sample standard deviation over seeds "
        f"{seed_list} of the final averaged model's test AP or of a per-seed measurement. "
        "Iterations to target: the first evaluation at or above the target, linearly "
        "interpolated with the evaluation before it.\n\n" + "\n".join(sections)
    )
    (out / "claims.md").write_text(report)
    log(f"wrote {out / 'claims.md'} and {figures}/claims_*")
    return results


# --------------------------------------------------------------------------- output helpers


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without their private (``_``) formatting entries."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def _write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    clean = _strip(rows)
    columns = list(dict.fromkeys(k for r in clean for k in r))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(clean)
