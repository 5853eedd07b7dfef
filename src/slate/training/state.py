"""A run's training state: what a party needs to continue from one point, bit for bit.

:class:`TrainingState` serves both the rollback snapshots a recovering party keeps
(:class:`slate.training.recovery.Snapshots`: references to the run's tensors, which the steps
replace and never write in place) and the checkpoints (:meth:`TrainingState.to_checkpoint`:
copies on the CPU, written by :mod:`slate.training.checkpoint`).
:meth:`slate.training.run.Run.training_state` takes one and :meth:`slate.training.run.Run.restore`
continues from one.

The communicator's state (compressed gossip's public copies, :mod:`slate.communication.choco`)
is not in it: a checkpoint stores it beside, and every rollback is followed by a change of the
party set, which gives every survivor a new communicator whose public copies restart at zero,
the same on both sides of every edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = ["TrainingState"]


@dataclass(frozen=True)
class TrainingState:
    """Everything that changes as a run trains, at the start of a step.

    Attributes:
        iteration: the steps taken.
        x: the local parties' parameters (and algorithm variables kept inside them).
        algorithm_state: the algorithm's other variables (momentum, tracker).
        buffers: the model's BatchNorm buffers, per party.
        sampler: the sampler streams' state at the start of the current chunk.
        sampler_used: the steps drawn from them since.
        loss_sum: each local party's summed training loss since the last evaluation.
        loss_steps: the steps in that sum.
        traffic: the communicator's ``(bytes, messages, rounds)``.
        history_length: the evaluation rows made by then (None: not recorded; a checkpoint
            keeps the rows themselves).
    """

    iteration: int
    x: Tensor
    algorithm_state: dict[str, Tensor]
    buffers: dict[str, Tensor]
    sampler: dict[str, Any]
    sampler_used: int
    loss_sum: Tensor
    loss_steps: int
    traffic: tuple[float, ...] | list[float]
    history_length: int | None = None

    def to_checkpoint(self) -> dict[str, Any]:
        """The checkpoint's entries of this state, copied to the CPU."""
        return {
            "iteration": self.iteration,
            "x": self.x.cpu(),
            "algorithm_state": {k: v.cpu() for k, v in self.algorithm_state.items()},
            "buffers": {k: v.cpu() for k, v in self.buffers.items()},
            "sampler": self.sampler,
            "sampler_used": self.sampler_used,
            "loss_sum": self.loss_sum.cpu(),
            "loss_steps": self.loss_steps,
            "traffic": list(self.traffic),
        }

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> TrainingState:
        """The state a checkpoint recorded (on the CPU, as read)."""
        return cls(
            iteration=state["iteration"],
            x=state["x"],
            algorithm_state=dict(state["algorithm_state"]),
            buffers=dict(state["buffers"]),
            sampler=state["sampler"],
            sampler_used=state["sampler_used"],
            loss_sum=state["loss_sum"],
            loss_steps=state["loss_steps"],
            traffic=state["traffic"],
        )
