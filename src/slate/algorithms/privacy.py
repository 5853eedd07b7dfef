r"""Differentially private gradients (``--dp-epsilon``): grouped clipping and Gaussian noise.

SLATE's loss scores a whole batch: every row is a comparator in every positive's term, so
clipping per example or per positive does not bound one row's influence (docs/privacy.md).
Grouped clipping does. A party's Poisson sample (:class:`slate.data.sampler.PoissonGroupSampler`)
is dealt at random into ``G`` groups of ``k`` slots; then

.. math::

    \tilde u = \frac{1}{D}\Big(\sum_{g=1}^{G} \mathrm{clip}_C\big(\nabla L(x; \mathcal G_g)\big)
        + N\big(0, (2 C z)^2 I\big)\Big),
    \qquad \mathrm{clip}_C(v) = v \min\big(1, C / \lVert v \rVert_2\big),

where :math:`L(x; \mathcal G_g)` is the algorithm's loss on group ``g``'s rows alone (SLATE's AP
surrogate unchanged inside a group, 0 for a group without a positive:
:func:`slate.objectives.ap.masked_ap_surrogate`), and ``D`` a public constant, the expected
number of groups that contribute (:func:`expected_contributors`). A party with ``D = 0`` (the
AP surrogate at a party without positives, which samples nothing) releases nothing:
:math:`\tilde u = 0`, no noise. One row sits in one group, so
adding or removing it moves the clipped sum by at most ``2C`` (its group's clipped gradient can
flip from one vector of norm ``C`` to another), and the noise's standard deviation is ``2C``
times the noise multiplier ``z`` the accountant calibrated (:mod:`slate.training.accountant`).
Losses that are sums over rows (D-PSGD's cross-entropy, CODA's) use groups of one row: standard
DP-SGD, with the same ``2C`` bound (a row's slot may displace another row); on slate's MLP their
per-row norms come from the layers' inputs and output gradients, without a copy of the
parameters per row, and larger groups' gradients from one product per layer
(:mod:`slate.algorithms.chain_clipping`).

The clipping factors aim a relative :math:`2^{-16}` below ``C``, so that the clipped gradients,
scaled and summed in the parameters' dtype, stay within ``C`` despite rounding; the sum is then
widened to float64, the noise drawn and added in float64, and the estimate cast to the
parameters' dtype only after the add. The noise does not depend on the rows, so the next
step's is drawn on a worker thread while this step computes (:class:`NoiseAhead`); each party's
stream is read in the order that drawing it when needed would read it. Everything the algorithm
does with :math:`\tilde u` afterwards
(gradient tracking, momentum, mixing, CHOCO, ``--robust clip``) is post-processing.

:class:`PrivateCompute` has :class:`~slate.algorithms.compute.PartyCompute`'s call signature, so
the algorithms run it unchanged on both engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from slate.algorithms import clipping
from slate.algorithms.chain_clipping import LinearChainClipping, linear_chain
from slate.algorithms.compute import Batch, Objective, PartyCompute
from slate.errors import ConfigError

__all__ = [
    "NoiseAhead",
    "NoiseSource",
    "PrivateCompute",
    "PrivateGroups",
    "clip_scales",
    "clipped_sum",
    "expected_contributors",
    "row_objective",
]


class NoiseSource(Protocol):
    """A party's secret source of Gaussian noise (:class:`slate.security.secret_random.
    SecretStream`): ``normal(count, std)``, float64 draws of :math:`N(0, std^2)`."""

    def normal(self, count: int, std: float = 1.0) -> Any: ...


def row_objective(objective: Objective, with_context: bool) -> Objective:
    """A per-row loss on a group of one slot: ``objective`` of the row, or 0 for an empty slot
    (label -1)."""

    def masked(logits: Tensor, labels: Tensor, extra: Tensor, *context: Tensor) -> Tensor:
        loss = objective(logits, labels.clamp(min=0), extra, *context)
        return torch.where(labels[0] >= 0, loss, torch.zeros_like(loss))

    if with_context:
        return masked

    def plain(logits: Tensor, labels: Tensor, extra: Tensor) -> Tensor:
        return masked(logits, labels, extra)

    return plain


def expected_contributors(
    unit: str, groups: int, positives: int, negatives: int, q_pos: float, q_neg: float
) -> float:
    """The public divisor ``D``: for AP groups (``unit="group"``), the expected number of the
    ``G`` groups holding a positive, :math:`G\\,(1 - (1 - q_+/G)^{n_+})`; for groups of one row
    (``unit="row"``), the expected number of rows sampled, :math:`q_+ n_+ + q_- n_-`."""
    if unit == "group":
        return groups * (1.0 - (1.0 - q_pos / groups) ** positives)
    return q_pos * positives + q_neg * negatives


def clip_scales(grads: Tensor, clip: float) -> Tensor:
    """Each group's factor (:func:`slate.algorithms.clipping.clip_factors`, ``(G, P)``,
    float64) for the gradients ``grads[g, p]`` (``(G, P, d)``)."""
    return clipping.clip_factors(torch.linalg.vector_norm(grads, dim=-1).double(), clip)


def clipped_sum(grads: Tensor, clip: float) -> Tensor:
    """:math:`\\sum_g \\mathrm{clip}_C(g)` per party (``(P, d)``, float64): one batched product
    of the groups' factors with their gradients, in the gradients' dtype, then widened."""
    scales = clip_scales(grads, clip).to(grads.dtype)  # (G, P)
    total = torch.bmm(scales.t().unsqueeze(1), grads.transpose(0, 1)).squeeze(1)
    return total.double()


class NoiseAhead:
    r"""Each local party's noise, ``(P, d)`` float64 of :math:`N(0, \sigma_p^2)`, drawn one
    step ahead on a worker thread.

    :meth:`take` returns the draw made for this step, if it was made for the same ``d``, and
    starts the next one; the streams are read one draw after another, as drawing on demand
    reads them, so a test seed gives the same numbers. A draw made ahead and never taken (the
    run stopped, or parties left) is dropped: it was never released.
    """

    def __init__(self, sources: Sequence[NoiseSource], std: Tensor) -> None:
        self.sources = list(sources)
        self.std = std
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slate-dp-noise")
        self._ahead: tuple[int, Future[Tensor]] | None = None

    def _draw(self, dim: int) -> Tensor:
        return torch.stack(
            [
                torch.as_tensor(source.normal(dim, float(std)), dtype=torch.float64)
                for source, std in zip(self.sources, self.std, strict=True)
            ]
        )

    def take(self, dim: int) -> Tensor:
        """This step's noise for ``dim`` coordinates; the next step's starts drawing."""
        ahead, self._ahead = self._ahead, None
        noise = None
        if ahead is not None:
            drawn = ahead[1].result()  # (always awaited: the streams are not shared with it)
            noise = drawn if ahead[0] == dim else None
        if noise is None:
            noise = self._draw(dim)
        self._ahead = (dim, self._worker.submit(self._draw, dim))
        return noise

    def keep(self, rows: list[int]) -> None:
        """Draw only for the parties at positions ``rows``; the draw made ahead is dropped."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[1].result()  # the streams are not shared with a running draw
        self.sources = [self.sources[k] for k in rows]
        self.std = self.std[rows]


@dataclass(frozen=True)
class PrivateGroups:
    """The public shape of the mechanism: ``groups`` G, ``group_size`` slots per group,
    ``clip`` C, and per local party the noise's standard deviation ``2 C z`` (``noise_std``)
    and the divisor ``D`` (``divisor``)."""

    groups: int
    group_size: int
    clip: float
    noise_std: tuple[float, ...]
    divisor: tuple[float, ...]


class PrivateCompute:
    """:class:`PartyCompute`'s call, privatised: ``(losses, noisy estimates)`` of the parties'
    grouped batches (see the module docstring). ``inner`` computes the masked per-group loss
    (built with the algorithm's masked objective); ``noise`` holds one secret source per local
    party. Everything else (evaluation, layout, buffers) is the inner compute's.

    The losses it returns are each party's own (the groups' losses summed, over ``D``), for its
    own console; they are never sent to the other parties under ``--dp-epsilon``.
    """

    def __init__(
        self, inner: PartyCompute, groups: PrivateGroups, noise: Sequence[NoiseSource]
    ) -> None:
        if len(noise) != inner.n_parties or len(groups.noise_std) != inner.n_parties:
            raise ValueError("one noise source and one noise scale per local party")
        self.inner = inner
        self.groups = groups
        chain = linear_chain(inner.module)
        #: on a Linear chain: the groups' gradients without a copy of the parameters per group
        self.chain = None if chain is None else LinearChainClipping(inner, chain, groups.groups)
        self.noise = NoiseAhead(noise, torch.tensor(groups.noise_std, dtype=torch.float64))
        self.divisor = torch.tensor(groups.divisor, dtype=torch.float64)
        self._kept = list(range(inner.n_parties))  # the positions of the parties still here

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def buffers(self) -> dict[str, Tensor]:
        """The inner compute's per-party buffers (read and replaced by snapshots)."""
        return self.inner.buffers

    @buffers.setter
    def buffers(self, value: dict[str, Tensor]) -> None:
        self.inner.buffers = value

    def split_groups(self, batch: Batch) -> Batch:
        """``(P, G k, ...)`` slots to ``(G P, k, ...)``: group-major blocks of the parties."""
        g, k = self.groups.groups, self.groups.group_size
        parties = batch.labels.shape[0]

        def regroup(t: Tensor) -> Tensor:
            t = t.reshape(parties, g, k, *t.shape[2:]).transpose(0, 1)
            return t.reshape(g * parties, k, *t.shape[3:])

        return Batch(regroup(batch.features), regroup(batch.labels))

    def group_gradients(self, x: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        """Every group's loss ``(G, P)`` and unclipped gradient ``(G, P, d)`` at ``x (P, d)``."""
        g = self.groups.groups
        losses, grads = self.inner(x.repeat(g, 1), self.split_groups(batch))
        return losses.view(g, x.shape[0]), grads.view(g, *x.shape)

    def __call__(self, x: Tensor, batch: Batch, once: bool = False) -> tuple[Tensor, Tensor]:
        del once
        if x.shape[0] != self.inner.n_parties:
            raise ConfigError(
                "This algorithm evaluates its gradient on more than the parties' current "
                "iterates (SLATE-M's STORM estimator), which --dp-epsilon does not account; use "
                "--momentum ema."
            )
        if self.chain is not None:
            losses, total = self.chain(x, batch, self.groups.clip)
        else:
            losses, grads = self.group_gradients(x, batch)
            total = clipped_sum(grads, self.groups.clip)  # (P, d), float64
        noise = self.noise.take(total.shape[1]).to(total.device)
        divisor = self.divisor.to(total.device)[:, None]
        silent = divisor == 0  # a party that samples nothing: its estimate is exactly 0
        safe = torch.where(silent, 1.0, divisor)
        estimate = torch.where(silent, 0.0, (total + noise) / safe).to(x.dtype)
        return (losses.double().sum(dim=0) / safe[:, 0]).to(x.dtype), estimate

    def keep_parties(self, rows: Tensor) -> None:
        """Compute only for the parties at positions ``rows`` from now on."""
        self.inner.keep_parties(rows)
        kept = rows.tolist()
        self.noise.keep(kept)
        self.divisor = self.divisor[kept]
        self._kept = [self._kept[k] for k in kept]

    def set_noise_std(self, noise_std: Sequence[float]) -> None:
        """Each local party's noise standard deviation ``2 C z`` (one per party the compute was
        built for), set before the first step of a run planned against its ledger
        (:func:`slate.training.private_run.plan_against_ledger`). The draw made ahead at the
        old scale, if any, is dropped: it was never released."""
        if len(noise_std) != len(self.groups.noise_std):
            raise ValueError("one noise scale per party the compute was built for")
        self.groups = replace(self.groups, noise_std=tuple(float(s) for s in noise_std))
        self.noise.keep(list(range(len(self._kept))))  # (drops the draw made ahead)
        self.noise.std = torch.tensor([noise_std[k] for k in self._kept], dtype=torch.float64)
