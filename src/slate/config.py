"""The flags of a run, and the paper's per-dataset defaults.

Every setting of a run is a field of :class:`TrainConfig`; each is declared once as a flag of
``slate train`` (its flag, help, type and group) in :mod:`slate.cli.train_settings`, which the
parser and the job file (``slate job init``, ``--job``) are built from. A flag left unset takes the
dataset's default from :data:`DATASET_DEFAULTS` (the hyperparameters of the paper's runs,
REFERENCE.md), then the generic default: :data:`_GENERIC_DEFAULTS` here, or, for a parameter of
one algorithm or operator, its own dataclass's default (passed in by
:func:`slate.training.configuration.resolve_and_check`). The resolved config is stored in
``summary.json``.

Every field is classified where it is declared: :func:`agreed` (every site of a distributed run
must hold the same value: it changes the trajectory or the collectives the sites take part in;
:mod:`slate.training.agreement` compares these before step 1) or :func:`per_site` (each site may
hold its own: its files, folder, device, threads). The parameter dataclasses of the algorithms
and compression operators use the same two helpers, with the flag's ``help`` beside them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AGREE",
    "DATASET_DEFAULTS",
    "DP_FEATURE_RANGE",
    "TrainConfig",
    "agreed",
    "agreed_fields",
    "must_agree",
    "per_site",
    "resolve_config",
]

#: The metadata key of a field's classification: True (must agree), False (may differ).
AGREE = "agree"


def agreed(default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A dataclass field that every site must hold with the same value; ``metadata`` may add
    the flag's ``help`` (with ``flag``, ``choices``, ``metavar``, ``example``) where the field is
    one of ``slate train``'s flags built from its dataclass."""
    return dataclasses.field(default=default, metadata={AGREE: True, **metadata})


def per_site(default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A dataclass field that each site may hold with its own value (its files, run folder,
    device, threads); ``metadata`` as for :func:`agreed`."""
    return dataclasses.field(default=default, metadata={AGREE: False, **metadata})


def must_agree(field: dataclasses.Field) -> bool:
    """Whether every site must hold ``field`` with the same value; a ``TypeError`` names a field
    declared without :func:`agreed` or :func:`per_site`."""
    agree = field.metadata.get(AGREE)
    if not isinstance(agree, bool):
        raise TypeError(
            f"the field {field.name!r} is not classified: declare it with agreed(...) (every "
            "site must hold the same value) or per_site(...) (each site may hold its own)"
        )
    return agree


def agreed_fields(cls: type) -> tuple[str, ...]:
    """The names of the fields of dataclass ``cls`` that every site must share, in order."""
    return tuple(f.name for f in dataclasses.fields(cls) if must_agree(f))


def _run(iterations, m, b, lr, margin, alpha, lr_dual, model, nodes=20) -> dict[str, Any]:
    return {
        "iterations": iterations, "batch_size": m, "positives": b, "lr": lr, "margin": margin,
        "alpha": alpha, "lr_dual": lr_dual, "model": model, "nodes": nodes,
    }  # fmt: skip


# The paper's runs: N = 20 parties on a ring (REFERENCE.md, Hyperparameters). Columns:
# iterations, m, b, lr, margin, SLATE-M alpha, CODA dual lr, model.
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": _run(1000, 20, 4, 0.05, 0.5, 0.1, 0.001, "mlp", nodes=8),
    "w7a": _run(10000, 20, 2, 0.01, 0.1, 0.1, 0.0001, "mlp"),
    "w8a": _run(10000, 20, 2, 0.01, 0.1, 0.1, 0.0001, "mlp"),
    "mnist": _run(300, 20, 3, 0.01, 0.1, 0.9, 0.001, "mnist-cnn"),
    "fashion-mnist": _run(300, 20, 5, 0.005, 0.1, 0.9, 0.0005, "fashion-mnist-cnn"),
    "cifar10": _run(2000, 60, 20, 0.01, 0.1, 0.1, 0.001, "cifar10-cnn"),
    # The paper gives no iteration count for Tiny-ImageNet and tunes lr, margin, alpha on grids.
    "tiny-imagenet": _run(2000, 200, 35, 0.01, 0.1, 0.1, 0.001, "resnet18"),
    "libsvm": {"model": "mlp"},
    # A user's table: the step size chosen from its training rows (slate.training.lr_choice),
    # and 5000 iterations; docs/data.md measures both on three public tables against the
    # paper's 0.01 and 2000.
    "csv": {"model": "mlp", "lr": "auto", "iterations": 5000},
}

#: The public range of every LIBSVM feature value under ``--dp-epsilon`` when ``--feature-range``
#: is not given: svm-scale's default output range, which also holds 0/1 features (w7a, a9a).
#: Every site declares it in place of its own smallest and largest values, and clips a cell
#: outside it (slate.data.parts.PartReader; docs/privacy.md, "What a site sends at set-up").
DP_FEATURE_RANGE = (-1.0, 1.0)

# Where the paper's SLATE-M or CODA runs differ from the dataset's SLATE run.
ALGORITHM_DEFAULTS: dict[tuple[str, str], dict[str, Any]] = {
    ("cifar10", "slate-m"): {"positives": 25},
}

# The generic defaults of the flags that are no algorithm's or operator's parameter (those take
# their dataclass's default: slate.algorithms.parameter_defaults).
_GENERIC_DEFAULTS: dict[str, Any] = {
    "iterations": 2000,
    "batch_size": 20,
    "positives": 2,
    "lr": 0.01,
    "nodes": 20,
    "model": "mlp",
    "hidden": 28,
}


@dataclass
class TrainConfig:
    """Everything that determines a run. ``None`` means "take the dataset's default".

    The fields from ``margin`` to ``coda_objective`` hold the algorithms' parameters as flags
    (their types, defaults and help are their dataclasses', :mod:`slate.algorithms`); each is
    ``None`` until resolved.
    """

    dataset: str = per_site("digits")
    data_dir: str | None = per_site(None)
    train: str | None = per_site(None)
    test: str | None = per_site(None)
    label_column: str | None = per_site(None)
    positive_label: str | None = per_site(None)
    n_features: int | None = per_site(None)
    feature_range: tuple[float, float] | None = agreed(None)  # libsvm: the public value range
    party_files: bool = per_site(False)
    standardize: bool | None = agreed(None)
    id_columns: tuple[str, ...] = per_site(())
    drop_columns: tuple[str, ...] = per_site(())
    feature_columns: tuple[str, ...] = per_site(())
    categorical_columns: tuple[str, ...] = per_site(())
    na_values: tuple[str, ...] = per_site(())
    missing: str = per_site("impute")
    schema: str | None = per_site(None)  # its path; its sha256 is agreed (training.agreement)
    max_categories: int | None = agreed(50)
    min_frequency: int = agreed(1)
    validation_fraction: float | None = agreed(None)
    early_stopping: int | None = agreed(None)
    delimiter: str | None = per_site(None)
    encoding: str = per_site("utf-8")
    zero_based: bool = per_site(False)
    test_fraction: float = per_site(0.25)
    split_seed: int = per_site(0)
    download: bool = per_site(False)
    algorithm: str = agreed("slate")
    nodes: int | None = agreed(None)
    topology: str = agreed("ring")
    fed_period: int = agreed(10)
    iterations: int | None = agreed(None)
    batch_size: int | None = agreed(None)
    positives: int | None = agreed(None)
    lr: float | str | None = agreed(None)  # a number, or "auto" (slate.training.lr_choice)
    margin: float | None = agreed(None)
    gradient_tracking: bool = agreed(False)
    alpha: float | None = agreed(None)
    initial_batch: int | None = agreed(None)
    momentum: str | None = agreed(None)
    lr_dual: float | None = agreed(None)
    coda_objective: str | None = agreed(None)
    gossip_every: int = agreed(1)
    compress: str = agreed("none")
    consensus_step: str | float | None = agreed(None)
    wan: str | None = per_site(None)
    partition: str = agreed("stratified")
    dirichlet_alpha: float = agreed(0.5)
    model: str | None = agreed(None)
    hidden: int | None = agreed(None)
    eval_every: int | None = agreed(None)
    checkpoint_every: int | None = agreed(None)
    seed: int = agreed(0)
    out: str | None = per_site(None)
    device: str = per_site("cpu")
    threads: int | None = per_site(None)
    compile: str = agreed("auto")
    party_ap: bool | None = agreed(None)
    on_party_loss: str | None = agreed(None)
    drop_party: tuple[str, ...] = per_site(())
    robust: str = agreed("none")
    dp_epsilon: float | None = agreed(None)
    dp_delta: float = agreed(1e-5)
    dp_clip: float = agreed(1.0)
    dp_groups: int = agreed(8)
    log_level: str = per_site("info")  # run.log's threshold (slate.training.reporting)
    tensorboard: str | None = per_site(None)  # a SummaryWriter's folder for the scalars
    final_check_bounds: str | None = per_site(None)  # slate.training.final_measures.Bounds
    declared_bounds: str | None = per_site(None)  # slate.data.plausible.SetupBounds
    job_sha256: str | None = agreed(None)  # the --job file's digest (slate.cli.job_file)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        if values["robust"] == "none":  # recorded only when set: older outputs stay the same
            del values["robust"]
        if values["schema"] is None:  # likewise
            del values["schema"]
        if values["feature_range"] is None:  # likewise
            del values["feature_range"]
        if values["dp_epsilon"] is None:  # likewise the privacy flags (docs/privacy.md)
            for key in ("dp_epsilon", "dp_delta", "dp_clip", "dp_groups"):
                del values[key]
        if values["log_level"] == "info":  # likewise what a run reports as it goes
            del values["log_level"]
        if values["tensorboard"] is None:
            del values["tensorboard"]
        if values["final_check_bounds"] is None:
            del values["final_check_bounds"]
        if values["declared_bounds"] is None:
            del values["declared_bounds"]
        if values["job_sha256"] is None:  # recorded for a run started with --job only
            del values["job_sha256"]
        return values


def default_checkpoint_every(iterations: int, gossip_every: int = 1) -> int:
    """``--checkpoint-every``'s default: :math:`T/10`, rounded up to a whole number of gossip
    rounds (``--gossip-every`` :math:`H`), at least one round. At each checkpoint the parties
    agree on the stop and join flags, which the gossip rounds before it carry
    (:mod:`slate.communication.flag_flood`); a checkpoint between two gossip rounds would cost
    an exchange of its own."""
    tenth = max(1, iterations // 10)
    return gossip_every * max(1, -(-tenth // gossip_every))


def resolve_config(config: TrainConfig, parameters: Mapping[str, Any] | None = None) -> TrainConfig:
    """Fill every ``None`` field from the dataset's defaults, then the generic ones: those of
    :data:`_GENERIC_DEFAULTS`, and ``parameters`` (flag name -> default of the algorithms' and
    operators' parameter dataclasses; without it those flags keep what the dataset gives)."""
    defaults = {
        **(parameters or {}),
        **_GENERIC_DEFAULTS,
        **DATASET_DEFAULTS.get(config.dataset, {}),
        **ALGORITHM_DEFAULTS.get((config.dataset, config.algorithm), {}),
    }
    updates = {key: value for key, value in defaults.items() if getattr(config, key) is None}
    resolved = dataclasses.replace(config, **updates)
    if resolved.standardize is None:  # user tables arrive at raw scales; the paper's sets do not
        resolved.standardize = resolved.dataset == "csv"
    if resolved.dp_epsilon is not None and config.momentum is None:
        resolved.momentum = "ema"  # SLATE-M under --dp-epsilon: STORM is not accounted
    if resolved.dp_epsilon is not None and resolved.dataset == "libsvm":
        # a public range, never the rows' own minimum and maximum (docs/privacy.md)
        resolved.feature_range = tuple(resolved.feature_range or DP_FEATURE_RANGE)
    # eval_every and party_ap stay None here: their defaults depend on the test set's size,
    # which is known once the data is loaded (the run's plan, slate.training.plan).
    if resolved.checkpoint_every is None:
        resolved.checkpoint_every = default_checkpoint_every(
            resolved.iterations, resolved.gossip_every or 1
        )
    if resolved.on_party_loss is None:  # docs/reliability.md: why continue, and why not on CUDA
        resolved.on_party_loss = "stop" if resolved.device.startswith("cuda") else "continue"
    return resolved
