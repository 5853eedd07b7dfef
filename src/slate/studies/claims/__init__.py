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

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slate.errors import ConfigError, DataError
from slate.studies.claims.measures import (
    Spread,
    best_step_size,
    gradient_cost,
    gradient_evaluations,
    iterations_to_target,
    read_history,
    samples_drawn,
    spread,
)
from slate.studies.claims.momentum import momentum_study
from slate.studies.claims.runs import DIVERGED, ClaimsPlan, Context, Outcome, Runner, RunSpec
from slate.studies.claims.speedup import speedup_study
from slate.studies.claims.topology import topology_study
from slate.studies.claims.tracking import tracking_study
from slate.studies.reproduce import (
    dataset_available,
    default_config_dir,
    load_preset,
    train_config,
)
from slate.training.configuration import resolve_and_check

__all__ = [
    "DIVERGED",
    "STUDIES",
    "ClaimsPlan",
    "Outcome",
    "RunSpec",
    "Spread",
    "best_step_size",
    "claims",
    "gradient_cost",
    "gradient_evaluations",
    "iterations_to_target",
    "momentum_study",
    "read_history",
    "samples_drawn",
    "speedup_study",
    "spread",
    "topology_study",
    "tracking_study",
]

STUDIES = ("speedup", "topology", "tracking", "momentum")
FIGURES = "figures"  # subfolder of OUT with the CSVs and PNGs, as docs/figures


STUDY_FUNCTIONS: dict[str, Callable[[Context], tuple[list[dict[str, Any]], str]]] = {
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
        config_dir: folder of the TOML presets (default: :func:`default_config_dir`).
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
    reason = dataset_available(preset, data_dir)
    if reason is not None:
        raise DataError(f"Dataset {dataset} is not present: {reason}.")
    base = resolve_and_check(train_config(preset, "slate", seeds[0], data_dir=data_dir)).flags
    figures = out / FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    ctx = Context(Runner(preset, data_dir, out, seeds, device, log), plan, base, figures)
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
