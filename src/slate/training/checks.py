"""A run's flags checked, and the settings derived from them, before anything is built.

:func:`check_config` checks every flag that can be checked without data; it runs once, in
:func:`slate.training.configuration.resolve_and_check`. The derived settings: the device, whether
to compile, the evaluation interval and whether to score each party's own model (filled by the
run's plan, :mod:`slate.training.plan`), the algorithm's config and parameters.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import torch

from slate.algorithms import AlgorithmConfig, configure, parameter_fields
from slate.communication.gossip import check_gossip_flags
from slate.config import TrainConfig
from slate.data.dictionary import read_dictionary
from slate.data.sampler import validate_batch_shape
from slate.errors import ConfigError
from slate.security.guards import check_robust

__all__ = [
    "COMPILE_CHOICES",
    "EVALUATION_BUDGET",
    "PARTY_LOSS_CHOICES",
    "algorithm_config",
    "algorithm_params",
    "check_config",
    "check_out_dir",
    "compressed",
    "default_threads",
    "evaluation_cost",
    "evaluation_count",
    "parse_drops",
    "resolve_device",
    "should_compile",
    "step_work",
    "with_evaluation_defaults",
    "with_thread_default",
]

EVALUATION_BUDGET = 0.1  # default evaluations cost at most this share of the training work
#: ``--threads``' default: one thread when a step's work (:func:`step_work`) is below this,
#: torch's own count (one per core) from here on; measured in docs/engines.md ("Threads").
SMALL_STEP_WORK = 10_000_000


def resolve_device(name: str) -> torch.device:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:K``; CUDA must be present."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"--device {name!r} is not a device name (use cpu or cuda).") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"--device {name} was asked for, but this machine has no CUDA device that torch "
            f"{torch.__version__} can use. Run with --device cpu."
        )
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name!r} is not supported; use cpu or cuda.")
    return device


COMPILE_CHOICES = ("auto", "on", "off")
COMPILE_MAX_PARAMETERS = 100_000  # "auto" compiles small models, whose steps are overhead-bound
COMPILE_MIN_ITERATIONS = 20_000  # ... in runs long enough to repay even a cold compilation


def should_compile(
    choice: str, iterations: int, one_process: bool, device: torch.device, model: torch.nn.Module
) -> bool:
    """Whether to ``torch.compile`` the parties' gradient (``--compile auto|on|off``: ``choice``)
    in a run of ``iterations``.

    ``auto`` compiles where it was measured faster (``benchmarks/RESULTS.md``): one process
    running every party (``one_process``: the simulator) on CPU, a model of at most
    ``COMPILE_MAX_PARAMETERS`` parameters (the w8a MLP's steps: 0.28 ms against 0.95 ms; the
    MNIST CNN, compute-bound, gains about 1.3x for a 9 s compilation) and at least
    ``COMPILE_MIN_ITERATIONS`` iterations: compiling costs about 9 s with a cold inductor
    cache and 2.6 s with a warm one, so the paper's 10 000-iteration w8a run is 3 s slower
    compiled on a fresh machine and 3 s faster afterwards. Distributed processes stay eager: N
    compilations at once would share the same cores.
    """
    if choice == "on":
        return True
    if choice == "off":
        return False
    n_parameters = sum(p.numel() for p in model.parameters())
    return (
        one_process
        and device.type == "cpu"
        and n_parameters <= COMPILE_MAX_PARAMETERS
        and iterations >= COMPILE_MIN_ITERATIONS
    )


def evaluation_cost(config: TrainConfig, n_test: int) -> float:
    """One evaluation of one model on the test set, in iterations' worth of training work.

    An iteration runs a forward and a backward pass (about three forward passes' work) on the
    N m samples of all parties; an evaluation runs a forward pass on the ``n_test`` test rows.
    """
    return n_test / (3 * config.nodes * config.batch_size)


def evaluation_count(iterations: int, eval_every: int) -> int:
    """History rows of a run: iteration 0, every multiple of ``eval_every``, and the last one."""
    return 1 + math.ceil(iterations / eval_every)


def with_evaluation_defaults(
    config: TrainConfig, n_test: int, party_ap_possible: bool = True
) -> TrainConfig:
    """Fill ``eval_every`` and ``party_ap`` so that evaluation costs at most ~10% of training.

    ``eval_every`` defaults to T/20, or to the smallest interval whose evaluations of the averaged
    model (:func:`evaluation_count` of them) cost at most ``EVALUATION_BUDGET`` of the training
    work: MNIST's 10 000 test images against 300 iterations of 20 x 20 images give every 150.
    ``party_ap`` (the AP of each party's own final model: N more evaluations) defaults to on
    where those, added to the periodic ones, still fit in the budget, and in every compressed
    run (``--compress`` other than ``none``), whatever they cost: compressed gossip can leave
    the parties far apart behind a good average (:mod:`slate.metrics.divergence`), and their own APs
    are what shows it. An explicit ``--party-ap`` / ``--no-party-ap`` wins; it is off where no
    process holds the whole test set (per-party files).
    """
    iterations, cost = config.iterations, evaluation_cost(config, n_test)
    affordable = EVALUATION_BUDGET * iterations / cost  # evaluations the budget pays for
    every = config.eval_every
    if every is None:
        periodic = math.floor(affordable) - 1  # multiples of eval_every, the final one included
        every = iterations if periodic < 1 else math.ceil(iterations / periodic)
        every = min(iterations, max(1, iterations // 20, every))
    party_ap = config.party_ap if party_ap_possible else False
    if party_ap is None:
        party_ap = compressed(config) or (
            evaluation_count(iterations, every) + config.nodes <= affordable
        )
    return dataclasses.replace(config, eval_every=every, party_ap=party_ap)


def step_work(parameters: int, parties: int, batch_size: int) -> int:
    """One training step's work, as ``--threads``' default measures it: the model's parameters
    times this process's parties times the rows of each party's batch (m)."""
    return parameters * parties * batch_size


def default_threads(parameters: int, parties: int, batch_size: int) -> int:
    """``--threads``' default for a process that runs ``parties`` parties of a model of
    ``parameters`` parameters on batches of ``batch_size`` rows: 1 when the step's work
    (:func:`step_work`) is below :data:`SMALL_STEP_WORK`, where more threads cost more in
    start-up and waiting than they save (and far more on a busy machine), else the threads
    torch uses now (by default one per core)."""
    if step_work(parameters, parties, batch_size) < SMALL_STEP_WORK:
        return 1
    return torch.get_num_threads()


def with_thread_default(
    config: TrainConfig, input_shape: tuple[int, ...], parties: int
) -> TrainConfig:
    """``config`` with ``threads`` filled (:func:`default_threads`) when it was not given:
    the count of the model's parameters, built without memory on the meta device, for inputs
    of ``input_shape``. An explicit ``--threads`` is kept. Threads change the speed only."""
    if config.threads is not None:
        return config
    from slate.models import build_model  # the models import nothing from here; kept local

    with torch.device("meta"):
        model = build_model(config.model, input_shape, hidden=config.hidden, seed=config.seed)
    parameters = sum(p.numel() for p in model.parameters())
    threads = default_threads(parameters, parties, config.batch_size)
    return dataclasses.replace(config, threads=threads)


def compressed(config: TrainConfig) -> bool:
    """Whether the run gossips through a compressor (``--compress`` other than ``none``)."""
    return str(config.compress or "none").strip().lower() != "none"


def check_config(config: TrainConfig, given: TrainConfig | None = None) -> None:
    """Every flag of a resolved config that can be checked without data (``given``: the flags
    as the user gave them, before the defaults)."""
    validate_batch_shape(config.batch_size, config.positives)
    if isinstance(config.lr, str) and config.lr != "auto":  # a number is checked by the rule
        raise ConfigError(f"--lr must be a number or 'auto', got {config.lr!r}.")
    if config.iterations < 1:
        raise ConfigError(f"--iterations must be at least 1, got {config.iterations}.")
    if config.compile not in COMPILE_CHOICES:
        raise ConfigError(
            f"--compile must be one of {', '.join(COMPILE_CHOICES)}, got {config.compile!r}."
        )
    if config.eval_every is not None and config.eval_every < 1:
        raise ConfigError(f"--eval-every must be at least 1, got {config.eval_every}.")
    if config.nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, got {config.nodes}.")
    if config.hidden < 1:
        raise ConfigError(f"--hidden must be at least 1, got {config.hidden}.")
    if config.threads is not None and config.threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {config.threads}.")
    if config.out is not None:
        check_out_dir(config.out)
    _check_party_loss(config)
    check_gossip_flags(config)
    check_robust(config.robust)
    _check_validation(config)
    _check_positive_label(config)
    check_feature_range(config)
    check_privacy(config, given)


def check_privacy(config: TrainConfig, given: TrainConfig | None = None) -> None:
    """``--dp-epsilon``'s values, and what it refuses: every choice made on the private rows
    that the accountant does not count (docs/privacy.md, "Refused under --dp-epsilon"), all
    named in one message. ``given``: the flags as the user gave them, so that a default that
    cannot run privately (a table's ``--lr auto``) gives way instead (:mod:`.lr_choice`)."""
    epsilon = config.dp_epsilon
    if epsilon is None:
        return
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ConfigError(f"--dp-epsilon must be a positive number, got {epsilon!r}.")
    if not 0 < config.dp_delta < 1:
        raise ConfigError(f"--dp-delta must lie strictly between 0 and 1, got {config.dp_delta}.")
    if not (config.dp_clip > 0 and math.isfinite(config.dp_clip)):
        raise ConfigError(f"--dp-clip must be a positive number, got {config.dp_clip!r}.")
    if config.dp_groups < 1:
        raise ConfigError(f"--dp-groups must be at least 1, got {config.dp_groups}.")
    refused = privacy_refusals(config, given or config)
    if len(refused) == 1:
        raise ConfigError(f"Refused under --dp-epsilon {epsilon:g}: {refused[0]}")
    if refused:
        listed = " ".join(f"({k}) {why}" for k, why in enumerate(refused, 1))
        raise ConfigError(
            f"Refused under --dp-epsilon {epsilon:g}, for {len(refused)} reasons: {listed}"
        )


def privacy_refusals(config: TrainConfig, given: TrainConfig) -> list[str]:
    """Why ``config`` cannot run under ``--dp-epsilon``, one sentence per flag or file."""
    table = config.dataset == "csv" and (config.train is not None or bool(config.party_files))
    refusals = [
        (
            given.lr == "auto",
            "--lr auto chooses the step size from short runs on the private rows, which "
            "--dp-epsilon does not account. Give the step size with --lr (chosen on public "
            "data), or leave --lr out for the public default.",
        ),
        (
            config.early_stopping is not None,
            "--early-stopping chooses the kept model by its AP on private validation rows, "
            "which --dp-epsilon does not account. Drop --early-stopping.",
        ),
        (
            bool(config.standardize) and config.dataset != "csv",
            "--standardize computes means and standard deviations from the private rows, which "
            "--dp-epsilon does not account. Scale the features with public or declared "
            "statistics beforehand and pass --no-standardize.",
        ),
        (
            table and config.schema is None,
            "--dataset csv without --schema fits its table encoding (imputed values, category "
            "vocabularies, scales) on the private rows, which --dp-epsilon does not account. "
            "Declare the table in a schema file every site holds (--schema FILE; 'slate "
            'schema\' writes one), with each numeric column\'s public "range" (or "mean" '
            'and "std") and each text column\'s categories.',
        ),
        (
            config.algorithm == "slate-m" and config.momentum == "storm",
            "--momentum storm needs its gradient difference privatised, with noise about 5x "
            "larger at alpha 0.1; it is not accounted under --dp-epsilon. Use --momentum ema "
            "(the default under --dp-epsilon).",
        ),
    ]
    found = [why for refused, why in refusals if refused]
    if table and config.schema is not None:
        found += _schema_refusals(config)
    return found


def _schema_refusals(config: TrainConfig) -> list[str]:
    """The numeric feature columns of ``--schema`` that have no public constants to be imputed
    and scaled with under ``--dp-epsilon``."""
    dictionary = read_dictionary(config.schema)
    skipped = {*config.id_columns, *config.drop_columns}
    features = [n for n in dictionary.names if n not in skipped
                and (not config.feature_columns or n in config.feature_columns)]  # fmt: skip
    bare = dictionary.without_public_constants(features)
    if not bare:
        return []
    return [
        f'the schema {config.schema} declares neither "range" nor "mean" and "std" for '
        f"the numeric column{'s' if len(bare) != 1 else ''} {', '.join(map(repr, bare))}, so "
        "their missing cells and scale would come from the private rows. Declare a public "
        '"range": [lo, hi] (or "mean" and "std") for each in the file every site holds.'
    ]


def check_feature_range(config: TrainConfig) -> None:
    """``--feature-range LO HI``: LIBSVM only, two finite numbers with ``LO <= 0 <= HI`` and
    ``LO < HI`` (a missing feature is a zero, so zero must lie in the range)."""
    span = config.feature_range
    if span is None:
        return
    if config.dataset != "libsvm":
        raise ConfigError(
            f"--feature-range gives the public range of LIBSVM feature values; --dataset "
            f"{config.dataset} does not take it. A table's ranges are declared per column in "
            'its --schema file ("range": [lo, hi]; docs/data.md).'
        )
    if len(span) != 2:
        raise ConfigError(f"--feature-range takes two numbers, LO and HI; got {list(span)}.")
    lo, hi = (float(v) for v in span)
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo <= 0.0 <= hi or lo == hi:
        raise ConfigError(
            f"--feature-range {lo:g} {hi:g} is not a usable range: LO and HI must be finite, "
            "LO < HI, and zero must lie between them (a feature a LIBSVM row leaves out is a "
            "zero). For features scaled to [0, 1] give 0 1; for svm-scale's default, -1 1."
        )


def _check_positive_label(config: TrainConfig) -> None:
    """``--positive-label``: a column value for csv, -1/0/+1 for libsvm, and nothing for the
    named datasets, whose positive class is fixed (it used to be ignored there)."""
    if config.positive_label is None or config.dataset == "csv":
        return
    if config.dataset == "libsvm":
        from slate.data.readers.libsvm import positive_value

        positive_value(config.positive_label)
        return
    raise ConfigError(
        f"--positive-label applies to --dataset csv and libsvm; --dataset {config.dataset} has "
        "a fixed positive class (docs/data.md)."
    )


def _check_validation(config: TrainConfig) -> None:
    """``--validation-fraction`` in (0, 1); ``--early-stopping`` at least 1, and only with it."""
    fraction = config.validation_fraction
    if fraction is not None and not 0 < fraction < 1:
        raise ConfigError(
            f"--validation-fraction must lie strictly between 0 and 1, got {fraction}."
        )
    if config.early_stopping is not None:
        if fraction is None:
            raise ConfigError(
                "--early-stopping needs --validation-fraction F: stopping on the test AP would "
                "choose the model by its test score."
            )
        if config.early_stopping < 1:
            raise ConfigError(
                f"--early-stopping must be at least 1 evaluation, got {config.early_stopping}."
            )


PARTY_LOSS_CHOICES = ("continue", "stop")


def _check_party_loss(config: TrainConfig) -> None:
    if config.on_party_loss not in (None, *PARTY_LOSS_CHOICES):
        raise ConfigError(
            f"--on-party-loss must be continue or stop, got {config.on_party_loss!r}."
        )
    if config.on_party_loss == "continue" and config.device.startswith("cuda"):
        raise ConfigError(
            "--on-party-loss continue needs the gloo backend (CPU tensors): nccl cannot abandon "
            "a collective with a dead peer without aborting the process. Use --on-party-loss "
            "stop with --device cuda, or --device cpu (docs/reliability.md)."
        )


def check_out_dir(out: str) -> None:
    """``--out`` must be a folder that can be created (and written) before any data is read."""
    path = Path(out.replace("{rank}", "0"))
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {out} exists and is a file; give a folder.")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(
            f"--out {out} cannot be created: {ancestor} is a file, not a folder. Give a folder "
            "path."
        )
    if not os.access(ancestor, os.W_OK):
        raise ConfigError(f"--out {out} cannot be created: {ancestor} is not writable.")


def _algorithm_values(config: TrainConfig) -> dict[str, object]:
    """The algorithm flags of resolved ``config`` by name, and the sampler's positive rate."""
    values = {p.dest: getattr(config, p.dest) for p in parameter_fields()}
    return {
        **values,
        "lr": config.lr,
        "sampled_positive_rate": config.positives / config.batch_size,
    }


def algorithm_config(config: TrainConfig) -> AlgorithmConfig:
    """The hyperparameters the algorithms share, from resolved ``config`` (``lr`` as resolved:
    a number, or ``"auto"`` until the plan chooses it)."""
    return configure(config.algorithm, **_algorithm_values(config))[0]


def algorithm_params(config: TrainConfig) -> object:
    """``--algorithm``'s own parameter dataclass, from resolved ``config``'s flags."""
    return configure(config.algorithm, **_algorithm_values(config))[1]


def parse_drops(values: tuple[str, ...], nodes: int, iterations: int) -> dict[int, list[int]]:
    """``--drop-party RANK@ITER`` values to ``{iteration: [ranks]}``, checked: the simulator's
    schedule of injected party losses (:class:`slate.training.recovery.PartySet`).

    A party dropped at ``ITER`` takes part in iterations ``0 .. ITER-1``; the others switch to
    the surviving graph before step ``ITER``.
    """
    drops: dict[int, list[int]] = {}
    seen: set[int] = set()
    for text in values:
        rank_text, sep, at_text = text.partition("@")
        if not sep or not rank_text.strip().isdigit() or not at_text.strip().isdigit():
            raise ConfigError(
                f"--drop-party {text!r} is not RANK@ITER (for example 2@800: party 2 leaves "
                "before iteration 800)."
            )
        rank, at = int(rank_text), int(at_text)
        if rank >= nodes:
            raise ConfigError(f"--drop-party {text}: rank {rank} is not one of 0..{nodes - 1}.")
        if not 0 < at < iterations:
            raise ConfigError(
                f"--drop-party {text}: the iteration must lie in 1..{iterations - 1} "
                f"(--iterations {iterations})."
            )
        if rank in seen:
            raise ConfigError(f"--drop-party names party {rank} twice.")
        seen.add(rank)
        drops.setdefault(at, []).append(rank)
    if len(seen) >= nodes:
        raise ConfigError(f"--drop-party drops all {nodes} parties; at least one must remain.")
    return {at: sorted(ranks) for at, ranks in sorted(drops.items())}
