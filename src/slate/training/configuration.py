"""A run's configuration, resolved and checked once, in sections.

:func:`resolve_and_check` is the one place where a :class:`~slate.config.TrainConfig` (the flat,
user-facing flags) has its defaults filled (:func:`slate.config.resolve_config`) and its flags
checked (:func:`slate.training.checks.check_config`). Its :class:`ResolvedConfig` carries the
resolved flags (what ``summary.json`` and checkpoints store) and the settings derived from them,
in one section per stage: data, model, algorithm, communication, membership and outputs. Every
later stage takes the resolved object (:func:`slate.training.loop.train`,
:class:`slate.training.run.Run`) and checks nothing again; a later fill-in (the parties a
launcher started, a party's own run folder, the evaluation defaults once the test set's size is
known) is :meth:`ResolvedConfig.replace`, which derives the sections again without resolving.

:func:`check_inputs` is what a launcher adds, once for all its parties: the topology, the
algorithm and the data (read once: a dataset already read to choose N is reused).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from slate.algorithms import AlgorithmConfig, build_algorithm
from slate.communication.gossip import WanLink, parse_wan
from slate.config import TrainConfig, resolve_config
from slate.data.datasets import Dataset
from slate.data.partition import check_party_counts, make_partition
from slate.data.sources import load_dataset
from slate.data.spec import DataSpec
from slate.topology import build_topology
from slate.training.checks import algorithm_config, check_config, resolve_device

__all__ = [
    "AlgorithmSection",
    "CommunicationSection",
    "DataSection",
    "MembershipSection",
    "ModelSection",
    "OutputsSection",
    "ResolvedConfig",
    "as_resolved",
    "check_inputs",
    "resolve_and_check",
]

#: The data section: the resolved flags that :mod:`slate.data` reads (:class:`DataSpec`).
DataSection = DataSpec


@dataclass(frozen=True)
class ModelSection:
    """What builds the model and where it runs: ``--model``, ``--hidden``, the seed of its
    initial weights, the device, ``--compile`` and ``--threads``."""

    name: str
    hidden: int
    seed: int
    device: torch.device
    compile: str
    threads: int | None


@dataclass(frozen=True)
class AlgorithmSection:
    """``--algorithm`` and its hyperparameters (:class:`~slate.algorithms.AlgorithmConfig`),
    and the steps it takes: T iterations of m rows, b of them positive."""

    name: str
    config: AlgorithmConfig
    iterations: int
    batch_size: int
    positives: int


@dataclass(frozen=True)
class CommunicationSection:
    """The graph and the gossip over it: ``--topology`` of ``--nodes`` parties (seeded,
    ``--fed-period``), ``--gossip-every``, ``--compress``, ``--consensus-step`` and the parsed
    ``--wan`` link (None without one). :func:`slate.communication.gossip.gossip_settings` reads
    this section."""

    topology: str
    nodes: int
    seed: int
    fed_period: int
    gossip_every: int
    compress: str
    consensus_step: str | float | None
    wan: WanLink | None


@dataclass(frozen=True)
class MembershipSection:
    """What a lost party does to the run (``--on-party-loss``) and the losses the simulator
    injects (``--drop-party``, as given)."""

    on_party_loss: str
    drop_party: tuple[str, ...]


@dataclass(frozen=True)
class OutputsSection:
    """The run folder (``--out``, None: a fresh one), the evaluations (``--eval-every`` and
    ``--party-ap``, None until the test set's size fills them), ``--checkpoint-every`` and
    ``--early-stopping``."""

    out: str | None
    eval_every: int | None
    party_ap: bool | None
    checkpoint_every: int
    early_stopping: int | None


@dataclass(frozen=True)
class ResolvedConfig:
    """A run's configuration, resolved and checked (:func:`resolve_and_check`), in sections.

    Attributes:
        given: the flags as the user gave them (None where a default was taken).
        flags: the resolved flags, every default filled: what ``summary.json`` stores.
        data, model, algorithm, communication, membership, outputs: each stage's section.
    """

    given: TrainConfig
    flags: TrainConfig
    data: DataSection
    model: ModelSection
    algorithm: AlgorithmSection
    communication: CommunicationSection
    membership: MembershipSection
    outputs: OutputsSection

    def replace(self, **changes: Any) -> ResolvedConfig:
        """These resolved flags changed and the sections derived again; nothing is resolved or
        checked again (a new configuration goes through :func:`resolve_and_check`)."""
        flags = dataclasses.replace(self.flags, **changes)
        data_changed = bool(changes.keys() & {f.name for f in dataclasses.fields(DataSpec)})
        return _derive(self.given, flags, None if data_changed else self.data)


def resolve_and_check(config: TrainConfig) -> ResolvedConfig:
    """Fill ``config``'s defaults, check every flag that can be checked without data (``--out``
    first, before any data is read), and derive each stage's section."""
    flags = resolve_config(config)
    check_config(flags)
    return _derive(config, flags)  # the device is checked here, after the other flags


def as_resolved(config: TrainConfig | ResolvedConfig) -> ResolvedConfig:
    """``config`` itself when it is resolved already, else :func:`resolve_and_check`'s."""
    if isinstance(config, ResolvedConfig):
        return config
    return resolve_and_check(config)


def check_inputs(resolved: ResolvedConfig, dataset: Dataset | None = None) -> None:
    """What a launcher checks once, so that bad input gives one clear error instead of one per
    party: the topology, the algorithm and, for one partitioned dataset, every party's share of
    the training rows (``dataset`` where it was read already, else read here as a run reads it).
    With per-party files each party reads and checks its own; they agree before training."""
    flags = resolved.flags
    comm = resolved.communication
    build_topology(comm.topology, comm.nodes, seed=comm.seed, fed_period=comm.fed_period)
    algorithm = resolved.algorithm.config
    if algorithm.lr == "auto":  # chosen from the data later; the other values are checked now
        algorithm = dataclasses.replace(algorithm, lr=1.0)
    build_algorithm(resolved.algorithm.name, algorithm)
    spec = resolved.data
    if spec.per_party:
        return
    if dataset is None:
        dataset = load_dataset(spec, spec.validation_fraction, spec.split_seed)
    parts = dataset.parts
    if parts is None:
        parts = make_partition(
            dataset.y_train, flags.nodes, flags.partition, flags.seed, flags.dirichlet_alpha
        )
    check_party_counts(dataset.y_train, parts, flags.positives, flags.batch_size, flags.partition)


def _derive(given: TrainConfig, flags: TrainConfig, data: DataSpec | None = None) -> ResolvedConfig:
    """The sections of resolved ``flags`` (checked already); ``data``, where given, is the data
    section, unchanged since it was built."""
    return ResolvedConfig(
        given=given,
        flags=flags,
        data=data if data is not None else DataSpec.from_config(flags),
        model=ModelSection(
            name=flags.model, hidden=flags.hidden, seed=flags.seed,
            device=resolve_device(flags.device), compile=flags.compile, threads=flags.threads,
        ),
        algorithm=AlgorithmSection(
            name=flags.algorithm, config=algorithm_config(flags), iterations=flags.iterations,
            batch_size=flags.batch_size, positives=flags.positives,
        ),
        communication=CommunicationSection(
            topology=flags.topology, nodes=flags.nodes, seed=flags.seed,
            fed_period=flags.fed_period, gossip_every=flags.gossip_every, compress=flags.compress,
            consensus_step=flags.consensus_step, wan=parse_wan(flags.wan),
        ),
        membership=MembershipSection(
            on_party_loss=flags.on_party_loss, drop_party=tuple(flags.drop_party)
        ),
        outputs=OutputsSection(
            out=flags.out, eval_every=flags.eval_every, party_ap=flags.party_ap,
            checkpoint_every=flags.checkpoint_every, early_stopping=flags.early_stopping,
        ),
    )  # fmt: skip
