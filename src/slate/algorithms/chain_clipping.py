r"""Grouped clipping on a chain of Linear layers, without a copy of the parameters per group
(Goodfellow 2015, "Efficient per-example gradient computations").

Under ``--dp-epsilon`` each group's gradient is clipped (:mod:`slate.algorithms.privacy`). The
generic path gives every group its own copy of the parameters and differentiates them all:
``G`` copies of ``d`` values per party a step, and for groups of one row (D-PSGD's
cross-entropy, CODA's) ``G`` is the number of slots, about 140. For a model that is a chain of
``nn.Linear`` layers with ReLUs between, on rows that do not interact (slate's
:class:`~slate.models.mlp.MLP` declares this with ``LINEAR_CHAIN``), one forward and one backward
pass on the party's rows give every layer's inputs :math:`a_i^l` and the gradients
:math:`\delta_i^l` of the loss with respect to its outputs; a group :math:`g`'s gradient of
layer :math:`l` is then

.. math::

    \nabla_{W^l} L_g = \sum_{i \in g} \delta_i^l (a_i^l)^\top, \qquad
    \nabla_{b^l} L_g = \sum_{i \in g} \delta_i^l .

* **Groups of one row:** :math:`\lVert \nabla_{W^l} \ell_i \rVert_F^2 = \lVert \delta_i^l
  \rVert^2 \lVert a_i^l \rVert^2`, so no row's gradient is formed, and the clipped sum of a layer
  is one product, :math:`\sum_i s_i \delta_i^l (a_i^l)^\top = (s \odot \delta^l)^\top a^l`.
* **Larger groups** (SLATE's): each group's layer gradient is formed by one batched product
  over the groups, its norm taken as the generic path takes it, and the clipped sum is one
  more product with the factors.

Here :math:`s_g = \min(1, C (1 - 2^{-16}) / \lVert \nabla L_g \rVert)`
(:func:`slate.algorithms.clipping.clip_factors`). The algorithm's own
variables (CODA's ``a``, ``b``, ``alpha``) get one copy per group, since they are few. Each piece's
norm is taken in the parameters' dtype, as the generic path's is (a sum of squares, whose
relative rounding stays far below the clipping margin), then squared and added in float64;
the clipped sum is taken in the parameters' dtype and widened, as there. The two paths agree
to float rounding (``tests/algorithms/test_chain_clipping.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import vmap

from slate.algorithms import clipping
from slate.algorithms.compute import Batch, PartyCompute

__all__ = ["LinearChainClipping", "linear_chain"]


def linear_chain(module: nn.Module) -> tuple[str, ...] | None:
    """The names of ``module``'s Linear layers in order, when its class declares itself such a
    chain (``LINEAR_CHAIN``, read from the class itself: a subclass that changes ``forward``
    does not inherit it) and they hold every parameter; None otherwise."""
    chain = vars(type(module)).get("LINEAR_CHAIN")
    if not chain or list(module.buffers()):
        return None
    layers = [getattr(module, name, None) for name in chain]
    if not all(isinstance(layer, nn.Linear) and layer.bias is not None for layer in layers):
        return None
    names = [f"{name}.{part}" for name in chain for part in ("weight", "bias")]
    if names != [name for name, _ in module.named_parameters()]:
        return None
    return tuple(chain)


class LinearChainClipping:
    """Per-group losses and the clipped sum of the groups' gradients, for a
    :class:`PartyCompute` whose model is a Linear chain (:func:`linear_chain`) and whose
    objective is the masked loss of one group (empty slots: label -1).

    A call takes ``x (P, d)`` and a batch of ``(P, G k, ...)`` slots, ``G`` groups of ``k``
    consecutive slots per party.
    """

    def __init__(self, compute: PartyCompute, chain: tuple[str, ...], groups: int) -> None:
        self.compute = compute
        self.chain = chain
        self.groups = groups
        self._group_losses = vmap(compute.objective)  # over every party's groups at once

    def forward(self, x: Tensor, features: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """Every layer's inputs ``(P, R, in)`` and outputs ``(P, R, out)`` (the first output a
        leaf that requires grad, so that the others follow it), and the logits ``(P, R)``: the
        model's forward pass, with each party's parameters."""
        params, _ = self.compute.layout.split(x.detach())
        h = features.reshape(*features.shape[:2], -1)
        inputs, outputs = [], []
        for k, name in enumerate(self.chain):
            weight, bias = params[f"{name}.weight"], params[f"{name}.bias"]
            z = torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))
            if k == 0:
                z.requires_grad_(True)
            inputs.append(h)
            outputs.append(z)
            h = z.relu() if k + 1 < len(self.chain) else z
        return inputs, outputs, h.squeeze(-1)

    def __call__(self, x: Tensor, batch: Batch, clip: float) -> tuple[Tensor, Tensor]:
        """``(losses (G, P), clipped sum (P, d) float64)`` at ``x (P, d)``: each group's
        gradient scaled by :func:`slate.algorithms.clipping.clip_factors`, then summed."""
        parties, groups = x.shape[0], self.groups
        with torch.enable_grad():
            inputs, outputs, logits = self.forward(x, batch.features)
            extra = x.detach()[:, self.compute.layout.size :]
            extra = extra.repeat_interleave(groups, dim=0).requires_grad_(True)  # (P G, e)
            losses = self._losses(logits, batch.labels, extra)
            wanted = [*outputs, extra] if extra.shape[1] else outputs
            grads = torch.autograd.grad(losses.sum(), wanted)
        inputs, deltas = [a.detach() for a in inputs], list(grads[: len(outputs)])
        extra_grads = grads[len(outputs)].view(parties, groups, -1) if extra.shape[1] else None
        if batch.labels.shape[1] == groups:  # groups of one row
            norms2, parts = _row_norms(inputs, deltas), None
        else:
            norms2, parts = _group_norms(inputs, deltas, groups)
        if extra_grads is not None:
            norms2 = norms2 + _squared_norms(extra_grads)
        scales = clipping.clip_factors(norms2.sqrt(), clip).to(x.dtype)  # (P, G)
        if parts is None:
            total = _rows_sum(inputs, deltas, scales)
        else:
            total = [torch.bmm(scales.unsqueeze(1), part).squeeze(1) for part in parts]
        if extra_grads is not None:
            total.append(torch.bmm(scales.unsqueeze(1), extra_grads).squeeze(1))
        return losses.detach().view(parties, groups).t(), torch.cat(total, dim=1).double()

    def _losses(self, logits: Tensor, labels: Tensor, extra: Tensor) -> Tensor:
        """Each group's loss, ``(P G,)``, party-major."""
        parties, groups = logits.shape[0], self.groups
        rows = logits.reshape(parties * groups, -1)
        group_labels = labels.reshape(parties * groups, -1)
        if self.compute.context is not None:
            context = self.compute.context.repeat_interleave(groups, dim=0)
            return self._group_losses(rows, group_labels, extra, context)
        return self._group_losses(rows, group_labels, extra)


def _squared_norms(t: Tensor) -> Tensor:
    """The squared L2 norm of ``t`` over its last dimension, taken in ``t``'s dtype (as the
    generic path's) and squared in float64."""
    return torch.linalg.vector_norm(t, dim=-1).double().square()


def _row_norms(inputs: list[Tensor], deltas: list[Tensor]) -> Tensor:
    """Each row's squared gradient norm over every layer, ``(P, R)`` float64:
    :math:`\\sum_l \\lVert \\delta_i^l \\rVert^2 (\\lVert a_i^l \\rVert^2 + 1)` (weight, bias)."""
    total: Any = 0.0
    for a, delta in zip(inputs, deltas, strict=True):
        total = total + _squared_norms(delta) * (_squared_norms(a) + 1.0)
    return total


def _rows_sum(inputs: list[Tensor], deltas: list[Tensor], scales: Tensor) -> list[Tensor]:
    """Each layer's :math:`\\sum_i s_i \\delta_i a_i^\\top` and :math:`\\sum_i s_i \\delta_i`,
    flat, ``(P, out in)`` and ``(P, out)``, in the layout's order."""
    pieces = []
    for a, delta in zip(inputs, deltas, strict=True):
        scaled = delta * scales.unsqueeze(-1)  # (P, R, out)
        pieces.append(torch.bmm(scaled.transpose(1, 2), a).flatten(1))
        pieces.append(scaled.sum(dim=1))
    return pieces


def _group_norms(
    inputs: list[Tensor], deltas: list[Tensor], groups: int
) -> tuple[Tensor, list[Tensor]]:
    """Each group's squared gradient norm ``(P, G)`` float64, and each layer's per-group
    gradients, flat: weight ``(P, G, out in)`` and bias ``(P, G, out)``, in the layout's order."""
    parties = inputs[0].shape[0]
    total: Any = 0.0
    parts = []
    for a, delta in zip(inputs, deltas, strict=True):
        a_g = a.reshape(parties * groups, -1, a.shape[-1])  # (P G, k, in)
        d_g = delta.reshape(parties * groups, -1, delta.shape[-1])  # (P G, k, out)
        weight = torch.bmm(d_g.transpose(1, 2), a_g).view(parties, groups, -1)
        bias = d_g.sum(dim=1).view(parties, groups, -1)
        total = total + _squared_norms(weight) + _squared_norms(bias)
        parts += [weight, bias]
    return total, parts
