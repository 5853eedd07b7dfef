"""Binary cross-entropy, the objective of the D-PSGD baseline."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["bce_objective"]


def bce_objective(logits: Tensor, labels: Tensor, extra: Tensor) -> Tensor:
    r"""Mean binary cross-entropy of the logits ``z``.

    .. math:: -\frac1m\sum_j y_j\log\sigma(z_j) + (1-y_j)\log(1-\sigma(z_j))

    Computed from logits for numerical stability.
    """
    del extra
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
