"""The two-layer perceptron of the paper's w7a / w8a experiments."""

from __future__ import annotations

from torch import Tensor, nn

from slate.models.init import xavier_normal_init

__all__ = ["MLP"]


class MLP(nn.Module):
    """``Linear(in, hidden) -> ReLU -> Linear(hidden, 1)``, returning one logit per sample.

    REFERENCE.md: w7a / w8a use ``Linear(300, 28), ReLU, Linear(28, 1)`` with Xavier-normal init.
    """

    #: Its Linear layers in order, a ReLU after each but the last, every row scored on its own:
    #: per-row gradient norms follow from each layer's inputs and output gradients
    #: (:mod:`slate.algorithms.chain_clipping`). A subclass that changes ``forward`` must not
    #: inherit it (it is read from the class itself).
    LINEAR_CHAIN = ("hidden", "out")

    def __init__(self, in_features: int, hidden: int = 28) -> None:
        super().__init__()
        self.hidden = nn.Linear(in_features, hidden)
        self.out = nn.Linear(hidden, 1)
        xavier_normal_init(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.hidden(x.flatten(1)).relu()).squeeze(-1)
