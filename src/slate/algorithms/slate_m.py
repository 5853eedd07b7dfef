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

import torch
from torch import Tensor

from slate.algorithms.base import Algorithm, AlgorithmConfig, Mixer, validate_positive
from slate.algorithms.compute import Batch, Objective, PartyCompute
from slate.algorithms.slate import tracked_direction
from slate.errors import ConfigError
from slate.objectives.ap import sigmoid_ap_objective

__all__ = ["MOMENTUM_ESTIMATORS", "SLATEM"]

MOMENTUM_ESTIMATORS = ("storm", "ema")


class SLATEM(Algorithm):
    """SLATE with the momentum-based variance-reduced gradient estimator (Alg. 2)."""

    name = "slate-m"

    def __init__(self, config: AlgorithmConfig) -> None:
        super().__init__(config)
        validate_positive("--margin", config.margin)
        if not 0 < config.alpha <= 1:
            raise ConfigError(f"--alpha must lie in (0, 1], got {config.alpha}.")
        if config.momentum not in MOMENTUM_ESTIMATORS:
            raise ConfigError(
                f"--momentum must be one of {', '.join(MOMENTUM_ESTIMATORS)}, "
                f"got {config.momentum!r}."
            )
        if config.initial_batch is not None and config.initial_batch < 1:
            raise ConfigError(f"--initial-batch must be at least 1, got {config.initial_batch}.")

    def objective(self) -> Objective:
        return sigmoid_ap_objective(self.config.margin)

    def initial_batches(self, positives: int) -> int:
        if self.config.momentum == "ema":
            return 0
        wanted = self.config.initial_batch or 5 * positives
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
        alpha = self.config.alpha
        if self.config.momentum == "ema":
            losses, g = compute(x, batch)
            u = alpha * g + (1 - alpha) * self.state["u"]
            return self._consensus(x, u, comm), losses
        n = x.shape[0]
        # Line 10: both gradients on the same samples xi_t, in one batched call.
        losses, grads = compute(torch.cat([x, self.state["x_prev"]]), batch.repeat(2))
        g_now, g_prev = grads[:n], grads[n:]
        u = g_now + (1 - alpha) * (self.state["u"] - g_prev)
        return self._consensus(x, u, comm), losses[:n]
