"""A run's configuration, resolved and checked once, in sections.

:func:`resolve_and_check` is the one place where a :class:`~slate.config.TrainConfig` (the flat,
user-facing flags) has its defaults filled (:func:`slate.config.resolve_config`, with the
algorithms' own defaults from their dataclasses) and its flags checked
(:func:`slate.training.checks.check_config`). Its :class:`ResolvedConfig` carries the resolved
flags and the settings derived from them, in one section per stage: data, model, algorithm,
communication, membership and outputs. Every later stage takes the resolved object and checks
nothing again; it is never changed. What depends on the data or on the process (N where it is
chosen from the data, ``--lr auto``, the evaluation defaults, threads, a party's device and run
folder) is the run's plan (:mod:`slate.training.plan`), made once from it.

:func:`check_inputs` is what a launcher adds, once for all its parties: the topology, the
algorithm and the data (read once: a dataset already read to choose N is reused).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from slate.algorithms import AlgorithmConfig, build_algorithm, parameter_defaults
from slate.communication.gossip import WanLink, parse_wan
from slate.config import TrainConfig, resolve_config
from slate.data.datasets import Dataset
from slate.data.dictionary import label_flags, read_dictionary
from slate.data.partition import check_party_counts, make_partition
from slate.data.sources import load_dataset
from slate.data.spec import DataSpec
from slate.errors import ConfigError
from slate.topology import build_topology
from slate.training.checks import algorithm_config, algorithm_params, check_config, resolve_device

__all__ = [
    "AlgorithmSection",
    "CommunicationSection",
    "DataSection",
    "MembershipSection",
    "ModelSection",
    "OutputsSection",
    "PrivacySection",
    "ResolvedConfig",
    "as_resolved",
    "check_inputs",
    "resolve_and_check",
]

#: The data section: the resolved flags that :mod:`slate.data` reads (:class:`DataSpec`). Its
#: ``nodes`` is the flags'; a run cuts its rows with its plan's (``RunPlan.data``).
DataSection = DataSpec


@dataclass(frozen=True)
class ModelSection:
    """What builds the model and where it runs: ``--model``, ``--hidden``, the seed of its
    initial weights, the device, ``--compile`` and ``--threads`` (None: the plan's default; a
    party process's device and threads are its plan's)."""

    name: str
    hidden: int
    seed: int
    device: torch.device
    compile: str
    threads: int | None


@dataclass(frozen=True)
class AlgorithmSection:
    """``--algorithm``, the hyperparameters the algorithms share
    (:class:`~slate.algorithms.AlgorithmConfig`; ``lr`` may be ``"auto"``, the plan's is the
    number) and its own (``params``, its parameter dataclass), and the steps it takes: T
    iterations of m rows, b of them positive, drawn by streams seeded with ``seed``."""

    name: str
    config: AlgorithmConfig
    params: Any
    iterations: int
    batch_size: int
    positives: int
    seed: int


@dataclass(frozen=True)
class CommunicationSection:
    """The graph and the gossip over it: ``--topology`` (over the plan's N parties; seeded,
    ``--fed-period``), ``--gossip-every``, ``--compress``, ``--consensus-step``, the parsed
    ``--wan`` link (None without one) and ``--robust``.
    :func:`slate.communication.gossip.gossip_settings` reads this section."""

    topology: str
    seed: int
    fed_period: int
    gossip_every: int
    compress: str
    consensus_step: str | float | None
    wan: WanLink | None
    robust: str


@dataclass(frozen=True)
class MembershipSection:
    """What a lost party does to the run (``--on-party-loss``; a torchrun worker's plan stops)
    and the losses the simulator injects (``--drop-party``, as given; parsed by the plan)."""

    on_party_loss: str
    drop_party: tuple[str, ...]


@dataclass(frozen=True)
class OutputsSection:
    """The run folder (``--out``, None: a fresh one; a party's is its plan's), the evaluations
    (``--eval-every`` and ``--party-ap``, None: the plan's defaults once the test set's size is
    known), ``--checkpoint-every`` and ``--early-stopping``."""

    out: str | None
    eval_every: int | None
    party_ap: bool | None
    checkpoint_every: int
    early_stopping: int | None
    final_check_bounds: str | None = None  # a site's bounds of the final check (final_measures)


@dataclass(frozen=True)
class PrivacySection:
    """``--dp-epsilon`` E at ``--dp-delta``, the clip C (``--dp-clip``) and the groups G
    (``--dp-groups``) of the mechanism (:mod:`slate.algorithms.privacy`,
    :mod:`slate.training.accountant`)."""

    epsilon: float
    delta: float
    clip: float
    groups: int


@dataclass(frozen=True)
class ResolvedConfig:
    """A run's configuration, resolved and checked (:func:`resolve_and_check`), in sections.

    Attributes:
        given: the flags as the user gave them (None where a default was taken).
        flags: the resolved flags, every default filled that needs no data; with the plan's
            fill-ins they are what ``summary.json`` stores (``RunPlan.flags``).
        data, model, algorithm, communication, membership, outputs: each stage's section.
        privacy: ``--dp-epsilon``'s section, None without it.
    """

    given: TrainConfig
    flags: TrainConfig
    data: DataSection
    model: ModelSection
    algorithm: AlgorithmSection
    communication: CommunicationSection
    membership: MembershipSection
    outputs: OutputsSection
    privacy: PrivacySection | None = None


def resolve_and_check(config: TrainConfig) -> ResolvedConfig:
    """Fill ``config``'s defaults, check every flag that can be checked without data (``--out``
    first, before any data is read), and derive each stage's section."""
    flags = _with_schema(resolve_config(config, parameter_defaults()))
    check_config(flags, config)
    return _derive(config, flags)  # the device is checked here, after the other flags


def _with_schema(flags: TrainConfig) -> TrainConfig:
    """With ``--schema FILE``: the file read and checked before anything else is (a bad file
    stops here, naming the file and the key), and its label filling ``--label-column`` and
    ``--positive-label`` where they are not given (recorded in ``summary.json`` and
    ``model.json``)."""
    if flags.schema is None:
        return flags
    if flags.dataset != "csv":
        raise ConfigError(
            f"--schema describes a table's columns: it needs --dataset csv, got --dataset "
            f"{flags.dataset}."
        )
    dictionary = read_dictionary(flags.schema)
    label, positive = label_flags(dictionary, flags.label_column, flags.positive_label)
    return dataclasses.replace(flags, label_column=label, positive_label=positive)


def as_resolved(config: TrainConfig | ResolvedConfig) -> ResolvedConfig:
    """``config`` itself when it is resolved already, else :func:`resolve_and_check`'s."""
    if isinstance(config, ResolvedConfig):
        return config
    return resolve_and_check(config)


def check_inputs(resolved: ResolvedConfig, nodes: int, dataset: Dataset | None = None) -> None:
    """What a launcher checks once, so that bad input gives one clear error instead of one per
    party: the topology of its ``nodes`` parties, the algorithm and, for one partitioned
    dataset, every party's share of the training rows (``dataset`` where it was read already,
    else read here as a run reads it). With per-party files each party reads and checks its
    own; they agree before training."""
    comm = resolved.communication
    build_topology(comm.topology, nodes, seed=comm.seed, fed_period=comm.fed_period)
    section = resolved.algorithm
    algorithm = section.config
    if algorithm.lr == "auto":  # chosen from the data later; the other values are checked now
        algorithm = dataclasses.replace(algorithm, lr=1.0)
    build_algorithm(section.name, algorithm, section.params)
    spec = resolved.data
    if spec.per_party:
        return
    if dataset is None:
        dataset = load_dataset(spec, spec.validation_fraction, spec.split_seed)
    parts = dataset.parts
    if parts is None:
        parts = make_partition(dataset.y_train, nodes, spec.partition, spec.seed,
                               spec.dirichlet_alpha)  # fmt: skip
    check_party_counts(dataset.y_train, parts, spec.positives, spec.batch_size, spec.partition)


def _derive(given: TrainConfig, flags: TrainConfig) -> ResolvedConfig:
    """The sections of resolved ``flags`` (checked already)."""
    return ResolvedConfig(
        given=given,
        flags=flags,
        data=DataSpec.from_config(flags),
        model=ModelSection(
            name=flags.model, hidden=flags.hidden, seed=flags.seed,
            device=resolve_device(flags.device), compile=flags.compile, threads=flags.threads,
        ),
        algorithm=AlgorithmSection(
            name=flags.algorithm, config=algorithm_config(flags), params=algorithm_params(flags),
            iterations=flags.iterations, batch_size=flags.batch_size, positives=flags.positives,
            seed=flags.seed,
        ),
        communication=CommunicationSection(
            topology=flags.topology, seed=flags.seed, fed_period=flags.fed_period,
            gossip_every=flags.gossip_every, compress=flags.compress,
            consensus_step=flags.consensus_step, wan=parse_wan(flags.wan), robust=flags.robust,
        ),
        membership=MembershipSection(
            on_party_loss=flags.on_party_loss, drop_party=tuple(flags.drop_party)
        ),
        outputs=OutputsSection(
            out=flags.out, eval_every=flags.eval_every, party_ap=flags.party_ap,
            checkpoint_every=flags.checkpoint_every, early_stopping=flags.early_stopping,
            final_check_bounds=flags.final_check_bounds,
        ),
        privacy=None if flags.dp_epsilon is None else PrivacySection(
            epsilon=flags.dp_epsilon, delta=flags.dp_delta, clip=flags.dp_clip,
            groups=flags.dp_groups,
        ),
    )  # fmt: skip
