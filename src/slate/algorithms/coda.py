r"""CODA, the paper's AUROC baseline, run serverless: local SGDA then consensus mixing.

Each party minimises over the model ``w`` and scalars ``a, b`` and maximises over a dual
``alpha`` the AUC-margin square loss (margin 1) on the raw model output ``h``:

.. math::

    L = (1-p)\,\overline{(h-a)^2\,\mathbf 1[y=1]} + p\,\overline{(h-b)^2\,\mathbf 1[y=0]}
      + 2\alpha\big(p(1-p)\,c + \overline{p\,h\,\mathbf 1[y=0] - (1-p)\,h\,\mathbf 1[y=1]}\big)
      - p(1-p)\,\alpha^2,

where the bars are batch means, ``c = 1`` is the margin and ``p`` the party's positive rate,
measured from its own training data. Every step: descent on ``(w, a, b)`` with ``lr``, ascent on
``alpha`` with ``lr_dual`` (clamped to ``[-10, 10]``), then consensus mixing of all four.
"""

from __future__ import annotations

import torch
from torch import Tensor

from slate.algorithms.base import Algorithm, AlgorithmConfig, validate_positive
from slate.algorithms.slate import tracked_direction
from slate.engines.base import Communicator
from slate.engines.compute import Batch, Objective, PartyCompute

__all__ = ["CODA", "auc_margin_loss"]

DUAL_BOUND = 10.0
AUC_MARGIN = 1.0


def auc_margin_loss(logits: Tensor, labels: Tensor, extra: Tensor, context: Tensor) -> Tensor:
    """The AUC-margin square loss above; ``extra = (a, b, alpha)``, ``context = (p,)``."""
    a, b, alpha = extra[0], extra[1], extra[2]
    p = context[0]
    pos = labels.to(logits.dtype)
    neg = 1.0 - pos
    return (
        (1 - p) * ((logits - a) ** 2 * pos).mean()
        + p * ((logits - b) ** 2 * neg).mean()
        + 2
        * alpha
        * (p * (1 - p) * AUC_MARGIN + (p * logits * neg - (1 - p) * logits * pos).mean())
        - p * (1 - p) * alpha**2
    )


class CODA(Algorithm):
    """Serverless CODA: stochastic gradient descent-ascent on the AUC-margin loss, then mixing."""

    name = "coda"
    n_extra = 3  # a, b, alpha

    def __init__(self, config: AlgorithmConfig) -> None:
        super().__init__(config)
        validate_positive("--lr-dual", config.lr_dual)

    def objective(self) -> Objective:
        return auc_margin_loss

    def context(self, labels_per_party: list[Tensor]) -> Tensor:
        """Each party's positive rate p, from its own training labels."""
        return torch.stack([labels.double().mean() for labels in labels_per_party])[:, None]

    def step(self, x: Tensor, batch: Batch, comm: Communicator, compute: PartyCompute):
        losses, grads = compute(x, batch)
        # Gradient tracking (off in the paper's experiments) tracks the whole SGDA direction.
        grads = tracked_direction(self.state, grads, comm, self.config.gradient_tracking)
        step = self.config.lr * grads
        step[:, -1] = -self.config.lr_dual * grads[:, -1]  # ascent on alpha
        x = x - step
        x[:, -1].clamp_(-DUAL_BOUND, DUAL_BOUND)
        return comm.mix(x), losses
