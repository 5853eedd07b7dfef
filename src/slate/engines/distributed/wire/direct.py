"""Small collectives as one direct exchange: every member sends its tensor to every other member
in one ``batch_isend_irecv`` step, and each combines what it holds in rank order.

A ring all-reduce (gloo's, for any size) takes :math:`2(N-1)` dependent steps, each a network
round trip: on a wide-area link that is latency, not bandwidth. For a small tensor (flags,
evaluation counts, set-up sums, JSON facts, the model average of a small model) one direct
exchange costs about one round trip whatever N, at :math:`N-1` times the bytes each member
sends; :data:`DIRECT_BYTES` is where the engine stops using it (per message). The members
combine the gathered tensors in rank order (:data:`REDUCERS`), so every member gets the same
bits.

:class:`DirectWire` is the plain exchange; :class:`~slate.engines.distributed.wire.sealed_wire.
SealedWire` overrides only how a message is sent and opened (sealed) and how a sum is made
(masked), and carries every exchange of a run under a roster, whatever its size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from slate.engines.base import DIRECT_BYTES  # the largest message exchanged directly

__all__ = ["DIRECT_BYTES", "REDUCERS", "DirectWire", "Posted"]


@dataclass(frozen=True)
class Posted:
    """A receive posted ahead (:meth:`DirectWire.post_receives`): from the member at index
    ``peer``, into ``buffer``, completed when ``work`` is."""

    peer: int
    buffer: Tensor
    work: Any


REDUCERS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "sum": torch.add,
    "min": torch.minimum,
    "max": torch.maximum,
}


class DirectWire:
    """Party ``rank``'s direct exchanges with the other ``members`` (global ranks, in group
    order) of one generation. Peers are named by their index in ``members`` (the group rank)."""

    def __init__(self, rank: int, members: tuple[int, ...]) -> None:
        self.rank, self.members = rank, tuple(members)
        self.index = self.members.index(rank)

    # -- one message (what a sealed wire overrides) ------------------------------------------

    def outgoing(self, tensor: Tensor, peer: int) -> Tensor:
        """What is sent to the member at index ``peer`` for ``tensor``: the tensor itself."""
        del peer
        return tensor.contiguous()

    def buffer(self, like: Tensor) -> Tensor:
        """An empty receive buffer for a message like ``like``."""
        return torch.empty_like(like)

    def incoming(self, received: Tensor, peer: int, like: Tensor) -> Tensor:
        """The message of the member at index ``peer``, as received (of ``like``'s type)."""
        del peer, like
        return received

    def refused(self, waiter: Any, err: Exception) -> Exception:
        """What a message that does not open raises (never, for a plain message)."""
        del waiter
        return err

    # -- exchanges -----------------------------------------------------------------------------

    def post_receives(
        self, waiter: Any, receives: list[tuple[int, Tensor]], group: Any = None, tag: int = 0
    ) -> list[Posted]:
        """Post a receive of one message like each ``(peer, like)`` of ``receives`` now, to be
        waited for by a later :meth:`swap` (``posted=``). gloo sends a message only once its
        receiver has posted the receive: a receive posted ahead saves that notice's trip."""
        buffers = [(p, self.buffer(like)) for p, like in receives]
        ops = [dist.P2POp(dist.irecv, b, self._global(p, group), group, tag) for p, b in buffers]
        if not ops:
            return []
        works = waiter.post(lambda: dist.batch_isend_irecv(ops), [p for p, _ in receives])
        return [Posted(p, b, w) for (p, b), w in zip(buffers, works, strict=True)]

    def swap(
        self,
        waiter: Any,
        sends: list[tuple[int, Tensor]],
        receives: list[tuple[int, Tensor]],
        group: Any = None,
        check: Callable[[int, Tensor], None] | None = None,
        tag: int = 0,
        posted: list[Posted] | None = None,
    ) -> list[Tensor]:
        """Send each ``(peer, tensor)`` of ``sends`` and receive one message like each
        ``(peer, like)`` of ``receives``, all at once; the received messages, in order.
        Receives are waited for (and opened, then ``check``-ed) before sends. ``posted``: the
        receives, already posted by :meth:`post_receives` (same peers, same order)."""
        out_messages = [(p, self.outgoing(t, p)) for p, t in sends]
        ops = [dist.P2POp(dist.isend, m, self._global(p, group), group, tag)
               for p, m in out_messages]  # fmt: skip
        if posted is None:
            buffers = [(p, self.buffer(like)) for p, like in receives]
            ops += [dist.P2POp(dist.irecv, b, self._global(p, group), group, tag)
                    for p, b in buffers]  # fmt: skip
        else:
            assert [r.peer for r in posted] == [p for p, _ in receives]
            buffers = [(r.peer, r.buffer) for r in posted]
        if not ops and not buffers:
            return []
        peers = sorted({p for p, _ in sends} | {p for p, _ in receives})
        works = waiter.post(lambda: dist.batch_isend_irecv(ops), peers) if ops else []
        k = len(out_messages)
        receiving = works[k:] if posted is None else [r.work for r in posted]
        received = []
        for (p, buf), (_, like), work in zip(buffers, receives, receiving, strict=True):
            waiter.point_to_point(work, p)
            message = self._opened(waiter, buf, p, like)
            if check is not None:
                check(p, message)
            received.append(message)
        for (p, _), work in zip(out_messages, works[:k], strict=True):
            waiter.point_to_point(work, p)
        return received

    def _opened(self, waiter: Any, buf: Tensor, peer: int, like: Tensor) -> Tensor:
        return self.incoming(buf, peer, like)

    def _global(self, peer: int, group: Any) -> int:
        return peer if group is None else dist.get_global_rank(group, peer)

    def _everyone_else(self) -> list[int]:
        return [i for i in range(len(self.members)) if i != self.index]

    def gather(self, waiter: Any, value: Tensor) -> list[Tensor]:
        """Every member's ``value`` (all the same size and type), in rank order."""
        others = self._everyone_else()
        received = self.swap(waiter, [(p, value) for p in others], [(p, value) for p in others])
        parts = dict(zip(others, received, strict=True))
        parts[self.index] = value.clone()
        return [parts[i] for i in range(len(self.members))]

    def reduce(
        self, waiter: Any, value: Tensor, op: str, what: str = "", narrow: bool = False
    ) -> Tensor:
        """``value`` combined over every member with ``op`` (``sum``, ``min``, ``max``) in
        rank order: every member gets the same bits. ``what`` names the quantity and ``narrow``
        asks for a sealed wire's one-word floats (its refusals, recorder and masks use them)."""
        del what, narrow
        return self.combined(waiter, value, op)

    def combined(self, waiter: Any, value: Tensor, op: str) -> Tensor:
        """Every member's ``value`` gathered, then combined with ``op`` in rank order."""
        parts = self.gather(waiter, value)
        out = parts[0]
        for part in parts[1:]:
            out = REDUCERS[op](out, part)
        return out

    def broadcast(self, waiter: Any, value: Tensor, src: int) -> None:
        """Member ``src``'s ``value`` (index) written into ``value`` on every member."""
        if self.index == src:
            self.swap(waiter, [(p, value) for p in self._everyone_else()], [])
        else:
            value.copy_(self.swap(waiter, [], [(src, value)])[0])
