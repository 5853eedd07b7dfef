"""The stop and join flags every party agrees on at the end of each chunk of a run
(docs/engines.md, "Stopping"): whether any party asks to stop (SIGINT, SIGTERM), and, at a
checkpoint boundary, whether any party's lookout saw a returning party ask to join.

They need no exchange of their own where something else carries them: the evaluation's sum at an
evaluation (:meth:`StopFlags.riders`), or the chunk's last gossip rounds when those reach every
party (:mod:`slate.communication.flag_flood`). Otherwise one small exchange
(:meth:`slate.engines.base.Engine.any_of`). Every party takes the same branch: each is decided
from public facts (the iteration, the schedule, the topology), never from a party's own state.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from slate.communication.flag_flood import flag_bits

__all__ = ["StopFlags"]

STOP, JOIN = 1, 2  # the flags' bits


class StopFlags:
    """One run's stop and join flags, and where they were last agreed without an exchange.
    ``run``: its :class:`slate.training.run.Run` (its engine, communicator, settings, iteration
    and ``stop_requested``)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        #: ``(iteration, bits)``: the flags summed in that iteration's evaluation
        self.evaluated: tuple[int, int] | None = None

    def own(self, t: int | None = None) -> list[bool]:
        """This process's flags for iteration ``t`` (default: now): a stop asked here, and, if
        ``t`` is a checkpoint boundary, whether its lookout saw a returning party ask to join."""
        run = self.run
        t = run.iteration if t is None else t
        boundary = t > 0 and t % run.settings.outputs.checkpoint_every == 0
        return [run.stop_requested, boundary and run.engine.joins_requested()]

    def riders(self) -> list[float]:
        """The flags as the evaluation's riders (summed with its counts: how many set each)."""
        return [float(flag) for flag in self.own()]

    def evaluated_sums(self, sums: Tensor) -> None:
        """The summed riders of :meth:`riders` in this iteration's evaluation."""
        self.evaluated = (self.run.iteration, flag_bits([bool(v > 0) for v in sums]))

    def plan_chunk(self, start: int, end: int) -> None:
        """Let the last gossip rounds of the chunk ``[start, end)`` carry the flags its end
        agrees on (:meth:`slate.engines.base.Communicator.plan_flags`); the last chunk needs
        none."""
        run = self.run
        if end >= run.settings.algorithm.iterations:
            run.comm.forget_flags()
            return
        run.comm.plan_flags(start, end, lambda: flag_bits(self.own(end)))

    def agree(self, t: int) -> tuple[bool, bool]:
        """``(stopping, admitting)`` at iteration ``t``, the same on every party: carried by the
        chunk's gossip or by this iteration's evaluation, else one small exchange."""
        run = self.run
        agreed = run.comm.carried_flags(t)
        evaluated, self.evaluated = self.evaluated, None
        if agreed is None and evaluated is not None and evaluated[0] == t:
            agreed = evaluated[1]
        if agreed is None:
            stopping, admitting = run.engine.any_of(self.own(t))
            return stopping, admitting
        return bool(agreed & STOP), bool(agreed & JOIN)

    def forget(self) -> None:
        """After a failed exchange the survivors agree on the flags by an exchange."""
        self.run.comm.forget_flags()
        self.evaluated = None
