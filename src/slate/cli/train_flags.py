"""The flags of ``slate train`` and ``slate tune``.

The algorithms' parameters (``--margin`` ... ``--coda-objective``) are built from their
dataclasses (:func:`slate.algorithms.parameter_fields`), and ``--compress``'s help from the
compression operators' (:func:`slate.communication.compression.compress_help`): a new
parameter is declared once, in its algorithm's or operator's module.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from slate.config import TrainConfig

if TYPE_CHECKING:
    from slate.algorithms import ParameterField

__all__ = ["add_train_arguments", "comma_items", "lr_value"]


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


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``slate train`` (and ``slate tune``): data, tables, algorithm, communication
    and run groups."""
    from slate.algorithms import ALGORITHMS, parameter_fields
    from slate.communication.compression import compress_help
    from slate.data.partition import PARTITIONS
    from slate.security.guards import GUARDS

    data = p.add_argument_group("data")
    data.add_argument(
        "--dataset",
        default="digits",
        help="digits (default, ships with scikit-learn), w7a, w8a, mnist, fashion-mnist, "
        "cifar10, tiny-imagenet, libsvm or csv",
    )
    data.add_argument("--data-dir", help="folder laid out as DIR/w7a/w7a.gz, DIR/w8a/w8a.gz, ...")
    data.add_argument(
        "--download",
        action="store_true",
        help="fetch missing w7a, w8a, mnist, fashion-mnist or cifar10 files from their "
        "official sites (hash-checked where a hash is published)",
    )
    data.add_argument(
        "--train",
        help="training file for --dataset libsvm or csv; {rank} in it gives each party its own "
        "file (party n reads the path with n put in)",
    )
    data.add_argument(
        "--test",
        help="test file for --dataset libsvm or csv ({rank} as for --train); without it, each "
        "file holds out a seeded stratified --test-fraction",
    )
    data.add_argument(
        "--party-files",
        action="store_true",
        help="each party reads the --train/--test on its own command line (implied by {rank} "
        "in a path and by --rank); parties agree on the schema before training, and the test "
        "metrics are federated",
    )
    data.add_argument(
        "--standardize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="z-score the numeric features with the mean and std of all parties' training rows "
        "(federated sums with per-party files; saved with the model). Default: on for "
        "--dataset csv, off otherwise (the paper's datasets are used as they are)",
    )
    table = p.add_argument_group("tables (--dataset csv)")
    for flag, text in (
        ("--id-column", "an ID column: never a feature, carried into predictions (repeatable, "
                        "or a comma list)"),
        ("--drop-columns", "columns that are not features (comma list, repeatable)"),
        ("--feature-columns", "use only these columns as features (comma list, repeatable)"),
        ("--categorical-columns", "one-hot encode these columns even if they hold numbers "
                                  "(codes 1/2/3); text columns are one-hot encoded anyway"),
        ("--na-values", "more cell values that mean 'missing' (comma list); always missing: "
                        "empty, NA, N/A, NaN, ?, null"),
    ):  # fmt: skip
        dest = "id_columns" if flag == "--id-column" else None
        table.add_argument(
            flag, action="append", default=None, metavar="A,B", help=text,
            **({"dest": dest} if dest else {}),
        )  # fmt: skip
    table.add_argument(
        "--missing",
        default="impute",
        choices=("impute", "error"),
        help="missing cells: impute (numeric: the training mean, plus an indicator column where "
        "at least 1%% are missing; text: a 'missing' category), or error (refuse the file)",
    )
    table.add_argument(
        "--delimiter",
        help="cell separator, or 'whitespace' for runs of spaces and tabs (UCI style); "
        "default: detected from the header: , ; or tab",
    )
    table.add_argument(
        "--schema",
        metavar="FILE",
        help="a declared data dictionary every site holds (JSON: columns, kinds, categories, "
        "optional means and stds, the label; docs/data.md; 'slate schema' writes one): the "
        "one-hot columns come from it and no category is gathered from the sites; a value it "
        "does not list goes to <other> with a warning. Every site's file must be the same "
        "(its sha256 is compared before step 1)",
    )
    table.add_argument(
        "--max-categories",
        type=int,
        default=50,
        help="at most this many one-hot columns per text column, <other> included; the most "
        "frequent values keep their own column (0: no limit; default 50)",
    )
    table.add_argument(
        "--min-frequency",
        type=int,
        default=1,
        help="a text value seen in fewer training rows goes to <other> (default 1)",
    )
    table.add_argument("--encoding", default="utf-8", help="text encoding (e.g. latin-1)")
    table.add_argument(
        "--zero-based", action="store_true", help="libsvm: feature indices start at 0"
    )
    data.add_argument("--label-column", help="csv: the label column (name or 0-based index)")
    data.add_argument(
        "--positive-label",
        help="csv: the label value of the positive class; libsvm: -1 (or 0) to make that class "
        "positive (default +1)",
    )
    data.add_argument(
        "--n-features",
        "--features",
        dest="n_features",
        type=int,
        help="libsvm: number of features (default: the largest index over all files, and over "
        "all parties' files with per-party files)",
    )
    data.add_argument(
        "--feature-range",
        nargs=2,
        type=float,
        metavar=("LO", "HI"),
        help="libsvm: the public range of every feature value (LO <= 0 <= HI; the same at "
        "every site): each site declares it in place of its rows' own smallest and largest "
        "values, and clips a value outside it into it, saying so in its own output only "
        "(default: none, each site declares its own range; under --dp-epsilon -1 1; "
        "docs/privacy.md)",
    )
    data.add_argument(
        "--test-fraction",
        type=float,
        default=0.25,
        help="test share of the seeded stratified split when there is no test file",
    )
    data.add_argument(
        "--validation-fraction",
        type=float,
        help="hold out this stratified share of the training rows (of each party's, with "
        "per-party files) as validation rows: the evaluations (history.csv) score them, and "
        "the test rows are read and scored once, at the end",
    )
    data.add_argument(
        "--early-stopping",
        type=int,
        metavar="PATIENCE",
        help="with --validation-fraction: keep the model of the best validation AP, and stop "
        "after PATIENCE evaluations (--eval-every) without a better one",
    )
    data.add_argument("--partition", default="stratified", choices=PARTITIONS)
    data.add_argument(
        "--dirichlet-alpha",
        type=float,
        default=0.5,
        help="concentration of --partition dirichlet (smaller = more skewed)",
    )

    algo = p.add_argument_group("algorithm (unset values take the paper's per-dataset defaults)")
    algo.add_argument("--algorithm", default="slate", choices=sorted(ALGORITHMS))
    algo.add_argument("--nodes", type=int, help="number of parties N")
    algo.add_argument(
        "--topology",
        default="ring",
        help="ring, full, federated, star, torus, exponential, erdos-renyi, "
        "one-peer-exponential (N a power of 2), base-K (K >= 2, e.g. base-2), file:PATH",
    )
    algo.add_argument(
        "--fed-period", type=int, default=10, help="federated topology: average every q iterations"
    )
    algo.add_argument(
        "--iterations", type=int, help="T (default: 5000 for --dataset csv, else the dataset's)"
    )
    algo.add_argument("--batch-size", type=int, help="samples per party per step (m)")
    algo.add_argument("--positives", type=int, help="positives among them (b)")
    algo.add_argument(
        "--lr",
        type=lr_value,
        help="step size eta, or 'auto': the largest of 0.003, 0.01, 0.03, 0.1, 0.3 whose short "
        "run scores within 0.01 of the best AP on validation rows (--validation-fraction) or on "
        "20%% of the training rows, never the test rows (docs/data.md). Default: auto for "
        "--dataset csv, the paper's value otherwise",
    )
    # The local launcher's choice of --lr auto, handed to its parties (not a user flag).
    algo.add_argument("--lr-choice", help=argparse.SUPPRESS)
    for parameter in parameter_fields():  # --margin ... --coda-objective, from the dataclasses
        algo.add_argument(parameter.flag, **_argparse_options(parameter))
    algo.add_argument("--model", help="model name (default: the dataset's)")
    algo.add_argument("--hidden", type=int, help="hidden width of the MLP (default 28)")

    talk = p.add_argument_group(
        "communication (defaults: the paper's protocol; docs/communication.md)"
    )
    talk.add_argument(
        "--gossip-every",
        type=int,
        default=1,
        metavar="H",
        help="local steps per gossip round: parties exchange only every H-th iteration",
    )
    talk.add_argument("--compress", default="none", help=compress_help())
    talk.add_argument(
        "--consensus-step",
        metavar="GAMMA",
        help="CHOCO's consensus step gamma in (0, 1], or 'auto' to pick it by simulating "
        "gossip on this graph with SGD-like noise added every round (default: per compressor)",
    )
    talk.add_argument(
        "--robust",
        choices=tuple(GUARDS),
        default="none",
        help="clip: each neighbour's difference clipped to twice this party's own recent step, "
        "non-finite messages dropped, a sender of messages over half a model away excluded "
        "(docs/security.md, a misbehaving participant)",
    )
    talk.add_argument(
        "--wan",
        metavar="RTT_MS,MBIT_S",
        help="estimate the wall time over a WAN link: compute + RTT per round + bytes/bandwidth",
    )

    private = p.add_argument_group("differential privacy per site (docs/privacy.md)")
    private.add_argument(
        "--dp-epsilon",
        type=float,
        metavar="E",
        help="train with record-level (epsilon, delta) differential privacy per site against "
        "the other sites: Poisson sampling at public class rates, each group's gradient "
        "clipped, Gaussian noise calibrated by dp-accounting (PLD, replace-one row within "
        "its class) over every run the folder's append-only ledger records (E is their "
        "total); refuses --lr auto, --early-stopping, "
        "--standardize and CSV tables",
    )
    private.add_argument(
        "--dp-delta", type=float, default=1e-5, help="delta of --dp-epsilon (default 1e-5)"
    )
    private.add_argument(
        "--dp-clip",
        type=float,
        default=1.0,
        metavar="C",
        help="each group's gradient is clipped to this L2 norm (default 1; noise std 2 C z)",
    )
    private.add_argument(
        "--dp-groups",
        type=int,
        default=8,
        metavar="G",
        help="groups per step, each expecting b positives and m - b negatives, so that the "
        "sampling rates are q+ = G b / n+ and q- = G (m - b) / n- (default 8)",
    )

    run = p.add_argument_group("run")
    run.add_argument(
        "--eval-every",
        type=int,
        help="iterations between evaluations (default T/20, or rarer where evaluating the test "
        "set would cost over 10%% of the training work)",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out", help="run folder (default: a fresh folder under runs/)")
    run.add_argument("--device", default="cpu", help="cpu or cuda")
    run.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: 1 when the model's parameters x parties x m is below "
        "10 million, e.g. any MLP of the paper's sets or a table, where more threads measured "
        "at most 13%% faster idle and 10-60x slower on a busy machine; else torch's count, one "
        "per core; the distributed engine: 1). Threads change the speed, never the numbers",
    )
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument(
        "--no-plots",
        action="store_true",
        help="write no PNG figures into the run folder (about 0.8 s of CPU per folder, most of "
        "it importing matplotlib); 'slate plot RUN' draws the same figures later",
    )
    run.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="the least level of the lines of run.log, the run folder's log of events (start, "
        "evaluations, checkpoints, lost parties, stop, end); the console is the same at any level",
    )
    run.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write each evaluation's AP, training loss, bytes sent (and epsilon under "
        "--dp-epsilon) as TensorBoard scalars into DIR (needs: pip install 'slate[tensorboard]')",
    )
    run.add_argument(
        "--party-ap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also report each party's own final test AP (N more evaluations; default: on when "
        "they cost under 10%% of the training work)",
    )
    run.add_argument(
        "--compile",
        default="auto",
        choices=("auto", "on", "off"),
        help="torch.compile the parties' forward and backward pass into one graph: faster steps "
        "after a one-off compilation of seconds, eager if it fails (default auto: on for the "
        "simulator on CPU with a model under 100k parameters and at least 20 000 iterations)",
    )
    run.add_argument(
        "--checkpoint-every",
        type=int,
        help="iterations between checkpoints (default T/10, rounded up to a multiple of "
        "--gossip-every)",
    )
    run.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in DIR from its last checkpoint (only --iterations may change)",
    )
    run.add_argument(
        "--engine",
        default="simulator",
        choices=("simulator", "distributed"),
        help="simulator (all parties in this process) or distributed (one process per party)",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="distributed: seconds before a silent party counts as lost (default 60)",
    )
    run.add_argument(
        "--rank",
        type=int,
        help="run exactly one party, this one (0..N-1), and join the others at --rendezvous; "
        "implies --engine distributed and --party-files",
    )
    run.add_argument(
        "--rendezvous",
        metavar="HOST:PORT",
        help="with --rank: where the parties meet; party 0 listens there, the others connect "
        "(with --external-store, 'slate rendezvous' listens there instead)",
    )
    run.add_argument(
        "--external-store",
        action="store_true",
        help="with --rank: the rendezvous store is hosted by 'slate rendezvous --port P', not by "
        "party 0, so that any party, party 0 included, can be lost without stopping the others",
    )
    run.add_argument(
        "--roster",
        metavar="FILE",
        help="with --rank: the run's roster ('slate roster'); only the sites on it take part, "
        "and every record in the rendezvous store is signed and checked (needs --key)",
    )
    run.add_argument(
        "--key",
        metavar="FILE",
        help="with --roster: this site's private key ('slate keygen'; mode 0600)",
    )
    run.add_argument(
        "--on-party-loss",
        choices=("continue", "stop"),
        help="distributed: when a party is lost, the others continue on the surviving graph "
        "(default on CPU) or all stop, naming it (default with --device cuda)",
    )
    run.add_argument(
        "--drop-party",
        action="append",
        metavar="RANK@ITER",
        help="simulator: party RANK leaves the run before iteration ITER, as a lost party would "
        "(repeatable)",
    )


def _argparse_options(parameter: ParameterField) -> dict[str, Any]:
    """``add_argument``'s options for an algorithm parameter: its ``help`` and ``choices``, a
    switch for a ``bool``, the type of a number, and the default of its
    :class:`~slate.config.TrainConfig` field (``None``: the dataset's, then the dataclass's)."""
    metadata = parameter.field.metadata
    options: dict[str, Any] = {"help": metadata["help"]}
    if parameter.kind is bool:
        return {**options, "action": "store_true"}
    if parameter.kind in (int, float):
        options["type"] = parameter.kind
    if "choices" in metadata:
        options["choices"] = tuple(metadata["choices"])
    if "metavar" in metadata:
        options["metavar"] = metadata["metavar"]
    default = TrainConfig.__dataclass_fields__[parameter.dest].default
    if default is not None and default is not dataclasses.MISSING:
        options["default"] = default
    return options
