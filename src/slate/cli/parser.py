"""The ``slate`` command's argument parser: every subcommand and its flags."""

from __future__ import annotations

import argparse

from slate.cli.identity_commands import add_identity_parsers
from slate.cli.job_command import add_job_parser
from slate.cli.reproduce_command import add_reproduce_parser
from slate.cli.schema_command import add_schema_parser
from slate.cli.status_command import add_status_parser
from slate.cli.stop_command import add_stop_parser
from slate.cli.train_flags import add_train_arguments

__all__ = ["build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``slate`` command with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="slate", description="Serverless multi-party AUPRC optimisation (SLATE, KDD '23)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train on N parties and report the test AP")
    add_train_arguments(train)
    add_topology_parser(sub)
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
    rdv.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        help="exit (status 1) once no party's heartbeat has moved for this many seconds: the "
        "run can no longer finish here (default 600; 0: never)",
    )
    rdv.add_argument(
        "--linger",
        type=float,
        default=300.0,
        help="after a run that ended without some of its parties, stay up this many seconds "
        "more, so that one restarted late learns at once that the run is over (default 300; "
        "0: exit at once)",
    )
    rdv.add_argument(
        "--roster",
        metavar="FILE",
        help="the run's roster: only records signed by its sites are acted on (the end of the "
        "run included)",
    )
    rdv.add_argument(
        "--key",
        metavar="FILE",
        help="with --roster: the key of the site that hosts the rendezvous, checked to be on it",
    )
    add_reproduce_parser(sub)
    add_tune_parser(sub)
    add_model_parsers(sub)
    add_calibrate_parser(sub)
    add_plot_parser(sub)
    add_identity_parsers(sub)
    add_schema_parser(sub)
    add_status_parser(sub)
    add_stop_parser(sub)
    add_job_parser(sub)
    return parser


def add_topology_parser(sub) -> None:
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
        type=positive_bytes,
        default=None,
        metavar="B",
        help="bytes of one model sent to one neighbour, for --show of a cycle (default: the "
        "float32 parameters of the w7a MLP, 33828)",
    )


def positive_bytes(text: str) -> int:
    """``--model-bytes``: an integer of at least 1, else an argparse error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer number of bytes, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {value}")
    return value


def add_tune_parser(sub) -> None:
    """``slate tune``: the train flags (``--validation-fraction`` defaults to 0.2 here) and
    ``--grid``."""
    tune = sub.add_parser("tune", help="grid search on a validation split of the training set")
    add_train_arguments(tune, job=False)
    tune.add_argument(
        "--grid",
        help="e.g. 'lr=0.01,0.005 margin=0.1,0.5' (default: the paper's grid for the algorithm)",
    )


def add_model_parsers(sub) -> None:
    """``slate predict``, ``slate evaluate`` and ``slate export``: using a trained run
    (``slate calibrate``: :func:`add_calibrate_parser`)."""
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
        p.add_argument(
            "--on-bad-row", default="error", choices=("error", "skip"),
            help="a CSV row that cannot be scored (a cell that is not a number in a numeric "
            "column, the wrong number of cells): error (default) stops at the first, naming "
            "its line, column and cell; skip leaves such rows out (no score is written for "
            "them) and reports their count and first lines",
        )  # fmt: skip
        p.add_argument(
            "--delimiter", metavar="D",
            help="the CSV file's cell separator, instead of the run's: one character, or "
            "'whitespace' for runs of spaces and tabs",
        )  # fmt: skip
    pred.add_argument("--out", metavar="FILE", help="the predictions CSV (default: stdout)")
    pred.add_argument(
        "--threshold", type=float, metavar="T",
        help="add decision = score >= T (the score sigmoid(logit), in [0, 1])",
    )  # fmt: skip
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
        "the run's validation rows when it was trained with --validation-fraction, reporting "
        "the threshold's test precision and recall beside it; else the run's test set)",
    )  # fmt: skip
    pred.add_argument(
        "--curve", choices=("own", "pooled"),
        help="with per-site files, the run's curve to choose the threshold on: own (this "
        "site's own rows, the default: no other site can shape it) or pooled (every site's "
        "summed histograms, which a lying site can shape); model.json's threshold_curve",
    )  # fmt: skip
    ev.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    ev.add_argument("--out", metavar="DIR", help="also write evaluation.json and pr_curve.png")
    exp.add_argument(
        "--format", default="torch-export", choices=("torch-export",),
        help="torch-export: a torch.export program (.pt2) of preprocessing, model and sigmoid "
        "(or the run's calibrator)",
    )  # fmt: skip
    exp.add_argument("--out", metavar="FILE", help="the program file (default: RUN/model.pt2)")
    exp.add_argument(
        "--no-calibration", action="store_true",
        help="end with the sigmoid (scores) even when the run holds calibration.json",
    )  # fmt: skip


def add_calibrate_parser(sub) -> None:
    """``slate calibrate``: fit a calibrator of the run's logits on a labelled file."""
    cal = sub.add_parser(
        "calibrate",
        help="fit calibrated probabilities (Platt or isotonic) on a labelled file",
        description="Fit a map from the run's logit to a calibrated probability on a labelled "
        "file (read as slate evaluate reads it), report the Brier score and log-loss before "
        "and after, and write calibration.json and reliability.png into the run folder; slate "
        "predict then adds a probability column, slate evaluate its Brier score, and slate "
        "export ends the program with it. Use a labelled file other than the run's test file: "
        "metrics measured on the calibration file itself are optimistic.",
    )
    cal.add_argument("--run", required=True, metavar="DIR", help="the run folder")
    cal.add_argument(
        "--data", required=True, metavar="FILE",
        help="a labelled file in the run's format (as for slate evaluate)",
    )  # fmt: skip
    cal.add_argument(
        "--method", required=True, metavar="METHOD",
        help="sigmoid (Platt scaling: p = sigmoid(a * logit + b)) or isotonic (a "
        "non-decreasing piecewise-linear map; needs many positives)",
    )  # fmt: skip
    cal.add_argument(
        "--out", metavar="DIR",
        help="write calibration.json and reliability.png here instead (default: the run "
        "folder, the only place predict, evaluate and export look)",
    )  # fmt: skip


def add_plot_parser(sub) -> None:
    """``slate plot``: a run folder's figures, drawn from its files."""
    plot = sub.add_parser(
        "plot",
        help="draw a run folder's figures (after 'slate train --no-plots')",
        description="Draw the figures of a run folder from its summary.json, history.csv and "
        "pr_curve.csv: pr_curve.png, ap_curve.png, ap_bytes.png (when a party sent anything) "
        "and, for a --wan run, ap_wan_time.png; the same figures 'slate train' draws without "
        "--no-plots.",
    )
    plot.add_argument("--run", required=True, metavar="DIR", help="the run folder")
