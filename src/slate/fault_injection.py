"""Fault injection for tests of the distributed engine: a party kills itself at a chosen moment.

``SLATE_KILL_AT=RANK@ITER[:MOMENT][,...]`` makes distributed party ``RANK`` send itself SIGKILL
at iteration ``ITER``, at one of these moments:

* ``step`` (the default): just before step ``ITER``;
* ``evaluation``: just before the evaluation at ``ITER`` (``0``: before the first snapshot's
  step, during the run's first collective after set-up);
* ``checkpoint``: just before writing the checkpoint of ``ITER``.

The simulator ignores it (``--drop-party`` injects its losses).
"""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_ENV", "MOMENTS", "FaultPlan"]

FAULT_ENV = "SLATE_KILL_AT"
MOMENTS = ("step", "evaluation", "checkpoint")


class FaultPlan:
    """The moments at which this process's party dies, from :data:`FAULT_ENV`."""

    def __init__(self, rank: int | None) -> None:
        self.due_at: dict[str, int] = {}
        if rank is None:
            return
        for item in os.environ.get(FAULT_ENV, "").split(","):
            who, _, when = item.strip().partition("@")
            at, _, moment = when.partition(":")
            moment = moment or "step"
            if who.isdigit() and at.isdigit() and int(who) == rank and moment in MOMENTS:
                self.due_at[moment] = int(at)

    def check(self, moment: str, iteration: int) -> None:
        """Die now if this is the planned moment."""
        if self.due_at.get(moment) == iteration:
            os.kill(os.getpid(), signal.SIGKILL)
