r"""Gossip with a misbehaving neighbour: watching what arrives, ``--robust clip``, and the
accusations that exclusions are; the guard every communicator mixes through.

**The guard.** A run builds its guard once from ``--robust``
(:func:`slate.security.guards.message_guard`, from the registry of guards) and gives it
to its communicator, which hands it what arrives over each edge and mixes as it says:
:class:`MessageGuard` mixes plainly and watches, :class:`ClippingGuard` (``--robust clip``) clips
and excludes. No communicator knows which; the guard's class is the choice. What the local
parties send goes through the guard's :class:`Sender`: the parties' own rows, or, in a test, the
faults plan's attacker (:class:`slate.faults.attacks.Attacker`), which corrupts them.

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
entry is dropped (its weight returns to :math:`x_i`). Under CHOCO the clip acts on the
reconstructed neighbour model: :math:`\hat x_{j \to i} - \hat x_{i \to j}`.

*The radius.* :math:`\tau_i` is ``CLIP_FACTOR`` :math:`= 2` times the lower median of party
:math:`i`'s own movement :math:`m_i = \lVert x_i - x_i^{\text{last mix}} \rVert` (how far its
own local steps took it between two mixes) over its last ``WINDOW`` :math:`= 16` rounds; before
it has moved once, :math:`\tau_i = 0` and it mixes nothing. Why from its own movement only: no
neighbour can set it. A radius taken from the distances to the neighbours (ClippedGossip's
adaptive choice, and slate's earlier window of them) can be raised by an attacker that stays
plausible: it drags :math:`x_i` away from its honest neighbours, the honest distances grow, the
median with them, and the larger radius lets a larger pull through. On a ring of 4 (w7a),
with such a radius (twice the lower median of the neighbour distances and the own movement)
and the exclusion below, a ``drift:3`` neighbour held the AP at 0.25 against 0.71, and a
``drift:6`` one dragged honest parties :math:`0.9 \lVert x \rVert` apart within 90 rounds.
With the own movement, whatever a neighbour sends moves :math:`x_i` by at most
:math:`w_{ij} \tau_i = 2 w_{ij} \bar m_i` a round: twice its weight times the party's own
step. The factor 2 keeps honest mixing close to plain gossip: honest neighbours were a median
1.3 to 2.5 rounds' own movement apart (rings, exponential and base-2 graphs of 4 to 20 w7a
parties); half to nine tenths of the honest messages are clipped (most on base-2), the
consensus distance was 2 to 4 times plain gossip's and the AP without attacker within 0.006 of
it. A smaller factor bounds an attacker tighter and clips honest neighbours more.

*What it tolerates.* Each bad neighbour pulls :math:`x_i` by at most :math:`2 w_{ij} \bar
m_i`, in total :math:`2 \delta_i \bar m_i` with :math:`\delta_i` the weight of its bad
neighbours; its honest neighbours pull back with :math:`w_{ij} \min(\lVert x_j - x_i \rVert,
\tau_i)`, at most :math:`h_i \tau_i` in total, :math:`h_i` the weight of its honest neighbours.
While :math:`\delta_i < h_i` the honest neighbours out-pull the bad ones before :math:`x_i` is
:math:`\tau_i` from them, whatever the bad ones send; at :math:`\delta_i = h_i` (one of two
ring neighbours bad) only the party's own gradient stops the drag, and the cost is measured
(docs/security.md); past it (most of a party's neighbours bad) the party is not protected.
ClippedGossip's guarantee asks for less bad weight: :math:`\delta_{\max}` of the order of
:math:`\gamma^2`, :math:`\gamma` the spectral gap of the good parties' mixing matrix.

**Exclusion.** For every pair (receiver :math:`i`, sender :math:`j`), :math:`i` keeps the
moving rate :math:`r_{ij} \leftarrow r_{ij} + \beta(b - r_{ij})`, :math:`\beta =`
``REFUSED_STEP`` :math:`= 1/8`, with :math:`b = 1` when the message was non-finite or farther
than ``FAR`` :math:`= 1/2` times :math:`\lVert x_i \rVert` from :math:`x_i`. Once
``EXCLUDE_AFTER`` :math:`= 16` messages came from :math:`j` and :math:`r_{ij} \ge`
``EXCLUDE_RATE`` :math:`= 0.8` (13 such messages in a row from :math:`r = 0`), :math:`i`
excludes :math:`j` from the next round on, for the rest of the run: its messages are neither
mixed (their weight returns to :math:`x_i`) nor clipped. Why so far, and not "clipped again and
again": clipping is not evidence. An honest neighbour is clipped whenever it is more than two
own steps away, and one dragged by an attacker is clipped round after round; the earlier rule
(exclude a sender clipped 13 times in a row) excluded honest parties under ``drift:3`` on a ring
of 4: a neighbour of the attacker was dragged away and its other neighbours excluded it, and a
party that had excluded the attacker was left with a window half of its own movement, clipped
its remaining honest neighbour a dozen rounds running and excluded it too. A message farther
than half the receiver's own model is one no honest party sends: the parties start from one
model, no pull moves a party by more than its clipping radius a round, and the largest distance
between honest neighbours stayed under :math:`0.04 \lVert x_i \rVert` in the ten runs measured
for it (rings, exponential and base-2 graphs of 4 to 16 w7a parties; no attacker,
``signflip``, ``drift:3`` and ``drift:20``). Zeros are :math:`\lVert x_i \rVert` away, a
sign-flipped model about :math:`2 \lVert x_i \rVert`, a model times :math:`10^{30}` far
beyond, NaN is non-finite: those senders are excluded after 16 messages. A sender whose
messages stay plausible, however consistently they pull, is clipped, never excluded: an
undetected drift's cost is bounded by the clip (measured in docs/security.md). A change of the
party set starts the window and the exclusions again (:meth:`MessageGuard.restart`).

**Accusations.** An exclusion is what the receiver that made it says about the sender, not a
fact. At the end of a run the parties exchange their records (:meth:`MessageGuard.records`:
per receiver and sender, messages, drops, clips, far ones, ignored ones and the iteration of an
exclusion), and every site's summary lists, per sender, each receiver's report and the
receivers that excluded it (``accused_by``, ``accusations``); the log says ``party 2 accuses
party 1: ...`` (:func:`accusation_lines`). A participant that lies in its records can accuse
anyone; its accusation is printed as its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from slate.security.accusations import (
    RECORD_SHAPE,
    accusation_lines,
    current_record,
    events_from_records,
)
from slate.security.pulls import NO_PULL, PullRule, PullWatch

__all__ = [
    "RECORD_SHAPE",
    "ClipMemory",
    "ClipOutcome",
    "ClippingGuard",
    "HonestSender",
    "MessageGuard",
    "Sender",
    "accusation_lines",
    "clipped_update",
    "events_from_records",
]

NEVER = 1 << 62  # "no non-finite message yet"
CLIP_FACTOR = 2.0  # tau = CLIP_FACTOR x the lower median of the party's own recent movement
WINDOW = 16  # rounds of own movement behind tau
FAR = 0.5  # a message farther than FAR x |x_i| from x_i is one no honest neighbour sends
REFUSED_STEP = 1 / 8  # beta: the step of the per-pair rate of refused (non-finite or far) ones
EXCLUDE_AFTER = 16  # messages from a sender before it can be excluded ...
EXCLUDE_RATE = 0.8  # ... once this share of them (the moving rate) was refused
COUNTS = 5  # per pair: received, dropped, clipped, far, ignored
ABSURD = 1e6  # without --robust: a message this many times larger than 1 + |own| is named


class ClipMemory:
    """What ``--robust clip`` remembers between rounds, per receiving row (module docstring).

    ``window (P, WINDOW)``: each row's own movement in its last ``WINDOW`` rounds, a ring
    (NaN: not yet filled); ``filled (P,)``: values pushed; ``refused (P, n)``: :math:`r_{ij}`;
    ``seen (P, n)``: messages counted per pair; ``excluded_at (P, n)``: the iteration at which
    the row excluded the sender (``NEVER``: not); ``last (P, d)``: the rows as the last mix
    left them.
    """

    def __init__(self, p: int, n: int, device: torch.device, dtype: torch.dtype) -> None:
        self.window = torch.full((p, WINDOW), math.nan, dtype=dtype, device=device)
        self.filled = torch.zeros(p, dtype=torch.long, device=device)
        self.refused = torch.zeros(p, n, dtype=dtype, device=device)
        self.seen = torch.zeros(p, n, dtype=torch.long, device=device)
        self.excluded_at = torch.full((p, n), NEVER, dtype=torch.long, device=device)
        self.last: Tensor | None = None

    def excluded(self, receivers: Tensor, senders: Tensor) -> Tensor:
        """Per edge, whether its receiver has excluded its sender."""
        return self.excluded_at[receivers, senders] < NEVER

    def threshold(self, movement: Tensor) -> Tensor:
        r"""Push each row's own movement (``movement (P,)``; a non-finite or zero value is not
        pushed) over its oldest value and return :math:`\tau` per row: ``CLIP_FACTOR`` times
        the lower median of the window, 0 while the window is empty (nothing is mixed before
        the row has moved by itself once)."""
        pushed = torch.isfinite(movement) & (movement > 0)
        slot = (self.filled % WINDOW)[:, None]
        kept = self.window.gather(1, slot)[:, 0]
        self.window.scatter_(1, slot, torch.where(pushed, movement, kept)[:, None])
        self.filled += pushed.long()
        tau = CLIP_FACTOR * self.window.nanmedian(dim=1).values
        return torch.nan_to_num(tau, nan=0.0)

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
        r"""Per row, :math:`\lVert x_i - x_i^{\text{last mix}} \rVert`: how far its own local
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
    dropped (non-finite), clipped, far (farther than ``FAR`` times the receiver's norm), or
    ignored (its sender excluded); ``diff`` and ``dist``: each edge's difference and its norm."""

    delta: Tensor
    dropped: Tensor
    clipped: Tensor
    far: Tensor
    ignored: Tensor
    diff: Tensor
    dist: Tensor


def clipped_update(
    own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor, senders: Tensor,
    memory: ClipMemory, iteration: int, movement: Tensor, size: Tensor,
) -> ClipOutcome:  # fmt: skip
    r"""Self-centred clipped mixing's increments, with :class:`ClipMemory`'s threshold and
    exclusion (module docstring).

    Args:
        own: ``(E, d)``, the receiver's own value for each edge (under CHOCO its public copy).
        theirs: ``(E, d)``, what came over the edge.
        weights: ``(E,)``, :math:`w_{ij}`.
        receivers: ``(E,)``, each edge's receiving row in ``0..P-1`` (``P`` rows of ``memory``).
        senders: ``(E,)``, each edge's sending party.
        memory: the receiving rows' memory, updated in place.
        iteration: this round's iteration (recorded at an exclusion).
        movement: ``(P,)``, each row's own movement since its last mix
            (:meth:`ClipMemory.movement`), pushed into its window.
        size: ``(P,)``, each receiving row's norm :math:`\lVert x_i \rVert`.

    Returns:
        The increments :math:`\sum_j w_{ij} \mathrm{clip}(x_j - x_i, \tau_i)` over usable
        edges, and what happened to each edge.
    """
    p = memory.window.shape[0]
    finite = torch.isfinite(theirs).all(dim=1)
    ignored = memory.excluded(receivers, senders)
    usable = finite & ~ignored
    zero = torch.zeros((), dtype=own.dtype, device=own.device)
    diff = torch.where(usable[:, None], theirs - own, zero)
    dist = torch.linalg.vector_norm(diff, dim=1)
    tau = memory.threshold(movement)[receivers]
    clipped = usable & (dist > tau)
    scale = torch.where(clipped, tau / dist, torch.ones_like(dist))
    out = torch.zeros(p, diff.shape[1], dtype=diff.dtype, device=diff.device)
    out.index_add_(0, receivers, diff * (weights * scale)[:, None])
    far = usable & (dist > FAR * size[receivers])
    memory.record(receivers, senders, far | ~finite, ~ignored, iteration)
    return ClipOutcome(out, ~finite & ~ignored, clipped, far, ignored, diff, dist)


class Sender(Protocol):
    """What the local parties send their neighbours, and what they note of what they receive:
    :class:`HonestSender` in a real run (their own rows), the faults plan's attacker in a test
    (:class:`slate.faults.attacks.Attacker`)."""

    @property
    def listens(self) -> bool:
        """Whether :meth:`heard` needs what arrives (else the guard may skip computing it)."""
        ...

    def edge_by_edge(self, iteration: int) -> bool:
        """Whether what a party receives differs from the rows (mixing must go edge by edge)."""
        ...

    def sent(self, x: Tensor, iteration: int) -> Tensor:
        """The local rows ``x (P, d)`` as they are sent at ``iteration``."""
        ...

    def heard(self, own: Tensor, theirs: Tensor, receivers: Tensor) -> None:
        """What arrived over each edge (``theirs (E, d)``, the receiver's own value ``own``)."""
        ...

    def begin(self, x: Tensor) -> None: ...

    def restart(self, local_parties: list[int]) -> None: ...

    def state_dict(self) -> dict[str, Tensor]: ...

    def load_state_dict(self, state: dict[str, Any], like: Tensor) -> None: ...


class HonestSender:
    """The local parties send their own rows, and note nothing of what they receive."""

    listens = False

    def edge_by_edge(self, iteration: int) -> bool:
        del iteration
        return False

    def sent(self, x: Tensor, iteration: int) -> Tensor:
        del iteration
        return x

    def heard(self, own: Tensor, theirs: Tensor, receivers: Tensor) -> None:
        del own, theirs, receivers

    def begin(self, x: Tensor) -> None:
        del x

    def restart(self, local_parties: list[int]) -> None:
        del local_parties

    def state_dict(self) -> dict[str, Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, Any], like: Tensor) -> None:
        del state, like


class MessageGuard:
    """Plain mixing, with the watch on received values (module docstring): the guard of a run
    without ``--robust``. :class:`ClippingGuard` is ``--robust clip``'s.

    A communicator calls :meth:`sent` for what its parties send, then, with one received row
    per edge, :meth:`mix` (the simulator, mixing edge by edge while :attr:`edge_by_edge`),
    :meth:`arrived` (a distributed process) or :meth:`copies_round` (CHOCO's public copies).

    Args:
        n: the number of parties of the run (senders are counted per party index).
        local_parties: the parties whose rows this process holds.
        sender: what the local parties send (default: their own rows).
    """

    #: Whether this guard clips and excludes (``--robust clip``): its records are exchanged at
    #: the end of a run.
    clips: ClassVar[bool] = False

    def __init__(self, n: int, local_parties: list[int], sender: Sender | None = None) -> None:
        self.n = n
        self.local = list(local_parties)
        self.sender: Sender = sender if sender is not None else HonestSender()
        self.iteration = 0
        self._counts: Tensor | None = None  # (COUNTS, P, n): received, dropped, clipped, far,
        # ignored
        self._past: list[list[int]] = []  # records() before the last restart
        self._first_bad: Tensor | None = None  # (n,): first iteration of a non-finite message
        self._memory: ClipMemory | None = None  # --robust clip's, per local row
        self._pulls: PullWatch | None = None  # --robust clip's watch for a persistent pull

    @property
    def edge_by_edge(self) -> bool:
        """Whether mixing must go edge by edge (clipping, or an attacker among the rows)."""
        return self.sender.edge_by_edge(self.iteration)

    def sent(self, x: Tensor) -> Tensor:
        """``x (P, d)`` as the local parties send it (a copy when a row differs)."""
        return self.sender.sent(x, self.iteration)

    def _ensure(self, like: Tensor) -> None:
        if self._counts is None or self._counts.device != like.device:
            shape = (COUNTS, len(self.local), self.n)
            self._counts = torch.zeros(shape, dtype=torch.long, device=like.device)
            self._first_bad = torch.full((self.n,), NEVER, dtype=torch.long, device=like.device)

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
        self.sender.begin(x)

    def restart(self, local_parties: list[int], x: Tensor) -> None:
        """After a change of the party set: the local parties are now ``local_parties`` with
        rows ``x``; the clipping window and the exclusions start again (the surviving graph
        numbers its parties anew), the counts per sender are kept."""
        self._past = self.records()
        self.local = list(local_parties)
        self.sender.restart(self.local)
        self._memory = None
        self._counts = None
        self.begin(x)

    def mix(self, own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor,
            senders: Tensor, self_weight: Tensor) -> Tensor:  # fmt: skip
        """The new rows ``(P, d)`` from the own rows ``own (P, d)`` and one row per edge
        (``theirs (E, d)``, from ``senders`` to the local rows ``receivers`` with ``weights``)."""
        self.sender.heard(own[receivers], theirs, receivers)
        return self.combine(own, theirs, weights, receivers, senders, self_weight)

    def combine(self, own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor,
                senders: Tensor, self_weight: Tensor) -> Tensor:  # fmt: skip
        """:math:`w_{ii} x_i + \\sum_j w_{ij} x_j`, what arrived watched: the rule a guard of
        its own overrides (:class:`ClippingGuard`'s, docs/extending.md), with
        :attr:`edge_by_edge` true so that the simulator mixes through it."""
        self.watch(theirs, senders, own[receivers])
        out = own * self_weight[:, None]
        return out.index_add(0, receivers, theirs * weights[:, None])

    def arrived(self, own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor,
                senders: Tensor, self_weight: Tensor) -> Tensor | None:  # fmt: skip
        """A distributed process's round, as :meth:`mix` takes it: what arrived is watched,
        and None says "mix as usual" (the communicator's own sum)."""
        del weights, self_weight
        self.watch(theirs, senders, own[receivers])
        self.sender.heard(own[receivers], theirs, receivers)
        return None

    def copies_round(self, x: Tensor, arrived: Tensor, received: Tensor, sent: Tensor,
                     slots: Tensor, rows: Tensor, weights: Tensor, senders: Tensor,
                     gamma: float) -> Tensor:  # fmt: skip
        """The end of a CHOCO round (:mod:`slate.communication.choco`):
        :math:`x_i + \\gamma \\sum_j w_{ij} (\\hat x_{j \\to i} - \\hat x_{i \\to j})`, with
        the neighbours' copies ``received`` moved by what ``arrived`` (in place, at ``slots``)
        and the increments watched. ``sent``: the own copies; ``rows``, ``weights (E, 1)`` and
        ``senders``: each edge's local row, weight and sender."""
        own = sent.index_select(0, slots)
        self.watch(arrived, senders, own)
        received.index_add_(0, slots, arrived)
        theirs = received.index_select(0, slots)
        if self.sender.listens:
            self.sender.heard(x.index_select(0, rows), theirs, rows)
        return x.index_add(0, rows, (theirs - own) * weights, alpha=gamma)

    def first_non_finite(self) -> tuple[int, int] | None:
        """``(sender, iteration)`` of the earliest non-finite or absurd message received (a
        host synchronisation)."""
        if self._first_bad is None:
            return None
        at = int(self._first_bad.min())
        if at >= NEVER:
            return None
        return int((self._first_bad == at).nonzero()[0]), at

    def records(self) -> list[list[int]]:
        """``[receiver, sender, received, dropped, clipped, far, ignored, excluded_at]``
        (``-1``: not excluded) for every pair with a drop, a clip, a far message or an
        exclusion: what this process's parties saw, as the parties exchange it
        (:data:`RECORD_SHAPE`)."""
        if self._counts is None:
            return list(self._past)
        counts = self._counts.cpu()
        excluded = (self._memory.excluded_at.cpu() if self._memory is not None
                    else torch.full(counts.shape[1:], NEVER))  # fmt: skip
        rows = list(self._past)
        noted = (counts[1] + counts[2] + counts[3] > 0) | (excluded < NEVER)
        for row, sender in noted.nonzero().tolist():
            at = int(excluded[row, sender])
            rows.append([self.local[row], sender, *(int(c) for c in counts[:, row, sender]),
                         at if at < NEVER else -1, *self._pull_columns(row, sender)])  # fmt: skip
        return rows

    def _pull_columns(self, row: int, sender: int) -> list[int]:
        """A record's pull columns (:mod:`slate.security.pulls`; none without its watch)."""
        return list(NO_PULL) if self._pulls is None else self._pulls.columns(row, sender)

    def events(self, records: list[list[int]] | None = None) -> list[dict[str, Any]]:
        """``party_events`` entries from ``records`` (default: this process's own): one per
        sender that some receiver saw drop, clip, far or excluded (:func:`events_from_records`)."""
        return events_from_records(self.records() if records is None else records,
                                   self.iteration)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the counts, ``--robust clip``'s memory and the sender's."""
        state: dict[str, Any] = {}
        if self._counts is not None and self._first_bad is not None:
            state.update(counts=self._counts.cpu().clone(), first_bad=self._first_bad.cpu().clone())
        state["past"] = [list(row) for row in self._past]
        if self._memory is not None:
            state["memory"] = self._memory.state_dict()
        state.update(self.sender.state_dict())  # drift's (tests only)
        return state

    def load_state_dict(self, state: dict[str, Any], like: Tensor) -> None:
        """Continue from :meth:`state_dict`'s output; ``like``: a tensor on the run's device and
        dtype."""
        self._past = [current_record(row) for row in state.get("past", [])]
        if "counts" in state:
            self._ensure(like)
            counts = state["counts"]
            if counts.shape[0] == COUNTS - 1:  # written before the far count: none then
                counts = torch.cat([counts[:3], torch.zeros_like(counts[:1]), counts[3:]])
            self._counts = counts.to(like.device).clone()
            self._first_bad = state["first_bad"].to(like.device).clone()
        self.sender.load_state_dict(state, like)


class ClippingGuard(MessageGuard):
    """``--robust clip``: each received difference clipped, non-finite messages dropped, senders
    excluded, and every exclusion recorded as its receiver's accusation (module docstring)."""

    clips = True
    #: The persistent-pull watch's thresholds (:mod:`slate.security.pulls`).
    pull_rule: ClassVar[PullRule] = PullRule()

    @property
    def edge_by_edge(self) -> bool:
        return True

    def _ensure(self, like: Tensor) -> None:
        super()._ensure(like)
        if self._memory is None:
            self._memory = ClipMemory(len(self.local), self.n, like.device, like.dtype)
        if self._pulls is None and like.dim() == 2:
            self._pulls = PullWatch(len(self.local), self.n, like.shape[1], like.device,
                                    like.dtype, self.pull_rule)  # fmt: skip

    def restart(self, local_parties: list[int], x: Tensor) -> None:
        self._pulls = None
        super().restart(local_parties, x)

    def begin(self, x: Tensor) -> None:
        super().begin(x)
        self._ensure(x)
        assert self._memory is not None
        self._memory.last = x.detach().clone()

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
                              self.iteration, self._memory.movement(rows),
                              torch.linalg.vector_norm(rows, dim=1))  # fmt: skip
        assert self._pulls is not None
        self._pulls.observe(receivers, senders, done.diff, done.dist, done.clipped,
                            ~done.ignored & ~done.dropped, self.iteration)  # fmt: skip
        counted = torch.stack(
            [~done.ignored, done.dropped, done.clipped, done.far, done.ignored]
        ).long()
        self._counts.view(COUNTS, -1).index_add_(1, receivers * self.n + senders, counted)
        return done.delta

    def combine(self, own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor,
                senders: Tensor, self_weight: Tensor) -> Tensor:  # fmt: skip
        """:math:`x_i + \\sum_j w_{ij} \\mathrm{clip}(x_j - x_i, \\tau_i)`."""
        del self_weight
        delta = self.clipped_delta(own[receivers], theirs, weights, receivers, senders, own)
        return self.settle(own + delta)

    def arrived(self, own: Tensor, theirs: Tensor, weights: Tensor, receivers: Tensor,
                senders: Tensor, self_weight: Tensor) -> Tensor | None:  # fmt: skip
        """The clipped mix of a distributed process's round."""
        return self.mix(own, theirs, weights, receivers, senders, self_weight)

    def copies_round(self, x: Tensor, arrived: Tensor, received: Tensor, sent: Tensor,
                     slots: Tensor, rows: Tensor, weights: Tensor, senders: Tensor,
                     gamma: float) -> Tensor:  # fmt: skip
        """CHOCO's round end under ``--robust clip``: a non-finite increment is dropped (the
        copy keeps its value) and :math:`\\hat x_{j \\to i} - \\hat x_{i \\to j}` is clipped."""
        finite = torch.isfinite(arrived).all(dim=1, keepdim=True)
        received.index_add_(0, slots, torch.where(finite, arrived, 0.0))
        theirs = torch.where(finite, received.index_select(0, slots), math.nan)
        own = sent.index_select(0, slots)
        self.sender.heard(x.index_select(0, rows), theirs, rows)
        delta = self.clipped_delta(own, theirs, weights[:, 0], rows, senders, x)
        return self.settle(x + gamma * delta)

    def first_non_finite(self) -> tuple[int, int] | None:
        """None: a non-finite message is dropped, never mixed."""
        return None

    def load_state_dict(self, state: dict[str, Any], like: Tensor) -> None:
        super().load_state_dict(state, like)
        if "memory" in state:
            self._ensure(like)
            assert self._memory is not None
            self._memory.load_state_dict(state["memory"])
        if "pulls" in state and self._pulls is not None:
            self._pulls.load_state_dict(state["pulls"])

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._pulls is not None:
            state["pulls"] = self._pulls.state_dict()
        return state
