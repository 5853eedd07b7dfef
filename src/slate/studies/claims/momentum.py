"""The momentum study of ``slate reproduce claims``: Corollary 2 against Corollary 1, SLATE-M
against SLATE by iteration, gradient evaluations and samples drawn."""

from __future__ import annotations

from typing import Any

from slate.metrics import plots
from slate.studies.claims.measures import gradient_cost, gradient_evaluations, spread
from slate.studies.claims.report import write_rows
from slate.studies.claims.runs import Context, RunSpec, require
from slate.studies.reproduce import METHOD_LABELS
from slate.studies.tables import markdown_table

__all__ = ["momentum_study"]


def momentum_study(ctx: Context) -> tuple[list[dict[str, Any]], str]:
    """Corollary 2 vs 1: SLATE-M against SLATE by iteration and by gradient evaluations."""
    plan = ctx.plan
    n, topology = int(ctx.base.nodes), ctx.base.topology
    outcomes = {}
    for method in ("slate", "slate-m"):
        spec = RunSpec(
            method=method, nodes=n, topology=topology, lr=ctx.lr, iterations=plan.iterations,
            eval_every=plan.every(plan.evaluations),
        )  # fmt: skip
        outcomes[method] = require(ctx.run(spec))
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
    write_rows(rows, ctx.figures / "claims_momentum.csv")
    plots.plot_ap_curves(
        by_iteration, ctx.figures / "claims_momentum_iterations.png",
        title=f"test AP by iteration, N = {n} {topology} (mean over seeds)",
    )  # fmt: skip
    plots.plot_ap_curves(
        by_gradient, ctx.figures / "claims_momentum_gradients.png",
        title=f"test AP by gradient evaluations per party, N = {n} {topology}",
        xlabel="mini-batch gradient evaluations per party",
    )  # fmt: skip
    table = markdown_table(
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
