"""One experiment's state on the parties this process runs: :class:`Run`, built from a resolved
config, and its steps.

The simulator runs all N parties in one :class:`Run`; a distributed process runs one party. A run
is built (:meth:`Run.__init__`) from the resolved config's sections and the run's plan
(:mod:`slate.training.plan`: N, the step size, the evaluation defaults, threads, drops, the
process's place), never from the flat flags (those are its record, :attr:`Run.flags`), and holds
its parts: the local data and sampler, the topology, the algorithm and model, the communicator,
the evaluator (:class:`slate.training.evaluation.Evaluator`) and the party set
(:class:`slate.training.recovery.PartySet`). The run owns its state operations:
one training state (:class:`slate.training.state.TrainingState`) for both rollback snapshots and
checkpoints, keeping parties and switching the topology; the party set decides when. The training
loop that drives a run, and writes its folder, is :func:`slate.training.loop.train`.

The hot loop (:meth:`Run.advance`) has no Python loop over parties and no host synchronisation:
indices are drawn for a whole chunk of steps at once, losses are kept on the device, and the host
looks at numbers only at evaluation points (every ``--eval-every`` iterations).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from slate.algorithms import Algorithm, build_algorithm
from slate.algorithms.compute import Batch, PartyCompute
from slate.communication.gossip import gossip_settings
from slate.config import TrainConfig
from slate.data.datasets import Dataset
from slate.data.local_data import LocalData
from slate.data.sampler import PartySampler
from slate.data.sources import load_local_data
from slate.engines.base import Communicator, Engine, RecordedExchange
from slate.engines.simulator import SimulatorEngine
from slate.errors import ConfigError, TrainingDiverged, parties_text
from slate.faults import FaultPlan
from slate.metrics.divergence import non_finite_message
from slate.models import build_model
from slate.security.guards import message_guard
from slate.security.messages import as_received
from slate.security.robust import RECORD_SHAPE
from slate.topology import SurvivorGraph, build_topology, surviving_topology
from slate.training import private_run
from slate.training.accountant import PrivacyBudgetExhausted, PrivacyLedger
from slate.training.agreement import FINGERPRINT_SHAPE, check_same_run, run_fingerprint
from slate.training.checks import should_compile
from slate.training.configuration import ResolvedConfig, as_resolved
from slate.training.evaluation import Evaluator, mean_buffers
from slate.training.network_clock import NetworkClock
from slate.training.plan import Choices, Place, RunPlan, choose, plan
from slate.training.recovery import PartySet
from slate.training.state import TrainingState
from slate.training.stop_flags import StopFlags

__all__ = ["Run"]


class Run:
    """One experiment's state, built from a resolved config, on the parties this engine runs.

    The simulator runs all N parties here; a distributed process runs one. Everything else
    (partition, sampling streams, model, algorithm, evaluation) is the same code, so both
    engines compute the same numbers.
    """

    def __init__(
        self,
        config: TrainConfig | ResolvedConfig,
        data: Dataset | None = None,
        engine: Engine | None = None,
        exchanges: list[Any] | None = None,
        *,
        choices: Choices | None = None,
        place: Place | None = None,
        local: LocalData | None = None,
        faults: FaultPlan | None = None,
    ) -> None:
        """A run of ``config`` (resolved and checked once, by the caller where it is a
        :class:`ResolvedConfig`) with its ``choices`` made (default: the flags' N and step size,
        :func:`slate.training.plan.choose`; ``--lr auto`` is chosen by
        :func:`slate.training.loop.train`), in this process's ``place``, on ``engine`` (default:
        the simulator of all N parties). Its rows are read here (``exchanges``: a returning
        party's recorded set-up, replayed), or are ``local``, read before for the same parties
        (the candidates of ``--lr auto`` share theirs); its plan follows from them. ``faults``:
        what a test injects (:class:`slate.faults.FaultPlan`); nothing by default."""
        self.settings = as_resolved(config)
        self.place = place or Place()
        choices = choices or choose(self.settings, data, place=self.place)
        self.engine = engine or SimulatorEngine(choices.nodes)
        self.fault_plan = faults if faults is not None else FaultPlan()  # tests only (faults/)
        self.faults = self.fault_plan.kills_of(self.engine.own_party)  # (a process per party)
        self.lies = self.fault_plan.lies(self.engine.own_party)  # an insider's lies
        self.faults.check("setup", 0)
        self._load_data(choices, exchanges, local)
        self.plan: RunPlan = plan(
            self.settings, self.data, choices, self.place, len(self.engine.local_parties)
        )
        torch.set_num_threads(self.plan.threads)  # --threads, else its default (checks.py)
        self.device = self.plan.device
        self._agree_on_the_run()
        self._build_sampler()
        self._build_graph()
        self.history: list[dict[str, float]] = []
        self._build_training()
        data = self.data
        self.evaluator = Evaluator(
            self.engine, self.compute, self.device,
            (data.x_test, data.y_test, data.test_parts), self.faults, self.lies,
            lr=self.plan.lr, standardize=bool(self.settings.data.standardize),
            stop_on_refusal=self.plan.on_party_loss != "continue",
        )  # fmt: skip
        if data.declared is not None:  # the summed counts must hold the declared test rows
            declared = data.declared
            self.evaluator.expected_counts = lambda: declared.test_rows(self.party_set.members)
        self.algorithm.init_state(self.x)
        self.iteration = 0
        self.loss_sum = torch.zeros(self.n_local, device=self.device)  # since the last evaluation
        self.loss_steps = 0
        self.stop_requested = False  # set by SIGINT / SIGTERM
        self.stop_flags = StopFlags(self)  # agreed at each chunk's end
        self._chunk_start: dict[str, Any] = self.sampler.state_dict()
        self._chunk_used = 0
        self.validated, self.n_validation = False, 0  # set by use_final_test
        self.resumed_best: dict[str, Any] | None = None  # --early-stopping's, from a checkpoint
        self.best_model: Any = (
            None  # --early-stopping's kept model (slate.training.early_stopping.BestModel)
        )
        # A party lost before the first step (during the first evaluation) is a loss like any
        # other: the survivors roll back to this position, iteration 0 before its evaluation.
        self.party_set.snapshot(after_evaluation=False)

    @property
    def flags(self) -> TrainConfig:
        """The run's record: its resolved flags with every fill-in of its plan (what
        ``summary.json``, ``model.json`` and the checkpoints store)."""
        return self.plan.flags

    def _load_data(
        self, choices: Choices, exchanges: list[Any] | None, local: LocalData | None
    ) -> None:
        """Only this process's parties' examples are kept (and moved to the device, later)."""
        started = time.perf_counter()
        # A party returning to a run in progress replays the data set-up's exchanges.
        self.exchange = RecordedExchange(self.engine, exchanges)
        dataset = choices.dataset
        if local is None:
            local = load_local_data(
                choices.data, self.engine.local_parties, self.lies.exchange(self.exchange),
                dataset,
            )  # fmt: skip
        self.data = local
        # A dataset read before the run (to choose N, or by the caller) counts its read too.
        self.load_seconds = (
            time.perf_counter() - started + (dataset.read_seconds if dataset else 0.0)
        )

    def _build_sampler(self) -> None:
        """The local parties' training rows on the device, and their sampling streams."""
        section = self.settings.algorithm
        self.n_local = len(self.engine.local_parties)
        self.features = torch.from_numpy(self.data.x_train).to(self.device)
        self.labels = torch.from_numpy(self.data.y_train).to(self.device)
        self.private = self.settings.privacy is not None
        if self.private:  # slate.training.private_run; an empty slot is the added last row
            self.private_sampling = private_run.sampling(self.settings, self.data, self.engine,
                                                         self.fault_plan)  # fmt: skip
            self.sampler: Any = self.private_sampling.sampler
            self.features, self.labels = private_run.with_empty_row(self.features, self.labels)
            return
        self.sampler = PartySampler(
            self.data.parts, self.data.y_train, section.batch_size, section.positives,
            section.seed, parties=self.engine.local_parties,
        )  # fmt: skip

    def _build_graph(self) -> None:
        """The topology of all N parties, and the party set that changes it."""
        comm = self.settings.communication
        self.topology = build_topology(
            comm.topology, self.plan.nodes, seed=comm.seed, fed_period=comm.fed_period
        )
        self.base_topology = self.topology  # the graph of all N parties
        if self.plan.drops and self.engine.own_party is not None:
            raise ConfigError(
                "--drop-party injects party losses in the simulator; with the distributed "
                "engine, stop a party's process instead."
            )
        self.party_set = PartySet(
            self, self.plan.drops, self.plan.nodes, comm.gossip_every,
            rollback=self.engine.recovers,
        )  # fmt: skip

    def _build_training(self) -> None:
        """The algorithm, the model and its per-party compute, the parties' starting parameters
        and the communicator."""
        section, model_section = self.settings.algorithm, self.settings.model
        self.algorithm: Algorithm = build_algorithm(
            section.name, self.plan.algorithm, section.params
        )
        model = build_model(
            model_section.name, self.data.input_shape, hidden=model_section.hidden,
            seed=model_section.seed,
        )  # fmt: skip
        self.model = model.to(self.device)
        one_process = self.engine.own_party is None
        context = self.algorithm.context([self.labels[p] for p in self.data.parts])
        # --dp-epsilon: the loss of a group, its empty slots left out
        objective = self.algorithm.masked_objective(context is not None) if self.private else None
        self.compute = PartyCompute(
            self.model,
            objective or self.algorithm.objective(),
            self.algorithm.n_extra,
            n_parties=self.n_local,
            context=context,
            compile=should_compile(
                model_section.compile, section.iterations, one_process, self.device, model
            ),
        )
        self.ledger: PrivacyLedger | None = None  # --dp-epsilon's (in memory, or the folder's)
        self.private_end: int | None = None  # where a plan cut by the ledger's remainder ends
        if self.private:
            folder = Path(self.plan.out) if self.plan.out is not None else None  # its ledger's
            self.compute, self.ledger = private_run.privatise(self.private_sampling, self.compute,
                self.algorithm, self.settings, self.engine, self.fault_plan, folder)  # fmt: skip
        self.x = self.initial_parameters()
        comm = self.settings.communication
        self.gossip = gossip_settings(comm, self.topology, self.x.shape[1])
        self.wan = comm.wan
        self.network = NetworkClock(self.engine, self.wan)  # what training waits for
        local = self.engine.local_parties
        attacker = self.fault_plan.attacker(local, self.compute.layout.last_linear(self.model))
        # the watch on received values, or --robust clip; a test's attacker sends through it
        self.guard = message_guard(comm.robust, self.plan.nodes, local, attacker)
        self.guard.begin(self.x)
        self.comm: Communicator = self.make_communicator(self.x)

    def _agree_on_the_run(self) -> None:
        """Every process's trajectory settings must equal the others'
        (:mod:`slate.training.agreement`);
        a returning party also checks its own against the recorded ones. One process running
        every party has no other to agree with."""
        if self.engine.own_party is None:
            return
        declared = self.data.declared
        digests = declared.digests() if declared is not None else None
        fingerprint = run_fingerprint(
            self.flags, self.engine.roster_digest, digests, self.data.dictionary
        )
        mine = [[party, fingerprint] for party in self.engine.local_parties]
        everyone = self.exchange.gather_json(mine, FINGERPRINT_SHAPE, "run's settings", 1 << 20)
        if self.exchange.replaying:  # compared as it would have arrived
            everyone += as_received(mine)
        check_same_run([(party, fingerprint) for party, fingerprint in everyone])

    def initial_parameters(self) -> Tensor:
        """Alg. 1 line 2: every party starts from the same model (plus algorithm variables)."""
        x0 = self.compute.layout.flatten(self.model)
        extra = self.algorithm.initial_extra(1, self.device, x0.dtype)[0]
        return torch.cat([x0, extra]).expand(self.n_local, -1).clone()

    def make_communicator(self, x0: Tensor) -> Communicator:
        """The engine's communicator over the current topology; compressed gossip's public
        copies start at ``x0``."""
        return self.engine.communicator(self.topology, self.device, self.gossip, x0, self.guard)

    def batch(self, indices: Tensor) -> Batch:
        """Gather every party's mini-batch from indices ``(..., P, m)`` (one step, or several)."""
        return Batch(_rows(self.features, indices), _rows(self.labels, indices))

    @property
    def sampler_position(self) -> tuple[dict[str, Any], int]:
        """Where the sampler streams are: their state at the start of the current chunk, and
        the steps drawn since."""
        return self._chunk_start, self._chunk_used

    def seek_sampler(self, used: int, start: dict[str, Any] | None = None) -> None:
        """Move the sampler streams ``used`` steps past ``start`` (a state of theirs; default:
        where they are), and start a new chunk there."""
        if start is not None:
            self.sampler.load_state_dict(start)
        self.sampler.draw(used)
        self._chunk_start, self._chunk_used = self.sampler.state_dict(), 0

    def advance(self, steps: int) -> int:
        """Run up to ``steps`` iterations and return how many ran.

        The simulator stops early, between two iterations, when a stop was requested; the
        distributed engine finishes the chunk, so that all parties stop at the same iteration.
        """
        # --dp-epsilon: the ledger records the releases before they are made, within budget
        steps, stop_at = self.ledger.admit(self.iteration, steps) if self.ledger else (steps, None)
        losses = torch.zeros(steps, self.n_local, device=self.device)
        done = 0
        positives = self.settings.algorithm.positives
        if self.iteration == 0 and self.algorithm.initial_batches(positives) > 0:
            self.party_set.snapshot(after_evaluation=True)
            losses[0] = self._first_step()
            self._add_loss(losses[0])
            done = 1
        self._chunk_start, self._chunk_used = self.sampler.state_dict(), 0
        indices = self.sampler.draw(steps - done, self.device)
        self.comm.run_through(self.iteration + steps - done)
        for k in range(steps - done):
            if self.stop_requested and self.engine.stops_between_iterations:
                break
            self.party_set.snapshot_before_step()  # (where a rollback may land)
            self.faults.check("step", self.iteration)
            self.comm.set_iteration(self.iteration)
            self.x, losses[done] = self.algorithm.step(
                self.x, self.batch(indices[k]), self.comm, self.compute
            )
            self._add_loss(losses[done])
            self.iteration += 1
            self._chunk_used += 1
            done += 1
        self.comm.run_through(None)
        self._guard_finite(losses[:done], self.iteration - done)
        self.party_set.snapshot(after_evaluation=False)
        if stop_at is not None and self.ledger is not None:
            raise PrivacyBudgetExhausted(self.ledger.exhausted_message(stop_at))
        return done

    def _add_loss(self, row: Tensor) -> None:
        # Added step by step, not as one sum: the result must not depend on where chunks
        # start, so that a run resumed mid-chunk accumulates bit for bit the same numbers.
        # Never in place: snapshots hold the previous sums.
        self.loss_sum = self.loss_sum + row
        self.loss_steps += 1

    def _first_step(self) -> Tensor:
        """Iteration 0 of an algorithm with an initial batch (SLATE-M, Alg. 2 lines 3-5)."""
        blocks = self.algorithm.initial_batches(self.settings.algorithm.positives)
        indices = self.sampler.draw(blocks, self.device)
        blocks_batch = self.batch(indices)  # (blocks, P, m, ...)
        batch = Batch.stack(blocks_batch.features, blocks_batch.labels)
        self.comm.set_iteration(0)
        self.x, losses = self.algorithm.first_step(self.x, batch, self.comm, self.compute)
        self.iteration = 1
        return losses

    def training_state(self) -> TrainingState:
        """The training state now: references to the run's tensors, which the steps replace
        and never write in place (a rollback snapshot), or copied by
        :meth:`TrainingState.to_checkpoint`."""
        return TrainingState(
            iteration=self.iteration,
            x=self.x,
            algorithm_state=dict(self.algorithm.state),
            buffers=dict(self.compute.buffers),
            sampler=self._chunk_start,
            sampler_used=self._chunk_used,
            loss_sum=self.loss_sum,
            loss_steps=self.loss_steps,
            traffic=self.comm.counters(),
            history_length=len(self.history),
        )

    def restore(self, state: TrainingState) -> None:
        """Continue from ``state`` (a snapshot's, or a checkpoint's): the evaluations made
        after it are dropped, and so are the scores kept from the last one."""
        self.iteration = state.iteration
        self.x = state.x.to(self.device)
        self.algorithm.state = {k: v.to(self.device) for k, v in state.algorithm_state.items()}
        self.compute.buffers = {k: v.to(self.device) for k, v in state.buffers.items()}
        self.seek_sampler(state.sampler_used, state.sampler)  # that chunk's steps taken
        self.loss_sum = state.loss_sum.to(self.device)
        self.loss_steps = state.loss_steps
        self.comm.restore_counters(state.traffic)
        if state.history_length is not None:
            del self.history[state.history_length :]
        self.evaluator.forget_scores()

    def keep_parties(self, members: list[int]) -> None:
        """Keep only the local parties among ``members`` (the simulator's dropped parties
        leave: their rows, parameters, algorithm variables, streams and test rows); the engine
        continues with ``members``."""
        rows = [k for k, p in enumerate(self.engine.local_parties) if p in members]
        if len(rows) < self.n_local:
            index = torch.tensor(rows, device=self.device)
            self.x = self.x.index_select(0, index)
            self.algorithm.state = {
                k: v.index_select(0, index) for k, v in self.algorithm.state.items()
            }
            self.compute.keep_parties(index)
            self.loss_sum = self.loss_sum.index_select(0, index)
            self.sampler.keep(rows)
            self.n_local = len(rows)
            self.evaluator.keep_parties(rows)
        self.engine.set_members(members)

    def switch_topology(self, members: list[int]) -> SurvivorGraph:
        """Mix over the surviving graph of ``members`` from now on
        (:func:`slate.topology.surviving_topology`: Metropolis-Hastings weights over the
        remaining edges, bridged where the graph fell apart), with a new communicator whose
        traffic counters continue; returns that graph's record."""
        self.topology, graph = surviving_topology(self.base_topology, members)
        traffic = self.comm.counters()
        # Compressed gossip's public copies restart at zero on every survivor (engines.choco),
        # and --robust forgets its window and exclusions (the graph's indices change).
        self.guard.restart(self.engine.local_parties, self.x)
        self.comm = self.make_communicator(torch.zeros_like(self.x))
        self.comm.restore_counters(traffic)
        self.algorithm.restart_tracking()
        self.evaluator.forget_scores()
        return graph

    def join_at(
        self, x: Tensor, algorithm_state: dict[str, Tensor], iteration: int, loss_steps: int,
        rounds: float,
    ) -> None:  # fmt: skip
        """A returning party takes the members' average model and algorithm variables, and
        their iteration (its sampler streams skip ahead to it), loss steps and rounds."""
        self.x, self.algorithm.state = x, algorithm_state
        self.seek_sampler(iteration - self.iteration)
        self.iteration = iteration
        self.loss_sum = torch.zeros_like(self.loss_sum)
        self.loss_steps = loss_steps
        # The rounds are the run's clock, the same for every member; the bytes and
        # messages stay this party's own (it sent nothing while it was away).
        sent, messages, _ = self.comm.counters()
        self.comm.restore_counters((sent, messages, rounds))

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this run bit for bit (see
        :mod:`slate.training.checkpoint`): its training state and what lies beside it."""
        return {
            "format": 1,
            "engine": self.engine.name,
            "parties": self.engine.local_parties,
            **self.training_state().to_checkpoint(),
            "evaluation_seconds": self.evaluator.seconds,
            "evaluation_bytes": self.evaluator.sent_bytes,
            "network": self.network.state(),
            "communicator": self.comm.state_dict(),
            "guard": self.guard.state_dict(),
            "config": self.flags.to_dict(),
            "members": self.party_set.members,
            "exchanges": self.exchange.record,
            "party_events": self.party_set.party_events,
            "graph_changes": self.party_set.graph_changes,
        }

    def load_state_dict(self, state: dict[str, Any], members_check: bool = True) -> None:
        """Continue from :meth:`state_dict`'s output (the party set it recorded included)."""
        members = state.get("members", self.party_set.members)
        if members_check and members != self.party_set.members:
            self.party_set.change_parties(members)
        if state["parties"] != self.engine.local_parties:
            raise ConfigError(
                f"The checkpoint holds {parties_text(state['parties'])}, this process runs "
                f"{parties_text(self.engine.local_parties)}: resume with the same engine and "
                "--nodes."
            )
        self.restore(TrainingState.from_checkpoint(state))
        self.evaluator.seconds = state.get("evaluation_seconds", 0.0)
        self.evaluator.sent_bytes = state.get("evaluation_bytes", 0.0)
        self.network.start(state.get("network"))
        self.comm.load_state_dict(state.get("communicator", {}))
        self.guard.load_state_dict(state.get("guard", {}), like=self.x)
        self.party_set.party_events = list(state.get("party_events", []))
        self.party_set.graph_changes = list(state.get("graph_changes", []))

    def _guard_finite(self, losses: Tensor, first_iteration: int) -> None:
        if bool(torch.isfinite(losses).all()) and bool(torch.isfinite(self.x).all()):
            return
        sent = self.guard.first_non_finite()
        if sent is not None:
            raise TrainingDiverged(
                f"Party {sent[0]} sent non-finite values (NaN or inf), or values a million times "
                f"larger than its neighbours' own, at iteration {sent[1]}: its training diverged "
                "or it misbehaves. --robust clip drops or clips such messages and goes on "
                "without them."
            )
        raise TrainingDiverged(
            non_finite_message(
                losses,
                self.x,
                self.engine.local_parties,
                first_iteration,
                self.iteration,
                self.plan.lr,
            )
        )

    def robust_records(self) -> list[list[int]]:
        """What ``--robust clip`` saw at every party (:meth:`MessageGuard.records`), so that each
        site's summary reports every receiver's accusations, each as that receiver's, also where
        neither party is its neighbour (collective: every process of a run with ``--robust
        clip`` calls it)."""
        mine = self.guard.records()
        if self.engine.own_party is None or not self.guard.clips:
            return mine
        return self.engine.gather_json(mine, RECORD_SHAPE, "--robust records", 1 << 20)

    def averaged_parameters(self) -> Tensor:
        """The output model of Alg. 1: :math:`\\bar x = \\frac1N \\sum_n x_n` (collective)."""
        return self.engine.mean_parameters(self.x)

    def averaged_buffers(self) -> dict[str, Tensor]:
        """BatchNorm statistics of the averaged model: the mean over all parties (collective)."""
        return mean_buffers(self.engine, self.compute.buffers)

    @property
    def writes_outputs(self) -> bool:
        """The main process writes the run folder; with per-party files every party does."""
        return self.engine.is_main or self.data.federated

    @property
    def validates(self) -> bool:
        """Whether the evaluations score validation rows (``--validation-fraction``)."""
        return self.data.final_test is not None or self.validated

    def use_final_test(self) -> None:
        """``--validation-fraction``: read the test rows now (collective with per-party files)
        and score them from here on; the training loop calls it once, at the end."""
        held = self.data.final_test()
        self.validated, self.n_validation = True, self.data.n_test
        self.data = dataclasses.replace(
            self.data, x_test=held.x, y_test=held.y, test_parts=held.parts, n_test=held.rows,
            held_out="test", final_test=None, test_positives=held.positives,
            test_split=held.split or self.data.test_split,
        )  # fmt: skip
        self.evaluator.use_rows(held.x, held.y, held.parts)
        if held.declared is not None:  # every site's test rows, as it reported them
            rows = held.declared
            self.evaluator.expected_counts = lambda: _declared_test(rows, self.party_set.members)

    def mean_traffic(self) -> dict[str, float]:
        """Bytes, messages and rounds per party, averaged over all parties (collective)."""
        local = torch.tensor(self.comm.counters(), dtype=torch.float64, device=self.device)
        # Each process's counters are the means over its parties: their mean over the processes.
        processes = self.engine.n_parties // len(self.engine.local_parties)
        local = self.engine.total(local, "traffic") / processes
        names = ("comm_bytes_per_party", "messages_per_party", "rounds")
        return dict(zip(names, local.tolist(), strict=True))

    def evaluate(self) -> tuple[dict[str, float], float, dict[str, float]]:
        """The evaluation of this iteration, the mean training loss since the last one and the
        mean traffic: the loss and the counters ride in the evaluation's own exchange."""
        counters = [float(v) for v in self.comm.counters()]  # means over the local parties
        # --dp-epsilon: the training loss is not accounted: not sent (0), NaN in the history
        own_loss = 0.0 if self.private else float(self.loss_sum.sum())
        flags = self.stop_flags.riders()  # (they ride in the evaluation's sum)
        riders = torch.tensor([own_loss, *counters, *flags], dtype=torch.float64)
        values = self.evaluator.evaluate(self.x, self.iteration, riders)
        summed, n = self.evaluator.summed_riders[: -len(flags)], self.engine.n_parties
        self.stop_flags.evaluated_sums(self.evaluator.summed_riders[-len(flags) :])
        loss = math.nan if self.private else float(summed[0]) / (max(self.loss_steps, 1) * n)
        self.loss_sum = torch.zeros_like(self.loss_sum)  # not in place: snapshots hold it
        self.loss_steps = 0
        processes = n // len(self.engine.local_parties)  # each holds its parties' mean
        names = ("comm_bytes_per_party", "messages_per_party", "rounds")
        traffic = {name: float(v) / processes for name, v in zip(names, summed[1:], strict=True)}
        return values, loss, traffic


def _rows(table: Tensor, indices: Tensor) -> Tensor:
    """``table[indices]`` by ``index_select`` (3x faster than advanced indexing on CPU)."""
    return table.index_select(0, indices.reshape(-1)).view(*indices.shape, *table.shape[1:])


def _declared_test(rows: list[tuple[int, int]], members: list[int]) -> tuple[int, int]:
    """``(negatives, positives)`` of the test rows ``(rows, positives)`` per rank that the
    sites ``members`` reported."""
    positives = sum(rows[m][1] for m in members)
    return sum(rows[m][0] for m in members) - positives, positives
