"""What a training run needs from its engine besides mixing: who runs here, and reductions.

The simulator runs every party in one process; a distributed process runs one party. The
training loop (``slate.training.run.Run``) is written once against :class:`Engine`, so both engines
share the sampling, the algorithm steps, the evaluation and the run outputs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor

from slate.communication.gossip import GossipSettings
from slate.engines.base import (
    Communicator,
    all_gather_round_trips,
    all_reduce_round_trips,
)
from slate.engines.simulator import SimulatorCommunicator
from slate.security.messages import ListOf, decode, encode
from slate.topology import Topology

__all__ = ["MESSAGE_LIMIT", "Engine", "SimulatorEngine"]

MESSAGE_LIMIT = 64 << 20  # bytes of one process's JSON facts in one exchange (schemas, counts)


class Engine(ABC):
    """The parties this process runs, and collective reductions over all N parties."""

    name: str
    stops_between_iterations: bool
    roster_digest: str | None = None  # the sha256 of the run's roster, when it has one
    n_parties: int
    local_parties: list[int]
    is_main: bool

    @abstractmethod
    def communicator(
        self,
        topology: Topology,
        device: torch.device,
        settings: GossipSettings | None = None,
        x0: Tensor | None = None,
    ) -> Communicator:
        """The mixing implementation for this engine (``x0``: the local parties' starting
        parameters, which compressed gossip's public copies start from)."""

    def set_members(self, members: list[int]) -> None:
        """The run continues with ``members`` (the distributed engine learns it on its own)."""
        del members

    @abstractmethod
    def mean(self, x: Tensor) -> Tensor:
        """The mean over all N parties of the local rows ``x (P, ...)``, on every process."""

    @abstractmethod
    def total(self, value: Tensor) -> Tensor:
        """The sum over all processes of a local tensor."""

    @abstractmethod
    def gather(self, x: Tensor) -> Tensor | None:
        """All N parties' rows stacked ``(N, ...)`` on the main process, None elsewhere."""

    @abstractmethod
    def minimum(self, value: Tensor) -> Tensor:
        """The minimum over all processes of a local scalar."""

    @abstractmethod
    def any(self, flag: bool) -> bool:
        """True on every process if ``flag`` is true on any."""

    def any_of(self, flags: list[bool]) -> list[bool]:
        """For each flag, True on every process if it is true on any (one exchange)."""
        self.count_collective(torch.zeros(len(flags)))
        return list(flags)

    def joins_requested(self) -> bool:
        """Whether a party outside the run asks to join (the distributed engine's lookout)."""
        return False

    def union(self, words: Tensor) -> Tensor:
        """The bitwise OR over all processes of local ``int64`` words (one process: itself)."""
        self.count_collective(words)
        return words

    #: Bytes this process sent in collectives besides gossip and exact averages (evaluations,
    #: stop checks, set-up facts): as a ring all-reduce of each tensor sends them, in both
    #: engines, so that the simulator reports what one process of a distributed run sends.
    collective_bytes: Fraction = Fraction(0)  # exact: differences of it repeat bit for bit
    #: Round trips those collectives wait for, one after the other
    #: (:func:`~slate.engines.base.all_reduce_round_trips`, ``all_gather_round_trips``).
    collective_round_trips: float = 0.0

    @property
    def wait_seconds(self) -> float:
        """Wall time this process spent waiting for communication (none in one process)."""
        return 0.0

    def count_collective(self, value: Tensor) -> None:
        """Count one ring all-reduce of ``value``: ``2 (N - 1) / N`` of its bytes, and its
        round trips."""
        n = self.n_parties
        if n > 1:
            self.collective_bytes += Fraction(2 * (n - 1) * value.numel() * value.element_size(), n)
            self.collective_round_trips += all_reduce_round_trips(value.numel(), n)

    def count_all_gather(self, piece: Tensor) -> None:
        """Count one ring all-gather of each party's ``piece``: ``N - 1`` pieces sent, and
        :func:`~slate.engines.base.all_gather_round_trips`."""
        n = self.n_parties
        self.collective_bytes += (n - 1) * piece.numel() * piece.element_size()
        self.collective_round_trips += all_gather_round_trips(n)

    @abstractmethod
    def gather_json(
        self, items: list[Any], shape: Any, what: str, limit: int = MESSAGE_LIMIT
    ) -> list[Any]:
        """Every process's ``items`` (JSON values of ``shape``), concatenated in rank order.

        What each process sent is parsed as JSON and checked against ``ListOf(shape)``
        (:mod:`slate.security.messages`): never unpickled. A message over ``limit`` bytes or of
        another shape raises :class:`~slate.security.messages.MalformedMessage` naming its
        sender, on every process alike. Tuples arrive as lists and object keys as strings.
        """


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
    ) -> Communicator:
        return SimulatorCommunicator(topology, device, torch.float32, settings, x0)

    def mean(self, x: Tensor) -> Tensor:
        self.count_collective(x[0])
        return x.mean(dim=0)

    def total(self, value: Tensor) -> Tensor:
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
