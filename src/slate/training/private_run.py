"""A run's parts under ``--dp-epsilon``: its secret streams, its Poisson sampler in groups and
its privatised compute (:mod:`slate.algorithms.privacy`, :mod:`slate.training.accountant`).

:class:`slate.training.run.Run` builds them through these functions, on either engine: the
simulator for its N parties, a site's process for its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from slate.algorithms import ALGORITHMS, Algorithm
from slate.algorithms.compute import PartyCompute
from slate.algorithms.privacy import PrivateCompute, PrivateGroups, expected_contributors
from slate.data.local_data import LocalData
from slate.data.sampler import PoissonGroupSampler, row_slots_for, slots_for
from slate.engines.base import Engine
from slate.errors import ConfigError
from slate.faults import FaultPlan
from slate.security.secret_random import SecretStream
from slate.training.accountant import (
    PrivacyLedger,
    folder_history,
    ledger_path,
    plan_privacy,
    sampling_rates,
)
from slate.training.configuration import ResolvedConfig


class RunView(Protocol):
    """What :func:`plan_against_ledger` reads of a :class:`slate.training.run.Run` (named here
    without importing it: ``run`` imports this module)."""

    ledger: PrivacyLedger | None
    settings: ResolvedConfig
    engine: Engine
    iteration: int
    algorithm: Algorithm
    compute: PartyCompute


__all__ = [
    "PrivateSampling",
    "plan_against_ledger",
    "privatise",
    "refuse_batch_norm",
    "sampling",
    "secret_streams",
    "with_empty_row",
]


def secret_streams(faults: FaultPlan, engine: Engine, purpose: str) -> list[SecretStream]:
    """One secret stream per local party (``os.urandom`` keys, never ``--seed``); reproducible
    ones only where a test asked (``SLATE_DP_TEST_SEED``), which a run under a roster refuses."""
    seed = faults.privacy_seed(engine.roster_digest is not None)
    if seed is None:
        return [SecretStream() for _ in engine.local_parties]
    return [SecretStream.for_test(seed, p, purpose) for p in engine.local_parties]


@dataclass(frozen=True)
class PrivateSampling:
    """The local parties' public sampling parameters and their sampler: class sizes
    ``(party, n+, n-)``, rates ``(q+, q-)``, the clipping unit, and ``groups`` of ``size``
    slots."""

    counts: list[tuple[int, int, int]]
    rates: list[tuple[float, float]]
    unit: str
    groups: int
    size: int
    sampler: PoissonGroupSampler


def sampling(
    settings: ResolvedConfig, data: LocalData, engine: Engine, faults: FaultPlan
) -> PrivateSampling:
    """Each local party's class sizes (public once declared), its rates ``q+ = G b / n+`` and
    ``q- = G (m - b) / n-`` (both 0 for the AP surrogate at a party without positives, which
    samples and releases nothing), and the groups' shape: ``G`` groups of ``k`` slots for a
    loss over a batch (SLATE's), or groups of one row for a sum over rows (D-PSGD's, CODA's),
    with slots for the expected rows' rare highs (:func:`slate.data.sampler.slots_for`)."""
    section, privacy = settings.algorithm, settings.privacy
    assert privacy is not None
    labels, parties = data.y_train, engine.local_parties
    counts = [
        (party, int((labels[rows] == 1).sum()), int((labels[rows] == 0).sum()))
        for party, rows in zip(parties, data.parts, strict=True)
    ]
    unit = ALGORITHMS[section.name].private_unit
    rates = [
        sampling_rates(privacy.groups, section.batch_size, section.positives, n_pos, n_neg, unit)
        for _, n_pos, n_neg in counts
    ]
    expected = max(
        q_pos * n_pos + q_neg * n_neg
        for (q_pos, q_neg), (_, n_pos, n_neg) in zip(rates, counts, strict=True)
    )
    if unit == "group":
        groups, size = privacy.groups, slots_for(expected / privacy.groups)
    else:
        groups, size = row_slots_for(expected), 1
    streams = secret_streams(faults, engine, "sample")
    sampler = PoissonGroupSampler(
        data.parts, labels, rates, groups, size, streams, pad=len(labels), parties=parties
    )
    return PrivateSampling(counts, rates, unit, groups, size, sampler)


def privatise(
    sampling: PrivateSampling,
    compute: PartyCompute,
    algorithm: Algorithm,
    settings: ResolvedConfig,
    engine: Engine,
    faults: FaultPlan,
    folder: Path | None = None,
) -> tuple[PrivateCompute, PrivacyLedger]:
    """The noise multiplier of each local party calibrated over the run's releases (one per
    step) against the history of ``folder``'s ledger (none without a folder), ``compute``
    (built on the algorithm's masked objective) wrapped in the mechanism with secret noise, and
    an in-memory ledger. Before its first step, a run with a folder opens that ledger, planned
    again only where its resume or return leaves fewer steps (:func:`plan_against_ledger`)."""
    section, privacy = settings.algorithm, settings.privacy
    assert privacy is not None
    refuse_batch_norm(compute.module, settings.model.name)
    releases = section.iterations + algorithm.initial_batches(section.positives)
    path = ledger_path(folder, engine.own_party) if folder is not None else None
    history = folder_history(folder, engine.own_party) if folder is not None else ()
    plan = plan_privacy(
        privacy.epsilon, privacy.delta, privacy.clip, sampling.groups, sampling.size,
        sampling.unit, releases, sampling.counts, section.batch_size, section.positives,
        history=history, ledger=path, rate_groups=privacy.groups,
    )  # fmt: skip
    divisors = tuple(
        expected_contributors(sampling.unit, sampling.groups, n_pos, n_neg, q_pos, q_neg)
        for (_, n_pos, n_neg), (q_pos, q_neg) in zip(sampling.counts, sampling.rates, strict=True)
    )
    shape = PrivateGroups(sampling.groups, sampling.size, privacy.clip, plan.noise_std(), divisors)
    noise = secret_streams(faults, engine, "noise")
    return PrivateCompute(compute, shape, noise), PrivacyLedger(plan)


def plan_against_ledger(run: RunView, folder: Path, say: Callable[[str], None]) -> PrivacyLedger:
    """The ledger of ``folder`` for ``run`` (after its resume or return, before its first step):
    the plan made again against the segments the ledger records (every earlier run of these
    rows), for the releases the run has left (``iterations - iteration``, and the initial
    batch's from iteration 0); each local party's noise set to the new plan's (its sensitivity
    times z). A cut plan is said (``say``); a history that leaves no room is refused here
    (:class:`slate.training.accountant.PrivacyBudgetSpent`), before any release."""
    assert run.ledger is not None and run.settings.privacy is not None
    old, section = run.ledger.plan, run.settings.algorithm
    rank = run.engine.own_party
    path = ledger_path(folder, rank)
    history = folder_history(folder, rank)
    left = section.iterations - run.iteration
    if run.iteration == 0:
        left += run.algorithm.initial_batches(section.positives)
    plan = old
    if history != old.history or left != old.requested:  # (made at set-up for these already)
        counts = [(p.party, p.positives, p.negatives) for p in old.parties]
        plan = plan_privacy(
            old.epsilon, old.delta, old.clip, old.groups, old.group_size, old.unit, left,
            counts, section.batch_size, section.positives, history=history, ledger=path,
            rate_groups=run.settings.privacy.groups,
        )  # fmt: skip
        compute = run.compute
        assert isinstance(compute, PrivateCompute)
        compute.set_noise_std(plan.noise_std())
    if plan.note is not None:
        say(plan.note)
    return PrivacyLedger.open(plan, folder, rank)


def with_empty_row(features: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The training table with one more row, zeros labelled -1: an empty slot's index
    (``len(labels)``) gathers it, and the masked objectives leave it out."""
    blank = features.new_zeros(1, *features.shape[1:])
    return torch.cat([features, blank]), torch.cat([labels, labels.new_full((1,), -1)])


def refuse_batch_norm(model: torch.nn.Module, name: str) -> None:
    """BatchNorm mixes the rows of a batch in its statistics and keeps running averages of
    them, neither of which grouped clipping bounds: refused under ``--dp-epsilon``."""
    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ConfigError(
            f"Refused under --dp-epsilon: --model {name} uses BatchNorm, whose batch statistics "
            "and running averages carry every row of a batch into every other row's output "
            "and into the saved model, which the privacy accounting does not bound. Use a "
            "model without BatchNorm (mlp, or the paper's CNNs)."
        )
