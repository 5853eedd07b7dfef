"""The gradient-tracking study of ``slate reproduce claims``: Algorithm 1 line 8 with and
without tracking, on IID and label-skewed parties."""

from __future__ import annotations

from typing import Any

import numpy as np

from slate.metrics import plots
from slate.studies.claims.measures import spread
from slate.studies.claims.report import write_rows
from slate.studies.claims.runs import Context, RunSpec
from slate.studies.tables import markdown_table

__all__ = ["tracking_study"]


def tracking_study(ctx: Context) -> tuple[list[dict[str, Any]], str]:
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
    write_rows(rows, ctx.figures / "claims_tracking.csv")
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
    table = markdown_table(
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
