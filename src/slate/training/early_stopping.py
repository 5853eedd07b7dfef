"""``--validation-fraction`` and ``--early-stopping``: choose the model without looking at the test.

With ``--validation-fraction F`` the run's evaluations (``history.csv``, the progress bar) score a
seeded stratified share ``F`` of the training rows, held out before anything was fitted
(:mod:`slate.data.sources`); the test rows are read and scored once, at the end. With
``--early-stopping P`` the run keeps the averaged model of its best validation AP and stops after
``P`` evaluations in a row without a better one; that kept model is the one tested and saved.

Every process takes the same decisions: the main process compares the APs (the pooled evaluation
computes them there only) and the others learn the outcome through one collective ``any``.

With fewer than :data:`FEW_VALIDATION_POSITIVES` validation positives one positive moves the AP
by up to :math:`1/P`, and the best single evaluation is mostly luck (an abalone run with 5 kept
the untrained model of iteration 0). Then the run compares the mean validation AP of the last
:data:`SMOOTHING_WINDOW` evaluations instead, never keeps the model of iteration 0, and says so.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

__all__ = ["FEW_VALIDATION_POSITIVES", "SMOOTHING_WINDOW", "BestModel", "validation_summary"]

#: Below this many validation positives, early stopping compares smoothed APs (module docstring).
FEW_VALIDATION_POSITIVES = 30
#: Evaluations whose mean validation AP is compared when the positives are few.
SMOOTHING_WINDOW = 3


class BestModel:
    """The parties' parameters at the best validation AP so far, and the patience left.

    ``positives``: the validation positives; below :data:`FEW_VALIDATION_POSITIVES` the score
    compared is the mean AP of the last :data:`SMOOTHING_WINDOW` evaluations, and iteration 0
    is never kept (``smoothed``).
    """

    def __init__(self, patience: int, positives: int | None = None) -> None:
        self.patience = patience
        self.smoothed = positives is not None and positives < FEW_VALIDATION_POSITIVES
        self.ap = -math.inf  # the best score so far; meaningful on the main process
        self.iteration = -1
        self.waited = 0  # evaluations since the best one
        self.recent: list[float] = []  # the last validation APs (smoothed only)
        self.x: Tensor | None = None
        self.buffers: dict[str, Tensor] = {}

    def score(self, ap: float, iteration: int) -> float:
        """What is compared for the evaluation of ``iteration`` with validation AP ``ap``:
        ``ap`` itself, or (``smoothed``) the mean of the last APs, minus infinity at 0."""
        if not self.smoothed:
            return ap
        self.recent = [*self.recent, ap][-SMOOTHING_WINDOW:]
        return -math.inf if iteration == 0 else sum(self.recent) / len(self.recent)

    def consider(self, run: Any, ap: float) -> bool:
        """Keep the run's model if its score beats the best so far; True once ``patience``
        evaluations in a row have not (collective: every process calls it at the same point)."""
        score = self.score(ap, run.iteration)
        better = run.engine.any(bool(run.engine.is_main and score > self.ap))
        if better:
            self.ap, self.iteration, self.waited = score, run.iteration, 0
            self.x = run.x.clone()
            self.buffers = {k: v.clone() for k, v in run.compute.buffers.items()}
        else:
            self.waited += 1
        return self.waited >= self.patience

    def few_positives_note(self, positives: int) -> str | None:
        """The console line that says how the model is chosen on few positives; None when
        they are enough."""
        if not self.smoothed:
            return None
        return (
            f"warning: early stopping on {positives} validation positive"
            f"{'s' if positives != 1 else ''} (fewer than {FEW_VALIDATION_POSITIVES}): one "
            f"positive moves the validation AP by up to {1 / max(positives, 1):.0%}, so the kept "
            f"model is chosen on the mean validation AP of the last {SMOOTHING_WINDOW} "
            "evaluations, never the untrained model of iteration 0. A larger "
            "--validation-fraction gives a firmer choice."
        )

    def restore(self, run: Any) -> None:
        """Put the best model back into the run (its parameters and BatchNorm buffers)."""
        if self.x is not None:
            run.x = self.x
            run.compute.buffers = dict(self.buffers)
            run.evaluator.forget_scores()

    def state_dict(self) -> dict[str, Any]:
        return {
            "patience": self.patience, "ap": self.ap, "iteration": self.iteration,
            "waited": self.waited, "recent": list(self.recent),
            "x": None if self.x is None else self.x.cpu(),
            "buffers": {k: v.cpu() for k, v in self.buffers.items()},
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any], device: Any) -> None:
        self.ap, self.iteration, self.waited = state["ap"], state["iteration"], state["waited"]
        self.recent = list(state.get("recent", []))  # (checkpoints before it had none)
        self.x = None if state["x"] is None else state["x"].to(device)
        self.buffers = {k: v.to(device) for k, v in state["buffers"].items()}


def validation_summary(
    history: list[dict[str, float]], best: BestModel | None, stopped_at: int | None, n_val: int
) -> dict[str, Any]:
    """``summary.json``'s validation keys: the validation AP of the model that was tested, the
    iteration it comes from, where the run stopped early (None: it did not), and the rows."""
    if best is not None and best.iteration >= 0:
        row = next(r for r in history if r["iteration"] == best.iteration)
    else:
        row = history[-1]
    return {
        "validation_ap": row["test_ap"],
        "validation_auroc": row["test_auroc"],
        "model_iteration": int(row["iteration"]),
        "stopped_early_at": stopped_at,
        "early_stopping_smoothed": best.smoothed if best is not None else None,
        "n_validation": n_val,
    }
