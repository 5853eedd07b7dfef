"""The real multi-party engine on ``torch.distributed``: one process per party.

Each process runs one party (``P = 1``) with exactly the simulator's code for sampling, model,
algorithm and evaluation; only the communicator differs
(:class:`slate.engines.distributed.wire.transport.DistributedCommunicator`: neighbour-only
point-to-point gossip, and ``all_reduce`` for exact averages). Small facts travel as JSON in tensors
(:mod:`slate.engines.distributed.wire.json_exchange`); every wait goes through a
:class:`~slate.engines.distributed.control.failures.Waiter`.

**A lost party.** With ``--on-party-loss stop`` every party fails within ``--timeout`` seconds
with a :class:`PartyLost` error that names the lost rank. With ``continue`` (gloo, with the
rendezvous store outside the parties), a failed exchange raises :class:`ExchangeFailed` instead;
the training loop then calls :meth:`DistributedEngine.leave_generation`, which

1. raises the generation's *failed* flag in the store, so that every pending collective of the
   other parties stops within ``POLL_SECONDS`` (collectives are waited for in slices);
2. sends each gossip neighbour a *leave* message (a gossip message whose last element is 0), so
   that a neighbour blocked on a point-to-point receive from this party wakes at once (gloo's
   point-to-point waits cannot be sliced: a timed-out wait closes the connection);
3. aborts the process group without joining its threads (a collective stuck on a dead peer
   would otherwise hold ``destroy_process_group`` for the whole timeout);
4. agrees with the other survivors on the new party set
   (:mod:`slate.engines.distributed.control.membership`);
5. opens a fresh process group over the survivors, ranked in rank order, under a new store
   prefix.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from slate.communication.gossip import GossipSettings
from slate.engines.base import MESSAGE_LIMIT, Communicator, Engine
from slate.engines.distributed.control import start_up
from slate.engines.distributed.control.failures import (
    ExchangeFailed,
    FailureGuard,
    Waiter,
    first_line,
)
from slate.engines.distributed.control.liveness import (
    FINAL_MEMBERS_KEY,
    Heartbeat,
    confirm_leave,
    leave_run,
    process_alive,
    registered_process,
)
from slate.engines.distributed.control.lookout import Lookout
from slate.engines.distributed.control.membership import Change, Membership, PartyLost
from slate.engines.distributed.control.rendezvous import Rendezvous
from slate.engines.distributed.control.site_status import SiteReport
from slate.engines.distributed.control.store_records import Records, SigningStore
from slate.engines.distributed.wire import handshake, json_exchange
from slate.engines.distributed.wire.direct import DIRECT_BYTES, DirectWire
from slate.engines.distributed.wire.sealed_wire import SealedWire
from slate.engines.distributed.wire.transport import DistributedCommunicator
from slate.errors import parties_text
from slate.faults.opened import OpenedRecorder
from slate.faults.tamper import Tamper
from slate.security.robust import MessageGuard
from slate.topology import Topology

__all__ = ["DistributedEngine"]

SET_UP_LOST_KEY = "slate/set_up_lost"  # the first description of a loss during the set-up


class DistributedEngine(Engine):
    """This process is party ``rank`` of the run; the other members are other processes.

    Build it with :meth:`open` (it opens the process group itself, and can recover from a lost
    party), or on an already initialised default group (``DistributedEngine(device)``: torchrun,
    or a user's own setup; a lost party stops the run).
    """

    name = "distributed"
    stops_between_iterations = False  # parties stop together, at the end of a chunk

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.rank = dist.get_rank()
        self.members: tuple[int, ...] = tuple(range(dist.get_world_size()))
        self.membership: Membership | None = None
        self.rendezvous: Rendezvous | None = None
        self.timeout_s = 60.0
        self._aborted: list[Any] = []  # process groups left behind, never destroyed
        self._communicator: DistributedCommunicator | None = None
        self._wire: SealedWire | None = None  # never sealed on a group opened outside slate
        self._tamper: Tamper | None = None
        self._recorder: OpenedRecorder | None = None
        self._masks = True
        self._heartbeat: Heartbeat | None = None
        self._lookout: Lookout | None = None
        self.store_out_of_reach = False  # the rendezvous store stopped answering mid-run
        self._prefix: SigningStore | None = None
        self.rosters_seen = ""  # another site's roster, as seen while the first group opened
        self.guard = FailureGuard(self.rank)
        self.records = self.guard.records() or Records(None, dist.get_world_size())
        self.guard.register()
        self.waiter = Waiter(self.guard, None)
        self.report: SiteReport | None = None

    @classmethod
    def open(
        cls,
        device: torch.device,
        rendezvous: Rendezvous,
        timeout_s: float,
        recover: bool,
        backend: str,
        tamper: Tamper | None = None,
        recorder: OpenedRecorder | None = None,
        masks: bool = True,
    ) -> DistributedEngine:
        """Open the process group of all ``world`` parties at ``rendezvous``.

        With ``recover``, a party that finds a run in progress at the store is *returning*: it
        opens no group yet, and joins with :meth:`rejoin` once its run is built. ``tamper``:
        this party's sealed-message hooks (tests only, :meth:`slate.faults.FaultPlan.tamper`),
        kept over every generation, as ``recorder`` (what it opens, recorded) and ``masks``
        (False: sums under a roster unmasked, for a comparing test).
        """
        engine = cls.__new__(cls)
        engine.device = torch.device(device)
        engine.rank = rendezvous.rank
        engine.rendezvous = rendezvous
        engine.timeout_s = timeout_s
        engine.backend = backend
        engine._aborted = []
        engine._communicator = None
        engine._wire = None
        engine._tamper = tamper
        engine._recorder, engine._masks = recorder, masks
        engine.members = tuple(range(rendezvous.world))
        engine.records = records = rendezvous.records()
        engine.roster_digest = rendezvous.identity.roster.digest if rendezvous.identity else None
        engine._prefix = None
        engine.rosters_seen = ""
        engine.report = SiteReport(rendezvous.connect, engine.rank, rendezvous.world, records,
                                   rendezvous.identity)  # fmt: skip
        start_up.publish_roster(records, engine.rank)
        running = start_up.join_session(engine, recover) if records.signed else None
        membership = Membership(records, rendezvous.rank, list(engine.members), timeout_s)
        engine.membership = membership if recover else None
        engine.guard = FailureGuard(engine.rank, records)
        engine._heartbeat = engine._lookout = None
        if recover:
            engine._heartbeat = Heartbeat(
                rendezvous.connect, engine.rank, records, membership.process
            )
            engine._lookout = Lookout(rendezvous.connect, membership, records)
        engine.waiter = Waiter(engine.guard, engine._lookout)
        engine.store_out_of_reach = False
        if records.signed:  # a run in progress is one of this store's sessions (running)
            engine.returning = running is not None
            if recover and not engine.returning:
                membership.running_generation()  # (an earlier session's record is noted)
        else:
            engine.returning = recover and membership.running_generation() is not None
        if not engine.returning:
            engine._open_group(0)
            if recover:
                membership.announce()
        engine.report.started()
        return engine

    def rejoin(self, reason: str = "restarted with --resume") -> Change:
        """A returning party: ask to be admitted, wait for the members' next checkpoint, and
        open the group of the admitted generation."""
        membership = self.membership
        assert membership is not None
        change = self._with_store(lambda: membership.request_join(reason))
        self.members = change.members
        self.returning = False
        self._open_group(change.generation)
        return change

    def note_status(self, **changes: Any) -> None:
        """This site's published status changed (``slate status``, :mod:`.control.site_status`)."""
        if self.report is not None:
            self.report.note(**changes)

    @property
    def generation(self) -> int:
        return self.membership.generation if self.membership is not None else 0

    # -- membership ---------------------------------------------------------------------------

    @property
    def n_parties(self) -> int:
        return len(self.members)

    @property
    def local_parties(self) -> list[int]:
        return [self.rank]

    @property
    def is_main(self) -> bool:
        """The lowest-ranked member keeps the log and writes a shared run folder."""
        return self.rank == self.members[0]

    @property
    def recovers(self) -> bool:
        """Whether a lost party leaves the others running (``--on-party-loss continue``)."""
        return self.membership is not None

    @property
    def own_party(self) -> int:
        """This process runs its own party only."""
        return self.rank

    resume_flags = " --engine distributed"

    def _open_group(self, generation: int) -> None:
        global _OPENED
        _OPENED = True
        assert self.rendezvous is not None
        scope = f"slate/pg{generation}"
        # gloo's addresses signed by each member and checked by the others (under a roster)
        prefix = SigningStore(
            dist.PrefixStore(scope, self.rendezvous.store), self.records, self.members,
            self.timeout_s, scope,
        )  # fmt: skip
        self._prefix = prefix
        self._wire = None
        key = SealedWire.publish(self.records, generation) if self.records.identity else None
        hello = handshake.publish(self.records, generation, self.rank)
        try:
            start_up.open_watched(self, prefix)
        except (RuntimeError, dist.DistBackendError, TimeoutError) as err:
            if generation == 0:
                raise PartyLost(start_up.failure(self, err)) from None
            if self.membership is None:
                raise PartyLost(
                    f"Party {self.rank} could not open the process group: {first_line(err)}"
                ) from None
            raise ExchangeFailed(first_line(err)) from None
        opened = time.monotonic()
        hellos = None
        if key is not None:  # under a roster every exchange of this generation is sealed
            # (the other members' hellos read with their sealing keys: the same store calls)
            others = [r for r in self.members if r != self.rank]
            self._wire, read = SealedWire.establish(
                self.records, key, self.members, self.timeout_s, self._tamper, self._recorder,
                self._masks, [handshake.hello_key(generation, r) for r in others],
            )  # fmt: skip
            self._wire.on_refused = self._note_refused
            hellos = dict(zip(others, read, strict=True))
        self.all_direct = self._wire is not None
        handshake.Hello(
            self.records, generation, self.rank, self.members, self.timeout_s, hello,
            self.device, self._wire, prefix.addresses, self._gone, hellos,
        ).run(opened)  # fmt: skip

    @property
    def generation_opened(self) -> bool:
        """Whether a process group of this run was opened before (only the first one's wait
        looks at the other sites' rosters)."""
        return bool(self._aborted) or self.generation > 0

    def _gone(self, rank: int) -> str | None:
        """Why member ``rank`` is gone (its heartbeat, or its process on this host), or None."""
        try:
            if self.membership is not None:
                why = self.membership.liveness.gone(rank)
                return None if why is None else f"is gone ({why})"
            where = registered_process(self.records, rank)
        except (RuntimeError, dist.DistStoreError):
            return None
        if where is not None and where[0] == socket.gethostname() and not process_alive(where[1]):
            return f"is gone (its process {where[1]} exited)"
        return None

    def _note_refused(self, sender: int, why: str) -> None:
        """With ``continue``: tell the survivors that ``sender``'s sealed message was
        refused, so that they count it as lost (:meth:`Membership.agree_on_loss`)."""
        if self.membership is not None:
            with contextlib.suppress(RuntimeError, dist.DistStoreError):
                self.membership.report_refused(sender, why)

    def gone_parties(self, look_s: float = 3.0) -> str:
        """The other members seen to be gone within ``look_s`` seconds (a process that exited
        on this host, a heartbeat that stopped), described for a message; "" if none is."""
        membership = self.membership
        if membership is None:
            return ""
        others = [r for r in membership.members if r != self.rank]
        deadline = time.monotonic() + look_s
        try:
            while True:
                gone: dict[str, list[int]] = {}  # why -> the parties lost for that reason
                for r in others:
                    why = membership.liveness.gone(r)
                    if why is not None:
                        gone.setdefault(why, []).append(r)
                if gone or time.monotonic() > deadline:
                    return "; ".join(
                        f"{parties_text(ranks)} {'was' if len(ranks) == 1 else 'were'} lost ({why})"
                        for why, ranks in gone.items()
                    )
                time.sleep(0.2)
        except (RuntimeError, dist.DistStoreError):
            return ""

    def set_up_failure(self, err: Exception) -> PartyLost:
        """A lost party while the parties agree on the data and the run, before step 1: every
        party stops (the agreement needs all of them), naming the lost one and the phase."""
        gone = self.gone_parties() or f"an exchange failed ({first_line(err)})"
        if self.rendezvous is not None:  # the first party to describe the loss speaks for all
            with contextlib.suppress(RuntimeError, dist.DistStoreError):
                gone = self.records.first(SET_UP_LOST_KEY, gone[:2000])
        return PartyLost(
            f"Party {self.rank} stops during the set-up, before step 1: {gone}. The parties "
            "agree on the data and the run's flags together, so every party stops; restart "
            "them all."
        )

    def leave_generation(self, position: int) -> Change:
        """After :class:`ExchangeFailed`: leave this generation and join the agreed next one.

        ``position`` is the earliest point this party can resume from. The returned change
        names the lost parties and the position every survivor resumes from.
        """
        membership = self.membership
        assert membership is not None
        self._with_store(membership.raise_failed_flag)
        if self._communicator is not None:
            self._communicator.signal_leaving()
        self._abort_group()
        change = self._with_store(lambda: membership.agree_on_loss(position))
        self.members = change.members
        self._open_group(change.generation)
        return change

    def admit_returning(self, iteration: int, asked: bool = True) -> Change | None:
        """At a checkpoint boundary: admit the parties that asked to return, if any (``asked``:
        some member's lookout saw a join request; without one the store is not asked)."""
        membership = self.membership
        if membership is None or self.store_out_of_reach:
            return None
        if self._lookout is not None and self._lookout.out_of_reach():
            self.store_out_of_reach = True  # (the lookout's own connection gets no answer)
            return None
        if not asked:
            return None
        try:
            change = membership.agree_on_joins(iteration)
        except (RuntimeError, dist.DistStoreError):
            # Nobody can ask to return without the store: training goes on without it.
            self.store_out_of_reach = True
            return None
        if change is None:
            return None
        self._abort_group()
        self.members = change.members
        self._open_group(change.generation)
        return change

    def _with_store(self, action: Callable[[], Any]) -> Any:
        """Run a store exchange; an unreachable store stops this party with a clear message."""
        try:
            return action()
        except (RuntimeError, dist.DistStoreError) as err:
            assert self.rendezvous is not None
            where = (
                "it lived in party 0, which is gone: host it outside the parties with "
                "'slate rendezvous --port P' and --external-store"
                if not self.rendezvous.outside
                else "its host (the launcher or 'slate rendezvous') is gone"
            )
            raise PartyLost(
                f"Party {self.rank} cannot reach the rendezvous store to agree on the parties "
                f"still running ({where}). Backend said: {first_line(err)}"
            ) from None

    def _abort_group(self) -> None:
        """Drop the default group at once. ``destroy_process_group`` would join gloo's worker
        threads, and one stuck on a dead peer holds it for the whole timeout; the aborted group
        is kept referenced so that its destructor never runs (the process ends with os._exit)."""
        group = dist.group.WORLD
        if group is None:
            return
        self._aborted.append(group)
        dist.distributed_c10d._abort_process_group()

    # -- communication ------------------------------------------------------------------------

    def _everyone(self) -> list[int]:
        return list(range(self.n_parties))

    def communicator(
        self,
        topology: Topology,
        device: torch.device,
        settings: GossipSettings | None = None,
        x0: Tensor | None = None,
        guard: MessageGuard | None = None,
    ) -> Communicator:
        del device
        comm = DistributedCommunicator(
            topology, self.members.index(self.rank), waiter=self.waiter, settings=settings, x0=x0,
            wire=self._wire, guard=guard,
        )  # fmt: skip
        self._communicator = comm
        return comm

    def mean(self, x: Tensor) -> Tensor:
        """The mean of every party's rows (under a roster a masked sum: only the average is
        revealed)."""
        return self.total(x.sum(dim=0), "average") / self.n_parties

    def total(self, value: Tensor, what: str = "") -> Tensor:
        """The sum over every member; under a roster a masked sum
        (:meth:`SealedWire.masked_sum`: only the total is revealed), else gloo's all-reduce."""
        return self._all_reduce(value.clone(), dist.ReduceOp.SUM, what)

    def totals(self, parts: list[Tensor], what: str = "") -> list[Tensor]:
        """Under a roster one masked exchange of every part, each encoded in its own type
        (:meth:`SealedWire.masked_sums`: an integer in one word); else :meth:`Engine.totals`."""
        if self._wire is None or not self._wire.masks:
            return super().totals(parts, what)
        self.count_collective(torch.cat([part.reshape(-1).to(torch.float64) for part in parts]))
        return self._wire.masked_sums(self.waiter, parts, what)

    def minimum(self, value: Tensor) -> Tensor:
        return self._all_reduce(value.to(self.device).clone(), dist.ReduceOp.MIN, "minimum")

    def _small_exchange(self, value: Tensor) -> DirectWire | None:
        """The wire that carries an exchange of ``value``: every exchange of a sealed run
        (its :class:`SealedWire`); in a plain run a message of at most
        :data:`~slate.engines.distributed.wire.direct.DIRECT_BYTES` goes as one direct
        exchange with every member (about one round trip, where gloo's ring takes 2(N - 1));
        None: a larger one takes gloo's collective."""
        if self._wire is not None:
            return self._wire
        if value.numel() * value.element_size() > DIRECT_BYTES or self.n_parties < 2:
            return None
        return DirectWire(self.rank, self.members)

    def mean_parameters(self, x: Tensor) -> Tensor:
        """:meth:`mean` of the parameters; under a roster each value in one masked word
        (:class:`~slate.security.masking.NarrowFixedPoint`) instead of two."""
        total = self._all_reduce(x.sum(dim=0).clone(), dist.ReduceOp.SUM, "average", narrow=True)
        return total / self.n_parties

    def _all_reduce(self, out: Tensor, op: Any, what: str = "", narrow: bool = False) -> Tensor:
        self.count_collective(out)
        wire = self._small_exchange(out)
        if wire is not None:
            return wire.reduce(self.waiter, out, _SEALED_OPS[op], what, narrow)
        self.waiter.collective(lambda: dist.all_reduce(out, op=op, async_op=True), self._everyone())
        return out

    def any(self, flag: bool) -> bool:
        """Whether any member's ``flag`` is set: a sum of 0/1 counts (masked under a roster:
        only how many members set it is revealed)."""
        return bool(self.total(torch.tensor(float(flag), device=self.device), "flags") > 0)

    def any_of(self, flags: list[bool]) -> list[bool]:
        summed = self.total(torch.tensor([float(f) for f in flags], device=self.device), "flags")
        return [bool(v > 0) for v in summed]

    def joins_requested(self) -> bool:
        return self._lookout is not None and self._lookout.joins_requested()

    @property
    def wait_seconds(self) -> float:
        return self.waiter.seconds

    def gather_json(
        self, items: list[Any], shape: Any, what: str, limit: int = MESSAGE_LIMIT
    ) -> list[Any]:
        """Every member's ``items`` as JSON in ``uint8`` tensors
        (:func:`slate.engines.distributed.wire.json_exchange.gather_json`): each member's text is
        parsed and checked on arrival, naming it when malformed. Nothing is unpickled."""
        return json_exchange.gather_json(items, shape, what, limit, self.members, self._all_gather)

    def broadcast_json(
        self, value: Any, source: int, shape: Any, what: str, limit: int = MESSAGE_LIMIT
    ) -> Any:
        """``value`` of party ``source`` on every member, sent as JSON
        (:func:`slate.engines.distributed.wire.json_exchange.broadcast_json`) and checked against
        ``shape`` on arrival."""
        src = self.members.index(source)
        return json_exchange.broadcast_json(
            value, source, shape, what, limit, self.rank == source,
            lambda value: self._broadcast(value, src),
        )  # fmt: skip

    def _all_gather(self, value: Tensor) -> list[Tensor]:
        self.count_all_gather(value)
        if self._wire is not None:
            with self._wire.exchange("gathered"):
                return self._wire.gather(self.waiter, value)
        direct = self._small_exchange(value)
        if direct is not None:
            return direct.gather(self.waiter, value)
        parts = [torch.empty_like(value) for _ in range(self.n_parties)]
        self.waiter.collective(
            lambda: dist.all_gather(parts, value, async_op=True), self._everyone()
        )
        return parts

    def _broadcast(self, value: Tensor, src: int) -> None:
        if self._wire is not None:
            with self._wire.exchange("broadcast"):
                self._wire.broadcast(self.waiter, value, src)
            return
        direct = self._small_exchange(value)
        if direct is not None:
            direct.broadcast(self.waiter, value, src)
            return
        self.waiter.collective(
            lambda: dist.broadcast(value, src=src, async_op=True), self._everyone()
        )

    def gather(self, x: Tensor) -> Tensor | None:
        parts = self._all_gather(x.contiguous())
        return torch.cat(parts) if self.is_main else None

    def leave(self) -> None:
        """Wait for every member before leaving, so that none tears down while another still
        talks to it: one direct exchange of a token with every member (about one round trip,
        where gloo's barrier takes ``N - 1``); a party lost at this point no longer matters."""
        with contextlib.suppress(PartyLost):
            self._all_members_here()
        for daemon in (self._heartbeat, self._lookout):
            if daemon is not None:
                daemon.stop()
        if self.rendezvous is not None:
            try:
                if self.report is not None:
                    self.report.done(self.records)
                final = json.dumps(list(self.members)) if self.is_main else None
                if final is not None:
                    self.records.put(FINAL_MEMBERS_KEY, final)
                leave_run(self.records, self.rank)
                confirm_leave(self.records, self.rank, final)
            except (RuntimeError, dist.DistStoreError):
                pass  # the store's host is gone; the results are written

    def _all_members_here(self) -> None:
        """Return once every member has reached this call: each sends every other a one-byte
        token and waits for all of theirs (a sealed run through its wire)."""
        if self.n_parties < 2:
            return
        token = torch.zeros(1, dtype=torch.uint8, device=self.device)
        if self._wire is not None:
            with self._wire.exchange("leave"):
                self._wire.gather(self.waiter, token)
            return
        DirectWire(self.rank, self.members).gather(self.waiter, token)


_SEALED_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max"}

_OPENED = False  # whether this process ever opened a process group (see opened_a_group)


def opened_a_group() -> bool:
    """Whether this process joined a process group, now open or aborted: its gloo threads then
    make a normal interpreter exit unsafe (the CLI leaves with ``os._exit``)."""
    return _OPENED or dist.is_initialized()


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))
