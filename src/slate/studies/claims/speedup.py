"""The speedup study of ``slate reproduce claims``: Corollaries 1-2, iterations to a target
AP against the number of parties, each N at its best step size."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from slate.metrics import plots
from slate.studies.claims.measures import Spread, best_step_size, spread
from slate.studies.claims.report import strip_private, write_rows
from slate.studies.claims.runs import Context, Outcome, RunSpec, ratio, require
from slate.studies.tables import markdown_table

__all__ = ["speedup_study"]


def speedup_study(ctx: Context) -> tuple[list[dict[str, Any]], str]:
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
            outcomes[n, lr] = require(ctx.run(spec), diverged_ok=True)
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
        speedup = ratio(base_iterations, its.mean) if complete else math.nan
        rows.append({
            "nodes": n, "lr": lr, "target": target, "ap_mean": ap.mean, "ap_std": ap.std,
            "iterations_mean": its.mean, "iterations_std": its.std,
            "samples_mean": samples.mean, "samples_std": samples.std, "reached": its.count,
            "diverged": len(outcome.diverged), "seeds": its.seeds, "best": lr == best[n],
            "speedup": speedup, "efficiency": speedup * smallest / n,
            "_its": its, "_samples": samples, "_ap": ap,
        })  # fmt: skip
    write_rows(rows, ctx.figures / "claims_speedup.csv")
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
    return strip_private(rows), text


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
    return markdown_table(
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
    return markdown_table(
        ["N", "best η", "final test AP", "iterations to target", "samples to target",
         "speedup", "efficiency"],
        cells,
    )  # fmt: skip


def _speedup_figures(
    ctx: Context,
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
