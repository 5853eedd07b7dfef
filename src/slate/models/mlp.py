"""The two-layer perceptron of the paper's w7a / w8a experiments."""

from __future__ import annotations

from torch import Tensor, nn

from slate.models.init import xavier_normal_init

__all__ = ["MLP"]


class MLP(nn.Module):
    """``Linear(in, hidden) -> ReLU -> Linear(hidden, 1)``, returning one logit per sample.

    REFERENCE.md: w7a / w8a use ``Linear(300, 28), ReLU, Linear(28, 1)`` with Xavier-normal init.
    """

    def __init__(self, in_features: int, hidden: int = 28) -> None:
        super().__init__()
        self.hidden = nn.Linear(in_features, hidden)
        self.out = nn.Linear(hidden, 1)
        xavier_normal_init(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.hidden(x.flatten(1)).relu()).squeeze(-1)
