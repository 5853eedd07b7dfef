r"""Gossip with a misbehaving neighbour: test-only attacks, watching what arrives, and clipping.

**Attacks (tests only).** ``SLATE_ATTACK=RANK@ITER:KIND[,...]`` makes party ``RANK`` send, from
iteration ``ITER`` on, a corruption of its parameters to its neighbours while its own copy stays
honest. ``KIND`` is ``nan`` (every value NaN), ``scale:F`` (times ``F``), ``signflip`` (times
-1) or ``zeros``. On both engines: the simulator mixes the attacker's corrupted row into the
others' rows, a distributed process sends it; under CHOCO the corrupted vector is what the
attacker compresses and sends (:func:`parse_attacks`, :class:`MessageGuard`).

**Watching (always).** Every received neighbour value is checked for non-finite entries on the
device, without a host synchronisation; the training loop looks once per chunk
(:meth:`MessageGuard.first_non_finite`) and, without ``--robust``, stops naming the sender.

**``--robust clip``** (self-centred clipping, ClippedGossip: He, Karimireddy and Jaggi, 2022).
Party :math:`i` mixes

.. math::

    x_i \leftarrow x_i + \sum_j w_{ij}\, \mathrm{clip}(x_j - x_i, \tau_i), \qquad
    \mathrm{clip}(v, \tau) = v \min(1, \tau / \lVert v \rVert),

which equals :math:`\sum_j w_{ij} x_j` when nothing is clipped. A message with a non-finite
entry is dropped (its weight returns to :math:`x_i`) and its sender recorded. :math:`\tau_i` is
twice the lower median of the distances :math:`\lVert x_j - x_i \rVert` of this round's finite
messages (:func:`clipped_update`): while at least half of :math:`i`'s neighbours are honest,
:math:`\tau_i` is at most twice an honest neighbour's distance, so one attacker moves
:math:`x_i` by no more than an honest neighbour's pull could, whatever it sends; the factor 2
lets the ordinary spread of honest distances pass unclipped. Under CHOCO the clip acts on the
reconstructed neighbour model: :math:`\hat x_{j \to i} - \hat x_{i \to j}`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from slate.errors import ConfigError

__all__ = [
    "ATTACK_ENV",
    "KINDS",
    "Attack",
    "MessageGuard",
    "clipped_update",
    "corrupt",
    "parse_attacks",
]

ATTACK_ENV = "SLATE_ATTACK"
KINDS = ("nan", "scale", "signflip", "zeros")
NEVER = 1 << 62  # "no non-finite message yet"
CLIP_FACTOR = 2.0  # tau = CLIP_FACTOR x the lower median of the neighbour distances


@dataclass(frozen=True)
class Attack:
    """Party ``rank`` corrupts what it sends from iteration ``start`` on."""

    rank: int
    start: int
    kind: str
    factor: float = 1.0


def parse_attacks(spec: str | None) -> list[Attack]:
    """``RANK@ITER:KIND[,...]`` (module docstring); raises ConfigError naming the bad part."""
    attacks: list[Attack] = []
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        who, at_sign, rest = item.partition("@")
        when, colon, kind = rest.partition(":")
        kind, _, argument = kind.partition(":")
        problem = None
        if not (at_sign and colon and who.isdigit() and when.isdigit()):
            problem = "expected RANK@ITER:KIND with whole numbers RANK and ITER"
        elif kind not in KINDS:
            problem = f"KIND must be one of nan, scale:F, signflip, zeros, not {kind!r}"
        elif (kind == "scale") != bool(argument):
            problem = "scale takes a factor (scale:F); the other kinds take none"
        factor = 1.0
        if problem is None and kind == "scale":
            try:
                factor = float(argument)
            except ValueError:
                problem = f"the factor {argument!r} is not a number"
        if problem is not None:
            raise ConfigError(f"{ATTACK_ENV}: bad part {item!r}: {problem}")
        attacks.append(Attack(int(who), int(when), kind, factor))
    return attacks


def corrupt(x: Tensor, attack: Attack) -> Tensor:
    """What the attacker sends in place of ``x`` (a new tensor; ``x`` is not changed)."""
    if attack.kind == "nan":
        return torch.full_like(x, math.nan)
    if attack.kind == "zeros":
        return torch.zeros_like(x)
    if attack.kind == "signflip":
        return -x
    return x * attack.factor


def _lower_median_layout(receivers: Tensor, p: int) -> tuple[Tensor, int]:
    """For edges grouped by receiver: a ``(P, kmax)`` index into the edges, ``E`` for padding."""
    counts = torch.bincount(receivers.cpu(), minlength=p)
    kmax = max(1, int(counts.max()) if len(counts) else 1)
    layout = torch.full((p, kmax), len(receivers), dtype=torch.long)
    filled = [0] * p
    for e, r in enumerate(receivers.tolist()):
        layout[r, filled[r]] = e
        filled[r] += 1
    return layout.to(receivers.device), kmax


def clipped_update(
    own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor, p: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Self-centred clipped mixing's increments.

    Args:
        own: ``(E, d)``, the receiver's own value for each edge.
        theirs: ``(E, d)``, what came over the edge.
        weights: ``(E,)``, :math:`w_{ij}`.
        receivers: ``(E,)``, each edge's receiving row in ``0..p-1``.
        p: rows.

    Returns:
        ``(P, d)`` increments :math:`\\sum_j w_{ij} \\mathrm{clip}(x_j - x_i, \\tau_i)`, and per
        edge whether it was dropped (non-finite) and whether it was clipped.
    """
    diff = theirs - own
    finite = torch.isfinite(theirs).all(dim=1)
    diff = torch.where(finite[:, None], diff, torch.zeros((), dtype=diff.dtype, device=diff.device))
    dist = torch.linalg.vector_norm(diff, dim=1)
    inf = torch.tensor([math.inf], dtype=dist.dtype, device=dist.device)
    key = torch.cat([torch.where(finite, dist, inf), inf])  # the last entry pads
    layout, _ = _lower_median_layout(receivers, p)
    ordered = key[layout].sort(dim=1).values
    n_finite = torch.zeros(p, dtype=torch.long, device=diff.device).index_add_(
        0, receivers, finite.long()
    )
    middle = ((n_finite - 1).clamp(min=0) // 2)[:, None]
    tau = (CLIP_FACTOR * ordered.gather(1, middle)).squeeze(1)[receivers]
    clipped = finite & (dist > tau)
    scale = torch.where(clipped, tau / dist, torch.ones_like(dist))
    scale = torch.nan_to_num(scale, nan=0.0)
    out = torch.zeros(p, diff.shape[1], dtype=diff.dtype, device=diff.device)
    out.index_add_(0, receivers, diff * (weights * scale)[:, None])
    return out, ~finite, clipped


class MessageGuard:
    """This process's attacks, its record of what arrived, and ``--robust`` (module docstring).

    Args:
        n: the number of parties of the run (senders are counted per party index).
        local_parties: the parties whose rows this process holds.
        robust: ``"clip"`` or ``"none"``.
        attacks: the planned attacks (:func:`parse_attacks`); a distributed process keeps only
            its own party's.
    """

    def __init__(self, n: int, local_parties: list[int], robust: str = "none", attacks=()) -> None:
        self.n = n
        self.local = list(local_parties)
        self.robust = robust == "clip"
        self.attacks = [a for a in attacks if a.rank in self.local]
        self.iteration = 0
        self._counts: Tensor | None = None  # (3, n): received, dropped, clipped per sender
        self._first_bad: Tensor | None = None  # (n,): first iteration of a non-finite message

    @classmethod
    def from_env(cls, n: int, local_parties: list[int], robust: str) -> MessageGuard:
        return cls(n, local_parties, robust, parse_attacks(os.environ.get(ATTACK_ENV)))

    @property
    def attacking(self) -> bool:
        return any(self.iteration >= a.start for a in self.attacks)

    @property
    def active(self) -> bool:
        """Whether mixing must go edge by edge (clipping, or an attacker among the rows)."""
        return self.robust or self.attacking

    def sent_view(self, x: Tensor) -> Tensor:
        """``x (P, d)`` as the local parties send it: attackers' rows corrupted (a copy)."""
        if not self.attacking:
            return x
        out = x.clone()
        for attack in self.attacks:
            if self.iteration >= attack.start:
                row = self.local.index(attack.rank)
                out[row] = corrupt(x[row], attack)
        return out

    def _ensure(self, device: torch.device) -> None:
        if self._counts is None or self._counts.device != device:
            self._counts = torch.zeros(3, self.n, dtype=torch.long, device=device)
            self._first_bad = torch.full((self.n,), NEVER, dtype=torch.long, device=device)

    def watch(self, theirs: Tensor, senders: Tensor) -> Tensor:
        """Record which of the received ``theirs (E, d)`` are non-finite (on the device)."""
        self._ensure(theirs.device)
        bad = ~torch.isfinite(theirs).all(dim=1)
        at = torch.full(bad.shape, NEVER, dtype=torch.long, device=bad.device)
        at = at.masked_fill(bad, self.iteration)
        self._first_bad = self._first_bad.scatter_reduce(0, senders, at, reduce="amin")
        return bad

    def clipped_delta(self, own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor,
                      senders: Tensor, p: int) -> Tensor:  # fmt: skip
        """:func:`clipped_update`'s increments (``own``: one row per edge), with the drops
        and clips counted per sender."""
        delta, dropped, clipped = clipped_update(own, theirs, weights, receivers, p)
        self._ensure(own.device)
        assert self._counts is not None
        self._counts[0].index_add_(0, senders, torch.ones_like(senders))
        self._counts[1].index_add_(0, senders, dropped.long())
        self._counts[2].index_add_(0, senders, clipped.long())
        return delta

    def mix(self, own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor,
            senders: Tensor, self_weight: Tensor) -> Tensor:  # fmt: skip
        """The new rows ``(P, d)`` from the own rows ``own (P, d)`` and one row per edge."""
        if self.robust:
            return own + self.clipped_delta(
                own[receivers], theirs, weights, receivers, senders, own.shape[0]
            )
        self.watch(theirs, senders)
        out = own * self_weight[:, None]
        return out.index_add(0, receivers, theirs * weights[:, None])

    def first_non_finite(self) -> tuple[int, int] | None:
        """``(sender, iteration)`` of the earliest non-finite message received (host sync)."""
        if self.robust or self._first_bad is None:
            return None
        at = int(self._first_bad.min())
        if at >= NEVER:
            return None
        return int((self._first_bad == at).nonzero()[0]), at

    def events(self) -> list[dict[str, Any]]:
        """``party_events`` entries: every sender whose messages were dropped or clipped."""
        if self._counts is None:
            return []
        received, dropped, clipped = (row.tolist() for row in self._counts.cpu())
        return [
            {
                "rank": j, "iteration": self.iteration, "event": "robust",
                "reason": f"{dropped[j]} dropped and {clipped[j]} clipped of the {received[j]} "
                "messages received from it",
                "received": received[j], "dropped": dropped[j], "clipped": clipped[j],
            }
            for j in range(self.n)
            if dropped[j] + clipped[j] > 0
        ]  # fmt: skip

    def suspects(self) -> list[str]:
        """One line per sender whose messages were mostly (over half) dropped or clipped."""
        return [
            f"party {e['rank']} is misbehaving or far from its neighbours: --robust clip "
            f"{e['reason']}"
            for e in self.events()
            if e["dropped"] + e["clipped"] > e["received"] / 2
        ]
