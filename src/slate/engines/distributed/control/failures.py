"""How a party process waits for its communication, and what a failure of it means.

A failed collective becomes :class:`~slate.engines.distributed.control.membership.PartyLost` naming
the lost rank (``--on-party-loss stop``), or :class:`ExchangeFailed` once any member raised the
generation's failed flag (``continue``): the survivors then agree on the next generation
(:mod:`slate.engines.distributed.control.membership`). Raw gloo and c10d messages are cut to one
line.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from slate.engines.distributed.control.liveness import process_alive, registered_process
from slate.engines.distributed.control.lookout import Lookout
from slate.engines.distributed.control.membership import PartyLost
from slate.engines.distributed.control.store_records import Records, parse_rank
from slate.errors import ranges_text

__all__ = ["ExchangeFailed", "FailureGuard", "Waiter", "default_store", "first_line"]

LOST_KEY = "slate/lost_rank"
PROC_KEY = "slate/process"
LOOKUP_SECONDS = 3.0
POLL_SECONDS = 0.2  # a wait looks this often whether another member left the generation


class ExchangeFailed(PartyLost):
    """An exchange of this generation failed; the survivors can agree on the next one."""


def pending_timeout(err: Exception) -> bool:
    text = str(err)
    return "timed out" in text.lower() and "pair closure" not in text


class FailureGuard:
    """Turns a failed collective into :class:`PartyLost`, naming the rank that was lost.

    Every party registers ``host:pid`` in the rendezvous store when it starts. On a failure, a
    party first looks for a registered process on its own host that is gone; failing that, it
    takes the rank that another party already recorded, or the single peer it was waiting on.
    The first party to find the lost rank records it in the store for the others.
    """

    def __init__(self, rank: int, records: Records | None = None) -> None:
        self.rank = rank
        self._records = records

    def records(self) -> Records | None:
        """The run's store records: the rendezvous's, or torchrun's default store (unsigned)."""
        if self._records is not None:
            return self._records
        store = default_store()
        return Records(store, dist.get_world_size()) if store is not None else None

    def register(self) -> None:
        records = self.records()
        if records is not None:
            records.put(f"{PROC_KEY}/{self.rank}", f"{socket.gethostname()}:{os.getpid()}")

    def run(self, action: Callable[[], Any], suspects: list[int]) -> Any:
        try:
            return action()
        except (RuntimeError, dist.DistBackendError) as err:
            raise PartyLost(self._message(suspects, err)) from None

    def _message(self, suspects: list[int], err: Exception) -> str:
        lost = self._find_lost(suspects)
        return (
            f"Party {self.rank} lost contact with party (rank) {lost}: its process died or its "
            f"machine became unreachable, so this party stops too (--on-party-loss stop). "
            f"Restart all parties (with --resume once checkpoints exist). Backend said: "
            f"{str(err).splitlines()[0][:200]}"
        )

    def _find_lost(self, suspects: list[int]) -> int | str:
        records = self.records()
        if records is None:
            return describe_suspects(suspects)
        try:
            # What the first party to find the lost rank recorded wins: the others may only
            # have seen that party leave after it reported. A party that cannot tell on its own
            # (a collective with every rank) waits a moment for that record or for a dead process.
            deadline = time.monotonic() + LOOKUP_SECONDS
            while True:
                recorded = parse_rank(records.get(LOST_KEY), records.nodes)
                if recorded is not None:
                    return recorded
                found = self._dead_local_process(records, suspects)
                if found is None and len(suspects) == 1:
                    found = suspects[0]
                if found is not None:
                    first = records.first(LOST_KEY, str(found), valid=records.names_a_rank)
                    return int(first)
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        except Exception:  # the store is unreachable: its host (rank 0 under env://) is gone
            return "0 (or the host of the rendezvous store)"
        return describe_suspects(suspects)

    def _dead_local_process(self, records: Records, suspects: list[int]) -> int | None:
        host = socket.gethostname()
        for rank in suspects:
            where = registered_process(records, rank) if rank != self.rank else None
            if where is not None and where[0] == host and not process_alive(where[1]):
                return rank
        return None


def describe_suspects(suspects: list[int]) -> int | str:
    return suspects[0] if len(suspects) == 1 else f"one of {ranges_text(suspects)}"


def default_store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no store: not initialised, or already torn down
        return None


class _Background:
    """One daemon thread that runs blocking waits for the training thread.

    gloo's point-to-point waits cannot be waited for in slices (a
    timed-out receive closes its connection), so :class:`Waiter` hands them to this thread and
    watches the run while it blocks. A wait given up on (its party counted as lost) keeps this
    thread until the abandoned group times out; the waiter then starts a new one.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="slate-wait", daemon=True).start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            action, done, box = job
            try:
                box.append((True, action()))
            except BaseException as err:  # handed back to the training thread
                box.append((False, err))
            done.set()

    def run(self, action: Callable[[], Any], watch: Callable[[], None]) -> Any:
        """``action()``'s result, calling ``watch()`` every ``POLL_SECONDS`` while it blocks
        (``watch`` raises to give up on it)."""
        done, box = threading.Event(), []
        self._jobs.put((action, done, box))
        while not done.wait(POLL_SECONDS):
            watch()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def retire(self) -> None:
        self._jobs.put(None)  # the thread ends once its abandoned wait does


class Waiter:
    """Waits for this process's communication, failing in the way the loss policy asks.

    ``stop`` (no ``lookout``): one blocking wait; a failure is :class:`PartyLost` naming the
    lost rank. ``continue``: every wait is watched every ``POLL_SECONDS``: it stops as soon as
    the :class:`~slate.engines.distributed.control.lookout.Lookout` (a daemon thread that reads the
    store) saw any member raise the generation's failed flag, or saw a member it waits for gone (its
    heartbeat silent for the membership's ``silence_s``, or its process exited), and a failure is
    :class:`ExchangeFailed`. A watch reads the lookout's last sighting only: no round trip to the
    store is ever on the training thread's path. Collectives are waited for in slices;
    point-to-point waits and posting of point-to-point messages block a background thread
    (:class:`_Background`) instead.
    """

    def __init__(self, guard: FailureGuard, lookout: Lookout | None = None) -> None:
        self.guard = guard
        self.lookout = lookout
        self._background: _Background | None = None
        self.seconds = 0.0  # wall time this process spent waiting for communication

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - started

    @property
    def watches(self) -> bool:
        """Whether waits are watched (``--on-party-loss continue``)."""
        return self.lookout is not None

    def collective(self, start: Callable[[], Any], suspects: list[int]) -> None:
        with self._timed():
            self._collective(start, suspects)

    def _collective(self, start: Callable[[], Any], suspects: list[int]) -> None:
        if self.lookout is None:
            self.guard.run(lambda: start().wait(), suspects)
            return
        try:
            work = start()
            while True:
                try:
                    work.wait(timeout=datetime.timedelta(seconds=POLL_SECONDS))
                    return
                except (RuntimeError, dist.DistBackendError) as err:
                    if not pending_timeout(err):
                        raise
                self._watch(suspects)
        except (RuntimeError, dist.DistBackendError) as err:
            raise ExchangeFailed(first_line(err)) from None

    def post(self, action: Callable[[], Any], suspects: list[int]) -> Any:
        """Start communication (posting sends and receives can fail on a closed connection),
        in the background, watched like a point-to-point wait."""
        with self._timed():
            if self.lookout is None:
                return self.guard.run(action, suspects)
            return self._in_background(action, suspects)

    def point_to_point(self, work: Any, peer: int) -> None:
        with self._timed():
            if self.lookout is None:
                self.guard.run(work.wait, [peer])
                return
            self._in_background(work.wait, [peer])

    def _in_background(self, action: Callable[[], Any], suspects: list[int]) -> Any:
        if self._background is None:
            self._background = _Background()
        try:
            return self._background.run(action, lambda: self._watch(suspects))
        except ExchangeFailed:
            self._background.retire()  # still blocked on the abandoned wait
            self._background = None
            raise
        except (RuntimeError, dist.DistBackendError) as err:
            raise ExchangeFailed(first_line(err)) from None

    def _watch(self, suspects: list[int]) -> None:
        """Give up on a wait once another member left this generation, or once a member it
        waits for (``suspects``: indices among the generation's members) is gone, as the
        lookout last saw them. Without a sighting (the store is out of reach: the rendezvous
        is gone, or this site is cut off) the wait goes on, bounded by --timeout."""
        assert self.lookout is not None
        seen = self.lookout.sighting()
        if seen is None:
            return
        if seen.failed:
            raise ExchangeFailed("another party left this generation")
        for i in suspects:
            rank = seen.members[i] if i < len(seen.members) else None
            if rank in seen.gone:
                raise ExchangeFailed(f"party {rank} is gone: {seen.gone[rank]}")


def first_line(err: Exception) -> str:
    return str(err).splitlines()[0][:200] if str(err) else type(err).__name__
