r"""The communicator interface every algorithm is written against.

An algorithm sees the parameters of the parties it runs as a tensor ``x`` of shape ``(P, d)``:
``P = N`` in the simulator (all parties stacked), ``P = 1`` for one process of the distributed
engine. It communicates only through

* ``mix(x)``: apply the gossip matrix of the current round, :math:`x_n \leftarrow \sum_r w_{nr} x_r`
  (the :math:`\mathbf{W}` of Alg. 1 lines 8-9);
* ``average(x)``: apply :math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top`, the exact average.

and never knows which engine carries these out. ``mix_step(x, v, lr)`` is ``mix(x - lr * v)``,
which an engine may carry out in one fused pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

__all__ = ["Communicator"]


class Communicator(ABC):
    """Carries out the mixing steps of one engine and counts what it would send."""

    def __init__(self) -> None:
        self.iteration = 0
        self.bytes_sent = 0.0
        self.messages_sent = 0.0

    def set_iteration(self, t: int) -> None:
        """Tell the communicator which round comes next (time-varying topologies use it)."""
        self.iteration = t

    @abstractmethod
    def mix(self, x: Tensor) -> Tensor:
        """Return :math:`(\\underline{W}_t \\otimes I_d)\\, x` for this round's gossip matrix."""

    @abstractmethod
    def average(self, x: Tensor) -> Tensor:
        """Return :math:`\\mathbf{J} x`: every party receives the exact mean of all parties."""

    def mix_step(self, x: Tensor, direction: Tensor, lr: float) -> Tensor:
        """Return ``mix(x - lr * direction)``: a local step, then one gossip round (Alg. 1 line 9).

        Engines may fuse the two passes (the simulator does, block by block in cache); the
        result is the same up to float rounding.
        """
        return self.mix(torch.add(x, direction, alpha=-lr))

    def traffic(self) -> dict[str, float]:
        """Per-party totals of what was (or would have been) sent: bytes and messages."""
        return {
            "comm_bytes_per_party": self.bytes_sent,
            "messages_per_party": self.messages_sent,
        }
