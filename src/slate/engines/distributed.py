"""The real multi-party engine on ``torch.distributed``: one process per party.

Each process runs one party (``P = 1``) with exactly the simulator's code for sampling, model,
algorithm and evaluation; only the communicator differs:

* ``mix(x)`` exchanges **one flat buffer per neighbour per exchange** with
  ``dist.batch_isend_irecv``, only with the parties ``r`` that have ``w_nr > 0``, then forms
  :math:`w_{nn} x_n + \\sum_r w_{nr} x_r` locally;
* ``average(x)`` is one ``all_reduce``; the ``full`` topology and federated averaging rounds use it.

gloo carries CPU tensors, nccl CUDA tensors. A party that stops answering makes the others fail
within ``--timeout`` seconds with a :class:`PartyLost` error that names the lost rank.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from slate.engines.base import Communicator
from slate.engines.local import Engine
from slate.errors import SlateError
from slate.topology import Topology

__all__ = ["DistributedCommunicator", "DistributedEngine", "PartyLost", "init_process_group"]

LOST_KEY = "slate/lost_rank"
PROC_KEY = "slate/process"
LOOKUP_SECONDS = 3.0


class PartyLost(SlateError):
    """Another party stopped answering (its process died or its machine became unreachable)."""


def init_process_group(
    backend: str, rank: int, world_size: int, timeout_s: float, init_method: str | None = None
) -> None:
    """Join the process group: from ``init_method``, or from torchrun's environment variables."""
    kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)}
    if init_method is not None:
        kwargs.update(init_method=init_method, rank=rank, world_size=world_size)
    dist.init_process_group(backend, **kwargs)


class _Guard:
    """Turns a failed collective into :class:`PartyLost`, naming the rank that was lost.

    Every party registers ``host:pid`` in the rendezvous store when it starts. On a failure, a
    party first looks for a registered process on its own host that is gone; failing that, it
    takes the rank that another party already recorded, or the single peer it was waiting on.
    The first party to find the lost rank records it in the store for the others.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def register(self) -> None:
        store = _store()
        if store is not None:
            store.set(f"{PROC_KEY}/{self.rank}", f"{socket.gethostname()}:{os.getpid()}")

    def run(self, action: Callable[[], Any], suspects: list[int]) -> Any:
        try:
            return action()
        except (RuntimeError, dist.DistBackendError) as err:
            raise PartyLost(self._message(suspects, err)) from None

    def _message(self, suspects: list[int], err: Exception) -> str:
        lost = self._find_lost(suspects)
        return (
            f"Party {self.rank} lost contact with party (rank) {lost}: its process died or its "
            f"machine became unreachable, so this party stops too. Restart all parties (with "
            f"--resume once checkpoints exist). Backend said: {str(err).splitlines()[0][:200]}"
        )

    def _find_lost(self, suspects: list[int]) -> int | str:
        store = _store()
        if store is None:
            return _describe(suspects)
        try:
            # What the first party to find the lost rank recorded wins: the others may only
            # have seen that party leave after it reported. A party that cannot tell on its own
            # (a collective with every rank) waits a moment for that record or for a dead process.
            deadline = time.monotonic() + LOOKUP_SECONDS
            while True:
                if store.check([LOST_KEY]):
                    return int(store.get(LOST_KEY))
                found = self._dead_local_process(store, suspects)
                if found is None and len(suspects) == 1:
                    found = suspects[0]
                if found is not None:
                    return int(store.compare_set(LOST_KEY, "", str(found)))
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        except Exception:  # the store is unreachable: its host (rank 0 under env://) is gone
            return "0 (or the host of the rendezvous store)"
        return _describe(suspects)

    def _dead_local_process(self, store, suspects: list[int]) -> int | None:
        host = socket.gethostname()
        for rank in suspects:
            if rank == self.rank or not store.check([f"{PROC_KEY}/{rank}"]):
                continue
            where, _, pid = store.get(f"{PROC_KEY}/{rank}").decode().rpartition(":")
            if where == host and not _process_alive(int(pid)):
                return rank
        return None


def _describe(suspects: list[int]) -> int | str:
    return suspects[0] if len(suspects) == 1 else f"one of {suspects}"


def _process_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host; a zombie (exited, not yet reaped) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no store: not initialised, or already torn down
        return None


class DistributedCommunicator(Communicator):
    """Neighbour-only gossip with point-to-point messages, and exact averages with all_reduce."""

    def __init__(self, topology: Topology, rank: int, group: Any = None) -> None:
        super().__init__()
        self.topology = topology
        self.rank = rank
        self.group = group
        self.n = topology.n
        self.self_weight = float(topology.W[rank, rank])
        self.neighbours = topology.neighbours(rank)
        self.guard = _Guard(rank)

    def mix(self, x: Tensor) -> Tensor:
        if self.topology.is_full_average_at(self.iteration):
            return self.average(x)
        if not self.neighbours:
            return x
        flat = x.reshape(-1).contiguous()
        received = {r: torch.empty_like(flat) for r, _ in self.neighbours}
        ops = []
        for r, _ in self.neighbours:
            peer = r if self.group is None else dist.get_global_rank(self.group, r)
            ops.append(dist.P2POp(dist.isend, flat, peer, self.group))
            ops.append(dist.P2POp(dist.irecv, received[r], peer, self.group))
        works = self.guard.run(lambda: dist.batch_isend_irecv(ops), [r for r, _ in self.neighbours])
        for k, work in enumerate(works):
            peer = self.neighbours[k // 2][0]
            self.guard.run(work.wait, [peer])
        out = self.self_weight * flat
        for r, w in self.neighbours:
            out = out + w * received[r]
        self.bytes_sent += len(self.neighbours) * flat.numel() * flat.element_size()
        self.messages_sent += len(self.neighbours)
        return out.view_as(x)

    def average(self, x: Tensor) -> Tensor:
        total = x.clone()
        self.guard.run(lambda: dist.all_reduce(total, group=self.group), list(range(self.n)))
        if self.n > 1:
            payload = x.numel() * x.element_size()
            self.bytes_sent += 2 * (self.n - 1) / self.n * payload
            self.messages_sent += 2 * (self.n - 1)
        return total / self.n


class DistributedEngine(Engine):
    """This process is party ``rank`` of ``world_size``; the process group is already set up."""

    name = "distributed"
    stops_between_iterations = False  # parties stop together, at the end of a chunk

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.rank = dist.get_rank()
        self.n_parties = dist.get_world_size()
        self.local_parties = [self.rank]
        self.is_main = self.rank == 0
        self.guard = _Guard(self.rank)
        self.guard.register()

    def communicator(self, topology: Topology, device: torch.device) -> Communicator:
        del device
        return DistributedCommunicator(topology, self.rank)

    def mean(self, x: Tensor) -> Tensor:
        return self.total(x.sum(dim=0)) / self.n_parties

    def total(self, value: Tensor) -> Tensor:
        out = value.clone()
        self.guard.run(lambda: dist.all_reduce(out), list(range(self.n_parties)))
        return out

    def minimum(self, value: Tensor) -> Tensor:
        out = value.to(self.device).clone()
        op = dist.ReduceOp.MIN
        self.guard.run(lambda: dist.all_reduce(out, op=op), list(range(self.n_parties)))
        return out

    def any(self, flag: bool) -> bool:
        return bool(self.total(torch.tensor(float(flag), device=self.device)) > 0)

    def gather_objects(self, items: list[Any]) -> list[Any]:
        everyone: list[Any] = [None] * self.n_parties
        self.guard.run(lambda: dist.all_gather_object(everyone, items), list(range(self.n_parties)))
        return [item for process_items in everyone for item in process_items]

    def gather(self, x: Tensor) -> Tensor | None:
        parts = [torch.empty_like(x) for _ in range(self.n_parties)]
        self.guard.run(lambda: dist.all_gather(parts, x.contiguous()), list(range(self.n_parties)))
        return torch.cat(parts) if self.is_main else None


def backend_for(device: torch.device) -> str:
    """nccl for CUDA tensors, gloo for CPU ones."""
    return "nccl" if device.type == "cuda" else "gloo"


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))
