"""A run's plan: everything it fills in from its data and from its process, made once.

The resolved configuration (:mod:`slate.training.configuration`) holds what the flags fix and
is never changed. What depends on the data or on the process is decided here, each value once,
in two moments:

1. **Before any party's rows are cut** (:func:`choose`, a :class:`Choices`): the number of
   parties N (fixed by the caller: the processes a launcher started; or, for a user's own file
   without ``--nodes``, chosen from its positives by :func:`choose_parties`; else the flags'),
   then the step size of ``--lr auto``, scored by short simulator runs
   (:mod:`slate.training.lr_choice`) through the runner that the caller passes down
   (:func:`slate.training.loop.run_candidates`: the loop owns both the plan and the runs). A
   launcher makes these choices once for all its parties and hands each ``--nodes``, ``--lr``
   and the choice's record. Where either choice needs the whole table's rows, they are read
   once, here (:func:`whole_rows`), and the run reuses them.
2. **Once this process's rows are read** (:func:`plan`, a :class:`RunPlan`): the evaluation
   defaults (``eval_every``, ``party_ap``) from the test rows' count, ``--threads``' default from
   the model's size, the simulator's ``--drop-party`` schedule, and the process's
   :class:`Place` (a party's device, run folder, loss policy, one thread).

:attr:`RunPlan.flags` are the resolved flags with every fill-in: what ``summary.json`` and the
checkpoints store, and what the sites compare before step 1 (:mod:`slate.training.agreement`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from slate.algorithms import AlgorithmConfig
from slate.config import TrainConfig
from slate.data.datasets import Dataset
from slate.data.local_data import LocalData
from slate.data.partition import MAX_DEFAULT_PARTIES, parties_for_positives
from slate.data.sources import load_dataset
from slate.data.spec import DataSpec
from slate.training.checks import (
    parse_drops,
    resolve_device,
    with_evaluation_defaults,
    with_thread_default,
)
from slate.training.configuration import ResolvedConfig
from slate.training.lr_choice import CandidateRunner, LrChoice, auto_lr

__all__ = [
    "Choices",
    "Place",
    "RunPlan",
    "choose",
    "choose_parties",
    "choose_step_size",
    "plan",
    "whole_rows",
]


@dataclass(frozen=True)
class Place:
    """Where a process runs its run, as its party process sets it (None: the resolved flags').

    Attributes:
        device: this party's device (``cuda:K`` for a launched process's local rank).
        out: this party's run folder (:func:`slate.training.party_process` names it).
        on_party_loss: ``stop`` under torchrun, whose agent stops every worker when one fails.
        threads: ``--threads``' default for this process where it is not the model's rule: one
            for a process that runs one party beside others on the same cores.
    """

    device: str | None = None
    out: str | None = None
    on_party_loss: str | None = None
    threads: int | None = None

    def applied(self, flags: TrainConfig) -> TrainConfig:
        """``flags`` as this process holds them: its device, folder, loss policy and threads."""
        return dataclasses.replace(
            flags,
            device=self.device or flags.device,
            out=self.out if self.out is not None else flags.out,
            on_party_loss=self.on_party_loss or flags.on_party_loss,
            threads=flags.threads if flags.threads is not None else self.threads,
        )


@dataclass(frozen=True)
class Choices:
    """What a run chooses before any party's rows are cut (:func:`choose`).

    Attributes:
        nodes: the number of parties N.
        lr: the step size (``--lr``, or the one ``--lr auto`` chose).
        lr_choice: ``--lr auto``'s record (``summary.json``'s ``lr_choice``), or None.
        dataset: the whole dataset where it was read to choose (or given by the caller), for
            the run to reuse; None otherwise.
        data: the data section with N (the parties its rows are cut into).
    """

    nodes: int
    lr: float
    lr_choice: LrChoice | None
    dataset: Dataset | None
    data: DataSpec


@dataclass(frozen=True)
class RunPlan:
    """Every fill-in of one process's run (module docstring), made once by :func:`plan`.

    Attributes:
        flags: the resolved flags with every value below: the run's record.
        nodes, lr, lr_choice, data: the :class:`Choices` (``data``: the data section with N).
        algorithm: the shared hyperparameters with the step size.
        device, out, on_party_loss: this process's place.
        drops: the simulator's injected losses, ``{iteration: [ranks]}``.
        eval_every, party_ap: the evaluations, given or by the budget rule.
        threads: torch's CPU threads in this process, given or by the model's rule.
    """

    flags: TrainConfig
    nodes: int
    lr: float
    lr_choice: LrChoice | None
    data: DataSpec
    algorithm: AlgorithmConfig
    device: torch.device
    out: str | None
    on_party_loss: str
    drops: dict[int, list[int]]
    eval_every: int
    party_ap: bool
    threads: int


def _parties_from_rows(resolved: ResolvedConfig, nodes: int | None, from_data: bool) -> bool:
    """Whether N follows the rows: a user's own whole file (``--dataset csv`` or ``libsvm``,
    not per-party files) without ``--nodes``, where the caller asks for it and fixes no N."""
    spec = resolved.data
    return (
        nodes is None and from_data and resolved.given.nodes is None
        and spec.dataset in ("csv", "libsvm") and not spec.per_party
    )  # fmt: skip


def whole_rows(
    resolved: ResolvedConfig,
    data: Dataset | None = None,
    *,
    nodes: int | None = None,
    from_data: bool = False,
    runner: CandidateRunner | None = None,
) -> Dataset | None:
    """The whole table's rows where a choice needs them, read once (``data``, when the caller
    read them already): N from a user's own file (:func:`choose_parties`), or ``--lr auto``
    scored on them (a ``runner`` given, not per-party files); else None."""
    if data is not None:
        return data
    spec = resolved.data
    scores_lr = resolved.algorithm.config.lr == "auto" and runner is not None
    if _parties_from_rows(resolved, nodes, from_data) or (scores_lr and not spec.per_party):
        return load_dataset(spec, spec.validation_fraction, spec.split_seed)
    return None


def choose_parties(
    resolved: ResolvedConfig,
    data: Dataset | None = None,
    *,
    nodes: int | None = None,
    from_data: bool = False,
    log=print,
) -> int:
    """N: ``nodes`` where the caller fixes it; with ``from_data`` (``slate train``, its
    launcher), a user's own file without ``--nodes`` (its rows ``data``, :func:`whole_rows`)
    gets the largest N <= 20 whose stratified parties each hold ``b`` training positives, said
    in one line; else the flags' N."""
    if nodes is not None:
        return nodes
    if not _parties_from_rows(resolved, nodes, from_data) or data is None:
        return resolved.flags.nodes
    positives, b = int(data.y_train.sum()), resolved.data.positives
    chosen = parties_for_positives(positives, b)
    if chosen < MAX_DEFAULT_PARTIES:
        log(
            f"note: {positives} training positives allow at most {positives // b} parties of "
            f"b = {b} positives each: running N = {chosen} (not the default "
            f"{MAX_DEFAULT_PARTIES}); --nodes N overrides."
        )
    return chosen


def choose_step_size(
    resolved: ResolvedConfig,
    nodes: int,
    data: Dataset | None = None,
    *,
    place: Place | None = None,
    lr_choice: LrChoice | None = None,
    runner: CandidateRunner | None = None,
    log=print,
) -> tuple[float, LrChoice | None]:
    """The step size and its record: ``--lr`` as given (with ``lr_choice``, a launcher's record
    of its choice), or ``--lr auto`` chosen for ``nodes`` parties on the whole table's rows
    ``data`` (:func:`whole_rows`) by :func:`slate.training.lr_choice.auto_lr` (its candidates
    run by ``runner``, in this process's ``place``)."""
    lr = resolved.algorithm.config.lr
    if lr != "auto":
        return lr, lr_choice
    flags = (place or Place()).applied(resolved.flags)
    return auto_lr(resolved, nodes, data, runner, log, flags)


def choose(
    resolved: ResolvedConfig,
    data: Dataset | None = None,
    *,
    place: Place | None = None,
    nodes: int | None = None,
    parties_from_data: bool = False,
    lr_choice: LrChoice | None = None,
    runner: CandidateRunner | None = None,
    log=print,
) -> Choices:
    """The rows both choices need, read once (:func:`whole_rows`), then N
    (:func:`choose_parties`), then the step size (:func:`choose_step_size`)."""
    data = whole_rows(resolved, data, nodes=nodes, from_data=parties_from_data, runner=runner)
    n = choose_parties(resolved, data, nodes=nodes, from_data=parties_from_data, log=log)
    lr, record = choose_step_size(
        resolved, n, data, place=place, lr_choice=lr_choice, runner=runner, log=log
    )
    spec = resolved.data
    if spec.nodes != n:  # the data section of the chosen N: the one fill-in of N in the data
        spec = dataclasses.replace(spec, nodes=n)
    return Choices(n, lr, record, data, spec)


def plan(
    resolved: ResolvedConfig,
    data: LocalData,
    choices: Choices,
    place: Place | None,
    parties: int,
) -> RunPlan:
    """The plan of a run of ``resolved`` whose ``choices`` are made, in ``place``, once the
    ``parties`` parties of this process hold their rows ``data``: the evaluation defaults from
    the test rows' count (:func:`~slate.training.checks.with_evaluation_defaults`; no party APs
    where no process holds every test row), ``--threads``' default
    (:func:`~slate.training.checks.with_thread_default`), the checked ``--drop-party``
    schedule."""
    place = place or Place()
    flags = place.applied(dataclasses.replace(resolved.flags, nodes=choices.nodes, lr=choices.lr))
    flags = with_evaluation_defaults(flags, data.n_test, party_ap_possible=not data.federated)
    flags = with_thread_default(flags, data.input_shape, parties)
    device = resolved.model.device if place.device is None else resolve_device(place.device)
    return RunPlan(
        flags=flags, nodes=choices.nodes, lr=choices.lr, lr_choice=choices.lr_choice,
        data=choices.data, algorithm=dataclasses.replace(resolved.algorithm.config, lr=choices.lr),
        device=device, out=flags.out, on_party_loss=flags.on_party_loss,
        drops=parse_drops(flags.drop_party, flags.nodes, flags.iterations),
        eval_every=flags.eval_every, party_ap=flags.party_ap, threads=flags.threads,
    )  # fmt: skip
