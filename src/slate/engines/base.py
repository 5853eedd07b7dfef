r"""The communicator interface every algorithm is written against.

An algorithm sees the parameters of the parties it runs as a tensor ``x`` of shape ``(P, d)``:
``P = N`` in the simulator (all parties stacked), ``P = 1`` for one process of the distributed
engine. It communicates only through

* ``mix(x)``: apply the gossip matrix of the current round, :math:`x_n \leftarrow \sum_r w_{nr} x_r`
  (the :math:`\mathbf{W}` of Alg. 1 lines 8-9);
* ``average(x)``: apply :math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top`, the exact average.

and never knows which engine carries these out. ``mix_step(x, v, lr)`` is ``mix(x - lr * v)``,
which an engine may carry out in one fused pass.

**Talking less** (:class:`GossipSettings`, docs/communication.md). Three settings change what
``mix`` sends, the same way on both engines; their defaults are the paper's protocol:

* *local steps*: with ``every = H``, only iterations :math:`t` with :math:`(t + 1) \bmod H = 0`
  are gossip rounds; on the others ``mix`` is the identity and sends nothing (Koloskova et al.,
  ICML 2020: :math:`W(t) = I` except every :math:`H`-th step). The topology advances by gossip
  round, :math:`r = \lfloor t / H \rfloor`, so a time-varying graph's cycle is not skipped;
* *time-varying graphs* (``one-peer-exponential``, ``base-K``): round :math:`r` applies
  ``topology.matrix_at(r)``;
* *compressed gossip* (CHOCO-SGD, :mod:`slate.communication.choco`): with a compressor, a gossip
  round sends compressed differences to public copies instead of the parameters.

Every communicator counts what a party sends: bytes as encoded, messages, and ``rounds``, the
sequential exchanges (a gossip round is one; an exact average by ring all-reduce is
:math:`2 (N - 1)` sequential steps).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from slate.communication.gossip import GossipSettings
from slate.communication.robust import MessageGuard

if TYPE_CHECKING:
    from slate.topology import Topology

__all__ = [
    "Communicator",
    "all_gather_round_trips",
    "all_reduce_round_trips",
    "all_reduce_steps",
]


def all_reduce_steps(n: int) -> int:
    """Sequential steps of a ring all-reduce over ``n`` parties: ``2 (n - 1)`` (reduce-scatter,
    then all-gather)."""
    return 2 * (n - 1) if n > 1 else 0


def all_reduce_round_trips(numel: int, n: int) -> int:
    """Round trips one party waits for, one after the other, in an all-reduce of ``numel``
    elements over ``n`` parties (the WAN estimate's :math:`Q`).

    Each of the ring's :func:`all_reduce_steps` waits a whole round trip: gloo's transport hands
    a message over once its receiver has posted the receive and said so. All-reduces of at most
    two elements (the stop and join flags) were measured at half that, ``n - 1``: their
    receives are posted before the data is ready. Measured with gloo over an emulated 80 ms
    link, 4 parties: 236 ms for 2 float32s, 493-517 ms for 1-16 KiB, 630 ms for 128 KiB
    (``python -m benchmarks --only wan``, "One exchange")."""
    if n <= 1:
        return 0
    return n - 1 if numel <= 2 else all_reduce_steps(n)


def all_gather_round_trips(n: int) -> int:
    """Round trips one party waits for in an all-gather over ``n`` parties: ``n - 1`` (its ring
    passes each party's piece on ``n - 1`` times; measured 246 ms at 4 parties and 80 ms)."""
    return max(0, n - 1)


class Communicator(ABC):
    """Carries out the mixing steps of one engine and counts what it sends.

    Subclasses implement one gossip round (:meth:`_gossip`) and the exact average; the schedule
    of local steps and time-varying rounds lives here, once for both engines.
    """

    def __init__(self, topology: Topology, settings: GossipSettings | None = None) -> None:
        self.topology = topology
        self.settings = settings or GossipSettings()
        self.iteration = 0
        self.bytes_sent = 0.0
        self.messages_sent = 0.0
        self.rounds = 0.0
        # Per gossip round: the mean and the largest number of messages a party sends (the
        # busiest party's bytes are the mean's times peak_messages / mean_messages).
        self.mean_messages = 0.0
        self.peak_messages = 0.0
        self._round_degrees: dict[int, tuple[float, float]] = {}
        #: Attacks (tests only), the watch on received values and ``--robust``
        #: (:mod:`slate.communication.robust`); set by the run.
        self.guard: MessageGuard | None = None

    def set_guard(self, guard: MessageGuard | None) -> None:
        """Use ``guard`` for this communicator's gossip (and CHOCO's, when it compresses)."""
        self.guard = guard
        choco = getattr(self, "choco", None)
        if choco is not None:
            choco.guard = guard

    def set_iteration(self, t: int) -> None:
        """Tell the communicator which iteration comes next."""
        self.iteration = t
        if self.guard is not None:
            self.guard.iteration = t

    @property
    def gossips_now(self) -> bool:
        """Whether this iteration ends with a gossip round: :math:`(t + 1) \\bmod H = 0`."""
        return (self.iteration + 1) % self.settings.every == 0

    @property
    def round(self) -> int:
        """The gossip round of this iteration, :math:`\\lfloor t / H \\rfloor` (``t`` for
        ``H = 1``): the index time-varying topologies are read at."""
        return self.iteration // self.settings.every

    def mix(self, x: Tensor) -> Tensor:
        """:math:`(\\underline{W}_r \\otimes I_d)\\, x` on a gossip round, ``x`` otherwise."""
        if not self.gossips_now:
            return x
        if self.topology.is_full_average_at(self.round):
            return self.average(x)
        self._count_round(self.round)
        return self._gossip(x, self.round)

    def mix_step(self, x: Tensor, direction: Tensor, lr: float) -> Tensor:
        """Return ``mix(x - lr * direction)``: a local step, then one gossip round (Alg. 1 line 9).

        Engines may fuse the two passes (the simulator does, block by block in cache); the
        result is the same up to float rounding.
        """
        if self.gossips_now and not self.topology.is_full_average_at(self.round):
            self._count_round(self.round)
            return self._gossip_step(x, direction, lr, self.round)
        return self.mix(torch.add(x, direction, alpha=-lr))

    @abstractmethod
    def _gossip(self, x: Tensor, r: int) -> Tensor:
        """One gossip round with the matrix ``topology.matrix_at(r)`` (not ``J``)."""

    def _gossip_step(self, x: Tensor, direction: Tensor, lr: float, r: int) -> Tensor:
        return self._gossip(torch.add(x, direction, alpha=-lr), r)

    @abstractmethod
    def average(self, x: Tensor) -> Tensor:
        """Return :math:`\\mathbf{J} x`: every party receives the exact mean of all parties."""

    def _count_round(self, r: int) -> None:
        """A gossip round is one sequential exchange of the network when any party of it
        exchanges (the same count at every party, also one idle in this round)."""
        key = r % max(1, self.topology.cycle_length)
        if key not in self._round_degrees:
            degrees = [float(d) for d in self.topology.degrees_at(r)]
            self._round_degrees[key] = (sum(degrees) / len(degrees), max(degrees))
        mean, peak = self._round_degrees[key]
        if peak > 0:
            self.rounds += 1
            self.mean_messages += mean
            self.peak_messages += peak

    @property
    def busiest_share(self) -> float:
        """The busiest party's gossip bytes over the mean party's (1 on regular graphs)."""
        return self.peak_messages / self.mean_messages if self.mean_messages > 0 else 1.0

    def _count(self, payload_bytes: float, messages: float, rounds: float = 0.0) -> None:
        self.bytes_sent += payload_bytes
        self.messages_sent += messages
        self.rounds += rounds

    def _count_all_reduce(self, x: Tensor, n: int) -> None:
        # A ring all-reduce sends 2 (N - 1) / N of the buffer per party in 2 (N - 1) messages,
        # one after the other.
        if n > 1:
            payload = x.shape[-1] * x.element_size()
            self._count(2 * (n - 1) / n * payload, all_reduce_steps(n), all_reduce_steps(n))

    def traffic(self) -> dict[str, float]:
        """Per-party totals of what was (or would have been) sent: bytes, messages, rounds."""
        return {
            "comm_bytes_per_party": self.bytes_sent,
            "messages_per_party": self.messages_sent,
            "rounds": self.rounds,
        }

    def counters(self) -> tuple[float, float, float]:
        """``(bytes, messages, rounds)`` sent so far, for checkpoints and snapshots."""
        return (self.bytes_sent, self.messages_sent, self.rounds)

    def restore_counters(self, values: tuple[float, ...] | list[float]) -> None:
        """Set the counters from :meth:`counters` (a checkpoint written before ``rounds``
        existed holds two values: its runs gossiped every iteration)."""
        self.bytes_sent, self.messages_sent = values[0], values[1]
        self.rounds = values[2] if len(values) > 2 else 0.0

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs beyond the counters (CHOCO's public copies); default none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state
