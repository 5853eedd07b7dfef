r"""CODA, the paper's AUROC baseline, run serverless: local SGDA then consensus mixing.

Each party minimises over the model ``w`` and scalars ``a, b`` and maximises over a dual
``alpha`` the square-loss AUC min-max objective of Ying et al. (2016), on which CODA (Guo et al.,
2020) is built, applied to the raw model output ``h`` (no sigmoid):

.. math::

    L = (1-p)\,\overline{(h-a)^2\,\mathbf 1[y=1]} + p\,\overline{(h-b)^2\,\mathbf 1[y=0]}
      + 2(1+\alpha)\,\overline{p\,h\,\mathbf 1[y=0] - (1-p)\,h\,\mathbf 1[y=1]}
      - p(1-p)\,\alpha^2,

where the bars are batch means and ``p`` is the rate at which positives are *drawn*: ``b / m``
with slate's sampler, which puts ``b`` positives in every batch of ``m``. Ying et al.'s identity
:math:`L = p(1-p)\,(\mathbb E[(1 - h^+ + h^-)^2] - 1)` at the optimal ``a, b, alpha`` holds only
when ``p`` is the rate of the distribution the means are taken over; with the party's training
rate instead (0.03 on w7a against 0.1 in the batches), a common shift of every score changes the
coupling term, and a perfect, a constant and a reversed scorer tie at the saddle.

The ``1 +`` comes from expanding the square loss ``(1 - (h(x^+) - h(x^-)))^2`` with margin 1:
it pushes positives up and negatives down even while ``alpha`` is still 0.

``objective="margin"`` selects LibAUC's later AUC-margin loss instead, whose coupling term is
:math:`2\alpha\big(p(1-p)\,c + \overline{p\,h\,\mathbf 1[y=0] - (1-p)\,h\,\mathbf 1[y=1]}\big)`
with margin ``c = 1``. It separates nothing until ``alpha`` grows, which the paper's small dual
step size does not allow; it is kept as an option, not the baseline.

Every step: descent on ``(w, a, b)`` with ``lr``, ascent on ``alpha`` with ``lr_dual`` (clamped
to ``[-10, 10]``), then consensus mixing of all four.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from slate.algorithms.base import Algorithm, AlgorithmConfig, Mixer, validate_positive
from slate.algorithms.compute import Batch, Objective, PartyCompute
from slate.algorithms.slate import tracked_direction
from slate.config import agreed
from slate.errors import ConfigError

__all__ = ["CODA", "CODA_OBJECTIVES", "CodaParams", "auc_margin_loss", "auc_square_loss"]

DUAL_BOUND = 10.0
AUC_MARGIN = 1.0


def _class_terms(logits: Tensor, labels: Tensor, extra: Tensor, p: Tensor) -> tuple[Tensor, ...]:
    """The variance terms (shared by both objectives) and the mean class-coupling term."""
    a, b = extra[0], extra[1]
    pos = labels.to(logits.dtype)
    neg = 1.0 - pos
    variance = (1 - p) * ((logits - a) ** 2 * pos).mean() + p * ((logits - b) ** 2 * neg).mean()
    coupling = (p * logits * neg - (1 - p) * logits * pos).mean()
    return variance, coupling


def auc_square_loss(logits: Tensor, labels: Tensor, extra: Tensor, context: Tensor) -> Tensor:
    """The square-loss AUC min-max objective above (CODA's); ``extra = (a, b, alpha)``,
    ``context = (p,)``."""
    alpha, p = extra[2], context[0]
    variance, coupling = _class_terms(logits, labels, extra, p)
    return variance + 2 * (1 + alpha) * coupling - p * (1 - p) * alpha**2


def auc_margin_loss(logits: Tensor, labels: Tensor, extra: Tensor, context: Tensor) -> Tensor:
    """LibAUC's AUC-margin loss (margin 1): ``2 alpha (p (1-p) c + coupling)`` in place of
    ``2 (1 + alpha) coupling``."""
    alpha, p = extra[2], context[0]
    variance, coupling = _class_terms(logits, labels, extra, p)
    return variance + 2 * alpha * (p * (1 - p) * AUC_MARGIN + coupling) - p * (1 - p) * alpha**2


CODA_OBJECTIVES: dict[str, Objective] = {"square": auc_square_loss, "margin": auc_margin_loss}


@dataclass(frozen=True)
class CodaParams:
    """CODA's own parameters (its flags).

    Attributes:
        lr_dual: the step size of the ascent on the dual variable alpha.
        objective: the loss, ``square`` (the square-loss AUC objective of the paper's baseline)
            or ``margin`` (LibAUC's AUC-margin loss); its flag is ``--coda-objective``.
    """

    lr_dual: float = agreed(0.0001, help="CODA step size for the dual variable")
    objective: str = agreed(
        "square",
        flag="--coda-objective",
        choices=tuple(CODA_OBJECTIVES),
        help="CODA's loss: square (the square-loss AUC objective of the paper's baseline, "
        "default) or margin (LibAUC's AUC-margin loss, which needs alpha to grow)",
    )


class CODA(Algorithm):
    """Serverless CODA: stochastic gradient descent-ascent on an AUC min-max loss, then mixing."""

    name = "coda"
    n_extra = 3  # a, b, alpha
    Params = CodaParams

    def __init__(self, config: AlgorithmConfig, params: CodaParams | None = None) -> None:
        super().__init__(config, params)
        validate_positive("--lr-dual", self.params.lr_dual)
        if self.params.objective not in CODA_OBJECTIVES:
            raise ConfigError(
                f"--coda-objective must be one of {', '.join(CODA_OBJECTIVES)}, "
                f"got {self.params.objective!r}."
            )

    def objective(self) -> Objective:
        return CODA_OBJECTIVES[self.params.objective]

    def context(self, labels_per_party: list[Tensor]) -> Tensor:
        """Each party's ``p``: the sampler's positive rate ``b / m``, or, for uniform sampling
        (``sampled_positive_rate=None``), the party's own positive rate."""
        rate = self.config.sampled_positive_rate
        if rate is not None:
            return torch.full((len(labels_per_party), 1), float(rate), dtype=torch.float64)
        return torch.stack([labels.double().mean() for labels in labels_per_party])[:, None]

    def step(self, x: Tensor, batch: Batch, comm: Mixer, compute: PartyCompute):
        losses, grads = compute(x, batch)
        # Gradient tracking (off in the paper's experiments) tracks the whole SGDA direction.
        grads = tracked_direction(self.state, grads, comm, self.config.gradient_tracking)
        step = self.config.lr * grads
        step[:, -1] = -self.params.lr_dual * grads[:, -1]  # ascent on alpha
        x = x - step
        x[:, -1].clamp_(-DUAL_BOUND, DUAL_BOUND)
        return comm.mix(x), losses
