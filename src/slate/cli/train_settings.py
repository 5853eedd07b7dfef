"""Every setting of ``slate train``, declared once.

Each :class:`TrainSetting` names a flag (or none), its TOML key (the field name, ``dest``), type,
default, help, metavar, choices, action and argparse group. A setting that is a field of
:class:`~slate.config.TrainConfig` takes its default and its classification (must every site
hold the same value?) from the field (:func:`~slate.config.agreed`,
:func:`~slate.config.per_site`); the others (``--rank``, ``--key``, ``--job``, ...) are declared
per-site here. The ``slate train`` parser (:mod:`slate.cli.train_flags`) and the job file
(:mod:`slate.cli.job_file`) are both built from :func:`train_settings`.

The algorithms' parameters (``--margin`` ... ``--coda-objective``) are declared by their
dataclasses (:func:`slate.algorithms.parameter_fields`) and take their place at
:data:`PARAMETERS`; ``--compress``'s help is the compression operators'
(:func:`slate.communication.compression.compress_help`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slate.config import TrainConfig, must_agree

__all__ = [
    "PARAMETERS",
    "SETTINGS",
    "TrainSetting",
    "comma_items",
    "lr_value",
    "train_settings",
]

#: A setting's default when it is the :class:`TrainConfig` field's (or None for another flag).
FIELD_DEFAULT: Any = type("FieldDefault", (), {"__repr__": lambda self: "FIELD_DEFAULT"})()

DATA = "data"
TABLE = "tables (--dataset csv)"
ALGO = "algorithm (unset values take the paper's per-dataset defaults)"
TALK = "communication (defaults: the paper's protocol; docs/communication.md)"
PRIVATE = "differential privacy per site (docs/privacy.md)"
RUN = "run"


def comma_items(values: list[str] | None) -> tuple[str, ...]:
    """A repeatable comma-list flag's values, flattened and stripped."""
    items = [item.strip() for value in values or () for item in value.split(",")]
    return tuple(item for item in items if item)


def lr_value(text: str) -> float | str:
    """``--lr``: a number, or ``auto`` (:mod:`slate.training.lr_choice`)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or 'auto': {text!r}") from None


@dataclass(frozen=True)
class TrainSetting:
    """One setting: ``dest`` is its TOML key and parsed name; ``flags`` its option strings
    (None: ``--dest-with-dashes``; empty: no flag); ``group`` its ``--help`` section; ``agree``
    None for a :class:`TrainConfig` field (the field's classification). ``help`` and
    ``choices`` may be callables, evaluated when the parser is built."""

    dest: str
    group: str | None
    help: str | Callable[[], str] | None = None
    flags: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None
    default: Any = FIELD_DEFAULT
    choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None
    metavar: str | tuple[str, ...] | None = None
    action: Any = None
    nargs: int | None = None
    agree: bool | None = None

    @property
    def option_strings(self) -> tuple[str, ...]:
        return ("--" + self.dest.replace("_", "-"),) if self.flags is None else self.flags

    @property
    def is_field(self) -> bool:
        """Whether the setting is a field of :class:`TrainConfig`."""
        return self.dest in TrainConfig.__dataclass_fields__

    @property
    def agreed(self) -> bool:
        """Whether every site must hold the same value."""
        if self.agree is not None:
            return self.agree
        return must_agree(TrainConfig.__dataclass_fields__[self.dest])

    def resolved(self) -> TrainSetting:
        """The setting with its callables evaluated and its default filled in: the field's
        (None for a repeatable flag, False for a switch), else None."""
        default = self.default
        if default is FIELD_DEFAULT:
            field = TrainConfig.__dataclass_fields__.get(self.dest)
            default = None if field is None or self.action == "append" else field.default
            if self.action == "store_true":
                default = False
        return dataclasses.replace(
            self,
            help=self.help() if callable(self.help) else self.help,
            choices=self.choices() if callable(self.choices) else self.choices,
            default=default,
        )

    def argparse_options(self) -> dict[str, Any]:
        """``add_argument``'s keyword arguments."""
        options: dict[str, Any] = {"dest": self.dest, "default": self.default, "help": self.help}
        for name in ("type", "choices", "metavar", "action", "nargs"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        return options


#: Where the algorithms' parameter flags go, in :data:`SETTINGS`.
PARAMETERS = TrainSetting("<algorithm parameters>", ALGO, agree=True)


def _algorithms() -> tuple[str, ...]:
    from slate.algorithms import ALGORITHMS

    return tuple(sorted(ALGORITHMS))


def _partitions() -> tuple[str, ...]:
    from slate.data.partition import PARTITIONS

    return tuple(PARTITIONS)


def _guards() -> tuple[str, ...]:
    from slate.security.guards import GUARDS

    return tuple(GUARDS)


def _compress_help() -> str:
    from slate.communication.compression import compress_help

    return compress_help()


def _columns(dest: str, flag: str, text: str) -> TrainSetting:
    """A repeatable comma-list column flag of a table."""
    return TrainSetting(dest, TABLE, text, flags=(flag,), action="append", metavar="A,B")


def _checked_bounds(text: str) -> str:
    """``--final-check-bounds``, checked (:class:`slate.training.final_measures.Bounds`)."""
    from slate.training.final_measures import bounds_text

    return bounds_text(text)


def _checked_declared(text: str) -> str:
    """``--declared-bounds``, checked (:class:`slate.data.plausible.SetupBounds`)."""
    from slate.data.plausible import bounds_text

    return bounds_text(text)


def _field(dest: str, group: str | None, text: str | None = None, **options: Any) -> TrainSetting:
    """A :class:`TrainConfig` field's setting (its default and classification: the field's)."""
    return TrainSetting(dest, group, text, **options)


def _site(dest: str, group: str | None, text: str | None = None, **options: Any) -> TrainSetting:
    """A flag that is no :class:`TrainConfig` field: each site's own."""
    return TrainSetting(dest, group, text, agree=False, **options)


TOPOLOGIES = (
    "ring, full, federated, star, torus, exponential, erdos-renyi, one-peer-exponential (N a "
    "power of 2), base-K (K >= 2, e.g. base-2), file:PATH"
)

SETTINGS: tuple[TrainSetting, ...] = (
    _field("dataset", DATA, "digits (default, ships with scikit-learn), w7a, w8a, mnist, "
            "fashion-mnist, cifar10, tiny-imagenet, libsvm or csv"),
    _field("data_dir", DATA, "folder laid out as DIR/w7a/w7a.gz, DIR/w8a/w8a.gz, ..."),
    _field("download", DATA, "fetch missing w7a, w8a, mnist, fashion-mnist or cifar10 files "
            "from their official sites (hash-checked where a hash is published)",
            action="store_true"),
    _field("train", DATA, "training file for --dataset libsvm or csv; {rank} in it gives each "
            "party its own file (party n reads the path with n put in)"),
    _field("test", DATA, "test file for --dataset libsvm or csv ({rank} as for --train); "
            "without it, each file holds out a seeded stratified --test-fraction"),
    _field("party_files", DATA, "each party reads the --train/--test on its own command line "
            "(implied by {rank} in a path and by --rank); parties agree on the schema before "
            "training, and the test metrics are federated", action="store_true"),
    _field("standardize", DATA, "z-score the numeric features with the mean and std of all "
            "parties' training rows (federated sums with per-party files; saved with the "
            "model). Default: on for --dataset csv, off otherwise (the paper's datasets are used "
            "as they are)", action=argparse.BooleanOptionalAction),
    _columns("id_columns", "--id-column", "an ID column: never a feature, carried into "
             "predictions (repeatable, or a comma list)"),
    _columns("drop_columns", "--drop-columns", "columns that are not features (comma list, "
             "repeatable)"),
    _columns("feature_columns", "--feature-columns", "use only these columns as features "
             "(comma list, repeatable)"),
    _columns("categorical_columns", "--categorical-columns", "one-hot encode these columns "
             "even if they hold numbers (codes 1/2/3); text columns are one-hot encoded anyway"),
    _columns("na_values", "--na-values", "more cell values that mean 'missing' (comma list); "
             "always missing: empty, NA, N/A, NaN, ?, null"),
    _field("missing", TABLE, "missing cells: impute (numeric: the training mean, plus an "
            "indicator column where at least 1%% are missing; text: a 'missing' category), or "
            "error (refuse the file)", choices=("impute", "error")),
    _field("delimiter", TABLE, "cell separator, or 'whitespace' for runs of spaces and tabs "
            "(UCI style); default: detected from the header: , ; or tab"),
    _field("schema", TABLE, "a declared data dictionary every site holds (JSON: columns, "
            "kinds, categories, optional means and stds, the label; docs/data.md; 'slate "
            "schema' writes one): the one-hot columns come from it and no category is gathered "
            "from the sites; a value it does not list goes to <other> with a warning. Every "
            "site's file must be the same (its sha256 is compared before step 1)",
            metavar="FILE"),
    _field("max_categories", TABLE, "at most this many one-hot columns per text column, "
            "<other> included; the most frequent values keep their own column (0: no limit; "
            "default 50)", type=int),
    _field("min_frequency", TABLE, "a text value seen in fewer training rows goes to <other> "
            "(default 1)", type=int),
    _field("encoding", TABLE, "text encoding (e.g. latin-1)"),
    _field("zero_based", TABLE, "libsvm: feature indices start at 0", action="store_true"),
    _field("label_column", DATA, "csv: the label column (name or 0-based index)"),
    _field("positive_label", DATA, "csv: the label value of the positive class; libsvm: -1 "
            "(or 0) to make that class positive (default +1)"),
    _field("n_features", DATA, "libsvm: number of features (default: the largest index over "
            "all files, and over all parties' files with per-party files)",
            flags=("--n-features", "--features"), type=int),
    _field("feature_range", DATA, "libsvm: the public range of every feature value (LO <= 0 "
            "<= HI; the same at every site): each site declares it in place of its rows' own "
            "smallest and largest values, and clips a value outside it into it, saying so in "
            "its own output only (default: none, each site declares its own range; under "
            "--dp-epsilon -1 1; docs/privacy.md)", nargs=2, type=float, metavar=("LO", "HI")),
    _field("test_fraction", DATA, "test share of the seeded stratified split when there is no "
            "test file", type=float),
    _field("validation_fraction", DATA, "hold out this stratified share of the training rows "
            "(of each party's, with per-party files) as validation rows: the evaluations "
            "(history.csv) score them, and the test rows are read and scored once, at the end",
            type=float),
    _field("early_stopping", DATA, "with --validation-fraction: keep the model of the best "
            "validation AP, and stop after PATIENCE evaluations (--eval-every) without a "
            "better one", type=int, metavar="PATIENCE"),
    _field("partition", DATA, choices=_partitions),
    _field("dirichlet_alpha", DATA, "concentration of --partition dirichlet (smaller = more "
            "skewed)", type=float),
    _field("split_seed", None, flags=()),  # the seed of the held-out test split: no flag
    _field("algorithm", ALGO, choices=_algorithms),
    _field("nodes", ALGO, "number of parties N", type=int),
    _field("topology", ALGO, TOPOLOGIES),
    _field("fed_period", ALGO, "federated topology: average every q iterations", type=int),
    _field("iterations", ALGO, "T (default: 5000 for --dataset csv, else the dataset's)",
            type=int),
    _field("batch_size", ALGO, "samples per party per step (m)", type=int),
    _field("positives", ALGO, "positives among them (b)", type=int),
    _field("lr", ALGO, "step size eta, or 'auto': the largest of 0.003, 0.01, 0.03, 0.1, 0.3 "
            "whose short run scores within 0.01 of the best AP on validation rows "
            "(--validation-fraction) or on 20%% of the training rows, never the test rows "
            "(docs/data.md). Default: auto for --dataset csv, the paper's value otherwise",
            type=lr_value),
    # The local launcher's choice of --lr auto, handed to its parties (not a user flag).
    _site("lr_choice", ALGO, argparse.SUPPRESS),
    PARAMETERS,  # --margin ... --coda-objective, from the algorithms' dataclasses
    _field("model", ALGO, "model name (default: the dataset's)"),
    _field("hidden", ALGO, "hidden width of the MLP (default 28)", type=int),
    _field("gossip_every", TALK, "local steps per gossip round: parties exchange only every "
            "H-th iteration", type=int, metavar="H"),
    _field("compress", TALK, _compress_help),
    _field("consensus_step", TALK, "CHOCO's consensus step gamma in (0, 1], or 'auto' to pick "
            "it by simulating gossip on this graph with SGD-like noise added every round "
            "(default: per compressor)", metavar="GAMMA"),
    _field("robust", TALK, "clip: each neighbour's difference clipped to twice this party's "
            "own recent step, non-finite messages dropped, a sender of messages over half a "
            "model away excluded (docs/security.md, a misbehaving participant)",
            choices=_guards),
    _field("wan", TALK, "estimate the wall time over a WAN link: compute + RTT per round + "
            "bytes/bandwidth", metavar="RTT_MS,MBIT_S"),
    _field("dp_epsilon", PRIVATE, "train with record-level (epsilon, delta) differential "
            "privacy per site against the other sites: Poisson sampling at public class rates, "
            "each group's gradient clipped, Gaussian noise calibrated by dp-accounting (PLD, "
            "replace-one row within its class) over every run the folder's append-only ledger "
            "records (E is their total); refuses --lr auto, --early-stopping, --standardize "
            "and CSV tables", type=float, metavar="E"),
    _field("dp_delta", PRIVATE, "delta of --dp-epsilon (default 1e-5)", type=float),
    _field("dp_clip", PRIVATE, "each group's gradient is clipped to this L2 norm (default 1; "
            "noise std 2 C z)", type=float, metavar="C"),
    _field("dp_groups", PRIVATE, "groups per step, each expecting b positives and m - b "
            "negatives, so that the sampling rates are q+ = G b / n+ and q- = G (m - b) / n- "
            "(default 8)", type=int, metavar="G"),
    _field("eval_every", RUN, "iterations between evaluations (default T/20, or rarer where "
            "evaluating the test set would cost over 10%% of the training work)", type=int),
    _field("seed", RUN, type=int),
    _field("out", RUN, "run folder (default: a fresh folder under runs/)"),
    _field("device", RUN, "cpu or cuda"),
    _field("threads", RUN, "torch CPU threads (default: 1 when the model's parameters x "
            "parties x m is below 10 million, e.g. any MLP of the paper's sets or a table, "
            "where more threads measured at most 13%% faster idle and 10-60x slower on a busy "
            "machine; else torch's count, one per core; the distributed engine: 1). Threads "
            "change the speed, never the numbers", type=int),
    _site("no_progress", RUN, "hide the progress bar", action="store_true", default=False),
    _site("no_plots", RUN, "write no PNG figures into the run folder (about 0.8 s of CPU per "
          "folder, most of it importing matplotlib); 'slate plot RUN' draws the same figures "
          "later", action="store_true", default=False),
    _field("log_level", RUN, "the least level of the lines of run.log, the run folder's log "
            "of events (start, evaluations, checkpoints, lost parties, stop, end); the console "
            "is the same at any level", choices=("debug", "info", "warning", "error")),
    _field("tensorboard", RUN, "write each evaluation's AP, training loss, bytes sent (and "
            "epsilon under --dp-epsilon) as TensorBoard scalars into DIR (needs: pip install "
            "'slate[tensorboard]')", metavar="DIR"),
    _field("final_check_bounds", RUN, "distributed: the bounds of the final check of the average "
            "against this site's own model on its own test rows, e.g. 'mean_logit=0.5,"
            "flagged_at_half=0.05' (names and defaults: docs/security.md)",
            type=_checked_bounds, metavar="NAME=V,..."),
    _field("declared_bounds", RUN, "distributed: the plausibility rules of every site's "
            "declared row counts and the clamp of the federated scaling by this site's own "
            "rows, e.g. 'test_ratio=3,share=10,rate=3,scale=20' (the defaults; "
            "docs/security.md)", type=_checked_declared, metavar="NAME=V,..."),
    _field("party_ap", RUN, "also report each party's own final test AP (N more "
            "evaluations; default: on when they cost under 10%% of the training work)",
            action=argparse.BooleanOptionalAction),
    _field("compile", RUN, "torch.compile the parties' forward and backward pass into one "
            "graph: faster steps after a one-off compilation of seconds, eager if it fails "
            "(default auto: on for the simulator on CPU with a model under 100k parameters "
            "and at least 20 000 iterations)", choices=("auto", "on", "off")),
    _field("checkpoint_every", RUN, "iterations between checkpoints (default T/10, rounded "
            "up to a multiple of --gossip-every)", type=int),
    _site("resume", RUN, "continue the run in DIR from its last checkpoint (only --iterations "
          "may change)", metavar="DIR"),
    _site("engine", RUN, "simulator (all parties in this process) or distributed (one process "
          "per party)", default="simulator", choices=("simulator", "distributed")),
    _site("timeout", RUN, "distributed: seconds before a silent party counts as lost (default "
          "60)", type=float, default=60.0),
    _site("rank", RUN, "run exactly one party, this one (0..N-1), and join the others at "
          "--rendezvous; implies --engine distributed and --party-files", type=int),
    _site("rendezvous", RUN, "with --rank: where the parties meet; party 0 listens there, the "
          "others connect (with --external-store, 'slate rendezvous' listens there instead)",
          metavar="HOST:PORT"),
    _site("external_store", RUN, "with --rank: the rendezvous store is hosted by 'slate "
          "rendezvous --port P', not by party 0, so that any party, party 0 included, can be "
          "lost without stopping the others", action="store_true", default=False),
    _site("roster", RUN, "with --rank: the run's roster ('slate roster'); only the sites on it "
          "take part, and every record in the rendezvous store is signed and checked (needs "
          "--key)", metavar="FILE"),
    _site("key", RUN, "with --roster: this site's private key ('slate keygen'; mode 0600)",
          metavar="FILE"),
    _field("on_party_loss", RUN, "distributed: when a party is lost, the others continue on "
            "the surviving graph (default on CPU) or all stop, naming it (default with "
            "--device cuda)", choices=("continue", "stop")),
    _field("drop_party", RUN, "simulator: party RANK leaves the run before iteration ITER, as "
            "a lost party would (repeatable)", action="append", metavar="RANK@ITER"),
    _site("job", RUN, "the job file of a multi-site run ('slate job init'): it holds every "
          "setting the sites must agree on, and the command line gives only this site's own "
          "(--rank, --key, --roster, --rendezvous, --train, --test, --out, ...)",
          metavar="FILE"),
    _field("job_sha256", None, flags=()),  # set from --job: the job file's digest
)  # fmt: skip


def _parameter_setting(parameter: Any) -> TrainSetting:
    """The :class:`TrainSetting` of an algorithm parameter: its dataclass field's ``help`` and
    ``choices`` and ``metavar``, a switch for a ``bool``, the type of a number, and the default
    of its :class:`TrainConfig` field (``None``: the dataset's, then the dataclass's)."""
    metadata = parameter.field.metadata
    field = TrainConfig.__dataclass_fields__.get(parameter.dest)
    default = None if field is None else field.default
    default = None if default is dataclasses.MISSING else default
    options: dict[str, Any] = {"flags": (parameter.flag,), "default": default}
    if parameter.kind is bool:
        options.update(action="store_true", default=bool(default))
    elif parameter.kind in (int, float):
        options["type"] = parameter.kind
    if parameter.kind is not bool and "choices" in metadata:
        options["choices"] = tuple(metadata["choices"])
    if parameter.kind is not bool and "metavar" in metadata:
        options["metavar"] = metadata["metavar"]
    return TrainSetting(parameter.dest, ALGO, metadata["help"], agree=must_agree(parameter.field),
                   **options)  # fmt: skip


def train_settings() -> list[TrainSetting]:
    """Every setting of ``slate train`` in ``--help``'s order, resolved (callables evaluated,
    defaults filled in), the algorithms' parameters in :data:`PARAMETERS`'s place."""
    from slate.algorithms import parameter_fields

    out: list[TrainSetting] = []
    for setting in SETTINGS:
        if setting is PARAMETERS:
            out.extend(_parameter_setting(p) for p in parameter_fields())
        else:
            out.append(setting.resolved())
    return out
