r"""The two interfaces both engines implement: :class:`Communicator` (mixing, which every
algorithm is written against) and :class:`Engine` (who runs here, and reductions), with what
both engines share (:class:`RecordedExchange`, the round-trip counts).

**Mixing.** An algorithm sees the parameters of the parties it runs as a tensor ``x`` of shape
``(P, d)``: ``P = N`` in the simulator (all parties stacked), ``P = 1`` for one process of the
distributed engine. It communicates only through

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
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from slate.communication.flag_flood import FlagFlood
from slate.communication.gossip import GossipSettings
from slate.errors import ConfigError
from slate.security.robust import MessageGuard

if TYPE_CHECKING:
    from slate.engines.distributed.control.membership import Change
    from slate.topology import Topology

__all__ = [
    "DIRECT_BYTES",
    "DIRECT_ROUND_TRIPS",
    "MESSAGE_LIMIT",
    "SET_UP_STORE_ROUND_TRIPS",
    "TEARDOWN_STORE_ROUND_TRIPS",
    "Communicator",
    "Engine",
    "RecordedExchange",
    "all_gather_round_trips",
    "all_reduce_round_trips",
    "all_reduce_steps",
    "direct_round_trips",
]


MESSAGE_LIMIT = 64 << 20  # bytes of one process's JSON facts in one exchange (schemas, counts)


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


#: The largest message (bytes) that a plain distributed run exchanges directly with every member
#: (:mod:`slate.engines.distributed.wire.direct`); a larger one takes gloo's ring.
DIRECT_BYTES = 200_000
#: Round trips one direct exchange waits for, whatever N: every member posts its sends and
#: receives at once, as a gossip round does (measured 89 ms for 8.6 KB at 80 ms, docs/wan.md).
DIRECT_ROUND_TRIPS = 1
#: Store round trips of one site's set-up (from the first connection to the open process group
#: and its hello) and of its teardown, whatever N: each read of the set-up waits for every
#: site's record at once (``tests/engines/test_store_round_trips.py`` counts them at the costs
#: measured on ``TCPStore``: connect 2, check 1, get 2, wait 1, multi_get 2, compare_set 1).
SET_UP_STORE_ROUND_TRIPS = {"plain": 14, "sealed": 20}
TEARDOWN_STORE_ROUND_TRIPS = 1


def direct_round_trips(n: int) -> int:
    """Round trips of one direct exchange over ``n`` parties: :data:`DIRECT_ROUND_TRIPS`."""
    return DIRECT_ROUND_TRIPS if n > 1 else 0


def all_gather_round_trips(n: int) -> int:
    """Round trips one party waits for in an all-gather over ``n`` parties: ``n - 1`` (its ring
    passes each party's piece on ``n - 1`` times; measured 246 ms at 4 parties and 80 ms)."""
    return max(0, n - 1)


class Communicator(ABC):
    """Carries out the mixing steps of one engine and counts what it sends.

    Subclasses implement one gossip round (:meth:`_gossip`) and the exact average; the schedule
    of local steps and time-varying rounds lives here, once for both engines. Every communicator
    is a :class:`slate.algorithms.base.Mixer` (``mix``, ``mix_step``), all the algorithms use.
    ``guard`` (:class:`~slate.security.robust.MessageGuard`) decides how what arrives is mixed.
    """

    def __init__(
        self,
        topology: Topology,
        settings: GossipSettings | None = None,
        guard: MessageGuard | None = None,
    ) -> None:
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
        #: How what arrives is mixed: the watch on received values, or ``--robust clip``, with
        #: what the parties send (a test's attacker) (:mod:`slate.security.robust`); built once
        #: by the run. None: plain mixing, unwatched.
        self.guard = guard
        #: The current chunk's plan for carrying the stop and join flags (:meth:`plan_flags`).
        self.flags: FlagFlood | None = None
        #: The iterations before this one run without a stop (:meth:`run_through`).
        self.through: int | None = None
        # Gossip rounds counted by this process, and those of them after another round of the
        # same chunk: a distributed process posts their receives when that round ends
        # (:attr:`ahead_share`). Not checkpointed: the share depends on the schedule alone.
        self.rounds_here = 0.0
        self.rounds_after_one = 0.0
        self._chunk_rounds = 0

    def plan_flags(self, start: int, end: int, snapshot: Callable[[], int]) -> None:
        """The chunk of iterations ``[start, end)`` comes next: where its gossip rounds reach
        every party, its last ones carry the stop and join flags (:mod:`slate.communication.
        flag_flood`; ``snapshot``: this process's flags as bits, taken when the window opens),
        and :meth:`carried_flags` gives them at ``end`` without an exchange of their own."""
        self.flags = FlagFlood.plan(self.topology, self.settings.every, start, end, snapshot)

    def run_through(self, end: int | None) -> None:
        """The iterations before ``end`` run without a stop in between (the chunk that
        :meth:`slate.training.run.Run.advance` runs), so a communicator may prepare their gossip
        rounds ahead (the distributed one posts each round's receives two rounds before it);
        None: the chunk is over, nothing may stay prepared."""
        self.through = end
        self._chunk_rounds = 0

    @property
    def ahead_share(self) -> float:
        """The share of gossip rounds that follow another round of the same chunk with no exact
        average between them: a distributed process has posted their receives one or two rounds
        early, so their messages do not wait for the receiver's notice (the ``--wan`` estimate's
        :math:`R_e / R`, :meth:`slate.communication.gossip.WanLink.seconds`)."""
        return self.rounds_after_one / self.rounds_here if self.rounds_here else 0.0

    def forget_flags(self) -> None:
        """Drop the chunk's plan (after a failed exchange: the flags take their own)."""
        self.flags = None

    def carried_flags(self, t: int) -> int | None:
        """The flags every party agreed on through the gossip, at the end ``t`` of a planned
        chunk (:meth:`plan_flags`), as bits; None: they need an exchange of their own."""
        agreed = self.flags.agreed(t) if self.flags is not None else None
        self.flags = None
        return agreed

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
            self._chunk_rounds = 0  # (the next round's receives are not posted early)
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
            self.rounds_here += 1
            self.rounds_after_one += self.through is not None and self._chunk_rounds > 0
            self._chunk_rounds += 1
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


# ------------------------------------------------------------------------------------ engines
#
# What a training run needs from its engine besides mixing: who runs here, and reductions. The
# simulator runs every party in one process; a distributed process runs one party. The training
# loop (``slate.training.run.Run``) is written once against :class:`Engine`, so both engines
# share the sampling, the algorithm steps, the evaluation and the run outputs.


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
    #: Said after that command: what else the restart needs (a site's new rendezvous).
    resume_note: str = ""

    @abstractmethod
    def communicator(
        self,
        topology: Topology,
        device: torch.device,
        settings: GossipSettings | None = None,
        x0: Tensor | None = None,
        guard: MessageGuard | None = None,
    ) -> Communicator:
        """The mixing implementation for this engine (``x0``: the local parties' starting
        parameters, which compressed gossip's public copies start from; ``guard``: how what
        arrives is mixed, :mod:`slate.security.robust`)."""

    def set_members(self, members: list[int]) -> None:
        """The run continues with ``members`` (the distributed engine learns it on its own)."""
        del members

    @abstractmethod
    def mean(self, x: Tensor) -> Tensor:
        """The mean over all N parties of the local rows ``x (P, ...)``, on every process."""

    def mean_parameters(self, x: Tensor) -> Tensor:
        """:meth:`mean` of the parties' parameters (an engine may carry them more compactly:
        under a roster the distributed engine masks them in one word a value)."""
        return self.mean(x)

    @abstractmethod
    def total(self, value: Tensor, what: str = "") -> Tensor:
        """The sum over all processes of a local tensor; ``what`` names the sum."""

    def totals(self, parts: list[Tensor], what: str = "") -> list[Tensor]:
        """The sums over all processes of several local tensors, in one exchange, each in its
        own type: integer parts exact (under a roster an integer costs one masked word where a
        float costs two). By default one ``float64`` :meth:`total` of them all."""
        flat = torch.cat([part.reshape(-1).to(torch.float64) for part in parts])
        summed = self.total(flat, what).split([part.numel() for part in parts])
        return [s.view(part.shape).to(part.dtype) for s, part in zip(summed, parts, strict=True)]

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

    def note_status(self, **changes: Any) -> None:
        """This process's published status changed (the distributed engine publishes it for
        ``slate status``; the simulator has nobody to tell)."""
        return None

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

    #: Whether every exchange goes direct whatever its size (a sealed run's wire).
    all_direct: bool = False

    def _direct(self, nbytes: int) -> bool:
        """Whether an exchange of ``nbytes`` per member is one direct exchange with every
        member (at most :data:`DIRECT_BYTES`, or any size on a sealed wire)."""
        return self.all_direct or nbytes <= DIRECT_BYTES

    @property
    def store_round_trips(self) -> int:
        """Round trips to the rendezvous store of one site's set-up and teardown
        (:data:`SET_UP_STORE_ROUND_TRIPS`, sealed or plain, and
        :data:`TEARDOWN_STORE_ROUND_TRIPS`): what a distributed run of these flags pays."""
        kind = "sealed" if self.all_direct else "plain"
        return SET_UP_STORE_ROUND_TRIPS[kind] + TEARDOWN_STORE_ROUND_TRIPS

    def count_collective(self, value: Tensor) -> None:
        """Count one all-reduce of ``value``: as one direct exchange when it is small
        (``N - 1`` copies of its bytes sent, :func:`direct_round_trips`), else as gloo's ring
        (``2 (N - 1) / N`` of its bytes, :func:`all_reduce_round_trips`)."""
        n = self.n_parties
        if n > 1:
            nbytes = value.numel() * value.element_size()
            if self._direct(nbytes):
                self.collective_bytes += (n - 1) * nbytes
                self.collective_round_trips += direct_round_trips(n)
                return
            self.collective_bytes += Fraction(2 * (n - 1) * nbytes, n)
            self.collective_round_trips += all_reduce_round_trips(value.numel(), n)

    def count_all_gather(self, piece: Tensor) -> None:
        """Count one all-gather of each party's ``piece``: ``N - 1`` pieces sent, in one direct
        exchange when small (:func:`direct_round_trips`), else gloo's ring
        (:func:`~slate.engines.base.all_gather_round_trips`)."""
        n = self.n_parties
        nbytes = piece.numel() * piece.element_size()
        self.collective_bytes += (n - 1) * nbytes
        steps = direct_round_trips(n) if self._direct(nbytes) else all_gather_round_trips(n)
        self.collective_round_trips += steps

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
