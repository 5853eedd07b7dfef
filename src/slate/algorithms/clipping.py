r"""The clipping rule of ``--dp-epsilon``, one function for both ways of computing the groups'
gradients (:mod:`slate.algorithms.privacy`'s copies of the parameters, and
:mod:`slate.algorithms.chain_clipping`'s Linear chain).

A group's gradient :math:`g` is scaled by :math:`\min(1, C (1 - 2^{-16}) / \lVert g \rVert_2)`.
The factor aims a relative :math:`2^{-16}` below ``C`` so that rounding in the parameters' dtype
(float32's relative error over a norm of millions of terms stays below :math:`10^{-6}`) can never
take a clipped gradient past ``C``. Callers reach it as ``clipping.clip_factors`` (the privacy
benchmark's planted bug replaces it, and must reach every path).
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["CLIP_MARGIN", "clip_factors"]

CLIP_MARGIN = 1.0 - 2.0**-16


def clip_factors(norms: Tensor, clip: float) -> Tensor:
    """Each group's factor :math:`\\min(1, C (1 - 2^{-16}) / \\lVert g \\rVert)` for its
    gradient's norm (float64, any shape); a zero gradient's factor is 1 (``C / 0 = inf``)."""
    return (clip * CLIP_MARGIN / norms).clamp(max=1.0)
