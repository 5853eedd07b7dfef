"""The single-process simulator of N parties: its engine (:class:`SimulatorEngine`, every party in
this process, reductions as tensor operations) and its communicator, where mixing is one matrix
product.

All parties' parameters are stacked into ``x`` of shape ``(N, d)``; ``mix(x)`` is
``W_t @ x`` on the whole flat buffer (every parameter tensor of every party at once) and
``average(x)`` broadcasts the column means. A sparse network (a ring, a torus: at most a quarter
of W's entries non-zero) multiplies with W in compressed sparse row form, whose cost grows with
the number of edges rather than N². A large buffer is stepped and mixed block by block in
cache (:meth:`SimulatorCommunicator.mix_step`). The traffic counters report what the distributed
engine would send for the same rounds: one flat buffer per neighbour per gossip exchange, or one
compressed payload per edge with ``--compress`` (:mod:`slate.communication.choco`).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

from slate.communication.choco import ChocoGossip, simulated_exchange
from slate.communication.gossip import GossipSettings
from slate.engines.base import MESSAGE_LIMIT, Communicator, Engine
from slate.security.messages import ListOf, decode, encode
from slate.security.robust import MessageGuard
from slate.topology import Topology

__all__ = ["SimulatorCommunicator", "SimulatorEngine"]

SPARSE_DENSITY = 0.25  # W is stored sparse when at most this fraction of it is non-zero
BLOCK_BYTES = 1 << 20  # a large (N, d) buffer is mixed in column blocks of about this size


def _gossip_matrix(W: np.ndarray, dtype: torch.dtype, device: torch.device) -> Tensor:
    """W as a dense tensor, or in CSR form on CPU when it is sparse enough for that to be faster.

    (A ring of 20: 42 us against 103 us per product with the w8a MLP's buffer, on 2 cores.)
    """
    dense = torch.tensor(W, dtype=dtype, device=device)
    if device.type != "cpu" or np.count_nonzero(W) > SPARSE_DENSITY * W.size:
        return dense
    with warnings.catch_warnings():  # "sparse CSR support is in beta"; we test what we use
        warnings.simplefilter("ignore", UserWarning)
        return dense.to_sparse_csr()


class SimulatorCommunicator(Communicator):
    """:class:`Communicator` for stacked parties on one device.

    Args:
        topology: the network; ``topology.matrix_at(r)`` gives gossip round ``r``'s matrix.
        device: where the parties' parameters live.
        dtype: the parameters' dtype (the matrices are cast to it once).
        settings: local steps and compression (default: the paper's protocol).
        x0: the parties' starting parameters ``(N, d)``; needed with a compressor (CHOCO's
            public copies start there).
        guard: how what arrives is mixed (:mod:`slate.security.robust`); None: plain.
    """

    def __init__(
        self,
        topology: Topology,
        device: torch.device,
        dtype: torch.dtype,
        settings: GossipSettings | None = None,
        x0: Tensor | None = None,
        guard: MessageGuard | None = None,
    ) -> None:
        super().__init__(topology, settings, guard)
        self.n = topology.n
        self.device, self.dtype = device, dtype
        self._matrices: dict[int, tuple[Tensor | None, float]] = {}
        self._edges: dict[int, tuple[Tensor, Tensor, Tensor, Tensor]] = {}  # _guarded_mix's
        self.choco: ChocoGossip | None = None
        if self.settings.compressor is not None:
            if x0 is None:
                raise ValueError("compressed gossip needs the starting parameters x0")
            self.choco = ChocoGossip(
                topology, range(self.n), self.settings.compressor,
                self.settings.consensus_step, x0, simulated_exchange, guard,
            )  # fmt: skip

    def gossip_matrix(self, r: int) -> tuple[Tensor | None, float]:
        """Round ``r``'s matrix (``None`` for the identity) and its mean degree, cached per
        position in the topology's cycle."""
        key = r % max(1, self.topology.cycle_length)
        if key not in self._matrices:
            W = np.array(self.topology.matrix_at(r))
            off = W > 0
            np.fill_diagonal(off, False)
            identity = bool(np.array_equal(W, np.eye(self.n)))
            gossip = None if identity else _gossip_matrix(W, self.dtype, self.device)
            self._matrices[key] = (gossip, float(off.sum()) / self.n)
        return self._matrices[key]

    def _gossip(self, x: Tensor, r: int) -> Tensor:
        return self._gossip_step(x, None, 0.0, r)

    def _gossip_step(self, x: Tensor, direction: Tensor | None, lr: float, r: int) -> Tensor:
        if self.choco is not None:
            stepped = x if direction is None else torch.add(x, direction, alpha=-lr)
            mixed, messages = self.choco.gossip(stepped, r)
            payload = self.choco.payload_bytes(x.shape[-1])
            self._count(messages * payload / self.n, messages / self.n)
            return mixed
        gossip, degree = self.gossip_matrix(r)
        if gossip is None:
            return x if direction is None else torch.add(x, direction, alpha=-lr)
        self._count(degree * x.shape[-1] * x.element_size(), degree)
        if self.guard is not None and self.guard.edge_by_edge:
            stepped = x if direction is None else torch.add(x, direction, alpha=-lr)
            return self._guarded_mix(stepped, r)
        return self._mix_in_blocks(gossip, x, direction, lr)

    def _guarded_mix(self, x: Tensor, r: int) -> Tensor:
        """Mixing edge by edge (an attacker among the rows, or ``--robust clip``): each party
        receives its neighbours' rows as they send them, and the guard mixes them
        (:mod:`slate.security.robust`)."""
        assert self.guard is not None
        key = r % max(1, self.topology.cycle_length)
        if key not in self._edges:
            W = np.array(self.topology.matrix_at(r))
            pairs = [(i, j) for i in range(self.n) for j in range(self.n) if i != j and W[i, j] > 0]
            as_long = lambda v: torch.tensor(v, dtype=torch.long, device=self.device)  # noqa: E731
            self._edges[key] = (
                as_long([i for i, _ in pairs]),
                as_long([j for _, j in pairs]),
                torch.tensor([W[i, j] for i, j in pairs], dtype=self.dtype, device=self.device),
                torch.tensor(np.diag(W).copy(), dtype=self.dtype, device=self.device),
            )
        receivers, senders, weights, self_weight = self._edges[key]
        theirs = self.guard.sent(x).index_select(0, senders)
        return self.guard.mix(x, theirs, weights, receivers, senders, self_weight)

    @staticmethod
    def _mix_in_blocks(gossip: Tensor, x: Tensor, direction: Tensor | None, lr: float) -> Tensor:
        """``W (x - lr direction)`` on column blocks of about ``BLOCK_BYTES`` each (CPU).

        A large model's ``(N, d)`` buffer does not fit in cache, so a separate step and mix would
        each stream it through memory; block by block, the step's result is mixed while it is
        still in cache. Every entry is the same sum either way.
        """
        n, d = x.shape
        width = max(1024, BLOCK_BYTES // (n * x.element_size()))
        if d <= width or x.device.type != "cpu":
            return gossip @ (x if direction is None else torch.add(x, direction, alpha=-lr))
        out = torch.empty_like(x)
        for start in range(0, d, width):
            cols = slice(start, start + width)
            block = x[:, cols]
            if direction is not None:
                block = torch.add(block, direction[:, cols], alpha=-lr)
            out[:, cols] = gossip @ block
        return out

    def average(self, x: Tensor) -> Tensor:
        self._count_all_reduce(x, self.n)
        return x.mean(dim=0, keepdim=True).expand_as(x).clone()

    def state_dict(self) -> dict:
        return {"choco": self.choco.state_dict()} if self.choco is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.choco is not None and "choco" in state:
            self.choco.load_state_dict(state["choco"])


class SimulatorEngine(Engine):
    """Every party in this process: reductions are plain tensor operations."""

    name = "simulator"
    is_main = True
    stops_between_iterations = True

    def __init__(self, n_parties: int) -> None:
        self.n_parties = n_parties
        self.local_parties = list(range(n_parties))

    def set_members(self, members: list[int]) -> None:
        self.local_parties = sorted(members)
        self.n_parties = len(members)

    def communicator(
        self,
        topology: Topology,
        device: torch.device,
        settings: GossipSettings | None = None,
        x0: Tensor | None = None,
        guard: MessageGuard | None = None,
    ) -> Communicator:
        return SimulatorCommunicator(topology, device, torch.float32, settings, x0, guard)

    def mean(self, x: Tensor) -> Tensor:
        self.count_collective(x[0])
        return x.mean(dim=0)

    def total(self, value: Tensor, what: str = "") -> Tensor:
        del what
        self.count_collective(value)
        return value

    def gather(self, x: Tensor) -> Tensor:
        self.count_all_gather(x[0])
        return x

    def minimum(self, value: Tensor) -> Tensor:
        self.count_collective(value)
        return value

    def any(self, flag: bool) -> bool:
        self.count_collective(torch.zeros(1))
        return flag

    def gather_json(
        self, items: list[Any], shape: Any, what: str, limit: int = MESSAGE_LIMIT
    ) -> list[Any]:
        # The same encoding as between processes, so that both engines see the same values.
        return decode(encode(items), ListOf(shape), "0 (this process)", what, limit)
