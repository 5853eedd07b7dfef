"""slate: serverless multi-party AUPRC optimisation (SLATE and SLATE-M, KDD '23).

The public PyTorch-native pieces are importable from here; the rest lives in submodules:
``slate.topology`` (mixing matrices), ``slate.algorithms`` (update rules), ``slate.engines``
(simulator), ``slate.data`` (readers, partitions, samplers), ``slate.train`` (the run loop).
"""

from slate.objectives.ap import APLoss

__version__ = "0.1.0"

__all__ = ["APLoss", "__version__"]
