r"""The paper's AP surrogate (eqs. 2-6) as a functional core and a thin ``nn.Module``.

For a mini-batch :math:`\mathcal{B}` of :math:`m` scored samples and a positive :math:`i`,

.. math::

    \ell(i, j) = \max\{s - (h_i - h_j), 0\}^2 \qquad \text{(eq. 2)}

    g_i = \frac{1}{m} \sum_{j \in \mathcal{B}}
          \big[\mathbf{1}(y_j = 1)\,\ell(i, j),\; \ell(i, j)\big]

    f(u) = -u_1 / u_2 ,

and the loss is :math:`\frac{1}{|\mathcal{B}^+|}\sum_{i \in \mathcal{B}^+} f(g_i)`: minus the
surrogate AP of the batch (lower is better). Here :math:`j` runs over the whole batch, ``i`` itself
included, so :math:`g_i^2 \ge s^2/m > 0` and the ratio is always defined. Its autograd gradient is
eq. (6) of the paper:

.. math::

    u = \frac{1}{b\,m} \sum_{i \in \mathcal{B}^+} \sum_{j \in \mathcal{B}}
        \frac{g_i^1 - g_i^2\,\mathbf{1}(y_j = 1)}{(g_i^2)^2} \nabla \ell(i, j).

The estimator is *online*: nothing is remembered between batches (unlike LibAUC's ``APLoss``,
which keeps a moving average per training sample).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = [
    "APLoss",
    "ap_surrogate",
    "ap_surrogate_terms",
    "masked_ap_surrogate",
    "masked_sigmoid_ap_objective",
    "sigmoid_ap_objective",
]


def ap_surrogate_terms(scores: Tensor, labels: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    r"""Return :math:`g^1_i` and :math:`g^2_i` (eq. 5's inner averages) for every ``i``.

    Args:
        scores: prediction scores :math:`h` of shape ``(m,)``.
        labels: 0/1 labels of shape ``(m,)`` (any dtype).
        margin: the squared-hinge margin ``s``.

    Returns:
        ``(g1, g2)``, each of shape ``(m,)``; only the entries of positives are used by the loss.
    """
    hinge = torch.clamp(margin - (scores.unsqueeze(-1) - scores.unsqueeze(-2)), min=0.0) ** 2
    positive = labels.to(scores.dtype)
    g_pos = hinge @ positive / scores.shape[-1]
    g_all = hinge.mean(dim=-1)
    return g_pos, g_all


def ap_surrogate(scores: Tensor, labels: Tensor, margin: float) -> Tensor:
    r"""Mean over the batch's positives of :math:`f(g_i) = -g^1_i / g^2_i` (eqs. 3-5).

    Written with masks rather than boolean indexing so that it runs unchanged under
    ``torch.func.vmap`` (one call for all parties). A batch without a positive (a site that
    holds none) has no term: the sum over :math:`\mathcal{B}^+` is empty, the count is taken
    as 1, and the loss is exactly 0 with an exactly zero gradient (each term is finite, since
    :math:`g^2_i \ge s^2/m`, and is multiplied by the 0 of its label). :class:`APLoss`, a
    user's loss, still refuses such a batch.
    """
    g_pos, g_all = ap_surrogate_terms(scores, labels, margin)
    positive = labels.to(scores.dtype)
    return -(positive * g_pos / g_all).sum(dim=-1) / positive.sum(dim=-1).clamp(min=1.0)


def sigmoid_ap_objective(margin: float):
    """The SLATE objective on raw model outputs: ``ap_surrogate(sigmoid(logits), labels)``."""

    def objective(logits: Tensor, labels: Tensor, extra: Tensor) -> Tensor:
        del extra  # SLATE has no variables besides the model's
        return ap_surrogate(torch.sigmoid(logits), labels, margin)

    return objective


def masked_ap_surrogate(scores: Tensor, labels: Tensor, margin: float) -> Tensor:
    r""":func:`ap_surrogate` of the rows whose label is 0 or 1, the others (label -1, an empty
    slot of a fixed-size group) left out: the same value as :func:`ap_surrogate` on the kept
    rows alone (the :math:`1/m` of eq. 5 cancels in :math:`g^1_i / g^2_i`), and 0 for rows
    without a positive. Written with masks, so it runs under ``torch.func.vmap``."""
    valid = (labels >= 0).to(scores.dtype)
    positive = (labels == 1).to(scores.dtype)
    hinge = torch.clamp(margin - (scores.unsqueeze(-1) - scores.unsqueeze(-2)), min=0.0) ** 2
    g_pos = hinge @ positive
    g_all = hinge @ valid  # >= margin^2 for a kept positive (j = i is kept)
    ratio = torch.where(positive > 0, g_pos / torch.where(positive > 0, g_all, 1.0), 0.0)
    return -ratio.sum(dim=-1) / positive.sum(dim=-1).clamp(min=1.0)


def masked_sigmoid_ap_objective(margin: float):
    """:func:`sigmoid_ap_objective` on the kept rows of a group (:func:`masked_ap_surrogate`)."""

    def objective(logits: Tensor, labels: Tensor, extra: Tensor) -> Tensor:
        del extra
        return masked_ap_surrogate(torch.sigmoid(logits), labels, margin)

    return objective


def _validate(scores: Tensor, labels: Tensor, margin: float) -> None:
    if scores.ndim != 1 or labels.ndim != 1 or scores.shape != labels.shape:
        raise ValueError(
            f"APLoss expects scores and labels of the same shape (B,), got {tuple(scores.shape)} "
            f"and {tuple(labels.shape)}."
        )
    if not torch.all((labels == 0) | (labels == 1)):
        raise ValueError("APLoss expects 0/1 labels; found other values.")
    if not bool(labels.bool().any()):
        raise ValueError(
            "APLoss needs at least one positive in the batch: AP is undefined without positives. "
            "Draw a fixed number of positives per batch (slate's sampler draws b of them)."
        )
    if not margin > 0:
        raise ValueError(f"APLoss margin must be > 0, got {margin}.")


class APLoss(nn.Module):
    """Minus the paper's surrogate AP of a batch; lower is better.

    Example:
        >>> import torch
        >>> from slate import APLoss
        >>> scores = torch.sigmoid(torch.tensor([2.0, -1.0, 0.5, -2.0]))
        >>> labels = torch.tensor([1, 0, 1, 0])
        >>> loss = APLoss(margin=0.1)(scores, labels)
        >>> round(float(loss), 4)
        -1.0

    Args:
        margin: the squared-hinge margin ``s`` of eq. (2).
        validate_args: check shapes, labels and that a positive is present (one host sync).
    """

    def __init__(self, margin: float = 0.1, *, validate_args: bool = True) -> None:
        super().__init__()
        if not margin > 0:
            raise ValueError(f"APLoss margin must be > 0, got {margin}.")
        self.margin = float(margin)
        self.validate_args = validate_args

    def forward(self, scores: Tensor, labels: Tensor) -> Tensor:
        """Compute the loss for sigmoid ``scores`` of shape ``(B,)`` and 0/1 ``labels``."""
        if self.validate_args:
            _validate(scores, labels, self.margin)
        return ap_surrogate(scores, labels, self.margin)

    def extra_repr(self) -> str:
        return f"margin={self.margin}"
