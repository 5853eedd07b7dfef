"""Objectives: each maps ``(logits (m,), labels (m,), extra (k,))`` to a scalar loss.

``extra`` holds an algorithm's own scalar variables (CODA's a, b, alpha); objectives without any
ignore it. Every objective is written with masks so that ``torch.func.vmap`` runs it for all
parties in one call.
"""

from slate.objectives.ap import APLoss, ap_surrogate, ap_surrogate_terms, sigmoid_ap_objective
from slate.objectives.bce import bce_objective

__all__ = [
    "APLoss",
    "ap_surrogate",
    "ap_surrogate_terms",
    "bce_objective",
    "sigmoid_ap_objective",
]
