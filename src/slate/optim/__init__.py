"""Decentralised optimizers for your own training loop on ``torch.distributed``.

Example (one process per party, e.g. ``torchrun --nproc-per-node 4 train.py``)::

    torch.distributed.init_process_group("gloo")
    opt = slate.optim.SLATE(model.parameters(), lr=0.01, topology="ring")
    for x, y in loader:                      # this party's own data
        opt.zero_grad()
        slate.APLoss(0.1)(torch.sigmoid(model(x)), y).backward()
        opt.step()                           # local step, then one exchange with the neighbours
"""

from slate.optim.base import DecentralizedOptimizer, validate_learning_rate
from slate.optim.dsgd import DSGD
from slate.optim.slate import SLATE

__all__ = ["DSGD", "SLATE", "DecentralizedOptimizer", "validate_learning_rate"]
