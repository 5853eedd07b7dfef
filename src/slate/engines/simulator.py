"""The single-process simulator of N parties: mixing is one matrix product.

All parties' parameters are stacked into ``x`` of shape ``(N, d)``; ``mix(x)`` is
``W_t @ x`` on the whole flat buffer (every parameter tensor of every party at once) and
``average(x)`` broadcasts the column means. A sparse network (a ring, a torus: at most a quarter
of W's entries non-zero) multiplies with W in compressed sparse row form, whose cost grows with
the number of edges rather than N². A large buffer is stepped and mixed block by block in
cache (:meth:`SimulatorCommunicator.mix_step`). The traffic counters report what the distributed
engine would send for the same rounds: one flat buffer per neighbour per gossip exchange.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import Tensor

from slate.engines.base import Communicator
from slate.topology import Topology

__all__ = ["SimulatorCommunicator"]

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
        topology: the network; ``topology.matrix_at(t)`` gives round ``t``'s matrix.
        device: where the parties' parameters live.
        dtype: the parameters' dtype (the matrix is cast to it once).
    """

    def __init__(self, topology: Topology, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.topology = topology
        self.n = topology.W.shape[0]
        self._gossip = _gossip_matrix(np.array(topology.W), dtype, device)
        self._gossip_is_identity = bool(np.array_equal(topology.W, np.eye(self.n)))
        self._mean_degree = (
            sum(len(topology.neighbours(i)) for i in range(self.n)) / self.n if self.n > 1 else 0.0
        )

    def mix(self, x: Tensor) -> Tensor:
        if self.topology.is_full_average_at(self.iteration):
            return self.average(x)
        if self._gossip_is_identity:
            return x
        self._count_gossip(x)
        return self._mix_in_blocks(x, None, 0.0)

    def mix_step(self, x: Tensor, direction: Tensor, lr: float) -> Tensor:
        if self.topology.is_full_average_at(self.iteration) or self._gossip_is_identity:
            return super().mix_step(x, direction, lr)
        self._count_gossip(x)
        return self._mix_in_blocks(x, direction, lr)

    def _mix_in_blocks(self, x: Tensor, direction: Tensor | None, lr: float) -> Tensor:
        """``W (x - lr direction)`` on column blocks of about ``BLOCK_BYTES`` each (CPU).

        A large model's ``(N, d)`` buffer does not fit in cache, so a separate step and mix would
        each stream it through memory; block by block, the step's result is mixed while it is
        still in cache. Every entry is the same sum either way.
        """
        n, d = x.shape
        width = max(1024, BLOCK_BYTES // (n * x.element_size()))
        if d <= width or x.device.type != "cpu":
            return self._gossip @ (x if direction is None else torch.add(x, direction, alpha=-lr))
        out = torch.empty_like(x)
        for start in range(0, d, width):
            cols = slice(start, start + width)
            block = x[:, cols]
            if direction is not None:
                block = torch.add(block, direction[:, cols], alpha=-lr)
            out[:, cols] = self._gossip @ block
        return out

    def average(self, x: Tensor) -> Tensor:
        self._count_all_reduce(x)
        return x.mean(dim=0, keepdim=True).expand_as(x).clone()

    def _count_gossip(self, x: Tensor) -> None:
        payload = x.shape[-1] * x.element_size()
        self.bytes_sent += self._mean_degree * payload
        self.messages_sent += self._mean_degree

    def _count_all_reduce(self, x: Tensor) -> None:
        # A ring all-reduce sends 2 (N - 1) / N of the buffer per party in 2 (N - 1) messages.
        if self.n > 1:
            payload = x.shape[-1] * x.element_size()
            self.bytes_sent += 2 * (self.n - 1) / self.n * payload
            self.messages_sent += 2 * (self.n - 1)
