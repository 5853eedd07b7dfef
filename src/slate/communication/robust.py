r"""Gossip with a misbehaving neighbour: test-only attacks, watching what arrives, and clipping.

**Attacks (tests only).** ``SLATE_ATTACK=RANK@ITER:KIND[,...]`` makes party ``RANK`` misbehave from
iteration ``ITER`` on. The gossip kinds (:data:`GOSSIP_KINDS`) corrupt what it sends its
neighbours while its own copy stays honest: ``nan`` (every value NaN), ``scale:F`` (times
``F``), ``signflip`` (times -1) or ``zeros``. On both engines: the simulator mixes the
attacker's corrupted row into the others' rows, a distributed process sends it; under CHOCO the
corrupted vector is what the attacker compresses and sends (:func:`parse_attacks`,
:class:`MessageGuard`). The other kinds are an insider's lies in the final average, the
evaluation counts and the set-up sums, told by a distributed process only
(:mod:`slate.training.lies`).

**Watching (always).** Every received neighbour value is checked, on the device and without a
host synchronisation, for non-finite entries and for an absurd size (a norm over ``ABSURD``
:math:`= 10^6` times :math:`1 + \lVert x_i \rVert`: a model scaled by :math:`10^{30}` stays
finite in float32, and would otherwise make the receiver diverge and be blamed). The training
loop looks once per chunk (:meth:`MessageGuard.first_non_finite`) and, without ``--robust``,
stops naming the sender.

**``--robust clip``** (self-centred clipping, ClippedGossip: He, Karimireddy and Jaggi, 2022).
Party :math:`i` mixes

.. math::

    x_i \leftarrow x_i + \sum_j w_{ij}\, \mathrm{clip}(x_j - x_i, \tau_i), \qquad
    \mathrm{clip}(v, \tau) = v \min(1, \tau / \lVert v \rVert),

which equals :math:`\sum_j w_{ij} x_j` when nothing is clipped. A message with a non-finite
entry is dropped (its weight returns to :math:`x_i`) and its sender recorded. :math:`\tau_i` is
twice the lower median of a window of recent distances (:class:`ClipMemory`): the distances
:math:`\lVert x_j - x_i \rVert` of the last messages :math:`i` mixed, and, once a round, its
own movement :math:`\lVert x_i - x_i^{\text{last mix}} \rVert` (how far its local steps took
it since its last mix), ``WINDOW`` values in all (at least twice a round's), this round's
included. While at most half of the window comes from attackers, :math:`\tau_i` is at most
twice an honest value, so one attacker moves :math:`x_i` by no more than an honest neighbour's
pull could, whatever it sends; the factor 2 lets the ordinary spread of honest distances pass
unclipped. Why the own movement: neighbours drift apart at about the rate each moves, and the
attacker cannot set this value. On a one-peer topology (base-2: one message a round, half of
them from an attacking neighbour) it keeps the honest values a majority, and at the very first
round it is what the lone message is measured against; without it, a first message from an
attacker passes unclipped and drags :math:`x_i` away from its honest neighbours, after which
every distance it sees is large.

**Exclusion.** Clipping bounds an attacker's pull but does not remove it: a neighbour that is
clipped every round still pulls with strength :math:`\tau_i`, always the wrong way. For every
pair (receiver :math:`i`, sender :math:`j`), :math:`i` keeps the moving rate
:math:`r_{ij} \leftarrow r_{ij} + \beta(b - r_{ij})`, :math:`\beta =` ``REFUSED_STEP``
:math:`= 1/8`, with :math:`b = 1` when the message was dropped or clipped. Once ``EXCLUDE_AFTER``
:math:`= 16` messages came from :math:`j` and :math:`r_{ij} \ge` ``EXCLUDE_RATE`` :math:`= 0.8`
(13 refusals in a row from :math:`r = 0`), :math:`i` excludes :math:`j` from the next round on,
for the rest of the run: its messages are neither mixed (their weight returns to :math:`x_i`)
nor counted in :math:`\tau_i`. An honest neighbour is clipped only while it is more than twice
as far as the window's median, which does not go on for a dozen rounds unless its model really
is far from the others' (an honest site with very different data can be excluded too; it is
named, as every exclusion is, in ``summary.json``). A change of the party set starts the window
and the exclusions again (:meth:`MessageGuard.restart`). Under CHOCO the clip acts on the
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
    "GOSSIP_KINDS",
    "KINDS",
    "LIE_KINDS",
    "RECORD_SHAPE",
    "Attack",
    "ClipMemory",
    "ClipOutcome",
    "MessageGuard",
    "clipped_update",
    "corrupt",
    "events_from_records",
    "parse_attacks",
    "suspect_lines",
]

ATTACK_ENV = "SLATE_ATTACK"
GOSSIP_KINDS = ("nan", "scale", "signflip", "zeros")
#: The insider's lies outside gossip (:mod:`slate.training.lies`).
LIE_KINDS = ("final-poison", "eval-inflate", "eval-deflate", "rows", "stats-scale",
             "fake-categories", "impute")  # fmt: skip
KINDS = GOSSIP_KINDS + LIE_KINDS
FACTOR_KINDS = ("scale", "rows", "stats-scale", "impute")  # KIND:F, F a number
NEVER = 1 << 62  # "no non-finite message yet"
CLIP_FACTOR = 2.0  # tau = CLIP_FACTOR x the lower median of recent neighbour distances
WINDOW = 16  # distances behind tau: the last 16 messages (at least twice a round's)
REFUSED_STEP = 1 / 8  # beta: the step of the per-pair rate of refused messages
EXCLUDE_AFTER = 16  # messages from a sender before it can be excluded ...
EXCLUDE_RATE = 0.8  # ... once this share of them (the moving rate) was refused
MAX_GROUPINGS = 64  # rounds' edge groupings kept (a topology's cycle is shorter)
ABSURD = 1e6  # without --robust: a message this many times larger than 1 + |own| is named


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
            problem = f"KIND must be one of {', '.join(_kind_forms())}, not {kind!r}"
        elif (kind in FACTOR_KINDS) != bool(argument):
            problem = (f"{kind} takes a factor ({kind}:F)" if kind in FACTOR_KINDS
                       else f"{kind} takes no factor")  # fmt: skip
        factor = 1.0
        if problem is None and kind in FACTOR_KINDS:
            try:
                factor = float(argument)
            except ValueError:
                problem = f"the factor {argument!r} is not a number"
        if problem is not None:
            raise ConfigError(f"{ATTACK_ENV}: bad part {item!r}: {problem}")
        attacks.append(Attack(int(who), int(when), kind, factor))
    return attacks


def _kind_forms() -> list[str]:
    return [f"{kind}:F" if kind in FACTOR_KINDS else kind for kind in KINDS]


def corrupt(x: Tensor, attack: Attack) -> Tensor:
    """What the attacker sends in place of ``x`` (a new tensor; ``x`` is not changed)."""
    if attack.kind == "nan":
        return torch.full_like(x, math.nan)
    if attack.kind == "zeros":
        return torch.zeros_like(x)
    if attack.kind == "signflip":
        return -x
    return x * attack.factor


def _by_receiver(receivers: Tensor, p: int) -> Tensor:
    """For edges grouped by receiver: a ``(P, kmax)`` index into the edges, ``E`` for padding
    (a host synchronisation, except for a single row)."""
    if p == 1:
        return torch.arange(len(receivers), device=receivers.device)[None]
    counts = torch.bincount(receivers.cpu(), minlength=p)
    kmax = max(1, int(counts.max()) if len(counts) else 1)
    layout = torch.full((p, kmax), len(receivers), dtype=torch.long)
    filled = [0] * p
    for e, r in enumerate(receivers.tolist()):
        layout[r, filled[r]] = e
        filled[r] += 1
    return layout.to(receivers.device)


class ClipMemory:
    """What ``--robust clip`` remembers between rounds, per receiving row (module docstring).

    ``window (P, WINDOW + 1)``: each row's last distances, a ring (NaN: not yet filled; the last
    column is scratch); ``refused (P, n)``: :math:`r_{ij}`; ``seen (P, n)``: messages counted
    per pair;
    ``excluded_at (P, n)``: the iteration at which the row excluded the sender (``NEVER``: not).
    """

    def __init__(self, p: int, n: int, device: torch.device, dtype: torch.dtype) -> None:
        self.window = torch.full((p, WINDOW + 1), math.nan, dtype=dtype, device=device)
        self.filled = torch.zeros(p, dtype=torch.long, device=device)
        self.refused = torch.zeros(p, n, dtype=dtype, device=device)
        self.seen = torch.zeros(p, n, dtype=torch.long, device=device)
        self.excluded_at = torch.full((p, n), NEVER, dtype=torch.long, device=device)
        self.last: Tensor | None = None  # (P, d): the rows as the last mix left them
        self._groupings: dict[tuple[int, bool], tuple[Tensor, Tensor, Tensor]] = {}

    def grouping(self, receivers: Tensor, own_rows: bool) -> tuple[Tensor, Tensor]:
        """The receiving row of each of this round's values (the edges', then, with
        ``own_rows``, one per row for its own movement) and their :func:`_by_receiver` layout.
        Kept for as long as the same ``receivers`` tensor comes back (the simulator and CHOCO
        keep one per round of the topology's cycle), so that a round costs no host
        synchronisation and no Python loop over its edges."""
        key = (id(receivers), own_rows)
        kept = self._groupings.get(key)
        if kept is not None and kept[0] is receivers:
            return kept[1], kept[2]
        p = self.window.shape[0]
        rows = torch.arange(p, device=receivers.device)
        every = torch.cat([receivers, rows]) if own_rows else receivers
        layout = _by_receiver(every, p)
        if p > 1:  # one row: nothing to save, and a new tensor every round
            if len(self._groupings) >= MAX_GROUPINGS:
                self._groupings.clear()
            self._groupings[key] = (receivers, every, layout)
        return every, layout

    def excluded(self, receivers: Tensor, senders: Tensor) -> Tensor:
        """Per edge, whether its receiver has excluded its sender."""
        return self.excluded_at[receivers, senders] < NEVER

    def threshold(self, dist: Tensor, usable: Tensor, receivers: Tensor, layout: Tensor) -> Tensor:
        """Push this round's usable distances into each receiving row's window (over its oldest
        values) and return :math:`\tau` per edge (NaN, so nothing is clipped, while empty).

        A round's values go in ascending order, so that what a row keeps does not depend on
        the order of its edges: every engine, whatever order its messages arrive in, computes
        the same :math:`\tau`. ``receivers`` and ``layout``: :meth:`grouping`'s."""
        self._widen(2 * layout.shape[1])
        size = self.window.shape[1] - 1  # the last column takes what is not pushed
        inf = dist.new_full((1,), math.inf)
        values = torch.cat([torch.where(usable, dist, inf), inf])[layout].sort(dim=1).values
        pushed = torch.isfinite(values)
        place = (self.filled[:, None] + pushed.long().cumsum(1) - 1) % size
        self.window.scatter_(1, torch.where(pushed, place, size), values)
        self.filled += pushed.sum(1)
        tau = CLIP_FACTOR * self.window[:, :size].nanmedian(dim=1).values
        return tau[receivers]

    def _widen(self, size: int) -> None:
        """At least ``size`` values per row: twice a round's messages, so that a round never
        overwrites its own values."""
        have = self.window.shape[1] - 1
        if size <= have:
            return
        grown = self.window.new_full((self.window.shape[0], size + 1), math.nan)
        kept = self.filled.clamp(max=have)  # unwrap the ring: oldest first
        order = (
            self.filled[:, None] - kept[:, None] + torch.arange(have, device=kept.device)
        ) % have
        grown[:, :have] = self.window.gather(1, order)
        self.filled = kept
        self.window = grown

    def record(self, receivers: Tensor, senders: Tensor, refused: Tensor, counted: Tensor,
               iteration: int) -> None:  # fmt: skip
        """Update :math:`r_{ij}` for the ``counted`` edges and exclude where the rule says so."""
        pair = receivers * self.refused.shape[1] + senders
        rate, seen = self.refused.view(-1), self.seen.view(-1)
        step = counted.to(rate.dtype) * REFUSED_STEP
        rate[pair] = rate[pair] + step * (refused.to(rate.dtype) - rate[pair])
        seen[pair] = seen[pair] + counted.long()
        excluded_at = self.excluded_at.view(-1)
        newly = counted & (seen[pair] >= EXCLUDE_AFTER) & (rate[pair] >= EXCLUDE_RATE)
        excluded_at[pair] = torch.where(newly, iteration, excluded_at[pair])

    def movement(self, rows: Tensor) -> Tensor:
        """Per row, :math:`\\lVert x_i - x_i^{\text{last mix}} \rVert`: how far its own local
        steps took it since its last mix (NaN when unknown)."""
        if self.last is None or self.last.shape != rows.shape:
            return rows.new_full((rows.shape[0],), math.nan)
        return torch.linalg.vector_norm(rows - self.last, dim=1)

    def state_dict(self) -> dict[str, Tensor]:
        state = {name: getattr(self, name).cpu().clone() for name in MEMORY_FIELDS}
        if self.last is not None:
            state["last"] = self.last.cpu().clone()
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name in MEMORY_FIELDS:
            mine = getattr(self, name)
            setattr(self, name, state[name].to(mine.device, mine.dtype).clone())
        last = state.get("last")
        self.last = None if last is None else last.to(self.window.device, self.window.dtype)


MEMORY_FIELDS = ("window", "filled", "refused", "seen", "excluded_at")


@dataclass(frozen=True)
class ClipOutcome:
    """:func:`clipped_update`'s result: the ``(P, d)`` increments, and per edge whether it was
    dropped (non-finite), clipped, or ignored (its sender excluded)."""

    delta: Tensor
    dropped: Tensor
    clipped: Tensor
    ignored: Tensor


def clipped_update(
    own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor, senders: Tensor,
    memory: ClipMemory, iteration: int, movement: Tensor | None = None,
) -> ClipOutcome:  # fmt: skip
    """Self-centred clipped mixing's increments, with :class:`ClipMemory`'s threshold and
    exclusion (module docstring).

    Args:
        own: ``(E, d)``, the receiver's own value for each edge.
        theirs: ``(E, d)``, what came over the edge.
        weights: ``(E,)``, :math:`w_{ij}`.
        receivers: ``(E,)``, each edge's receiving row in ``0..P-1`` (``P`` rows of ``memory``).
        senders: ``(E,)``, each edge's sending party.
        memory: the receiving rows' memory, updated in place.
        iteration: this round's iteration (recorded at an exclusion).
        movement: ``(P,)``, each row's own movement since its last mix
            (:meth:`ClipMemory.movement`), counted in the window as one more distance.

    Returns:
        The increments :math:`\\sum_j w_{ij} \\mathrm{clip}(x_j - x_i, \\tau_i)` over usable
        edges, and what happened to each edge.
    """
    p = memory.window.shape[0]
    finite = torch.isfinite(theirs).all(dim=1)
    ignored = memory.excluded(receivers, senders)
    usable = finite & ~ignored
    zero = torch.zeros((), dtype=own.dtype, device=own.device)
    diff = torch.where(usable[:, None], theirs - own, zero)
    dist = torch.linalg.vector_norm(diff, dim=1)
    every, layout = memory.grouping(receivers, movement is not None)
    if movement is not None:
        dist = torch.cat([dist, movement])
        usable = torch.cat([usable, torch.isfinite(movement) & (movement > 0)])
    tau = memory.threshold(dist, usable, every, layout)[: len(receivers)]
    dist, usable = dist[: len(receivers)], usable[: len(receivers)]
    clipped = usable & (dist > tau)
    scale = torch.where(clipped, tau / dist, torch.ones_like(dist))
    out = torch.zeros(p, diff.shape[1], dtype=diff.dtype, device=diff.device)
    out.index_add_(0, receivers, diff * (weights * scale)[:, None])
    memory.record(receivers, senders, clipped | ~finite, ~ignored, iteration)
    return ClipOutcome(out, ~finite & ~ignored, clipped, ignored)


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
        self.attacks = [a for a in attacks if a.rank in self.local and a.kind in GOSSIP_KINDS]
        self.iteration = 0
        self._counts: Tensor | None = None  # (4, P, n): received, dropped, clipped, ignored
        self._past: list[list[int]] = []  # records() before the last restart
        self._first_bad: Tensor | None = None  # (n,): first iteration of a non-finite message
        self._memory: ClipMemory | None = None  # --robust clip's, per local row

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

    def _ensure(self, like: Tensor) -> None:
        if self._counts is None or self._counts.device != like.device:
            shape = (4, len(self.local), self.n)
            self._counts = torch.zeros(shape, dtype=torch.long, device=like.device)
            self._first_bad = torch.full((self.n,), NEVER, dtype=torch.long, device=like.device)
        if self.robust and self._memory is None:
            self._memory = ClipMemory(len(self.local), self.n, like.device, like.dtype)

    def watch(self, theirs: Tensor, senders: Tensor, own: Tensor | None = None) -> None:
        """Record, on the device, which of the received ``theirs (E, d)`` are non-finite or
        absurd: over ``ABSURD`` times ``1 + |own|``, the receiver's own value per edge."""
        self._ensure(theirs)
        size = torch.linalg.vector_norm(theirs, dim=1)
        bad = ~torch.isfinite(size)
        if own is not None:
            bad |= size > ABSURD * (1 + torch.linalg.vector_norm(own, dim=1))
        at = torch.full(bad.shape, NEVER, dtype=torch.long, device=bad.device)
        at = at.masked_fill(bad, self.iteration)
        assert self._first_bad is not None
        self._first_bad = self._first_bad.scatter_reduce(0, senders, at, reduce="amin")

    def begin(self, x: Tensor) -> None:
        """The local rows' starting parameters ``x (P, d)``: the first round's own movement is
        measured from them."""
        if self.robust:
            self._ensure(x)
            assert self._memory is not None
            self._memory.last = x.detach().clone()

    def restart(self, local_parties: list[int], x: Tensor) -> None:
        """After a change of the party set: the local parties are now ``local_parties`` with
        rows ``x``; the clipping window and the exclusions start again (the surviving graph
        numbers its parties anew), the counts per sender are kept."""
        self._past = self.records()
        self.local = list(local_parties)
        self._memory = None
        self._counts = None
        self.begin(x)

    def settle(self, rows: Tensor) -> Tensor:
        """The local rows ``(P, d)`` as this round's mix leaves them (returned unchanged)."""
        if self._memory is not None:
            self._memory.last = rows.detach().clone()
        return rows

    def clipped_delta(self, own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor,
                      senders: Tensor, rows: Tensor) -> Tensor:  # fmt: skip
        """:func:`clipped_update`'s increments (``own``: one row per edge; ``receivers``: local
        rows; ``rows (P, d)``: the local rows before this mix), with the drops, clips and
        exclusions counted per sender. The caller passes the mixed rows to :meth:`settle`."""
        self._ensure(own)
        assert self._counts is not None and self._memory is not None
        done = clipped_update(own, theirs, weights, receivers, senders, self._memory,
                              self.iteration, self._memory.movement(rows))  # fmt: skip
        counted = torch.stack([~done.ignored, done.dropped, done.clipped, done.ignored]).long()
        self._counts.view(4, -1).index_add_(1, receivers * self.n + senders, counted)
        return done.delta

    def mix(self, own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor,
            senders: Tensor, self_weight: Tensor) -> Tensor:  # fmt: skip
        """The new rows ``(P, d)`` from the own rows ``own (P, d)`` and one row per edge."""
        if self.robust:
            delta = self.clipped_delta(own[receivers], theirs, weights, receivers, senders, own)
            return self.settle(own + delta)
        self.watch(theirs, senders, own[receivers])
        out = own * self_weight[:, None]
        return out.index_add(0, receivers, theirs * weights[:, None])

    def first_non_finite(self) -> tuple[int, int] | None:
        """``(sender, iteration)`` of the earliest non-finite or absurd message received (a
        host synchronisation)."""
        if self.robust or self._first_bad is None:
            return None
        at = int(self._first_bad.min())
        if at >= NEVER:
            return None
        return int((self._first_bad == at).nonzero()[0]), at

    def records(self) -> list[list[int]]:
        """``[receiver, sender, received, dropped, clipped, ignored, excluded_at]`` (``-1``: not
        excluded) for every pair with a drop, a clip or an exclusion: what this process saw,
        as the parties exchange it (:data:`RECORD_SHAPE`)."""
        if self._counts is None:
            return list(self._past)
        counts = self._counts.cpu()
        excluded = (self._memory.excluded_at.cpu() if self._memory is not None
                    else torch.full(counts.shape[1:], NEVER))  # fmt: skip
        rows = list(self._past)
        for row, sender in ((counts[1] + counts[2] > 0) | (excluded < NEVER)).nonzero().tolist():
            at = int(excluded[row, sender])
            rows.append([self.local[row], sender, *(int(c) for c in counts[:, row, sender]),
                         at if at < NEVER else -1])  # fmt: skip
        return rows

    def events(self, records: list[list[int]] | None = None) -> list[dict[str, Any]]:
        """``party_events`` entries from ``records`` (default: this process's own): one per
        sender with a drop, a clip or an exclusion, summed over the receivers that saw it."""
        return events_from_records(self.records() if records is None else records,
                                   self.iteration)  # fmt: skip

    def suspects(self, records: list[list[int]] | None = None) -> list[str]:
        """:func:`suspect_lines` of :meth:`events`."""
        return suspect_lines(self.events(records))

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the counts and ``--robust clip``'s memory."""
        state: dict[str, Any] = {}
        if self._counts is not None and self._first_bad is not None:
            state.update(counts=self._counts.cpu().clone(), first_bad=self._first_bad.cpu().clone())
        state["past"] = [list(row) for row in self._past]
        if self._memory is not None:
            state["memory"] = self._memory.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], like: Tensor) -> None:
        """Continue from :meth:`state_dict`'s output; ``like``: a tensor on the run's device and
        dtype."""
        self._past = [list(row) for row in state.get("past", [])]
        if "counts" in state:
            self._ensure(like)
            self._counts = state["counts"].to(like.device).clone()
            self._first_bad = state["first_bad"].to(like.device).clone()
        if "memory" in state:
            self._ensure(like)
            assert self._memory is not None
            self._memory.load_state_dict(state["memory"])


#: One row of :meth:`MessageGuard.records`, as the parties exchange it at the end of a run.
RECORD_SHAPE = [int, int, int, int, int, int, int]


def events_from_records(records: list[list[int]], iteration: int) -> list[dict[str, Any]]:
    """Sum :meth:`MessageGuard.records` rows (from one process or all) per sender."""
    by_sender: dict[int, list[list[int]]] = {}
    for row in records:
        by_sender.setdefault(row[1], []).append(row)
    events = []
    for sender, rows in sorted(by_sender.items()):
        received, dropped, clipped, ignored = (sum(r[k] for r in rows) for k in (2, 3, 4, 5))
        event: dict[str, Any] = {
            "rank": sender, "iteration": iteration, "event": "robust",
            "reason": f"{dropped} dropped and {clipped} clipped of the {received} messages "
                      "received from it",
            "received": received, "dropped": dropped, "clipped": clipped,
            "seen_by": sorted({r[0] for r in rows}),
        }  # fmt: skip
        exclusions = [r for r in rows if r[6] >= 0]
        if exclusions:
            by = sorted({r[0] for r in exclusions})
            first = min(r[6] for r in exclusions)
            event["reason"] += (f"; excluded by part{'y' if len(by) == 1 else 'ies'} "
                                f"{', '.join(map(str, by))} from iteration {first}, {ignored} "
                                "later messages ignored")  # fmt: skip
            event.update(excluded_at=first, excluded_by=by, ignored=ignored)
        events.append(event)
    return events


def suspect_lines(events: list[dict[str, Any]]) -> list[str]:
    """One line per ``"robust"`` event whose sender was excluded or whose messages were mostly
    (over half) dropped or clipped."""
    return [
        f"party {e['rank']} is misbehaving or far from its neighbours: --robust clip {e['reason']}"
        for e in events
        if e["event"] == "robust"
        and ("excluded_at" in e or e["dropped"] + e["clipped"] > e["received"] / 2)
    ]
