"""``slate.optim.SLATE``: Algorithm 1's update inside your own training loop.

Pair it with :class:`slate.APLoss`: the gradient of that loss is eq. (6), so a loop of
``loss = APLoss()(torch.sigmoid(model(x)), y); loss.backward(); opt.step()`` on every party is
SLATE (with ``gradient_tracking=True``, including line 8).
"""

from __future__ import annotations

from slate.algorithms import slate as slate_algorithm
from slate.optim.base import DecentralizedOptimizer

__all__ = ["SLATE"]


class SLATE(DecentralizedOptimizer):
    """x <- mix(x - lr * v), with v the (tracked) gradient of the user's loss."""

    algorithm_class = slate_algorithm.SLATE
