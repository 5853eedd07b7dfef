"""The ``slate`` command line: ``train``, ``topology``, ``reproduce``, ``tune``, and
``predict``, ``evaluate``, ``export`` for a trained run.

Errors caused by the user's input (:class:`slate.errors.SlateError`) are printed as one paragraph
with exit code 2; an interrupted run exits with 130. No traceback reaches the user for either.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from slate.config import TrainConfig
from slate.errors import ConfigError, RunInterrupted, SlateError
from slate.memory import keep_freed_memory
from slate.party_process import exit_worker, launch, run_party, run_worker

__all__ = ["build_parser", "main"]

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    from slate.algorithms import ALGORITHMS
    from slate.data.partition import PARTITIONS

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
        "--delimiter", help="cell separator (default: detected from the header: , ; or tab)"
    )
    table.add_argument("--encoding", default="utf-8", help="text encoding (e.g. latin-1)")
    table.add_argument(
        "--zero-based", action="store_true", help="libsvm: feature indices start at 0"
    )
    data.add_argument("--label-column", help="csv: the label column (name or 0-based index)")
    data.add_argument("--positive-label", help="csv: the label value of the positive class")
    data.add_argument(
        "--n-features",
        "--features",
        dest="n_features",
        type=int,
        help="libsvm: number of features (default: the largest index over all files, and over "
        "all parties' files with per-party files)",
    )
    data.add_argument(
        "--test-fraction",
        type=float,
        default=0.25,
        help="test share of the seeded stratified split when there is no test file",
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
    algo.add_argument("--iterations", type=int)
    algo.add_argument("--batch-size", type=int, help="samples per party per step (m)")
    algo.add_argument("--positives", type=int, help="positives among them (b)")
    algo.add_argument("--lr", type=float, help="step size eta")
    algo.add_argument("--margin", type=float, help="squared-hinge margin s")
    algo.add_argument(
        "--gradient-tracking",
        action="store_true",
        help="run Alg. 1 line 8 (off in the paper's experiments)",
    )
    algo.add_argument("--alpha", type=float, help="SLATE-M momentum coefficient alpha")
    algo.add_argument(
        "--initial-batch", type=int, help="SLATE-M initial batch of B positives (default 5 b)"
    )
    algo.add_argument(
        "--momentum",
        default="storm",
        choices=("storm", "ema"),
        help="SLATE-M estimator: storm (the paper's, default) or ema (the authors' scripts)",
    )
    algo.add_argument("--lr-dual", type=float, help="CODA step size for the dual variable")
    algo.add_argument(
        "--coda-objective",
        default="square",
        choices=("square", "margin"),
        help="CODA's loss: square (the square-loss AUC objective of the paper's baseline, "
        "default) or margin (LibAUC's AUC-margin loss, which needs alpha to grow)",
    )
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
    talk.add_argument(
        "--compress",
        default="none",
        help="CHOCO compressed gossip: none, int8, topk:FRACTION (e.g. topk:0.01) or sign",
    )
    talk.add_argument(
        "--consensus-step",
        metavar="GAMMA",
        help="CHOCO's consensus step gamma in (0, 1], or 'auto' to pick it by simulating "
        "gossip on this graph (default: per compressor)",
    )
    talk.add_argument(
        "--wan",
        metavar="RTT_MS,MBIT_S",
        help="estimate the wall time over a WAN link: compute + RTT per round + bytes/bandwidth",
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
    run.add_argument("--threads", type=int, help="torch CPU threads")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
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
        "--checkpoint-every", type=int, help="iterations between checkpoints (default T/10)"
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slate", description="Serverless multi-party AUPRC optimisation (SLATE, KDD '23)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train on N parties and report the test AP")
    _add_train_arguments(train)
    _add_topology_parser(sub)
    rdv = sub.add_parser(
        "rendezvous",
        help="host the rendezvous store of one multi-site run (so that no party hosts it)",
        description="Host torch's TCPStore for one run of 'slate train --rank R --rendezvous "
        "HOST:PORT --external-store'. It holds coordination keys only (addresses, heartbeats, "
        "who is in the run) and exits once every party has left, so that any party can be lost "
        "without stopping the others.",
    )
    rdv.add_argument("--port", type=int, required=True, help="the port the parties connect to")
    rdv.add_argument(
        "--host", default="0.0.0.0", help="address to listen on (default: every interface)"
    )
    _add_reproduce_parser(sub)
    _add_tune_parser(sub)
    _add_model_parsers(sub)
    return parser


def _add_model_parsers(sub) -> None:
    """``slate predict``, ``slate evaluate`` and ``slate export``: using a trained run."""
    pred = sub.add_parser("predict", help="score a file with a trained run's model")
    ev = sub.add_parser("evaluate", help="AP, AUROC and operating points on a labelled file")
    exp = sub.add_parser("export", help="write the model as a program that runs without slate")
    for p in (pred, ev, exp):
        p.add_argument("--run", required=True, metavar="DIR", help="the run folder")
    for p in (pred, ev):
        p.add_argument(
            "--data", required=True, metavar="FILE",
            help="LIBSVM or CSV file as in training (image runs: the dataset folder, an IDX or "
            "CIFAR-10 file, or a .npy of raw pixels)",
        )  # fmt: skip
    pred.add_argument("--out", metavar="FILE", help="the predictions CSV (default: stdout)")
    pred.add_argument(
        "--threshold", type=float, metavar="T", help="add decision = score >= T (a probability)"
    )
    pred.add_argument(
        "--at-recall", type=float, metavar="R",
        help="add decisions at the threshold with recall >= R and the best precision",
    )  # fmt: skip
    pred.add_argument(
        "--at-precision", type=float, metavar="P",
        help="add decisions at the threshold with precision >= P and the best recall",
    )  # fmt: skip
    pred.add_argument(
        "--calibrate", metavar="FILE",
        help="choose the --at-recall/--at-precision threshold on this labelled file (default: "
        "the run's test set)",
    )  # fmt: skip
    ev.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    ev.add_argument("--out", metavar="DIR", help="also write evaluation.json and pr_curve.png")
    exp.add_argument(
        "--format", default="torch-export", choices=("torch-export",),
        help="torch-export: a torch.export program (.pt2) of preprocessing, model and sigmoid",
    )  # fmt: skip
    exp.add_argument("--out", metavar="FILE", help="the program file (default: RUN/model.pt2)")


def _run_predict(args: argparse.Namespace) -> int:
    from slate.predict import predict, write_predictions

    result = predict(
        args.run, args.data, threshold=args.threshold, at_recall_of=args.at_recall,
        at_precision_of=args.at_precision, calibrate=args.calibrate,
    )  # fmt: skip
    write_predictions(result, args.out)
    say = (lambda line: print(line, file=sys.stderr)) if args.out is None else print
    for note in result.notes:
        say(note)
    decided = result.describe_threshold()
    if decided:
        say(decided)
    if args.out is not None:
        say(f"{result.rows} predictions written to {args.out}")
    return 0


def _run_evaluate(args: argparse.Namespace) -> int:
    import json

    from slate.predict import evaluate, format_evaluation, write_evaluation

    result = evaluate(args.run, args.data)
    if args.out is not None:
        write_evaluation(result, args.out)
    for note in result.notes:
        print(note, file=sys.stderr)
    print(json.dumps(result.to_dict()) if args.json else format_evaluation(result))
    if args.out is not None and not args.json:
        print(f"evaluation.json and pr_curve.png written to {args.out}")
    return 0


def _run_export(args: argparse.Namespace) -> int:
    from slate.export import export_run

    exported = export_run(args.run, args.out, args.format)
    print(
        f"torch.export program written to {exported.path}: float32 raw features of shape "
        f"(rows, {', '.join(str(n) for n in exported.input_shape)}) in, probabilities (rows,) "
        "out. Load it with torch.export.load(path).module(); no slate needed."
    )
    return 0


def _add_reproduce_parser(sub) -> None:
    from slate.studies.reproduce import METHODS, TABLE2_DATASETS

    rep = sub.add_parser(
        "reproduce", help="the paper's Table 2 / Figures 1-2 / ablation / claims; communication"
    )
    what = rep.add_subparsers(dest="experiment", required=True)
    t2 = what.add_parser("table2", help="Table 2 and Figures 1-2: all methods, N=20 ring")
    t2.add_argument("--datasets", default=",".join(TABLE2_DATASETS), help="comma-separated")
    t2.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    t2.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    abl = what.add_parser("ablation", help="Tables 3-4: margin x b (x alpha) grids")
    abl.add_argument("--dataset", default="cifar10")
    abl.add_argument("--seed", type=int, default=0)
    abl.add_argument("--batch-size", type=int, help="override the preset's m")
    cl = what.add_parser(
        "claims", help="the paper's theoretical claims: speedup in N, topology, tracking, SLATE-M"
    )
    cl.add_argument(
        "--studies", default="speedup,topology,tracking,momentum", help="comma-separated"
    )
    cl.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    cl.add_argument("--dataset", default="w7a")
    com = what.add_parser(
        "communication",
        help="AP against rounds and bytes: local steps, base-2, compression",
    )
    com.add_argument("--datasets", default="w7a,fashion-mnist", help="comma-separated")
    com.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    for p in (t2, abl, cl, com):
        p.add_argument("--data-dir", help="folder laid out as DIR/w7a, DIR/mnist, ...")
        p.add_argument("--out", default="reproduction", help="output folder (runs are reused)")
        p.add_argument(
            "--configs", help="folder of TOML presets (default: those installed with slate)"
        )
        p.add_argument("--device", default="cpu")
        p.add_argument("--iterations", type=int, help="override the presets' iteration counts")


def _add_tune_parser(sub) -> None:
    tune = sub.add_parser("tune", help="grid search on a validation split of the training set")
    _add_train_arguments(tune)
    tune.add_argument(
        "--grid",
        help="e.g. 'lr=0.01,0.005 margin=0.1,0.5' (default: the paper's grid for the algorithm)",
    )
    tune.add_argument("--validation-fraction", type=float, default=0.2)


def _comma_list(text: str, kind=str, flag: str = "") -> list:
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ConfigError(f"{flag} expects comma-separated values, got {text!r}.") from err


def _run_reproduce(args: argparse.Namespace) -> int:

    from slate.studies import reproduce

    config_dir = Path(args.configs) if args.configs else None
    if args.experiment == "table2":
        reproduce.table2(
            args.data_dir, Path(args.out),
            datasets=_comma_list(args.datasets, flag="--datasets"),
            methods=_comma_list(args.methods, flag="--methods"),
            seeds=_comma_list(args.seeds, int, "--seeds"),
            config_dir=config_dir, device=args.device, iterations=args.iterations,
        )  # fmt: skip
    elif args.experiment == "claims":
        from slate.studies.claims import claims

        claims(
            args.data_dir, Path(args.out), studies=_comma_list(args.studies, flag="--studies"),
            seeds=_comma_list(args.seeds, int, "--seeds"), dataset=args.dataset,
            config_dir=config_dir, device=args.device, iterations=args.iterations,
        )  # fmt: skip
    elif args.experiment == "communication":
        from slate.studies.communication import communication

        communication(
            args.data_dir, Path(args.out), datasets=_comma_list(args.datasets, flag="--datasets"),
            seeds=_comma_list(args.seeds, int, "--seeds"), config_dir=config_dir,
            device=args.device, iterations=args.iterations,
        )  # fmt: skip
    else:
        reproduce.ablation(
            args.dataset, args.data_dir, Path(args.out), seed=args.seed, config_dir=config_dir,
            device=args.device, iterations=args.iterations, batch_size=args.batch_size,
        )  # fmt: skip
    return 0


def _run_tune(args: argparse.Namespace) -> int:

    from slate.tune import parse_grid, tune

    grid = parse_grid(args.grid) if args.grid else None
    tune(
        _train_config(args), grid, args.validation_fraction,
        out=Path(args.out) if args.out else None,
    )  # fmt: skip
    return 0


LIST_FLAGS = ("id_columns", "drop_columns", "feature_columns", "categorical_columns", "na_values")


def _comma_items(values: list[str] | None) -> tuple[str, ...]:
    """A repeatable comma-list flag's values, flattened and stripped."""
    items = [item.strip() for value in values or () for item in value.split(",")]
    return tuple(item for item in items if item)


def _train_config(args: argparse.Namespace) -> TrainConfig:
    fields = TrainConfig.__dataclass_fields__
    values = {k: v for k, v in vars(args).items() if k in fields}
    for key in LIST_FLAGS:
        if key in values:
            values[key] = _comma_items(values[key])
    values["drop_party"] = tuple(values.get("drop_party") or ())
    return TrainConfig(**values)


def _run_train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from slate.train import train

    config = _resumed_config(args.resume, argv) if args.resume else _train_config(args)
    if config.drop_party and (args.engine == "distributed" or _joins_alone(args)):
        raise ConfigError(
            "--drop-party injects party losses in the simulator; with the distributed engine, "
            "stop a party's process instead (docs/reliability.md)."
        )
    if _joins_alone(args):
        return run_party(config, args)
    if args.engine == "distributed":
        from slate.engines.launch import in_worker

        if in_worker():
            return run_worker(config, args)
        return launch(config, argv, args.timeout)
    train(config, progress=not args.no_progress, resume=bool(args.resume))
    return 0


NOT_CONFIG = frozenset(
    {
        "command",
        "resume",
        "engine",
        "timeout",
        "no_progress",
        "rank",
        "rendezvous",
        "external_store",
    }
)


def _explicit_flags(argv: Sequence[str]) -> dict:
    """The train flags present on the command line (not their defaults)."""
    parser = build_parser()
    for action in parser._subparsers._group_actions[0].choices["train"]._actions:
        action.default = argparse.SUPPRESS
    explicit = {k: v for k, v in vars(parser.parse_args(argv)).items() if k not in NOT_CONFIG}
    for key in LIST_FLAGS:
        if key in explicit:
            explicit[key] = _comma_items(explicit[key])
    if "drop_party" in explicit:
        explicit["drop_party"] = tuple(explicit["drop_party"])
    return explicit


def _resumed_config(folder: str, argv: Sequence[str]) -> TrainConfig:
    """The checkpoint's config; flags given with --resume must agree except --iterations."""

    from slate import checkpoint

    saved = checkpoint.load_checkpoint(checkpoint.newest_checkpoint(Path(folder)))["config"]
    explicit = _explicit_flags(argv)
    differing = checkpoint.differing_keys(saved, explicit)
    if differing:
        pairs = ", ".join(f"{k} (checkpoint {saved[k]!r}, now {explicit[k]!r})" for k in differing)
        raise ConfigError(
            f"--resume {folder}: the command differs from the checkpoint's run in {pairs}. Only "
            "--iterations may change when resuming; drop the other flags."
        )
    updates = {k: v for k, v in explicit.items() if k in checkpoint.RESUMABLE_KEYS}
    return TrainConfig(**{**saved, **updates, "out": folder})


def _run_rendezvous(args: argparse.Namespace) -> int:
    from slate.engines.launch import serve_rendezvous

    return serve_rendezvous(args.port, args.host)


def _add_topology_parser(sub) -> None:
    """``slate topology NAME``: lambda, the spectral gap and, for cycles, each round's cost."""
    topo = sub.add_parser("topology", help="print lambda and the spectral gap of a topology")
    topo.add_argument(
        "name",
        help="ring, full, federated, star, torus, exponential, erdos-renyi, "
        "one-peer-exponential (N a power of 2), base-K (K >= 2, e.g. base-2), file:PATH",
    )
    topo.add_argument("--nodes", type=int, default=20)
    topo.add_argument("--seed", type=int, default=0)
    topo.add_argument("--fed-period", type=int, default=10)
    topo.add_argument(
        "--show",
        action="store_true",
        help="also print W and, for a cycle (one-peer-exponential, base-K), every round's "
        "degrees, bytes sent and edges",
    )
    topo.add_argument(
        "--model-bytes",
        type=_positive_bytes,
        default=None,
        metavar="B",
        help="bytes of one model sent to one neighbour, for --show of a cycle (default: the "
        "float32 parameters of the w7a MLP, 33828)",
    )


def _positive_bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer number of bytes, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {value}")
    return value


def _run_topology(args: argparse.Namespace) -> int:
    from slate.topology import (
        W7A_MODEL_BYTES,
        build_topology,
        describe,
        describe_cycle,
        format_matrix,
    )

    topology = build_topology(args.name, args.nodes, seed=args.seed, fed_period=args.fed_period)
    print(describe(topology))
    if args.show:
        if topology.rounds is not None:
            print("W (union of the rounds, Metropolis-Hastings weights; not applied):")
        print(format_matrix(topology.W))
        if topology.rounds is not None:
            model_bytes = W7A_MODEL_BYTES if args.model_bytes is None else args.model_bytes
            print(describe_cycle(topology, model_bytes=model_bytes))
    return 0


def _is_worker(args: argparse.Namespace) -> bool:
    """A party process of the distributed engine (started by the launcher, torchrun, or on its
    own with --rank)."""
    from slate.engines.launch import in_worker

    if args.command != "train":
        return False
    return _joins_alone(args) or (args.engine == "distributed" and in_worker())


def _joins_alone(args: argparse.Namespace) -> bool:
    return args.rank is not None or args.rendezvous is not None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``slate`` console script and ``python -m slate``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command != "topology":
        keep_freed_memory()  # large per-iteration buffers are reused, not page-faulted in again
    handlers = {
        "topology": _run_topology,
        "reproduce": _run_reproduce,
        "tune": _run_tune,
        "predict": _run_predict,
        "evaluate": _run_evaluate,
        "export": _run_export,
        "rendezvous": _run_rendezvous,
    }
    try:
        if args.command == "train":
            return (
                exit_worker(_run_train(args, argv)) if _is_worker(args) else _run_train(args, argv)
            )
        return handlers[args.command](args)
    except RunInterrupted as err:
        print(f"slate: {err}", file=sys.stderr)
        return exit_worker(EXIT_INTERRUPTED) if _is_worker(args) else EXIT_INTERRUPTED
    except SlateError as err:
        print(f"slate: error: {err}", file=sys.stderr)
        return exit_worker(EXIT_USER_ERROR) if _is_worker(args) else EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("slate: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED
