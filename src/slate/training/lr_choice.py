"""``--lr auto``: the step size chosen from the data, before training, never from test rows.

The rule (:func:`choose_lr`), for a run of :math:`T` iterations:

1. **Rows.** With ``--validation-fraction`` the candidates are scored on the run's validation
   rows. Without it, a seeded stratified :data:`CHOICE_FRACTION` of the *training* rows is held
   out (seed ``--split-seed``), and the candidates train on the rest. The test rows (the
   ``--test`` file, or the held-out ``--test-fraction``) are never read for the choice.
2. **Candidates.** Each step size :math:`\\eta \\in` :data:`CANDIDATES` (a factor of about 3
   apart, 0.003 to 0.3) trains the run's own model, algorithm, batch, margin and seed on the
   simulator for :math:`K = \\min(` :data:`CHOICE_ITERATIONS` :math:`, T)` iterations, with
   the run's :math:`N` parties (fewer where the 80 % of the rows hold too few positives for
   :math:`N` parties of ``b``), and scores its averaged model's AP on the held rows. A candidate
   whose run diverges (non-finite values) scores nothing.
3. **Pick** (:func:`pick`). Let :math:`A^*` be the best AP. The chosen step size is the
   *largest* candidate whose AP is at least :math:`A^* -` :data:`TOLERANCE`: within the noise of
   a few hundred held-out rows candidates are alike, and the larger step size reaches further in
   the :math:`T` iterations of the real run (the short runs measure what is reached in
   :math:`K \\le T`). Every candidate diverged: an error that says to give ``--lr``.

Its cost is :math:`5K` iterations of the simulator on 80 % of the rows (2 500 with
:math:`K = 500`, half of a table's default :math:`T = 5000`), plus five set-ups; the seconds go
to ``summary.json`` (``lr_choice``) and to the console line that names the choice.

Every party uses the same step size: the simulator chooses it once; the local launcher of the
distributed engine chooses it once before starting the parties and hands each the number
(``--lr X``) and the record; a torchrun worker chooses it on the whole dataset, as every other
worker does, deterministically, and the run agreement compares ``lr`` before step 1. Sites with
their own files only (``--party-files``, ``{rank}`` paths, ``--rank``) cannot score candidates
on rows they do not hold: an explicit ``--lr auto`` is refused there, and the tables' default
falls back to :data:`FALLBACK_LR` with a note.

The choice is part of a run's plan (:mod:`slate.training.plan`). This module states the rule and
the candidates' runs (:func:`trial_config`) but runs none itself: a :class:`CandidateRunner`
passed down by the layer that owns the training loop runs them
(:func:`slate.training.loop.run_candidates`, all five on one cut of the rows).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from slate.config import TrainConfig
from slate.data.datasets import Dataset
from slate.data.partition import parties_for_positives
from slate.data.parts import hold_out
from slate.errors import ConfigError, TrainingDiverged
from slate.training.configuration import ResolvedConfig, resolve_and_check

__all__ = [
    "AUTO",
    "CANDIDATES",
    "CHOICE_FRACTION",
    "FALLBACK_LR",
    "CandidateRunner",
    "LrChoice",
    "auto_lr",
    "choice_iterations",
    "choose_lr",
    "pick",
    "trial_config",
]

AUTO = "auto"
CANDIDATES: tuple[float, ...] = (0.003, 0.01, 0.03, 0.1, 0.3)
CHOICE_FRACTION = 0.2  # of the training rows, held out for the choice without validation rows
CHOICE_ITERATIONS = 500  # each candidate's iterations K (at most the run's T)
TOLERANCE = 0.01  # AP points: candidates this close to the best count as equally good
FALLBACK_LR = 0.01  # the paper's step size, where no rows can be scored (per-party files)


@dataclass
class LrChoice:
    """What ``--lr auto`` chose and why (``summary.json``'s ``lr_choice``)."""

    lr: float
    aps: dict[float, float]  # candidate -> held-out AP (NaN: the run diverged)
    iterations: int  # K, each candidate's iterations
    rows: str  # which rows scored the candidates
    seconds: float
    nodes: int  # the parties of the candidates' runs

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": f"largest candidate within {TOLERANCE} AP of the best, each trained "
                    f"{self.iterations} iterations",
            "lr": self.lr, "candidates": {f"{k:g}": _finite_or_none(v) for k, v in
                                          self.aps.items()},
            "iterations": self.iterations, "rows": self.rows, "nodes": self.nodes,
            "seconds": round(self.seconds, 3),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> LrChoice:
        aps = {float(k): (math.nan if v is None else float(v))
               for k, v in record["candidates"].items()}  # fmt: skip
        return cls(float(record["lr"]), aps, int(record["iterations"]), str(record["rows"]),
                   float(record["seconds"]), int(record["nodes"]))  # fmt: skip

    def line(self) -> str:
        """The console line: the choice, the candidates' APs, the rows and the cost."""
        scores = ", ".join(f"{k:g}: {_ap_text(v)}" for k, v in self.aps.items())
        return (
            f"--lr auto: lr {self.lr:g} (held-out AP after {self.iterations} iterations on "
            f"{self.rows}: {scores}); the choice took {self.seconds:.1f} s"
        )


def _finite_or_none(value: float) -> float | None:
    return None if not math.isfinite(value) else round(value, 6)


def _ap_text(value: float) -> str:
    return "diverged" if not math.isfinite(value) else f"{value:.3f}"


def pick(aps: Mapping[float, float], tolerance: float = TOLERANCE) -> float:
    """The largest step size whose AP is within ``tolerance`` of the best finite AP.

    ``aps`` maps each candidate step size to its held-out AP; NaN marks a diverged run and is
    never picked. Raises ``ValueError`` when every candidate diverged.
    """
    finite = {lr: ap for lr, ap in aps.items() if math.isfinite(ap)}
    if not finite:
        raise ValueError("every candidate step size diverged")
    best = max(finite.values())
    return max(lr for lr, ap in finite.items() if ap >= best - tolerance)


def choice_iterations(iterations: int) -> int:
    """:math:`K = \\min(500, T)`: each candidate's iterations."""
    return min(iterations, CHOICE_ITERATIONS)


def choice_rows(data: Dataset, seed: int) -> tuple[Dataset, str]:
    """The candidates' data: the training rows and, to score them, the validation rows where
    ``data`` holds them (its test rows set aside), else a seeded stratified
    :data:`CHOICE_FRACTION` of the training rows. The test rows are dropped either way."""
    if data.final_test is not None:  # --validation-fraction: x_test holds the validation rows
        return dataclasses.replace(data, final_test=None, parts=None), "the validation rows"
    kept, held = hold_out(data.y_train, CHOICE_FRACTION, seed, "the training set",
                          "--lr auto")  # fmt: skip
    rows = f"a seeded stratified {CHOICE_FRACTION:.0%} of the training rows (seed {seed})"
    chosen = Dataset(
        data.name, data.x_train[kept], data.y_train[kept], data.x_train[held],
        data.y_train[held], rows, held_out="validation",
    )  # fmt: skip
    return chosen, rows


class CandidateRunner(Protocol):
    """Runs the candidates: each step size of ``lrs`` trains ``trial`` (:func:`trial_config`)
    on ``rows`` on the simulator with that step size; returns each one's held-out AP (the
    averaged model's AP on ``rows``' held-out rows), NaN for a run that diverged."""

    def __call__(
        self, trial: ResolvedConfig, rows: Dataset, lrs: tuple[float, ...]
    ) -> dict[float, float]: ...


def trial_config(flags: TrainConfig, nodes: int, iterations: int) -> ResolvedConfig:
    """The candidates' runs: the run's own ``flags`` (model, algorithm, batch, margin, seed, as
    this process holds them) for ``iterations`` on ``nodes`` parties, evaluated at the start and
    the end only, with no checkpoints, outputs, drops, party APs, early stopping or
    compilation. A configuration of its own, resolved and checked as every one is; its ``lr``
    is each candidate's, given by the runner."""
    return resolve_and_check(
        dataclasses.replace(
            flags, iterations=iterations, nodes=nodes, eval_every=iterations,
            checkpoint_every=iterations, party_ap=False, early_stopping=None, out=None,
            drop_party=(), compile="off",
        )
    )  # fmt: skip


def choose_lr(
    settings: ResolvedConfig,
    data: Dataset,
    runner: CandidateRunner,
    candidates: tuple[float, ...] = CANDIDATES,
    *,
    nodes: int | None = None,
    flags: TrainConfig | None = None,
) -> LrChoice:
    """Score each candidate step size by a short simulator run (module docstring) and pick.

    ``nodes`` is the run's N (default: the flags'); ``flags`` the run's flags as this process
    holds them (default: the resolved ones). ``runner`` runs the candidates
    (:func:`slate.training.loop.run_candidates`).
    """
    started = time.perf_counter()
    flags = flags or settings.flags
    rows, described = choice_rows(data, flags.split_seed)
    positives = int(rows.y_train.sum())
    nodes = min(flags.nodes if nodes is None else nodes,
                parties_for_positives(positives, flags.positives))  # fmt: skip
    k = choice_iterations(flags.iterations)
    aps = runner(trial_config(flags, nodes, k), rows, tuple(candidates))
    try:
        chosen = pick(aps)
    except ValueError:
        raise TrainingDiverged(
            "--lr auto: every candidate step size "
            f"({', '.join(f'{c:g}' for c in candidates)}) diverged on the training rows; give "
            "--lr, smaller than the smallest of them."
        ) from None
    return LrChoice(chosen, aps, k, described, time.perf_counter() - started, nodes)


def auto_lr(
    settings: ResolvedConfig,
    nodes: int,
    data: Dataset | None,
    runner: CandidateRunner | None,
    log: Callable[[str], None],
    flags: TrainConfig | None = None,
) -> tuple[float, LrChoice | None]:
    """``--lr auto``'s step size for a run of ``nodes`` parties, scored on the whole table's
    rows ``data`` (read by the plan, :func:`slate.training.plan.whole_rows`), and its record.

    Per-party files cannot be scored here (module docstring): an explicit ``--lr auto`` is a
    :class:`ConfigError`, the default falls back to :data:`FALLBACK_LR` with a note. So does
    the default under ``--dp-epsilon``, whose candidates' runs would be choices made on the
    private rows that the accountant does not count.
    """
    if settings.privacy is not None:  # an explicit --lr auto was refused (training.checks)
        log(f"note: --dp-epsilon: lr {FALLBACK_LR} (the default --lr auto would choose it from "
            "runs on the private rows, which the accountant does not count; give --lr to "
            "choose)")  # fmt: skip
        return FALLBACK_LR, None
    if settings.data.per_party:
        if settings.given.lr == AUTO:
            raise ConfigError(
                "--lr auto scores step sizes on rows of the whole table, which sites with their "
                "own files (--party-files, {rank} paths, --rank) do not hold: give --lr (e.g. "
                f"--lr {FALLBACK_LR}), or choose it with 'slate tune' on one site's rows."
            )
        log(f"note: per-party files: lr {FALLBACK_LR} (the default --lr auto needs the whole "
            "table; give --lr to choose)")  # fmt: skip
        return FALLBACK_LR, None
    if runner is None or data is None:
        raise ConfigError(
            "--lr auto is chosen by short runs of candidate step sizes, which "
            "slate.training.loop.train makes before it builds the run: give --lr a number to "
            "build a run directly."
        )
    choice = choose_lr(settings, data, runner, nodes=nodes, flags=flags)
    log(choice.line())
    return choice.lr, choice
