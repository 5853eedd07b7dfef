"""Gossip between the distributed engine's processes: neighbour-only point-to-point messages.

:class:`DistributedCommunicator` is the distributed engine's communicator
(:class:`slate.engines.distributed.engine.DistributedEngine` builds it): ``mix(x)`` exchanges **one
flat buffer per neighbour per exchange** with ``dist.batch_isend_irecv``, only with the parties
``r`` that have ``w_nr > 0``, then forms :math:`w_{nn} x_n + \\sum_r w_{nr} x_r` locally;
``average(x)`` is one ``all_reduce``. Every wait goes through a
:class:`~slate.engines.distributed.control.failures.Waiter`, so that a lost peer becomes a clear
error (or, with recovery, :class:`~slate.engines.distributed.control.failures.ExchangeFailed`); a
party that leaves a generation sends its neighbours a *leave* message
(:meth:`DistributedCommunicator.signal_leaving`).

gloo carries CPU tensors, nccl CUDA tensors (:func:`backend_for`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from slate.communication.choco import ChocoGossip, RoundEdges
from slate.communication.gossip import GossipSettings
from slate.engines.base import Communicator
from slate.engines.distributed.control.failures import ExchangeFailed, FailureGuard, Waiter
from slate.engines.distributed.wire.direct import DirectWire, Posted
from slate.engines.distributed.wire.sealed_wire import SealedWire
from slate.security.robust import MessageGuard
from slate.topology import Topology

__all__ = ["GOSSIP_TAG", "LEAVE", "DistributedCommunicator", "backend_for"]

LEAVE = 0.0  # the last element of a gossip message: 1 for parameters, 0 for "I have left"
#: gloo's tag of an iteration's first gossip exchange (and its leave messages); its k-th uses
#: GOSSIP_TAG + k. A receive posted ahead never takes another exchange's message (those use 0).
GOSSIP_TAG = 1
#: How many gossip rounds ahead a round's receives are posted, within a chunk: the notice that a
#: receive is posted then has a whole round to reach its sender, which at one round ahead it
#: often had not (it left when the previous round arrived, and the sender was ready to send
#: after only the local steps between the rounds).
ROUNDS_AHEAD = 2


class DistributedCommunicator(Communicator):
    """Neighbour-only gossip with point-to-point messages, and exact averages with all_reduce.

    ``rank`` is this party's index in ``topology`` (and in ``group``, or in the default group).
    With a compressor (CHOCO, :mod:`slate.communication.choco`), each message is the compressed
    encoding itself (``torch.uint8``), not dense floats.
    """

    def __init__(
        self,
        topology: Topology,
        rank: int,
        group: Any = None,
        waiter: Waiter | None = None,
        settings: GossipSettings | None = None,
        x0: Tensor | None = None,
        wire: SealedWire | None = None,
        guard: MessageGuard | None = None,
    ) -> None:
        super().__init__(topology, settings, guard)
        self.rank = rank
        self.wire = wire  # under --roster: every message sealed (wire.sealed_wire)
        self.group = group
        self.n = topology.n
        self.waiter = waiter or Waiter(FailureGuard(rank), None)
        # With recovery, every gossip message carries a last element: 1 (parameters) or 0 (the
        # sender has left this generation), so that a blocked receiver wakes up at once.
        self.signals_leaving = self.waiter.watches
        self._message: tuple[int, torch.dtype] | None = None  # the size and type of a message
        self._unwaited: list[Any] = []  # leave messages are never waited for
        # Point-to-point messages go through a direct wire: under a roster the sealed one.
        self._line = wire if wire is not None else DirectWire(rank, tuple(range(self.n)))
        # Receives posted ahead, in posting order: ((iteration, call), the group, the receives).
        self._ahead: list[tuple[tuple[int, int], Any, list[Posted]]] = []
        self._call = (-1, 0)  # the last exchange: (iteration, its call within the iteration)
        self._calls = 1  # the most exchanges an iteration has made
        # nccl's point-to-point ignores tags: a receive posted ahead could take another message.
        self._posts_ahead = backend_of(group) == "gloo"
        self.choco: ChocoGossip | None = None
        if self.settings.compressor is not None:
            if x0 is None:
                raise ValueError("compressed gossip needs the starting parameters x0")
            self.choco = ChocoGossip(
                topology, [rank], self.settings.compressor, self.settings.consensus_step, x0,
                self._exchange_payloads, guard,
            )  # fmt: skip

    def _peer(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)

    def _gossip(self, x: Tensor, r: int) -> Tensor:
        if self.choco is not None:
            mixed, messages = self.choco.gossip(x, r)
            self._count(messages * self.choco.payload_bytes(x.shape[-1]), messages)
            return mixed
        neighbours = self.topology.neighbours_at(self.rank, r)
        if not neighbours:
            return x
        flat = x.reshape(-1).contiguous()
        sent = flat if self.guard is None else self.guard.sent(flat[None])[0]
        received = self._swap([sent] * len(neighbours), [peer for peer, _ in neighbours])
        if self.guard is not None:
            mixed = self._guarded(flat, received, neighbours, r)
            if mixed is not None:
                self._count(len(neighbours) * flat.numel() * flat.element_size(), len(neighbours))
                return mixed.view_as(x)
        out = self.topology.self_weight_at(self.rank, r) * flat
        for (_, w), theirs in zip(neighbours, received, strict=True):
            out = out + w * theirs
        self._count(len(neighbours) * flat.numel() * flat.element_size(), len(neighbours))
        return out.view_as(x)

    def _guarded(
        self, flat: Tensor, received: list[Tensor], neighbours: list[tuple[int, float]], r: int
    ) -> Tensor | None:
        """What arrived, to the guard (:mod:`slate.security.robust`): its mix, or None to mix
        as usual."""
        assert self.guard is not None
        senders = torch.tensor([p for p, _ in neighbours], dtype=torch.long, device=flat.device)
        weights = torch.tensor([w for _, w in neighbours], dtype=flat.dtype, device=flat.device)
        self_weight = torch.tensor(
            [self.topology.self_weight_at(self.rank, r)], dtype=flat.dtype, device=flat.device
        )
        receivers = torch.zeros_like(senders)
        mixed = self.guard.arrived(flat[None], torch.stack(received), weights, receivers,
                                   senders, self_weight)  # fmt: skip
        return None if mixed is None else mixed[0]

    def _exchange_payloads(self, payload: Tensor, edges: RoundEdges) -> Tensor:
        """CHOCO's exchange: row ``e`` of ``payload`` goes to ``edges.peers[e]``, whose own
        payload for this party comes back as row ``e``."""
        received = self._swap(list(payload), list(edges.peers))
        return torch.stack(received) if received else payload

    def _swap(self, messages: list[Tensor], peers: list[int]) -> list[Tensor]:
        """Send ``messages[k]`` to ``peers[k]`` and receive one message of the same size and type
        from each, all at once (``batch_isend_irecv``, on :data:`GOSSIP_TAG`). A message may
        carry one last element (:meth:`_trailer`): 0 for "I have left", else 1 plus the flags
        its sender has heard. The receives may have been posted rounds before
        (:meth:`_post_rounds_ahead`); the next rounds' are posted when this one has arrived."""
        length = messages[0].numel()
        trailer = self._trailer(self.iteration)
        if trailer is not None:  # one tagged copy per distinct message
            tagged = {id(m): torch.cat([m, m.new_full((1,), trailer)]) for m in messages}
            messages = [tagged[id(m)] for m in messages]
        self._message = (messages[0].numel(), messages[0].dtype)
        pairs = list(zip(peers, messages, strict=True))
        call = self._next_call()
        posted = self._posted_for(call)
        try:
            received = self._line.swap(self.waiter, pairs, pairs, self.group, self._check_left,
                                       GOSSIP_TAG + call[1], posted)  # fmt: skip
        except BaseException:
            self._ahead.clear()  # (a failed exchange: this group is aborted, never reused)
            raise
        self._post_rounds_ahead(call, length, messages[0].dtype)
        return self._untagged(received, trailer)

    def _next_call(self) -> tuple[int, int]:
        """``(t, k)``: this is the ``k``-th exchange of iteration ``t`` (SLATE's gradient
        tracking gossips twice an iteration, the tracker then the parameters). Exchange ``k``
        of every iteration goes on gloo's tag ``GOSSIP_TAG + k``: a receive posted ahead for
        the next iteration's first exchange never takes this iteration's second."""
        t, k = self._call
        self._call = (self.iteration, k + 1 if t == self.iteration else 0)
        self._calls = max(self._calls, self._call[1] + 1)
        return self._call

    def run_through(self, end: int | None) -> None:
        super().run_through(end)
        if end is None and self._ahead:
            raise RuntimeError(
                f"party {self.rank}: receives posted ahead for exchange {self._ahead[0][0]} "
                "outlived their chunk"
            )

    def _posted_for(self, call: tuple[int, int]) -> list[Posted] | None:
        """The receives posted ahead for exchange ``call`` (:meth:`_next_call`), if any: the
        first posted on its tag, which gloo fills first."""
        if self._ahead and self._ahead[0][1] is not self._current_group():
            self._ahead.clear()  # posted in an aborted generation: never waited for
        for position, (at, _, posted) in enumerate(self._ahead):
            if at[1] != call[1]:
                continue
            if at != call:  # (the same tag: it would take this exchange's messages)
                raise RuntimeError(
                    f"party {self.rank}: receives were posted ahead for exchange {at} "
                    f"(iteration, call), but exchange {call} came first"
                )
            del self._ahead[position]
            return posted
        return None

    def _post_rounds_ahead(self, call: tuple[int, int], length: int, dtype: torch.dtype) -> None:
        """Post the receives of the next :data:`ROUNDS_AHEAD` gossip rounds that are not posted
        yet, when they fall within the iterations promised to run (:meth:`run_through`): gloo
        sends a message only after its receiver's notice that the receive is posted, so a
        receive posted rounds before its own saves up to half a round trip each round. The
        later rounds' peers and message sizes are public: their topology rounds, and whether
        their messages carry a last element. ``call``: the exchange just done; the ones posted
        for are the same call of the next gossip iterations, on the same gloo tag, in order
        (gloo fills a pair's receives of one tag in the order they were posted)."""
        if self.through is None or not self._posts_ahead:
            return
        every = self.settings.every
        posted_for = {at for at, _, _ in self._ahead}
        for ahead in range(1, ROUNDS_AHEAD + 1):
            t = call[0] + ahead * every
            if t >= self.through:
                return
            r = t // every
            if self.topology.is_full_average_at(r):
                return  # (an exact average: an all-reduce, not messages; posting stops there)
            if (t, call[1]) in posted_for:
                continue
            peers = self._round_peers(r)
            if not peers:
                continue
            like = torch.empty(length + self._tagged(t), dtype=dtype)
            posted = self._line.post_receives(self.waiter, [(p, like) for p in peers],
                                              self.group, GOSSIP_TAG + call[1])  # fmt: skip
            self._ahead.append(((t, call[1]), self._current_group(), posted))

    def _round_peers(self, r: int) -> list[int]:
        """Whom this party swaps messages with in gossip round ``r``, in the order it sends
        (CHOCO's edges of one party are the same: :class:`~slate.communication.choco.EdgeSlots`)."""
        return [peer for peer, _ in self.topology.neighbours_at(self.rank, r)]

    def _current_group(self) -> Any:
        return dist.group.WORLD if self.group is None else self.group

    def _trailer(self, t: int) -> int | None:
        """The last element of iteration ``t``'s messages: with recovery always (1 plus the
        flags carried), else only in a window that carries flags
        (:mod:`slate.communication.flag_flood`); None: no last element."""
        if not self._tagged(t):
            return None
        carrying = self.flags is not None and self.flags.carries(t)
        return 1 + (self.flags.outgoing(t) if carrying else 0)

    def _tagged(self, t: int) -> bool:
        """Whether iteration ``t``'s messages carry a last element (:meth:`_trailer`)."""
        return self.signals_leaving or (self.flags is not None and self.flags.carries(t))

    def _check_left(self, peer: int, message: Tensor) -> None:
        if self.signals_leaving and float(message[-1]) == LEAVE:
            raise ExchangeFailed(f"party {peer} of this generation left it")

    def _untagged(self, received: list[Tensor], trailer: int | None) -> list[Tensor]:
        """The received messages without their last element; the flags it carries, heard."""
        if trailer is None:
            return received
        if self.flags is not None and self.flags.carries(self.iteration):  # (a host read)
            for buf in received:
                self.flags.arrived(self.iteration, int(buf[-1]) - 1)
        return [buf[:-1] for buf in received]

    def signal_leaving(self) -> None:
        """Send every neighbour (of any round) a leave message in place of the next one (on
        the tag of each exchange an iteration makes: a neighbour may wait on any of them)."""
        if not (self.signals_leaving and self._message is not None):
            return
        numel, dtype = self._message
        leave = torch.full((numel,), LEAVE, dtype=dtype)
        for r in self.topology.union_neighbours(self.rank):
            # A neighbour whose connection is already gone needs no message.
            with contextlib.suppress(RuntimeError, dist.DistBackendError):
                sent = leave if self.wire is None else self.wire.seal(leave, r)  # (one round)
                for k in range(self._calls):
                    tag = GOSSIP_TAG + k
                    self._unwaited.append(dist.isend(sent, self._peer(r), self.group, tag))

    def average(self, x: Tensor) -> Tensor:
        if self.wire is not None:
            self._count_all_reduce(x, self.n)
            return self.wire.reduce(self.waiter, x, "sum", "gossip average") / self.n
        total = x.clone()
        self.waiter.collective(
            lambda: dist.all_reduce(total, group=self.group, async_op=True), list(range(self.n))
        )
        self._count_all_reduce(x, self.n)
        return total / self.n

    def state_dict(self) -> dict:
        return {"choco": self.choco.state_dict()} if self.choco is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.choco is not None and "choco" in state:
            self.choco.load_state_dict(state["choco"])


def backend_for(device: torch.device) -> str:
    """nccl for CUDA tensors, gloo for CPU ones."""
    return "nccl" if device.type == "cuda" else "gloo"


def backend_of(group: Any) -> str:
    """The backend of ``group`` (the default group's when None), as a lower-case name; ""
    when no group is open (a communicator built for a test)."""
    if not dist.is_initialized():
        return ""
    return str(dist.get_backend(group)).lower()
