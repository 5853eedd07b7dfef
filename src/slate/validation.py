"""``--validation-fraction`` and ``--early-stopping``: choose the model without looking at the test.

With ``--validation-fraction F`` the run's evaluations (``history.csv``, the progress bar) score a
seeded stratified share ``F`` of the training rows, held out before anything was fitted
(:mod:`slate.data.sources`); the test rows are read and scored once, at the end. With
``--early-stopping P`` the run keeps the averaged model of its best validation AP and stops after
``P`` evaluations in a row without a better one; that kept model is the one tested and saved.

Every process takes the same decisions: the main process compares the APs (the pooled evaluation
computes them there only) and the others learn the outcome through one collective ``any``.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

__all__ = ["BestModel", "validation_summary"]


class BestModel:
    """The parties' parameters at the best validation AP so far, and the patience left."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.ap = -math.inf  # meaningful on the main process
        self.iteration = -1
        self.waited = 0  # evaluations since the best one
        self.x: Tensor | None = None
        self.buffers: dict[str, Tensor] = {}

    def consider(self, run: Any, ap: float) -> bool:
        """Keep the run's model if ``ap`` beats the best so far; True once ``patience``
        evaluations in a row have not (collective: every process calls it at the same point)."""
        better = run.engine.any(bool(run.engine.is_main and ap > self.ap))
        if better:
            self.ap, self.iteration, self.waited = ap, run.iteration, 0
            self.x = run.x.clone()
            self.buffers = {k: v.clone() for k, v in run.compute.buffers.items()}
        else:
            self.waited += 1
        return self.waited >= self.patience

    def restore(self, run: Any) -> None:
        """Put the best model back into the run (its parameters and BatchNorm buffers)."""
        if self.x is not None:
            run.x = self.x
            run.compute.buffers = dict(self.buffers)
            run.evaluator.forget_scores()

    def state_dict(self) -> dict[str, Any]:
        return {
            "patience": self.patience, "ap": self.ap, "iteration": self.iteration,
            "waited": self.waited, "x": None if self.x is None else self.x.cpu(),
            "buffers": {k: v.cpu() for k, v in self.buffers.items()},
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any], device: Any) -> None:
        self.ap, self.iteration, self.waited = state["ap"], state["iteration"], state["waited"]
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
        "n_validation": n_val,
    }
