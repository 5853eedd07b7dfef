"""Per-party forward and backward passes for any ``nn.Module``, batched over parties.

The parameters of every party live in one flat buffer of shape ``(P, d)`` (plus an algorithm's
extra scalars at the end). :class:`PartyCompute` evaluates every party's loss and gradient at once,
with no Python loop over parties. Both engines use it: the simulator with ``P = N``, a distributed
process with ``P = 1``.

Two interchangeable paths compute the same numbers:

* **eager** (default): one ``torch.func.vmap`` of the forward pass gives the losses ``(P,)``, and
  one reverse pass, ``torch.autograd.grad(sum_p loss_p, x)``, gives every row of the gradient.
  Party p's loss depends only on row p of ``x``, so row p of the gradient of the sum is
  :math:`\nabla_{x_p} \text{loss}_p`: what ``vmap(grad(loss))`` returns (up to float rounding),
  with less per-call overhead than the ``grad`` transform. A call for one party (a distributed
  process) runs the forward pass without ``vmap``: the same numbers to float rounding, and a
  third less time per step for w7a's MLP (1.93 s against 1.22 s for 2 000 steps, one party).
* **compiled** (``compile=True``): ``torch.compile`` of ``vmap(grad_and_value(loss))``, forward and
  backward fused into one graph of generated kernels. It agrees with the eager path to float
  rounding. If compilation fails (no C++ compiler, an unsupported model), the eager path takes
  over with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from slate.errors import SlateError
from slate.models.passes import EVAL_CHUNK, forward_in_chunks

__all__ = ["Batch", "FlatParameters", "Objective", "PartyCompute"]


Objective = Callable[..., Tensor]


@dataclass(frozen=True)
class Batch:
    """One mini-batch per party: ``features`` of shape ``(P, m, ...)`` and ``labels`` ``(P, m)``."""

    features: Tensor
    labels: Tensor

    def repeat(self, times: int) -> Batch:
        """The same samples stacked ``times`` times along the party axis."""
        return Batch(_tile(self.features, times), _tile(self.labels, times))

    @staticmethod
    def stack(features: Tensor, labels: Tensor) -> Batch:
        """Blocks of batches ``(k, P, m, ...)`` flattened block-major to ``(k P, m, ...)``."""
        return Batch(features.flatten(0, 1), labels.flatten(0, 1))


def _tile(t: Tensor, blocks: int) -> Tensor:
    return t.repeat(blocks, *([1] * (t.ndim - 1)))


class FlatParameters:
    """Maps a module's parameters to one flat vector and back (views, no copies)."""

    def __init__(self, module: nn.Module) -> None:
        self.names: list[str] = []
        self.shapes: list[torch.Size] = []
        self.offsets: list[int] = []
        offset = 0
        for name, param in module.named_parameters():
            self.names.append(name)
            self.shapes.append(param.shape)
            self.offsets.append(offset)
            offset += param.numel()
        self.size = offset

    def last_linear(self, module: nn.Module) -> tuple[int, int] | None:
        """``(start, stop)``: where the last ``nn.Linear`` of ``module`` (in registration order:
        the output layer of slate's models) keeps its weight and bias in the flat vector, or
        ``None`` for a model without one. A Linear's weight and bias are registered one after
        the other, so they are one span."""
        linears = [name for name, m in module.named_modules() if isinstance(m, nn.Linear)]
        if not linears:
            return None
        prefix = f"{linears[-1]}." if linears[-1] else ""
        spans = [
            (offset, offset + shape.numel())
            for name, shape, offset in zip(self.names, self.shapes, self.offsets, strict=True)
            if name in (prefix + "weight", prefix + "bias")
        ]
        return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None

    def flatten(self, module: nn.Module) -> Tensor:
        """The module's parameters concatenated in registration order, shape ``(d,)``."""
        return torch.cat([p.detach().reshape(-1) for p in module.parameters()])

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Views of ``flat[..., :d]`` shaped like each parameter, keyed by name."""
        return self.split(flat)[0]

    def split(self, flat: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """The parameters' views (as :meth:`unflatten`) and the tail ``flat[..., d:]``.

        One ``split`` call, whose backward is a single concatenation: no slice of the whole
        vector, whose backward would zero-fill and copy a buffer of ``flat``'s size.
        """
        sizes = [s.numel() for s in self.shapes] + [flat.shape[-1] - self.size]
        *pieces, tail = flat.split(sizes, dim=-1)
        views = {
            name: piece.reshape(*flat.shape[:-1], *shape)
            for name, shape, piece in zip(self.names, self.shapes, pieces, strict=True)
        }
        return views, tail

    def load_into(
        self, module: nn.Module, flat: Tensor, buffers: dict[str, Tensor] | None = None
    ) -> None:
        """Copy a flat vector ``(d,)`` (or longer) into the module's parameters, and buffers."""
        views = self.unflatten(flat)
        with torch.no_grad():
            for name, param in module.named_parameters():
                param.copy_(views[name])
            for name, buf in module.named_buffers():
                if buffers is not None and name in buffers:
                    buf.copy_(buffers[name])


class PartyCompute:
    """Losses and gradients of ``objective(model(x_p; features_p), labels_p)`` for every party p.

    Buffers (BatchNorm running statistics) are kept per party, stacked like the parameters
    (``self.buffers[name]`` has shape ``(P, ...)``), and updated in place by each party's own
    forward pass inside the vmapped call. They are not mixed: only parameters are exchanged.
    Evaluation of an averaged model uses buffers averaged over the parties.

    A call may stack several blocks of the ``P`` parties (``x`` of shape ``(k P, d)``, block
    major), e.g. SLATE-M's current and previous iterates on the same samples: then every block
    runs with the parties' buffers and only the first block's statistics are kept.

    Args:
        module: the model; its parameters define the layout of the flat buffer.
        objective: maps ``(logits, labels, extra)`` to a scalar loss, or
            ``(logits, labels, extra, context)`` when ``context`` is given.
        n_extra: number of algorithm variables appended after the model's parameters.
        n_parties: how many parties ``P`` this process computes for.
        context: per-party constants ``(P, c)`` handed to the objective (CODA's positive rate).
        compile: use the ``torch.compile`` path (see the module docstring).
    """

    def __init__(
        self,
        module: nn.Module,
        objective: Objective,
        n_extra: int = 0,
        n_parties: int = 1,
        context: Tensor | None = None,
        compile: bool = False,
    ) -> None:
        self.module = module
        self.layout = FlatParameters(module)
        self.objective = objective
        self.n_extra = n_extra
        self.n_parties = n_parties
        self.dim = self.layout.size + n_extra
        # functional_call's untying pass costs ~0.1 ms a call; only models that share a
        # parameter between two modules need it (named_parameters lists a shared one once).
        self.has_tied_weights = len(list(module.named_parameters(remove_duplicate=False))) > len(
            self.layout.names
        )
        self.buffers = {
            name: buf.detach().unsqueeze(0).repeat(n_parties, *([1] * buf.ndim))
            for name, buf in module.named_buffers()
        }
        dtype = next(module.parameters()).dtype
        self.context = None if context is None else context.to(dtype)
        with_context = context is not None

        def party_loss(
            flat: Tensor,
            buffers: dict[str, Tensor],
            features: Tensor,
            labels: Tensor,
            context: Tensor,
        ) -> Tensor:
            params, extra = self.layout.split(flat)
            logits = functional_call(
                self.module, (params, buffers), (features,), tie_weights=self.has_tied_weights
            )
            if with_context:
                return self.objective(logits, labels, extra, context)
            return self.objective(logits, labels, extra)

        batched = vmap(party_loss)

        def losses(
            flat: Tensor, buffers: dict[str, Tensor], features: Tensor, labels: Tensor,
            context: Tensor,
        ) -> Tensor:  # fmt: skip
            """Every party's loss, ``(P,)``: vmapped, or for one party a plain call."""
            if flat.shape[0] != 1:
                return batched(flat, buffers, features, labels, context)
            one = {k: v[0] for k, v in buffers.items()}
            return party_loss(flat[0], one, features[0], labels[0], context[0]).unsqueeze(0)

        self._losses = losses
        self.compiled = False
        if compile:
            self._compiled = torch.compile(vmap(grad_and_value(party_loss)), dynamic=False)
            self.compiled = True

    def _losses_and_grads(
        self, x: Tensor, buffers: dict[str, Tensor], batch: Batch, context: Tensor, once: bool
    ) -> tuple[Tensor, Tensor]:
        """Every party's loss and gradient, by the compiled or the eager path."""
        if self.compiled and not once:
            try:
                grads, losses = self._compiled(x, buffers, batch.features, batch.labels, context)
                return losses, grads
            except Exception as err:
                self._give_up_compiling(err)
        with torch.enable_grad():
            leaf = x.detach().requires_grad_(True)
            losses = self._losses(leaf, buffers, batch.features, batch.labels, context)
            (grads,) = torch.autograd.grad(losses.sum(), leaf)
        return losses.detach(), grads

    def _give_up_compiling(self, err: Exception) -> None:
        """Switch to the eager path for good, saying why (slate's own errors pass through)."""
        if isinstance(err, SlateError):
            raise err
        self.compiled = False
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        warnings.warn(
            f"torch.compile could not compile this model's gradient ({type(err).__name__}: "
            f"{first_line}); continuing with the eager path, which computes the same numbers "
            "more slowly.",
            RuntimeWarning,
            stacklevel=3,
        )

    def __call__(self, x: Tensor, batch: Batch, once: bool = False) -> tuple[Tensor, Tensor]:
        """Return ``(losses (kP,), gradients (kP, d))`` at the parameters ``x (kP, d)``.

        Updates the parties' BatchNorm statistics, if the model has any, from the first block.
        ``once`` marks a call whose shape never recurs (SLATE-M's initial batch): it takes the
        eager path, since compiling a graph for one call costs more than it saves.
        """
        blocks = x.shape[0] // self.n_parties
        context = self.context
        if context is None:
            context = x.new_zeros(self.n_parties, 0)
        self.module.train()
        if blocks == 1:
            return self._losses_and_grads(x, self.buffers, batch, context, once)
        tiled = {k: _tile(v, blocks) for k, v in self.buffers.items()}
        losses, grads = self._losses_and_grads(x, tiled, batch, _tile(context, blocks), once)
        for name, buf in tiled.items():
            self.buffers[name] = buf[: self.n_parties].clone()
        return losses, grads

    def keep_parties(self, rows: Tensor) -> None:
        """Compute only for the parties at positions ``rows`` from now on (the others left)."""
        self.n_parties = len(rows)
        self.buffers = {k: v.index_select(0, rows) for k, v in self.buffers.items()}
        if self.context is not None:
            self.context = self.context.index_select(0, rows)

    def averaged_buffers(self) -> dict[str, Tensor]:
        """Float buffers averaged over parties, counters of party 0."""
        return {
            name: buf.mean(dim=0) if buf.is_floating_point() else buf[0]
            for name, buf in self.buffers.items()
        }

    def logits(
        self,
        x: Tensor,
        features: Tensor,
        buffers: dict[str, Tensor] | None = None,
        chunk: int = EVAL_CHUNK,
    ) -> Tensor:
        """Logits of one parameter vector ``x (d,)`` on ``features``, in forward passes of
        ``chunk`` rows aligned to the rows' indices, the last padded
        (:func:`slate.models.passes.forward_in_chunks`: the same passes as ``slate predict``).

        ``buffers`` default to the local parties' averaged buffers.
        """
        params = self.layout.unflatten(x)
        state = (params, self.averaged_buffers() if buffers is None else buffers)
        self.module.eval()
        with torch.no_grad():
            return forward_in_chunks(
                lambda rows: functional_call(self.module, state, (rows,)), features, chunk
            )

    def party_logits(
        self,
        x: Tensor,
        features: Tensor,
        buffers: dict[str, Tensor] | None = None,
        chunk: int = EVAL_CHUNK,
    ) -> Tensor:
        """Logits of every party's own model ``x (P, d)`` on the same ``features``: ``(P, n)``.

        ``buffers`` (stacked like ``x``) default to the local parties' own. One plain forward
        pass per party: evaluation has no per-party gradients to batch, and a vmapped
        convolution (a grouped one) is slower on CPU than P ordinary ones.
        """
        buffers = self.buffers if buffers is None else buffers
        return torch.stack(
            [
                self.logits(x[p], features, {k: v[p] for k, v in buffers.items()}, chunk)
                for p in range(x.shape[0])
            ]
        )
