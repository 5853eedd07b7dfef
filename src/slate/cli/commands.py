"""The handlers of the ``slate`` subcommands other than ``reproduce``: ``train`` (with
``--resume`` and the distributed engine), ``tune``, ``topology``, ``rendezvous``, and
``predict``, ``evaluate``, ``export``, ``calibrate`` for a trained run."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from slate.cli.job_command import check_resumed_job, with_job
from slate.cli.parser import build_parser
from slate.cli.train_flags import comma_items
from slate.cli.train_settings import SETTINGS
from slate.config import TrainConfig
from slate.errors import ConfigError
from slate.training.party_process import launch, run_party, run_worker

__all__ = [
    "config_from_args",
    "is_worker",
    "restore_site_flags",
    "run_calibrate",
    "run_evaluate",
    "run_export",
    "run_plot",
    "run_predict",
    "run_rendezvous",
    "run_topology",
    "run_train",
    "run_tune",
]


def run_train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``slate train``: the simulator in this process, the local launcher, a launched worker,
    or one ``--rank`` party. The ``SLATE_*`` test hooks are read here, once per process
    (:class:`slate.faults.FaultPlan`); the launcher's workers read their own."""
    from slate.faults import FaultPlan
    from slate.training.loop import train

    if args.resume:
        record = resumed_record(args.resume)
        if args.job:
            check_resumed_job(args.job, record["config"])
        config = resumed_config(args.resume, argv, record)
        # A run started with --no-progress resumes without a bar too.
        args.no_progress = args.no_progress or record.get("progress") is False
    else:
        config = config_from_args(args)
        if args.job:
            config = with_job(config, args.job, given_flags(argv))
    from slate.training.reporting import check_reporting

    check_reporting(config.log_level, config.tensorboard)  # before any data is read
    if config.drop_party and (args.engine == "distributed" or joins_alone(args)):
        raise ConfigError(
            "--drop-party injects party losses in the simulator; with the distributed engine, "
            "stop a party's process instead (docs/reliability.md)."
        )
    if (args.roster or args.key) and not joins_alone(args):
        raise ConfigError(
            "--roster and --key identify a site started on its own with --rank R --rendezvous "
            "HOST:PORT; the local launcher's parties run in one trusted machine."
        )
    if joins_alone(args):
        return run_party(config, args, FaultPlan.from_environment())
    if args.engine == "distributed":
        from slate.engines.distributed.control.launch import in_worker

        if in_worker():
            return run_worker(config, args, FaultPlan.from_environment())
        return launch(config, argv, args.timeout)
    from slate.training.configuration import resolve_and_check

    # A user's own file without --nodes: N from its positives (slate.training.plan).
    train(resolve_and_check(config), progress=not args.no_progress, resume=bool(args.resume),
          parties_from_data=not args.resume, faults=FaultPlan.from_environment(),
          figures=not args.no_plots)  # fmt: skip
    return 0


LIST_FLAGS = ("id_columns", "drop_columns", "feature_columns", "categorical_columns", "na_values")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` of the parsed train flags (comma lists split)."""
    fields = TrainConfig.__dataclass_fields__
    values = {k: v for k, v in vars(args).items() if k in fields}
    for key in LIST_FLAGS:
        if key in values:
            values[key] = comma_items(values[key])
    values["drop_party"] = tuple(values.get("drop_party") or ())
    if values.get("feature_range") is not None:
        values["feature_range"] = tuple(values["feature_range"])
    return TrainConfig(**values)


#: The parsed train flags that are no :class:`TrainConfig` field (``--rank``, ``--job``, ...).
NOT_CONFIG = frozenset({"command"} | {s.dest for s in SETTINGS if s.agree is False})


def given_flags(argv: Sequence[str]) -> dict:
    """Every train flag present on the command line (not their defaults), by its name in the
    parsed arguments."""
    parser = build_parser()
    for action in parser._subparsers._group_actions[0].choices["train"]._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_args(argv))


def explicit_flags(argv: Sequence[str]) -> dict:
    """The train flags present on the command line (not their defaults) that a run's config
    holds."""
    explicit = {k: v for k, v in given_flags(argv).items() if k not in NOT_CONFIG}
    for key in LIST_FLAGS:
        if key in explicit:
            explicit[key] = comma_items(explicit[key])
    if "drop_party" in explicit:
        explicit["drop_party"] = tuple(explicit["drop_party"])
    if explicit.get("feature_range") is not None:
        explicit["feature_range"] = tuple(explicit["feature_range"])
    return explicit


#: The site flags a folder records (:func:`slate.training.party_process.write_site_flags`).
SITE_FLAGS = ("rank", "rendezvous", "external_store", "roster", "key", "timeout", "no_plots")


def restore_site_flags(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """``slate train --resume DIR`` of a site's folder (one started with ``--rank``): the
    site's own flags that its checkpoint does not hold (``--rank``, ``--rendezvous``,
    ``--external-store``, ``--roster``, ``--key``, ``--timeout``, ``--no-plots``) are taken
    from the folder's record of them where the command does not give them, so that the short
    command that an interrupted site prints restarts it as it was started. Nothing changes for
    a folder without that record, nor for a command that gives ``--rank`` or ``--rendezvous``
    (it says where the site joins now)."""
    if args.command != "train" or not args.resume or joins_alone(args):
        return
    from slate.training.party_process import read_site_flags

    flags = read_site_flags(args.resume)
    if flags is None:
        return
    given = given_flags(argv)
    if given.get("engine") == "simulator":
        raise ConfigError(
            f"--resume {args.resume} is the folder of site {flags['rank']} of a distributed run "
            "(started with --rank); it resumes with the distributed engine: drop --engine "
            "simulator."
        )
    for name in SITE_FLAGS:
        if name not in given and flags.get(name) is not None:
            setattr(args, name, flags[name])
    args.engine = "distributed"


def resumed_record(folder: str) -> dict:
    """The newest checkpoint in ``folder``, or a party's set-up record when it holds none."""
    from slate.training import checkpoint

    path = checkpoint.newest_checkpoint(Path(folder))
    if not path.is_file():  # a party lost before its first checkpoint: its set-up record
        path = checkpoint.newest_setup(Path(folder)) or path
    return checkpoint.load_checkpoint(path)


def resumed_config(folder: str, argv: Sequence[str], record: dict) -> TrainConfig:
    """The checkpoint's config; flags given with --resume must agree except --iterations."""
    from slate.training import checkpoint

    saved = record["config"]
    explicit = explicit_flags(argv)
    differing = checkpoint.differing_keys(saved, explicit)
    if differing:
        pairs = ", ".join(f"{k} (checkpoint {saved[k]!r}, now {explicit[k]!r})" for k in differing)
        raise ConfigError(
            f"--resume {folder}: the command differs from the checkpoint's run in {pairs}. Only "
            "--iterations may change when resuming; drop the other flags."
        )
    updates = {k: v for k, v in explicit.items() if k in checkpoint.RESUMABLE_KEYS}
    return TrainConfig(**{**saved, **updates, "out": folder})


def is_worker(args: argparse.Namespace) -> bool:
    """A party process of the distributed engine (started by the launcher, torchrun, or on its
    own with --rank)."""
    from slate.engines.distributed.control.launch import in_worker

    if args.command != "train":
        return False
    return joins_alone(args) or (args.engine == "distributed" and in_worker())


def joins_alone(args: argparse.Namespace) -> bool:
    """Whether this process is one ``--rank`` party (given ``--rank`` or ``--rendezvous``)."""
    return args.rank is not None or args.rendezvous is not None


def run_tune(args: argparse.Namespace) -> int:
    """``slate tune``: the grid search of :func:`slate.training.tune.tune`."""
    from slate.training.tune import parse_grid, tune

    grid = parse_grid(args.grid) if args.grid else None
    fraction = 0.2 if args.validation_fraction is None else args.validation_fraction
    config = dataclasses.replace(config_from_args(args), validation_fraction=None)
    tune(config, grid, fraction, out=Path(args.out) if args.out else None)
    return 0


def run_topology(args: argparse.Namespace) -> int:
    """``slate topology NAME``: print lambda, the spectral gap and, with ``--show``, W."""
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


def run_rendezvous(args: argparse.Namespace) -> int:
    """``slate rendezvous``: host the rendezvous store of one multi-site run."""
    from slate.engines.distributed.control.launch import serve_rendezvous

    if args.idle_timeout < 0:
        raise ConfigError(f"--idle-timeout must be 0 (never) or positive, got {args.idle_timeout}.")
    if not 0 <= args.linger < float("inf"):
        raise ConfigError(
            f"--linger must be 0 (exit at once) or positive seconds, got {args.linger}."
        )
    roster = None
    if args.key is not None and args.roster is None:
        raise ConfigError("--key goes with --roster: the roster lists the key of each site.")
    if args.roster is not None:
        from slate.security import Roster, site_identity

        roster = Roster.read(args.roster)
        if args.key is not None:
            site_identity(args.roster, args.key)
    with _ctrl_c_stops():
        return serve_rendezvous(
            args.port, args.host, idle_timeout=args.idle_timeout, roster=roster,
            linger=args.linger,
        )  # fmt: skip


@contextlib.contextmanager
def _ctrl_c_stops():
    """SIGINT (Ctrl-C) raises KeyboardInterrupt within, also in a process that inherited it
    ignored (started by a script with ``&``, without job control, or by a runner that ignores
    it), as a foreground ``slate rendezvous`` does: its documented way to stop. Outside the
    main thread (an in-process test) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_plot(args: argparse.Namespace) -> int:
    """``slate plot``: draw a run folder's figures and name them."""
    from slate.training.outputs import draw_figures

    for path in draw_figures(args.run):
        print(path)
    return 0


def run_predict(args: argparse.Namespace) -> int:
    """``slate predict``: score a file, write the predictions and the notes."""
    from slate.inference.predict import Reading, predict, write_predictions

    result = predict(
        args.run, args.data, threshold=args.threshold, at_recall_of=args.at_recall,
        at_precision_of=args.at_precision, calibrate=args.calibrate,
        reading=Reading(args.on_bad_row, args.delimiter), curve=args.curve,
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


def run_evaluate(args: argparse.Namespace) -> int:
    """``slate evaluate``: AP, AUROC and operating points on a labelled file."""
    import json

    from slate.inference.predict import Reading, evaluate, format_evaluation, write_evaluation

    result = evaluate(args.run, args.data, Reading(args.on_bad_row, args.delimiter))
    if args.out is not None:
        write_evaluation(result, args.out)
    for note in result.notes:
        print(note, file=sys.stderr)
    print(json.dumps(result.to_dict()) if args.json else format_evaluation(result))
    if args.out is not None and not args.json:
        print(f"evaluation.json and pr_curve.png written to {args.out}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    """``slate export``: write the run's model as a ``torch.export`` program."""
    from slate.inference.export import export_run

    exported = export_run(args.run, args.out, args.format, calibrated=not args.no_calibration)
    output = (
        "scores sigmoid(logit) (rows,)"
        if exported.calibration is None
        else f"{exported.calibration}-calibrated probabilities (rows,)"
    )
    print(
        f"torch.export program written to {exported.path}: float32 raw features of shape "
        f"(rows, {', '.join(str(n) for n in exported.input_shape)}) in, {output} out. Load it "
        "with torch.export.load(path).module(); no slate needed."
    )
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    """``slate calibrate``: fit, measure and store a calibrator of the run's logits."""
    from slate.inference.calibration import (
        CALIBRATION_FILE,
        RELIABILITY_FILE,
        calibrate_run,
        format_calibration,
    )

    result = calibrate_run(args.run, args.data, args.method, args.out)
    print(format_calibration(result))
    print(f"{CALIBRATION_FILE} and {RELIABILITY_FILE} written to {result.out}")
    return 0
