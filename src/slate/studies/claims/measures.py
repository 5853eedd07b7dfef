"""The measurements of ``slate reproduce claims``: when a curve reaches a target, the work a run
has done by an iteration (gradient evaluations, samples drawn), the best step size of a grid, and
the spread of a value over seeds."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slate.studies.reproduce import mean_std

__all__ = [
    "Spread",
    "best_step_size",
    "gradient_cost",
    "gradient_evaluations",
    "iterations_to_target",
    "read_history",
    "samples_drawn",
    "spread",
]


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
    from slate.algorithms import build_algorithm, configure

    name = config["algorithm"]
    algorithm = build_algorithm(
        name,
        *configure(
            name,
            lr=config["lr"],
            momentum=config["momentum"],
            initial_batch=config["initial_batch"],
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
    mean, std = mean_std(finite) if finite else (math.nan, math.nan)
    return Spread(mean, std, len(finite), len(values))
