r"""SLATE, Algorithm 1 of the paper.

Every party draws ``b`` positives and ``m`` samples, forms the biased stochastic gradient of the
AP surrogate (eq. 6, line 7), optionally tracks the network-average gradient (line 8) and takes
a consensus step (line 9):

.. math::

    u_{n,t} &= \nabla \hat F_n(x_{n,t}; \mathcal{B}^+_{n,t}, \mathcal{B}_{n,t}) \\
    v_{n,t} &= \textstyle\sum_r w_{nr}\,(v_{r,t-1} + u_{r,t} - u_{r,t-1})
        \quad\text{(or } v_{n,t} = u_{n,t} \text{ without gradient tracking)} \\
    x_{n,t+1} &= \textstyle\sum_r w_{nr}\,(x_{r,t} - \eta\, v_{r,t})

with :math:`u_{n,-1} = v_{n,-1} = 0` (line 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from slate.algorithms.base import Algorithm, Mixer, validate_positive
from slate.algorithms.compute import Batch, Objective, PartyCompute
from slate.objectives.ap import masked_sigmoid_ap_objective, sigmoid_ap_objective

__all__ = ["SLATE", "SlateParams", "tracked_direction"]


def tracked_direction(
    state: dict[str, Tensor], u: Tensor, comm: Mixer, gradient_tracking: bool
) -> Tensor:
    """Alg. 1 line 8 (Alg. 2 line 11): ``v_t = mix(v_{t-1} + u_t - u_{t-1})``, or ``u_t`` if off."""
    if not gradient_tracking:
        return u
    v = comm.mix(state["v"] + u - state["u"])
    state["u"], state["v"] = u, v
    return v


@dataclass(frozen=True)
class SlateParams:
    """SLATE's own parameters: none beyond the shared step size, margin and gradient tracking
    (:class:`~slate.algorithms.base.AlgorithmConfig`). A new one is a field here, declared with
    :func:`slate.config.agreed` and its flag's ``help``."""


class SLATE(Algorithm):
    """Serverless biased stochastic gradient on the AP surrogate (Alg. 1)."""

    name = "slate"
    Params = SlateParams

    def __init__(self, config, params: SlateParams | None = None) -> None:
        super().__init__(config, params)
        validate_positive("--margin", config.margin)

    def objective(self) -> Objective:
        return sigmoid_ap_objective(self.config.margin)

    private_unit = "group"

    def masked_objective(self, with_context: bool) -> Objective:
        del with_context
        return masked_sigmoid_ap_objective(self.config.margin)

    def step(self, x: Tensor, batch: Batch, comm: Mixer, compute: PartyCompute):
        losses, u = compute(x, batch)  # line 7, eq. (6) by autograd
        v = tracked_direction(self.state, u, comm, self.config.gradient_tracking)  # line 8
        return comm.mix_step(x, v, self.config.lr), losses  # line 9
