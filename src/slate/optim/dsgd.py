"""``slate.optim.DSGD``: decentralised parallel SGD (Lian et al., 2017) for any loss."""

from __future__ import annotations

from slate.algorithms.dpsgd import DPSGD
from slate.optim.base import DecentralizedOptimizer

__all__ = ["DSGD"]


class DSGD(DecentralizedOptimizer):
    """x <- mix(x - lr * g): one local SGD step, then one exchange with the neighbours."""

    algorithm_class = DPSGD
