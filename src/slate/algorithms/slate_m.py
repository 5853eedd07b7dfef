r"""SLATE-M, Algorithm 2 of the paper: SLATE with a momentum-based variance-reduced estimator.

Initialisation (lines 3-5) uses an initial batch of ``B`` positives, drawn as ``B / b`` ordinary
mini-batches (``b`` positives and ``m - b`` negatives each) whose gradients are averaged:

.. math::

    u_{n,0} = \frac{1}{B}\sum_{i=1}^{B} \nabla\hat F_n(x_{n,0}; \xi^i_{n,0}, \mathcal{B}_{n,0}),
    \quad v_{n,0} = \textstyle\sum_r w_{nr} u_{r,0},
    \quad x_{n,1} = \textstyle\sum_r w_{nr} (x_{r,0} - \eta v_{r,0}).

Then, for ``t >= 1`` (line 10, the STORM estimator of Cutkosky & Orabona, 2019), with the
gradient at the previous iterate evaluated on the *same* samples :math:`\xi_t`:

.. math::

    u_{n,t} = \nabla\hat F_n(x_{n,t}; \xi_{n,t})
      + (1-\alpha)\big(u_{n,t-1} - \nabla\hat F_n(x_{n,t-1}; \xi_{n,t})\big),

followed by gradient tracking (line 11, optional) and the consensus step (line 12) as in SLATE.

``momentum="ema"`` reproduces the authors' scripts instead: :math:`u_t = \alpha g_t +
(1-\alpha) u_{t-1}` with :math:`u_{-1} = 0`, no initial batch and one gradient per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from slate.algorithms.base import Algorithm, AlgorithmConfig, Mixer, validate_positive
from slate.algorithms.compute import Batch, Objective, PartyCompute
from slate.algorithms.slate import tracked_direction
from slate.config import agreed
from slate.errors import ConfigError
from slate.objectives.ap import masked_sigmoid_ap_objective, sigmoid_ap_objective

__all__ = ["MOMENTUM_ESTIMATORS", "SLATEM", "SlateMParams"]

MOMENTUM_ESTIMATORS = ("storm", "ema")


@dataclass(frozen=True)
class SlateMParams:
    """SLATE-M's own parameters (its flags).

    Attributes:
        alpha: the momentum coefficient (STORM's, or the EMA's weight of the new gradient).
        initial_batch: the initial batch of B positives (default ``5 b``).
        momentum: the estimator, ``storm`` (the paper's) or ``ema`` (the authors' scripts).
    """

    alpha: float = agreed(0.1, help="SLATE-M momentum coefficient alpha")
    initial_batch: int | None = agreed(
        None, help="SLATE-M initial batch of B positives (default 5 b)"
    )
    momentum: str = agreed(
        "storm",
        choices=MOMENTUM_ESTIMATORS,
        help="SLATE-M estimator: storm (the paper's, default) or ema (the authors' scripts)",
    )


class SLATEM(Algorithm):
    """SLATE with the momentum-based variance-reduced gradient estimator (Alg. 2)."""

    name = "slate-m"
    Params = SlateMParams

    def __init__(self, config: AlgorithmConfig, params: SlateMParams | None = None) -> None:
        super().__init__(config, params)
        validate_positive("--margin", config.margin)
        params = self.params
        if not 0 < params.alpha <= 1:
            raise ConfigError(f"--alpha must lie in (0, 1], got {params.alpha}.")
        if params.momentum not in MOMENTUM_ESTIMATORS:
            raise ConfigError(
                f"--momentum must be one of {', '.join(MOMENTUM_ESTIMATORS)}, "
                f"got {params.momentum!r}."
            )
        if params.initial_batch is not None and params.initial_batch < 1:
            raise ConfigError(f"--initial-batch must be at least 1, got {params.initial_batch}.")

    def objective(self) -> Objective:
        return sigmoid_ap_objective(self.config.margin)

    private_unit = "group"

    def masked_objective(self, with_context: bool) -> Objective:
        del with_context
        return masked_sigmoid_ap_objective(self.config.margin)

    def initial_batches(self, positives: int) -> int:
        if self.params.momentum == "ema":
            return 0
        wanted = self.params.initial_batch or 5 * positives
        return max(1, math.ceil(wanted / positives))

    def init_state(self, x: Tensor) -> None:
        zeros = x.new_zeros(x.shape)
        self.state = {"u": zeros, "x_prev": x.clone()}
        if self.config.gradient_tracking:
            self.state["v"] = zeros.clone()

    def _consensus(self, x: Tensor, u: Tensor, comm: Mixer) -> Tensor:
        """Lines 11-12: track (if on) and take the consensus step; updates the stored u and v."""
        v = tracked_direction(self.state, u, comm, self.config.gradient_tracking)
        self.state["u"], self.state["x_prev"] = u, x
        return comm.mix_step(x, v, self.config.lr)

    def first_step(self, x: Tensor, batch: Batch, comm: Mixer, compute: PartyCompute):
        blocks = batch.labels.shape[0] // x.shape[0]
        losses, grads = compute(x.repeat(blocks, 1), batch, once=True)  # line 3, one call
        u0 = grads.view(blocks, *x.shape).mean(dim=0)
        # Line 4 sets v_0 = mix(u_0): the tracking update from v_{-1} = u_{-1} = 0.
        return self._consensus(x, u0, comm), losses.view(blocks, -1).mean(dim=0)

    def step(self, x: Tensor, batch: Batch, comm: Mixer, compute: PartyCompute):
        alpha = self.params.alpha
        if self.params.momentum == "ema":
            losses, g = compute(x, batch)
            u = alpha * g + (1 - alpha) * self.state["u"]
            return self._consensus(x, u, comm), losses
        n = x.shape[0]
        # Line 10: both gradients on the same samples xi_t, in one batched call.
        losses, grads = compute(torch.cat([x, self.state["x_prev"]]), batch.repeat(2))
        g_now, g_prev = grads[:n], grads[n:]
        u = g_now + (1 - alpha) * (self.state["u"] - g_prev)
        return self._consensus(x, u, comm), losses[:n]
