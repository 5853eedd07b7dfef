"""Sealed messages between the distributed engine's processes under ``--roster``: without them
every parameter vector, count and flag would cross the network in clear.

:class:`SealedWire` holds this party's :class:`~slate.security.sealing.SealedChannel` to every
other member of one generation, and one round counter per channel and direction. Both sides of
a pair advance a counter once per message, in the lockstep order of exchanges, so the receiver
always knows the round of the message it waits for. The wire is built when the generation's
process group opens (:meth:`SealedWire.establish`): each member makes a fresh X25519 key,
publishes its record signed by its site key under ``slate/pg{g}/sealing/{rank}`` (bound to the
run's session, :mod:`slate.engines.distributed.control.session`), and verifies every other member's
record against the roster. Every member publishes its record before it opens the process group, so
once the group is open every record is there: one that is not was deleted from the store. Keys live
in memory only (never in a checkpoint); the next generation gets new ones.

Every exchange of a sealed run goes through :meth:`SealedWire.swap`: point-to-point ``uint8``
messages (plaintext plus the 16-byte tag) with ``batch_isend_irecv``. What gloo would do as an
all-reduce, all-gather or broadcast is done here as sealed point-to-point steps, combined in
rank order so that every member gets the same bits (:meth:`reduce`, :meth:`gather`,
:meth:`broadcast`). A message that does not open raises
:class:`~slate.security.sealing.SealedMessageRefused` naming its sender; nothing of it is used.

**Sums reveal only their total.** A sum (:meth:`reduce` with ``sum``) is masked
(:mod:`slate.security.masking`): each member encodes its tensor (integers as ``int64``, floats
in 40-bit fixed point over two words), adds its pairwise masks (each pair's seed from the
X25519 secret of its sealed channel, the stream from the wire's counter of sums, so no stream
is used twice in a generation), and sends the masked words to every member; each member adds
every member's words modulo :math:`2^{64}` and decodes, so every member gets the same bits and
no message holds a member's own value. A member lost during a sum fails the exchange as any
other (:class:`PartyLost` or :class:`ExchangeFailed`): no total with a mask left in it is ever
returned, and the next generation redoes the sum under new keys. ``min``, ``max`` and ``or``
stay gathered: every member sees every member's value. ``masks=False`` (a test's or a
benchmark's ``SLATE_UNMASKED_SUMS``) sends sums unmasked, for comparison.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from slate.communication.sealed_tensors import open_tensor, seal_tensor, sealed_numel
from slate.engines.distributed.control.failures import ExchangeFailed
from slate.engines.distributed.control.membership import PartyLost
from slate.engines.distributed.wire.direct import DirectWire
from slate.faults.opened import OpenedRecorder
from slate.faults.tamper import Tamper
from slate.security.masking import MaskedSums, decode_sum, encode_sum
from slate.security.sealing import (
    SealedChannel,
    SealedMessageRefused,
    SealingKey,
    SealingKeyRefused,
    sealing_key_record,
)
from slate.security.sum_digests import digest_report, equivocation

__all__ = ["SealedWire", "sealing_key_name"]

GRACE_S = 5.0  # how long a member's sealing-key record may take to show once the group is open


def sealing_key_name(generation: int, rank: int) -> str:
    return f"slate/pg{generation}/sealing/{rank}"


def _deleted(rank: int, peer: int, name: str) -> str:
    return (
        f"Party {rank} opened the process group with party {peer}, but party {peer}'s sealing "
        f"key record {name} is not in the rendezvous store (every member publishes it before "
        "the group opens): someone may be deleting records in the rendezvous store. Nothing "
        "was exchanged; keep the rendezvous port reachable by the sites only "
        "(docs/security.md) and restart every site."
    )


class SealedWire(DirectWire):
    """Party ``rank``'s sealed channels to the other ``members`` (global ranks, in group
    order) of one generation. Peers are named by their index in ``members`` (the group rank).
    A :class:`DirectWire` whose messages are sealed and whose sums are masked."""

    def __init__(
        self,
        rank: int,
        members: tuple[int, ...],
        channels: dict[int, SealedChannel],
        tamper: Tamper | None = None,
        recorder: OpenedRecorder | None = None,
        masks: bool = True,
    ):
        super().__init__(rank, members)
        self.channels = channels
        self._out = dict.fromkeys(channels, 0)  # the next round sealed for each peer
        self._in = dict.fromkeys(channels, 0)  # the next round expected from each peer
        self._tamper = tamper  # tests only (slate.faults.tamper): None in a real run
        self._recorder = recorder  # tests only (slate.faults.opened): None in a real run
        self.masks = masks
        #: this generation's masked sums: a seed per other member, one counter for them all
        self.sums = MaskedSums(rank, {peer: ch.mask_seed for peer, ch in channels.items()})
        self.kind = "gossip"  # the exchange under way, as the recorder names it
        #: called with the refused sender's global rank before the refusal is raised
        self.on_refused: Callable[[int, str], None] | None = None

    @classmethod
    def publish(cls, records: Any, generation: int) -> SealingKey:
        """Make this site's fresh key of ``generation`` and publish its signed record."""
        identity = records.identity
        key = SealingKey.generate(
            identity.roster.run_id, generation, identity.rank, records.session
        )
        body = json.dumps(sealing_key_record(key, identity), separators=(",", ":"))
        records.put(sealing_key_name(generation, identity.rank), body, generation)
        return key

    @classmethod
    def establish(
        cls,
        records: Any,
        key: SealingKey,
        members: tuple[int, ...],
        timeout_s: float,
        tamper: Tamper | None = None,
        recorder: OpenedRecorder | None = None,
        masks: bool = True,
        read_with: list[str] | None = None,
    ) -> tuple[SealedWire, list[str | None]]:
        """Read and verify every other member's record of ``key``'s generation (called once
        the group is open: every member published its record before); one channel each.
        Raises :class:`SealingKeyRefused` naming a member whose record does not verify, and
        :class:`PartyLost` naming the record when it is gone from the store. ``tamper`` and
        ``recorder``: the faults plan's for this party (tests only), kept over every
        generation; ``masks``: whether sums are masked (always, but in a comparing test).
        ``read_with``: one more record of each other member (its name per member, in
        ``members`` order without this one, signed by that member), read in the same store
        calls and returned."""
        roster = records.identity.roster
        channels = {}
        peers = [peer for peer in members if peer != key.rank]
        names = [sealing_key_name(key.generation, peer) for peer in peers]
        extra = read_with or []
        assert len(extra) in (0, len(peers))
        signers = list(peers) + (list(peers) if extra else [])
        # Every record at once (a wait, then one multi_get: three round trips for them all).
        read = records.get_many(names + extra, signers, wait_s=min(timeout_s, GRACE_S))
        bodies, others = read[: len(names)], read[len(names) :]
        for peer, name, body in zip(peers, names, bodies, strict=True):
            if body is None and read(records.store, name) is None:
                raise PartyLost(_deleted(key.rank, peer, name))
            try:
                record = json.loads(body) if body is not None else None
            except ValueError:
                record = None
            if record is None:
                raise SealingKeyRefused(peer, "its record in the store is missing or unsigned")
            channels[peer] = SealedChannel.from_record(key, peer, record, roster.verifier(peer))
        return cls(key.rank, members, channels, tamper, recorder, masks), others

    # -- messages -----------------------------------------------------------------------------

    def seal(self, tensor: Tensor, peer: int) -> Tensor:
        """``tensor`` sealed for the member at index ``peer``, in that channel's next round."""
        rank = self.members[peer]
        round, self._out[rank] = self._out[rank], self._out[rank] + 1
        sealed = seal_tensor(self.channels[rank], tensor, round)
        if self._tamper is not None:
            sealed = self._tamper.sending(sealed, rank)
        return sealed.to(tensor.device)  # nccl carries CUDA tensors

    def open(self, sealed: Tensor, peer: int, like: Tensor) -> Tensor:
        """The message of the member at index ``peer`` for this channel's next round, of
        ``like``'s type and shape; :class:`SealedMessageRefused` names the sender otherwise."""
        rank = self.members[peer]
        round, self._in[rank] = self._in[rank], self._in[rank] + 1
        if self._tamper is not None:
            self._tamper.received(sealed, rank)
        opened = open_tensor(self.channels[rank], sealed, round, like.dtype, like.shape)
        if self._recorder is not None:
            self._recorder.opened(rank, self.kind, opened.contiguous().view(-1).numpy().tobytes())
        return opened.to(like.device)

    @contextlib.contextmanager
    def exchange(self, kind: str) -> Iterator[None]:
        """The messages opened within are of the exchange ``kind`` (for the test-only recorder;
        outside any, ``gossip``)."""
        before, self.kind = self.kind, kind or "sum"
        try:
            yield
        finally:
            self.kind = before

    def buffer(self, like: Tensor) -> Tensor:
        """An empty receive buffer for a sealed message of ``like``'s size."""
        size = sealed_numel(like.numel(), like.dtype)
        return torch.empty(size, dtype=torch.uint8, device=like.device)

    def outgoing(self, tensor: Tensor, peer: int) -> Tensor:
        return self.seal(tensor, peer)

    def incoming(self, received: Tensor, peer: int, like: Tensor) -> Tensor:
        return self.open(received, peer, like)

    def _opened(self, waiter: Any, buf: Tensor, peer: int, like: Tensor) -> Tensor:
        try:
            return self.incoming(buf, peer, like)
        except SealedMessageRefused as err:
            raise self.refused(waiter, err) from None

    def refused(self, waiter: Any, err: Exception) -> Exception:
        """A refused message, as the loss policy asks: with ``continue`` the sender is
        reported (:attr:`on_refused`) so the survivors count it as lost; with ``stop`` the run
        stops naming it."""
        assert isinstance(err, SealedMessageRefused)
        if self.on_refused is not None:
            self.on_refused(err.sender, str(err))
        if waiter.watches:
            return ExchangeFailed(str(err))
        return PartyLost(str(err))

    def _die_after_sending_one(self, waiter: Any, masked: Tensor) -> None:
        """Tests only (:data:`slate.faults.tamper.DIE_IN_SUM_ENV`): send ``masked`` to the next
        member only, then die as a killed site does."""
        self.swap(waiter, [((self.index + 1) % len(self.members), masked)], [])
        os.kill(os.getpid(), signal.SIGKILL)

    # -- what gloo's collectives did ------------------------------------------------------------

    def reduce(
        self, waiter: Any, value: Tensor, op: str, what: str = "", narrow: bool = False
    ) -> Tensor:
        """``value`` combined over every member with ``op`` (``sum``, ``min``, ``max``):
        every member gets the same bits. A sum is masked (:meth:`masked_sum`, unless
        :attr:`masks` is off); the others are gathered and combined in rank order. ``what``
        names the quantity (in a refusal, and for the recorder); ``narrow``: floats in one
        word (:class:`~slate.security.masking.NarrowFixedPoint`, the parameters' average)."""
        with self.exchange(what or op):
            if op == "sum" and self.masks:
                return self.masked_sums(waiter, [value], what or "sum", narrow)[0]
            return self.combined(waiter, value, op)

    def masked_sum(self, waiter: Any, value: Tensor, what: str) -> Tensor:
        """The sum of ``value`` over every member, each member's own value hidden by its
        pairwise masks (:mod:`slate.security.masking`): integers exactly, floats to
        :math:`2^{-40}` per term, in ``value``'s type and device. A value a member cannot
        carry (not finite, or beyond the fixed point's range) makes every member raise
        :class:`~slate.security.masking.MaskOverflow` naming ``what``."""
        return self.masked_sums(waiter, [value], what)[0]

    def masked_sums(
        self, waiter: Any, values: list[Tensor], what: str, narrow: bool = False
    ) -> list[Tensor]:
        """:meth:`masked_sum` of several tensors in one exchange: each encoded in its own type
        (an integer in one word, a float in two, or with ``narrow`` in one, and a refusal
        count), the words masked once."""
        with self.exchange(what):
            n = len(self.members)
            locals_ = [value.detach().cpu().numpy() for value in values]
            encoded = [encode_sum(local, what, n, narrow) for local in locals_]
            words = np.concatenate([w for w, _ in encoded])
            masked = torch.from_numpy(self.sums.mask(words).view(np.int64)).to(values[0].device)
            if self._tamper is not None and self._tamper.dies_in_sum():
                self._die_after_sending_one(waiter, masked)
            parts = [p.cpu().numpy() for p in self.gather(waiter, masked)]
            summed = MaskedSums.total(parts)
            self._agree_on_total(waiter, summed, parts, what, masked.device)
            sizes = np.cumsum([len(w) for w, _ in encoded])[:-1]
            out = []
            for total, local, (_, bad), value in zip(
                np.split(summed, sizes), locals_, encoded, values, strict=True
            ):
                decoded = torch.from_numpy(decode_sum(total, local, what, n, bad, narrow))
                out.append(decoded.to(dtype=value.dtype, device=value.device))
            return out

    def _agree_on_total(
        self, waiter: Any, summed: np.ndarray, parts: list[np.ndarray], what: str, device: Any
    ) -> None:
        """Compare the digest of the total and of every contribution with every member, in one
        small exchange (:mod:`slate.security.sum_digests`): a member that sent different
        contributions to different members makes the totals differ, and every member drops the
        sum (:class:`~slate.security.sum_digests.SumEquivocated`) before it is decoded."""
        report = torch.from_numpy(digest_report(summed, parts)).to(device)
        with self.exchange(f"{what} digest"):
            reports = self.gather(waiter, report)
        problem = equivocation([r.cpu().numpy() for r in reports], self.members, what)
        if problem is not None:
            raise problem
