"""What a run's training waited for on the network, counted from its start: the collectives'
bytes and round trips and the communication waits of this process, and from them the ``--wan``
estimate of one party's training time (docs/wan.md, docs/engines.md "Communication
accounting")."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slate.communication.gossip import WanLink
    from slate.engines.base import Communicator, Engine

__all__ = ["NetworkClock"]


class NetworkClock:
    """The training's collectives and waits since :meth:`start` (a resume adds those of the run
    before it)."""

    def __init__(self, engine: Engine, wan: WanLink | None) -> None:
        self.engine, self.wan = engine, wan
        self._start = [0.0, 0.0, 0.0]

    def _now(self) -> list[float]:
        engine = self.engine
        return [float(engine.collective_bytes), engine.collective_round_trips, engine.wait_seconds]

    def start(self, recorded: list[float] | None = None) -> None:
        """From now on, count the training's collectives (bytes, round trips) and waits
        (``recorded``: those of the run before a resume, from :meth:`state`)."""
        before = recorded or [0.0, 0.0, 0.0]
        self._start = [a - b for a, b in zip(self._now(), before, strict=True)]

    def set_up_round_trips(self) -> float:
        """Round trips of the collectives before training (this process's start or resume)."""
        return float(self._start[1])

    def state(self) -> list[float]:
        """The training's collective bytes, their round trips and its communication waits."""
        return [a - b for a, b in zip(self._now(), self._start, strict=True)]

    def compute_seconds(self, elapsed: float) -> float:
        """One party's compute in ``elapsed`` seconds of training: its wall time less its
        waits for communication, shared among the parties this process runs (the simulator
        runs all N: one party's share is ``1 / N`` of its time)."""
        waits = self.state()[2]
        return max(0.0, elapsed - waits) / len(self.engine.local_parties)

    def estimated_wan_seconds(
        self, elapsed: float, traffic: dict[str, float], comm: Communicator
    ) -> float:
        """``--wan``: one party's compute, plus one RTT per gossip round (half for a round
        whose receives were posted rounds before) and per round trip of the other
        collectives, plus the busiest party's gossip and collective bytes at the link's
        bandwidth (:meth:`slate.communication.gossip.WanLink.seconds`); NaN without
        ``--wan``."""
        if self.wan is None:
            return math.nan
        collective_bytes, round_trips, _ = self.state()
        exchanged = traffic["comm_bytes_per_party"] * comm.busiest_share
        rounds = traffic["rounds"]
        return self.wan.seconds(
            self.compute_seconds(elapsed), rounds, exchanged, round_trips, collective_bytes,
            rounds * comm.ahead_share,
        )  # fmt: skip
