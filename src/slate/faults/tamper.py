"""Tampering with sealed messages (tests only), so that a real run can show the receiver refusing
a bad message and naming its sender, and a site dying half-way through a masked sum
(:mod:`slate.engines.distributed.wire.sealed_wire` calls :class:`Tamper` on every message it
seals and opens and on every masked sum, when the faults plan gives it one)."""

from __future__ import annotations

from torch import Tensor

__all__ = ["DIE_IN_SUM_ENV", "FLIP_ENV", "HOOKS", "RELAY_ENV", "REPLAY_ENV", "Tamper"]

#: Test-only hooks, so that a real run can show the receiver refusing a bad message and naming
#: its sender. Each is ``RANK@N``: party RANK tampers once with a message it sends, the N-th it
#: seals or the first after that the hook can use, counted from 0 over all its channels and
#: generations (so a party that was counted lost and came back does not tamper again).
#: ``SLATE_FLIP_SEALED`` flips one byte of it.
FLIP_ENV = "SLATE_FLIP_SEALED"
#: ``SLATE_REPLAY_SEALED`` sends, in its place, the previous message it sealed for that peer (a
#: replayed message; the first from N on whose previous message has the same size).
REPLAY_ENV = "SLATE_REPLAY_SEALED"
#: ``SLATE_RELAY_SEALED`` sends, in its place, the last message of the same size that another
#: member sealed for RANK (a message of the wrong sender: that member's, as RANK's).
RELAY_ENV = "SLATE_RELAY_SEALED"
#: ``SLATE_DIE_IN_SUM=RANK@N``: in the N-th masked sum it makes (counted from 0 over the whole
#: process), party RANK sends its masked words to one member only (the next in group order) and
#: SIGKILLs itself: that member holds a complete set of words while the others miss RANK's, the
#: worst moment for a sum to lose a member.
DIE_IN_SUM_ENV = "SLATE_DIE_IN_SUM"
MESSAGE_HOOKS = (FLIP_ENV, REPLAY_ENV, RELAY_ENV)
HOOKS = (*MESSAGE_HOOKS, DIE_IN_SUM_ENV)


class Tamper:
    """Test-only: what this party does to one message it sends (:data:`FLIP_ENV`,
    :data:`REPLAY_ENV`, :data:`RELAY_ENV`), counting its sealed messages over the whole
    process (its engine keeps one over every generation). Only made when one of the hooks names
    this party's rank (:meth:`slate.faults.FaultPlan.tamper`)."""

    def __init__(self, due: dict[str, int]) -> None:
        self.due = due  # hook -> the first message (or sum) it may act on; removed once it did
        self.sealed = 0
        self.sums = 0
        # (peer, size) -> the last message of that size sealed for it; (sender, size) -> the
        # last of that size received (kept by size: a sum's digests go between its messages)
        self.last_out: dict[tuple[int, int], Tensor] = {}
        self.last_in: dict[tuple[int, int], Tensor] = {}

    def sending(self, sealed: Tensor, peer: int) -> Tensor:
        """What goes to global rank ``peer`` in place of ``sealed``: ``sealed`` itself, unless a
        hook is due and can act on it."""
        count, self.sealed = self.sealed, self.sealed + 1
        out = sealed
        for hook in [h for h, at in self.due.items() if at <= count and h in MESSAGE_HOOKS]:
            if hook == FLIP_ENV:
                out = sealed.clone()
                out[0] ^= 1
            elif hook == REPLAY_ENV:
                out = _same_size(sealed, [self.last_out.get((peer, sealed.numel()))])
            else:
                out = _same_size(sealed, [m for (r, _), m in self.last_in.items() if r != peer])
            if out is not sealed:
                del self.due[hook]
                break
        self.last_out[(peer, sealed.numel())] = sealed
        return out

    def dies_in_sum(self) -> bool:
        """Whether this party dies in the masked sum it is making (:data:`DIE_IN_SUM_ENV`)."""
        count, self.sums = self.sums, self.sums + 1
        return self.due.get(DIE_IN_SUM_ENV) == count

    def received(self, sealed: Tensor, sender: int) -> None:
        """Keep the last sealed message of global rank ``sender`` (for :data:`RELAY_ENV`)."""
        self.last_in[(sender, sealed.numel())] = sealed.detach().cpu().clone()


def _same_size(sealed: Tensor, candidates: list[Tensor | None]) -> Tensor:
    """The first of ``candidates`` as large as ``sealed``, else ``sealed`` itself."""
    for other in candidates:
        if other is not None and other.numel() == sealed.numel():
            return other.clone()
    return sealed
