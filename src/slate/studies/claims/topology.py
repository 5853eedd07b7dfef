"""The topology study of ``slate reproduce claims``: Theorems 1-2, iterations to a target and
the consensus distance against lambda."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from slate.metrics import plots
from slate.studies.claims.measures import spread
from slate.studies.claims.report import strip_private, write_rows
from slate.studies.claims.runs import Context, RunSpec, ratio, require
from slate.studies.tables import markdown_table

__all__ = ["topology_study"]


def topology_study(ctx: Context) -> tuple[list[dict[str, Any]], str]:
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
            outcome = require(ctx.run(spec))
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
                row["slowdown"] = ratio(row["iterations_mean"], full_iterations)
    write_rows(rows, ctx.figures / "claims_topology.csv")
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
    table = markdown_table(
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
    return strip_private(rows), text
