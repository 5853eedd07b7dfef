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
from slate.engines.membership import Change
from slate.engines.simulator import SimulatorCommunicator
from slate.errors import ConfigError
from slate.security.messages import ListOf, decode, encode
from slate.topology import Topology

__all__ = ["MESSAGE_LIMIT", "Engine", "RecordedExchange", "SimulatorEngine"]

MESSAGE_LIMIT = 64 << 20  # bytes of one process's JSON facts in one exchange (schemas, counts)


class Engine(ABC):
    """The parties this process runs, and collective reductions over all N parties."""

    name: str
    stops_between_iterations: bool
    roster_digest: str | None = None  # the sha256 of the run's roster, when it has one
    n_parties: int
    local_parties: list[int]
    is_main: bool
    #: Whether a lost party leaves the others running (the distributed engine with
    #: ``--on-party-loss continue``): they roll back, agree on the survivors and go on.
    recovers: bool = False
    #: Whether this process returns to a run in progress (it opens its group with
    #: :meth:`rejoin` once its run is built).
    returning: bool = False
    #: Whether the rendezvous store stopped answering mid-run (no party can return then).
    store_out_of_reach: bool = False
    #: The one party this process runs when every party has a process of its own (the
    #: distributed engine), else None (the simulator runs every party in one process). Per-party
    #: files (checkpoints, set-up records), fault injection and the agreement on the run's
    #: settings belong to that party.
    own_party: int | None = None
    #: The flags ``slate train --resume`` needs besides the folder to continue on this engine.
    resume_flags: str = ""

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
    def total(self, value: Tensor, what: str = "") -> Tensor:
        """The sum over all processes of a local tensor; ``what`` names the sum."""

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

    def raise_unless_recovering(self, err: Exception) -> None:
        """After a failed exchange: raise ``err`` again unless this engine :attr:`recovers`
        (then the survivors agree on who is lost, :meth:`leave_generation`)."""
        if not self.recovers:
            raise err

    def leave_generation(self, position: int) -> Change:
        """After a failed exchange: agree with the survivors on who is lost (``position``: the
        earliest point this process can resume from). Only an engine that :attr:`recovers`."""
        del position
        raise NotImplementedError(f"the {self.name} engine does not recover from a lost party")

    def rejoin(self, reason: str = "restarted with --resume") -> Change:
        """A returning process asks to be admitted (only an engine that :attr:`recovers`)."""
        del reason
        raise NotImplementedError(f"no party returns to a run of the {self.name} engine")

    def admit_returning(self, iteration: int, asked: bool = True) -> Change | None:
        """At a checkpoint boundary: the agreed admission of returning parties, if any (only an
        engine that :attr:`recovers` has any)."""
        del iteration, asked
        return None

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


class RecordedExchange:
    """The data set-up's exchanges with the other parties, recorded, or replayed from a record.

    Setting up per-party data (:func:`slate.data.sources.load_local_data`) agrees on the schema
    and sums feature statistics with every party through the engine (:meth:`Engine.total`,
    :meth:`Engine.gather_json`). A party that returns to a run in progress cannot repeat those
    exchanges (the others are training), so every party records their results in its
    checkpoints, and a returning party replays its own record: the same agreed schema and
    statistics, with no message sent.
    """

    def __init__(self, engine: Any = None, record: list[Any] | None = None) -> None:
        self.engine = engine
        self.replaying = record is not None
        self.record: list[Any] = list(record) if record is not None else []
        self._next = 0

    def total(self, value: Tensor, what: str = "") -> Tensor:
        if self.replaying:
            return self._replay().to(value.device)
        result = self.engine.total(value, what)
        self.record.append(result.detach().cpu())
        return result

    def gather_json(
        self, items: list[Any], shape: Any, what: str, limit: int = MESSAGE_LIMIT
    ) -> list[Any]:
        if self.replaying:
            return self._replay()
        result = self.engine.gather_json(items, shape, what, limit)
        self.record.append(result)
        return result

    def _replay(self) -> Any:
        if self._next >= len(self.record):
            raise ConfigError(
                "This party's checkpoint records fewer data set-up exchanges than its files "
                "need now: were its --train/--test files or flags changed since the run began?"
            )
        self._next += 1
        return self.record[self._next - 1]
