"""slate: serverless multi-party AUPRC optimisation (SLATE and SLATE-M, KDD '23).

The public PyTorch-native pieces are importable from here; the rest lives in submodules:
``slate.topology`` (mixing matrices), ``slate.algorithms`` (update rules), ``slate.engines``
(simulator), ``slate.data`` (readers, partitions, samplers), ``slate.training.loop`` (the run loop).
``slate.load_model(run_dir)`` rebuilds a run's trained model with its preprocessing;
``slate.SlateClassifier`` is a scikit-learn estimator that trains on simulated parties
(:mod:`slate.estimator`, imported on first use).
"""

from typing import TYPE_CHECKING, Any

from slate.objectives.ap import APLoss
from slate.version import __version__

if TYPE_CHECKING:
    from slate.estimator import SlateClassifier


__all__ = ["APLoss", "SlateClassifier", "__version__", "load_model"]


def __getattr__(name: str) -> Any:
    """``slate.SlateClassifier``, imported on first use: ``import slate`` does not load
    scikit-learn's estimator machinery or the training loop."""
    if name == "SlateClassifier":
        from slate.estimator import SlateClassifier

        return SlateClassifier
    raise AttributeError(f"module 'slate' has no attribute {name!r}")


def load_model(run_dir, device="cpu"):
    """``model, preprocessing = slate.load_model(run_dir)``: the run's model in eval mode and
    its :class:`slate.inference.model_file.Preprocessing` (see
    :func:`slate.inference.model_file.load_model`)."""
    from slate.inference.model_file import load_model as _load_model

    return _load_model(run_dir, device)
