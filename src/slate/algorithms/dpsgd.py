r"""D-PSGD (Lian et al., 2017) with binary cross-entropy: the paper's first baseline.

.. math::

    x_{n,t+1} = \textstyle\sum_r w_{nr}\,\big(x_{r,t} - \eta\,\nabla \mathrm{BCE}_r(x_{r,t};
    \mathcal{B}_{r,t})\big)

One local SGD step, then one exchange with the neighbours, as in the authors' scripts. With
gradient tracking on, the direction is tracked exactly as in SLATE (line 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from slate.algorithms.base import Algorithm, Mixer
from slate.algorithms.compute import Batch, Objective, PartyCompute
from slate.algorithms.slate import tracked_direction
from slate.objectives.bce import bce_objective

__all__ = ["DPSGD", "DPSGDParams"]


@dataclass(frozen=True)
class DPSGDParams:
    """D-PSGD's own parameters: none beyond the shared step size and gradient tracking."""


class DPSGD(Algorithm):
    """Decentralised parallel SGD on the cross-entropy loss."""

    name = "dpsgd"
    Params = DPSGDParams

    def objective(self) -> Objective:
        return bce_objective

    def step(self, x: Tensor, batch: Batch, comm: Mixer, compute: PartyCompute):
        losses, grad = compute(x, batch)
        direction = tracked_direction(self.state, grad, comm, self.config.gradient_tracking)
        return comm.mix_step(x, direction, self.config.lr), losses
