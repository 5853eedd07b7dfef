"""``slate reproduce``: its parser, and its handler that runs the studies of ``slate.studies``."""

from __future__ import annotations

import argparse
from pathlib import Path

from slate.errors import ConfigError

__all__ = ["add_reproduce_parser", "comma_list", "run_reproduce"]


def add_reproduce_parser(sub) -> None:
    """``slate reproduce table2|ablation|claims|communication`` and their flags."""
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
        help="AP against rounds and bytes: local steps, base-2, compression, and no gossip",
    )
    com.add_argument(
        "--datasets",
        default="w7a,w7a-dirichlet",
        help="comma-separated presets: w7a, w7a-dirichlet (w7a split non-IID), fashion-mnist, "
        "mnist, w8a, or any other TOML in --configs",
    )
    com.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    for p in (t2, abl, cl, com):
        p.add_argument("--data-dir", help="folder laid out as DIR/w7a, DIR/mnist, ...")
        p.add_argument("--out", default="reproduction", help="output folder (runs are reused)")
        p.add_argument(
            "--configs", help="folder of TOML presets (default: those installed with slate)"
        )
        p.add_argument("--device", default="cpu")
        p.add_argument("--iterations", type=int, help="override the presets' iteration counts")


def comma_list(text: str, kind=str, flag: str = "") -> list:
    """The values of a comma-separated flag, each converted by ``kind``; a value that does not
    convert is a ConfigError naming ``flag``."""
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ConfigError(f"{flag} expects comma-separated values, got {text!r}.") from err


def run_reproduce(args: argparse.Namespace) -> int:
    """``slate reproduce``: runs the chosen study of :mod:`slate.studies`."""
    from slate.studies import reproduce

    config_dir = Path(args.configs) if args.configs else None
    if args.experiment == "table2":
        reproduce.table2(
            args.data_dir, Path(args.out),
            datasets=comma_list(args.datasets, flag="--datasets"),
            methods=comma_list(args.methods, flag="--methods"),
            seeds=comma_list(args.seeds, int, "--seeds"),
            config_dir=config_dir, device=args.device, iterations=args.iterations,
        )  # fmt: skip
    elif args.experiment == "claims":
        from slate.studies.claims import claims

        claims(
            args.data_dir, Path(args.out), studies=comma_list(args.studies, flag="--studies"),
            seeds=comma_list(args.seeds, int, "--seeds"), dataset=args.dataset,
            config_dir=config_dir, device=args.device, iterations=args.iterations,
        )  # fmt: skip
    elif args.experiment == "communication":
        from slate.studies.communication import communication

        communication(
            args.data_dir, Path(args.out), datasets=comma_list(args.datasets, flag="--datasets"),
            seeds=comma_list(args.seeds, int, "--seeds"), config_dir=config_dir,
            device=args.device, iterations=args.iterations,
        )  # fmt: skip
    else:
        reproduce.ablation(
            args.dataset, args.data_dir, Path(args.out), seed=args.seed, config_dir=config_dir,
            device=args.device, iterations=args.iterations, batch_size=args.batch_size,
        )  # fmt: skip
    return 0
