"""The training loop on either engine: data, parties, algorithm, evaluation, checkpoints.

``train(config)`` runs a whole experiment and writes its run folder (:mod:`slate.training.outputs`):

* ``summary.json``: the final metrics and the whole resolved configuration;
* ``history.csv``: one row per evaluation (iteration, test_ap, test_auroc, train_loss,
  consensus_distance, elapsed_seconds, parties_alive);
* ``pr_curve.csv`` (with each point's threshold), ``pr_curve.png`` (the operating points
  marked) and ``ap_curve.png``;
* ``model.pt``: the averaged model's ``state_dict`` (load it with ``weights_only=True``), and
  ``model.json``, what rebuilds it (:func:`slate.load_model`).

Before the run is built, its choices are made (:func:`slate.training.plan.choose`: N where it is
chosen from the data, ``--lr auto``); the loop owns both the plan and the runs, so it passes the
plan the runner of ``--lr auto``'s candidates (:func:`run_candidates`), which builds and drives
runs itself and never calls :func:`train`. The steps themselves are
:meth:`slate.training.run.Run.advance`, the evaluations
:class:`slate.training.evaluation.Evaluator`'s; a lost party (``--on-party-loss continue``) or a
returning one changes the party set between passes (:class:`slate.training.recovery.PartySet`).
Checkpoint files (writing, pruning, the agreement on where to resume, set-up records) are
:mod:`slate.training.checkpoint`'s. The loop reads the resolved config's sections and the run's
plan, never the flat flags.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from slate.config import TrainConfig
from slate.data.datasets import Dataset
from slate.data.local_data import LocalData
from slate.engines.base import Engine
from slate.engines.distributed.control.failures import ExchangeFailed
from slate.engines.distributed.control.membership import CountedLost
from slate.errors import ConfigError, RunInterrupted, SumRefused, TrainingDiverged
from slate.faults import FaultPlan
from slate.metrics.divergence import advice_for, assess_divergence
from slate.training import checkpoint
from slate.training.configuration import ResolvedConfig, as_resolved
from slate.training.disclosure_warning import disclosure_warning
from slate.training.early_stopping import BestModel, validation_summary
from slate.training.final_check import AverageCheck, check_average, own_model_kept
from slate.training.final_measures import Distances
from slate.training.interruption import StopOnSignal, interrupted_message, who_stopped
from slate.training.ledger_file import console_line as privacy_line
from slate.training.lr_choice import LrChoice
from slate.training.outputs import (
    HISTORY_COLUMNS,
    ValidationCurve,
    build_summary,
    default_out_dir,
    evaluation_summary,
    final_curves,
    parties,
    report,
    test_positives,
    write_run_folder,
)
from slate.training.plan import Choices, Place, choose
from slate.training.private_run import plan_against_ledger
from slate.training.reporting import Progress, Reporter
from slate.training.run import Run

__all__ = ["RunResult", "run_candidates", "train"]

MAX_CHUNK = 1000  # steps of indices drawn at once


@dataclass
class RunResult:
    """What a finished run returns: its summary, history rows, folder and final parameters;
    ``refused``: the paragraph of a site that refused the final average and kept its own model
    (its caller leaves the run, then stops with it)."""

    summary: dict[str, Any]
    history: list[dict[str, float]]
    out_dir: Path | None
    parameters: Tensor = field(repr=False)
    refused: str | None = None


def _evaluation_row(run: Run, elapsed: float) -> dict[str, float]:
    trained = run.loss_steps > 0
    values, loss, traffic = run.evaluate()
    return {
        "iteration": run.iteration,
        **values,
        "train_loss": loss if trained else math.nan,
        "elapsed_seconds": elapsed,
        "parties_alive": run.engine.n_parties,
        "rounds": traffic["rounds"],
        "comm_bytes_per_party": traffic["comm_bytes_per_party"],
        "eval_bytes_per_party": run.evaluator.sent_bytes,
        "estimated_wan_seconds": run.network.estimated_wan_seconds(elapsed, traffic, run.comm),
    }


def _chunk_length(run: Run) -> int:
    """Steps until the next evaluation, checkpoint, injected drop or end (chunks never straddle
    them)."""
    t, every = run.iteration, run.plan.eval_every
    checkpoints = run.settings.outputs.checkpoint_every
    drops = [at - t for at in run.party_set.drops if at > t]
    return min(
        MAX_CHUNK,
        _last_iteration(run) - t,
        every - t % every,
        checkpoints - t % checkpoints,
        *drops,
    )


def _last_iteration(run: Run) -> int:
    """The iteration the run ends at: ``--iterations``, or sooner where the privacy ledger's
    remainder cut the plan (:func:`slate.training.accountant.plan_privacy`)."""
    iterations = run.settings.algorithm.iterations
    return iterations if run.private_end is None else min(iterations, run.private_end)


def _lambda_text(topology) -> str:
    """The mixing rate of what the run applies: a cycle of one-peer rounds reports its
    per-round rate over one cycle (0 when the cycle averages exactly), not its union's."""
    if getattr(topology, "rounds", None) is None:
        return f"lambda = {topology.lam:.4f}"
    return (
        f"a cycle of {topology.cycle_length} one-peer rounds, per-round lambda "
        f"{topology.applied_lambda:.4f}"
    )


@dataclass
class _Final:
    """The collectives that end a run: party APs, final scores, model and traffic; at a site of
    a distributed run, the check of the average against its own model
    (:mod:`slate.training.final_check`), which replaced scores and model if it refused it."""

    party_aps: list[float]
    wall: float
    logits: Tensor
    scores: Any
    model: tuple[Any, Any, Any]
    traffic: dict[str, float]
    validation: Any = None  # the kept model's scores on the validation rows (ValidationCurve)
    average_check: AverageCheck | None = None


class _Loop:
    """Steps, evaluations, checkpoints, stops and party-set changes, until the run ends.

    Every pass starts at a position the parties agree on (:mod:`slate.training.recovery`): an
    evaluation due at this iteration that is not in the history yet is made first, so a pass
    interrupted by a lost party can be made again from the position the survivors roll back to.
    """

    def __init__(self, run: Run, out: Path | None, start: float, bar: Progress, say, log,
                 reporter: Reporter) -> None:  # fmt: skip
        self.run, self.out, self.start, self.bar, self.reporter = run, out, start, bar, reporter
        self.say, self.log = say, log
        self.warned = False
        self.said_store_lost = False
        # A party admitted at a checkpoint boundary joins the others after that boundary's
        # stop check, checkpoint and admission, which they have already made.
        self.joined_at: int | None = None
        patience = run.settings.outputs.early_stopping
        self.best = run.best_model = None
        if patience:
            positives = test_positives(run)  # the validation rows' until the final test
            self.best = run.best_model = BestModel(patience, positives)
            note = self.best.few_positives_note(positives)
            if note:
                say(note)
        self.stopped_at: int | None = None
        self.distances = Distances()  # the final check's reference (final_measures)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def run_to_end(self) -> _Final:
        failed = False
        while True:
            try:
                if failed:
                    self._recover()
                    failed = False
                final = self._pass()
            except ExchangeFailed as err:
                self.run.engine.raise_unless_recovering(err)
                failed = True  # (also when a recovery or a return itself failed: agree again)
                continue
            except SumRefused as err:  # a lie in a sum: a site keeps its own model
                if self.run.engine.own_party is None:
                    raise
                return self._keep_own(str(err))
            if final is not None:
                return final

    def _pass(self) -> _Final | None:
        run = self.run
        t, iterations = run.iteration, _last_iteration(run)
        if (t % run.plan.eval_every == 0 or t == iterations) and not (
            run.history and run.history[-1]["iteration"] == t
        ):
            self.reporter.status("evaluating")
            run.history.append(_evaluation_row(run, self.elapsed()))
            self.distances.record(run, t)
            self.bar.show(f"{run.history[-1]['test_ap']:.4f}")
            self.reporter.evaluated()
            refused = run.evaluator.refused
            if refused and refused[-1]["iteration"] == t:
                self.note(f"warning: the evaluation at iteration {t} was dropped: "
                          f"{refused[-1]['problem']}; a participant lied in its evaluation "
                          "counts (--on-party-loss continue: training goes on)")  # fmt: skip
            warning = run.evaluator.learning_warning
            if warning and not self.warned:
                self.warned = True
                self.say(warning)
            if self.best is not None and self.best.consider(run, run.history[-1]["test_ap"]):
                if t < iterations:
                    self.stopped_at = t
                    self.say(
                        f"early stopping at iteration {t}: no better validation AP in "
                        f"{self.best.patience} evaluations; the model of iteration "
                        f"{self.best.iteration} is kept"
                    )
                return self._finish()
        if t >= iterations:
            return self._finish()
        if self.joined_at != t:  # (a party admitted here joins after this boundary)
            self._stop_or_checkpoint()
        run.party_set.snapshot(after_evaluation=True)
        for rank in run.party_set.apply_drops():
            self._announce_loss(rank, "--drop-party")
        length = _chunk_length(run)
        run.stop_flags.plan_chunk(t, t + length)
        run.advance(length)
        self.bar.show()
        self.reporter.status("training")
        self.reporter.event(f"steps: {length} to iteration {run.iteration}", logging.DEBUG)
        return None

    def _stop_or_checkpoint(self) -> None:
        """A stop is honoured after this iteration's evaluation, so none is ever skipped;
        returning parties are admitted after a checkpoint."""
        run, t = self.run, self.run.iteration
        boundary = t > 0 and t % run.settings.outputs.checkpoint_every == 0
        # A stop asked anywhere, and whether any party's lookout saw a returning party ask to
        # join (only then do the parties agree through the store; slate.training.stop_flags).
        stopping, admitting = run.stop_flags.agree(t)
        if stopping or boundary:
            checkpoint.save_run(run, self.out, self.elapsed(), self.bar.enabled)
            self.reporter.event(f"checkpoint: written at iteration {t}")
        if stopping:
            raise RunInterrupted(interrupted_message(run, self.out, who_stopped(run)))
        if boundary:
            self._admit_returning(admitting)

    def _finish(self) -> _Final:
        run = self.run
        if self.best is not None:
            self.best.restore(run)
        validation = None
        if run.validates:  # the kept model's validation curve, for predict's operating points
            validation = ValidationCurve.of(run)
            run.use_final_test()  # the test rows, read and scored only now
        party_aps = run.evaluator.party_aps(run.x) if run.plan.party_ap else []
        wall = self.elapsed()  # training and every evaluation, party APs included
        scored = run.evaluator.test_scores(run.x, run.iteration)  # the model saved is this one
        traffic = run.mean_traffic()
        check = None
        if run.engine.own_party is not None:  # a site: the average checked against its own
            own = run.evaluator.own_model(run.x)
            problem = run.evaluator.refused[-1]["problem"] if scored.refused else None
            check = check_average(run.engine.rank, scored.logits, own.logits,
                                  run.evaluator.test_labels, problem,
                                  **self.distances.check_inputs(run, scored))  # fmt: skip
            if check.refused:
                scored = own
        model = (scored.parameters, scored.buffers, scored.scores)
        return _Final(party_aps, wall, scored.logits, scored.scores, model, traffic, validation,
                      check)  # fmt: skip

    def _keep_own(self, why: str) -> _Final:
        """The end of a site that refused a sum (``why``): its own model, scored on its own
        test rows, with no exchange (:func:`slate.training.final_check.own_model_kept`)."""
        run = self.run
        own = run.evaluator.own_model(run.x)
        check = own_model_kept(run.engine.rank, own.logits, run.evaluator.test_labels, why)
        names = ("comm_bytes_per_party", "messages_per_party", "rounds")  # its own counters
        traffic = dict(zip(names, (float(v) for v in run.comm.counters()), strict=True))
        if not run.history or run.history[-1]["iteration"] != run.iteration:  # refused there
            row = dict.fromkeys(HISTORY_COLUMNS, math.nan)
            row.update(iteration=run.iteration, elapsed_seconds=self.elapsed(),
                       parties_alive=run.engine.n_parties, rounds=traffic["rounds"])  # fmt: skip
            run.history.append(row)
        model = (own.parameters, own.buffers, own.scores)
        return _Final([], self.elapsed(), own.logits, own.scores, model, traffic, None, check)

    def _recover(self) -> None:
        """Agree with the survivors on who is lost and continue without them. A party the
        others counted as lost while it was out of reach comes back by itself at their next
        checkpoint boundary (:meth:`slate.training.recovery.PartySet.rejoin_after_loss`)."""
        run = self.run
        run.stop_flags.forget()  # (the survivors agree on the flags by an exchange)
        try:
            change = run.party_set.recover()
        except CountedLost as lost:
            self.log(f"party {run.engine.rank} was counted as lost by the others at iteration "
                     f"{lost.iteration} ({lost.why}); it is reachable again and asks to rejoin "
                     "at their next checkpoint boundary")  # fmt: skip
            run.party_set.rejoin_after_loss()
            self.joined_at = run.iteration
            self.log(f"party {run.engine.rank} rejoined the run at iteration {run.iteration}")
            return
        for rank in change.lost:
            self._announce_loss(rank, change.reasons.get(rank, "lost"))

    def _admit_returning(self, asked: bool) -> None:
        engine = self.run.engine
        change = engine.admit_returning(self.run.iteration, asked)
        if engine.store_out_of_reach and not self.said_store_lost:
            self.said_store_lost = True
            self.note(
                f"the rendezvous store stopped answering by iteration {self.run.iteration}: "
                "training goes on without it, but no party can return now, and a party lost "
                "from now on stops every party (then start a fresh 'slate rendezvous' and every "
                "party with --resume, docs/deployment.md)"
            )
        if change is not None:
            self.run.party_set.admit(change, None)
            for rank in change.joined:
                self.note(
                    f"party {rank} rejoined at iteration {self.run.iteration}: "
                    f"{self.run.engine.n_parties} parties continue on the full graph"
                    if self.run.engine.n_parties == self.run.plan.nodes
                    else f"party {rank} rejoined at iteration {self.run.iteration}"
                )

    def note(self, line: str) -> None:
        """A change of the party set: logged by the main party, and by every party when each
        runs at its own site (per-party files), where each site's console is its own."""
        run = self.run
        self.reporter.event(f"party: {line}", logging.WARNING if " lost " in line else logging.INFO)
        if run.engine.is_main:
            self.say(line)
        elif run.data.federated:
            self.log(f"party {run.engine.local_parties[0]}: {line}")

    def _announce_loss(self, rank: int, reason: str) -> None:
        run = self.run
        change = run.party_set.graph_changes[-1]
        bridges = change["added_edges"]
        how = (
            "; bridges " + ", ".join(f"{e['edge'][0]}-{e['edge'][1]}" for e in bridges)
            if bridges
            else ""
        )
        self.note(
            f"party {rank} lost at iteration {change['iteration']} ({reason}): "
            f"{run.engine.n_parties} parties continue on the surviving graph "
            f"(lambda = {change['lambda']:.4f}{how})"
        )


def train(
    config: TrainConfig | ResolvedConfig,
    *,
    progress: bool = True,
    write: bool = True,
    data: Dataset | None = None,
    engine: Engine | None = None,
    resume: bool = False,
    log=print,
    lr_choice: LrChoice | None = None,
    place: Place | None = None,
    nodes: int | None = None,
    parties_from_data: bool = False,
    faults: FaultPlan | None = None,
    figures: bool = True,
) -> RunResult:
    """Run one experiment and (by default) write its run folder from the main process.

    With the distributed engine every process calls this; only the main one (the lowest party
    in the run) logs and writes. Checkpoints go to the run folder every ``checkpoint_every``
    iterations; ``resume=True`` continues from the folder's checkpoint. SIGINT / SIGTERM write a
    checkpoint and raise :class:`RunInterrupted`. ``config`` is resolved and checked here unless
    it is a :class:`~slate.training.configuration.ResolvedConfig` already.

    The run's choices come first (:func:`slate.training.plan.choose`): N is ``nodes`` where the
    caller fixes it (a party process: the processes launched), chosen from a user's own file
    without ``--nodes`` with ``parties_from_data`` (``slate train``), else the flags'; ``--lr
    auto`` is chosen here (:mod:`slate.training.lr_choice`, its candidates run by
    :func:`run_candidates`), unless a launcher chose it already and passes its ``lr_choice``
    with the number in ``lr``; the choice goes to ``summary.json``'s ``lr_choice``. ``place``
    is this process's (a party process's device, run folder, loss policy, threads).

    ``faults``: the faults a test injects (:class:`slate.faults.FaultPlan`, read once by the
    ``slate train`` command); none by default (``--lr auto``'s candidate runs never get them).
    ``figures``: draw the folder's figures (:func:`slate.training.outputs.draw_figures`); a
    distributed party passes False and draws them after it has left the run.
    """
    resolved = as_resolved(config)
    place = place or Place()
    main = engine is None or engine.is_main
    choices = choose(
        resolved, data, place=place, nodes=nodes, parties_from_data=parties_from_data,
        lr_choice=lr_choice, runner=run_candidates, log=log if main else _quiet,
    )  # fmt: skip
    returning = engine is not None and engine.returning
    if returning and not resume:
        raise ConfigError(
            "A run is already in progress at this rendezvous. To return a party to it, restart "
            "it with --resume and its own run folder; a new run needs a new rendezvous."
        )
    out = place.out if place.out is not None else resolved.outputs.out
    own, replay = checkpoint.returning_record(out, engine) if returning else (None, None)
    try:
        run = Run(
            resolved,
            engine=engine,
            exchanges=replay.get("exchanges") if replay else None,
            choices=choices,
            place=place,
            faults=faults,
        )
    except ExchangeFailed as err:  # a party lost while the parties agree on the data
        raise engine.set_up_failure(err) from None
    return _drive(run, progress=progress, write=write, resume=resume, log=log, own=own,
                  figures=figures)  # fmt: skip


def _quiet(_: str) -> None:
    """A log that says nothing (a process that is not the main one; the candidates' runs)."""


def run_candidates(
    trial: ResolvedConfig, rows: Dataset, lrs: tuple[float, ...]
) -> dict[float, float]:
    """``--lr auto``'s candidates (:class:`slate.training.lr_choice.CandidateRunner`): one short
    simulator run of ``trial`` on ``rows`` per step size in ``lrs``, all on one cut of the rows
    (the first run's, reused: the same rows, parties and seed give the same cut); each one's
    held-out AP, NaN where it diverged."""
    aps: dict[float, float] = {}
    local: LocalData | None = None
    for lr in lrs:
        choices = Choices(trial.data.nodes, lr, None, rows, trial.data)
        run = Run(trial, choices=choices, local=local)
        local = run.data
        try:
            result = _drive(run, progress=False, write=False, resume=False, log=_quiet)
            aps[lr] = float(result.summary["test_ap"])
        except TrainingDiverged:
            aps[lr] = math.nan
    return aps


def _drive(
    run: Run,
    *,
    progress: bool,
    write: bool,
    resume: bool,
    log,
    own: dict[str, Any] | None = None,
    figures: bool = True,
) -> RunResult:
    """Drive a built ``run`` to its end: its folder, set-up record, console lines, a resume or
    a return (``own``: a returning party's own newest checkpoint), the loop and the summary
    (with ``figures``, the folder's figures too)."""
    plan, settings = run.plan, run.settings
    returning = run.engine.returning

    def say(line: str) -> None:
        if run.engine.is_main:
            log(line)

    for note in run.data.notes:
        say(note)
    for note in getattr(run.data, "own_notes", ()):  # this site's alone (per-party files)
        log(note)
    out = None
    if write:
        folder = plan.out or default_out_dir(settings.data.dataset, settings.algorithm.name)
        out = Path(folder)
    if out is not None and not returning:
        checkpoint.write_setup(run, out, progress)
    say(f"{run.data.describe()} (data loaded in {run.load_seconds:.1f} s)")
    network = (
        "no network"  # one party: nothing to gossip, the topology and its lambda mean nothing
        if plan.nodes == 1
        else f"topology {settings.communication.topology} ({_lambda_text(run.topology)})"
    )
    say(f"{settings.algorithm.name} on {parties(plan.nodes)} ({run.engine.name}), {network}, "
        f"{settings.algorithm.iterations} iterations")  # fmt: skip
    # each site's own console; where one dataset is cut into parties, one operator holds every
    # party's rows, so no site learns another's model and nothing is said
    if settings.data.per_party and (exposed := disclosure_warning(run)) is not None:
        log(exposed)
    offset = 0.0
    run.network.start()
    if returning:
        run.party_set.admit(run.engine.rejoin(), own)
        log(f"party {run.engine.rank} rejoined the run at iteration {run.iteration}")
    elif resume and out is not None:
        offset = checkpoint.resume(run, out, say)
        say(f"resumed from iteration {run.iteration} of {out}")
    if run.ledger is not None and out is not None:  # --dp-epsilon: planned against the folder's
        run.ledger = plan_against_ledger(run, out, say)
        cut = run.ledger.plan
        if cut.requested is not None and cut.releases < cut.requested:  # ends where it affords
            run.private_end = run.iteration + cut.releases
    bar, reporter = Progress(run, progress), Reporter(run, out)
    reporter.open()
    reporter.event(f"start: {settings.algorithm.name} on {parties(plan.nodes)} ({run.engine.name})"
                   f" at iteration {run.iteration} of {settings.algorithm.iterations}")  # fmt: skip
    loop = _Loop(run, out, time.perf_counter() - offset, bar, say, log, reporter)
    loop.joined_at = run.iteration if returning else None
    if loop.best is not None and run.resumed_best is not None:
        loop.best.load_state_dict(run.resumed_best, run.device)
    try:
        with StopOnSignal(run), reporter.watching():
            try:
                final = loop.run_to_end()
            except TrainingDiverged as err:
                note = checkpoint.last_checkpoint_note(run, out)
                raise TrainingDiverged(f"{err} {note}") from None
            finally:
                bar.close()
        return _conclude(run, loop, final, out, log, reporter, figures)
    finally:
        reporter.close()


def _conclude(run: Run, loop: _Loop, final: _Final, out: Path | None, log, reporter: Reporter,
              figures: bool) -> RunResult:  # fmt: skip
    """The end of a run: its summary, run folder and closing lines."""
    plan = run.plan
    history = run.history
    robust = run.robust_records()
    if not run.writes_outputs:
        return RunResult({}, history, None, run.x)
    summary = build_summary(run, history, final.party_aps, final.wall, final.traffic, robust)
    refused = final.average_check is not None and final.average_check.refused
    curves = final_curves(run, final.logits, final.scores, refused)
    summary.update(evaluation_summary(run, final.logits, final.scores, curves))
    if run.validated or refused:  # the test scored once, just now; or the site's own model
        summary.update(test_ap=final.scores.values["test_ap"],
                       test_auroc=final.scores.values["test_auroc"])  # fmt: skip
    if run.validated:
        summary.update(validation_summary(history, loop.best, loop.stopped_at, run.n_validation))
    if final.average_check is not None:
        summary["final_average"] = final.average_check.to_dict()
    if refused:
        summary.update(evaluation="own test rows", test_ap_error_bound=None,
                       test_auroc_error_bound=None)  # fmt: skip
    if run.evaluator.refused:
        summary["refused_evaluations"] = list(run.evaluator.refused)
    summary["divergence"] = _divergence(run, history, final).to_dict()
    if plan.lr_choice is not None:
        summary["lr_choice"] = plan.lr_choice.to_dict()
    if run.ledger is not None:
        summary["privacy"] = run.ledger.summary()
    summary["state"] = "done"
    if out is not None:
        write_run_folder(run, summary, history, out, final.model, final.validation, figures,
                         curves)  # fmt: skip
        summary["out_dir"] = str(out)
    reporter.finished(summary)
    report(run, summary, final.wall, out, log)
    if run.ledger is not None:
        log(privacy_line(summary["privacy"]))
    message = final.average_check.message(out) if refused and final.average_check else None
    return RunResult(summary, history, out, run.x, message)


def _divergence(run: Run, history: list[dict[str, float]], final: _Final):
    """Whether the parties ended apart (:mod:`slate.metrics.divergence`): the history's consensus
    distances against the final averaged model's squared norm, and the party APs."""
    size = run.compute.layout.size
    xbar = final.model[0]
    squared_norm = float((xbar[:size].double() ** 2).sum()) if run.plan.nodes > 1 else 0.0
    settings = run.comm.settings
    compressor = settings.compressor
    advice = advice_for(
        compressor.name if compressor is not None else "none",
        settings.consensus_step if compressor is not None else None,
        compressor.default_consensus_step if compressor is not None else None,
        settings.every,
    )
    return assess_divergence(
        [row["consensus_distance"] for row in history], squared_norm, final.party_aps,
        final.scores.values["test_ap"], advice, run.ledger is not None,
    )  # fmt: skip
