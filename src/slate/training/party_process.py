"""One party's process of a distributed run, started from the command line.

``slate train --engine distributed`` without torchrun's variables is the *launcher*
(:func:`launch`); each process it starts, or torchrun starts, is a *worker* (:func:`run_worker`);
``slate train --rank R --rendezvous HOST:PORT`` runs one party at its own site
(:func:`run_party`). Each opens the :class:`~slate.engines.distributed.engine.DistributedEngine`,
trains, leaves with the others and ends with :func:`exit_worker`.

What a party process sets for its run (the processes launched as N, its device, its run
folder, the loss policy under torchrun, one thread) is its :class:`~slate.training.plan.Place`
and ``nodes``, handed to :func:`slate.training.loop.train`; it reads the resolved config's
sections, and the flags as given only to ask whether a flag was given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from slate.config import TrainConfig
from slate.engines.distributed.control.debug_log import DEBUG_LOG, send_native_stderr_to
from slate.errors import ConfigError

if TYPE_CHECKING:
    from slate.faults import FaultPlan
    from slate.training.configuration import ResolvedConfig
    from slate.training.lr_choice import LrChoice

__all__ = [
    "SITE_FLAGS_FILE",
    "exit_worker",
    "launch",
    "read_site_flags",
    "run_party",
    "run_worker",
    "write_site_flags",
]


def launch(config: TrainConfig, argv: Sequence[str], timeout: float) -> int:
    """Check the input once here, then start one worker process per party: N and ``--lr
    auto`` are chosen here, once, and handed to every party (``--nodes``, ``--lr``,
    ``--lr-choice``) with the run folder (``--out``)."""
    from slate.engines.distributed.control.launch import launch_local
    from slate.training.configuration import check_inputs, resolve_and_check
    from slate.training.loop import run_candidates
    from slate.training.outputs import default_out_dir
    from slate.training.plan import choose_parties, choose_step_size, whole_rows

    settings = resolve_and_check(config)
    data = whole_rows(settings, from_data=True, runner=run_candidates)  # read once, if needed
    nodes = choose_parties(settings, data, from_data=True)
    check_inputs(settings, nodes, data)  # the dataset read to choose N is not read again
    forwarded = list(argv)
    if settings.algorithm.config.lr == "auto":  # chosen once here, after the checks
        lr, choice = choose_step_size(settings, nodes, data, runner=run_candidates)
        forwarded += ["--lr", repr(lr)]
        if choice is not None:
            forwarded += ["--lr-choice", json.dumps(choice.to_dict())]
    given = settings.given
    out = settings.outputs.out
    if out is None:
        out = str(default_out_dir(settings.data.dataset, settings.algorithm.name))
        forwarded += ["--out", out]
    if given.nodes is None:
        forwarded += ["--nodes", str(nodes)]
    logs = [
        str(Path(_party_out_dir(settings, r, alone=False, out=out)) / DEBUG_LOG.format(rank=r))
        for r in range(nodes)
    ]
    return launch_local(forwarded, nodes, timeout, logs)


def run_worker(config: TrainConfig, args: argparse.Namespace, faults: FaultPlan) -> int:
    """A process started by the launcher (or by torchrun): join the others and train
    (``faults``: what a test injects, read once by the command)."""
    from slate.engines.distributed.control.launch import worker_rendezvous

    settings = _resolved(config)
    if settings.outputs.out is not None:  # the local launcher always names the run folder
        rank = int(os.environ["RANK"])
        send_native_stderr_to(Path(_party_out_dir(settings, rank, alone=False)), rank)
    from slate.training.lr_choice import LrChoice

    rendezvous = worker_rendezvous(args.timeout)
    choice = getattr(args, "lr_choice", None)
    lr_choice = LrChoice.from_dict(json.loads(choice)) if choice else None
    return _train_as_party(settings, rendezvous, args, faults, alone=False, lr_choice=lr_choice)


def _resolved(config: TrainConfig) -> ResolvedConfig:
    """This process's one resolution and check of its flags."""
    from slate.training.configuration import resolve_and_check

    return resolve_and_check(config)


def _open_engine(settings: ResolvedConfig, rendezvous, timeout: float, faults: FaultPlan):
    """The distributed engine of this party: recovering from a lost party where it can (and
    tampering with its sealed messages, recording what it opens or sending its sums unmasked
    where a test says so)."""
    from slate.engines.distributed.engine import DistributedEngine
    from slate.engines.distributed.wire.transport import backend_for

    device = settings.model.device
    if rendezvous is None:  # torchrun opened the default group; its agent handles failures
        return DistributedEngine(device)
    recover = settings.membership.on_party_loss == "continue"
    rank = rendezvous.rank
    return DistributedEngine.open(
        device, rendezvous, timeout, recover, backend_for(device), faults.tamper(rank),
        recorder=faults.recorder(rank), masks=faults.masks,
    )  # fmt: skip


def _train_as_party(
    settings: ResolvedConfig,
    rendezvous,
    args: argparse.Namespace,
    faults: FaultPlan,
    alone: bool,
    lr_choice: LrChoice | None = None,
) -> int:
    """Train as this process's party, then leave together with the others; then draw the run
    folder's figures (unless ``--no-plots``)."""
    import torch.distributed as dist

    from slate.engines.distributed.engine import local_rank
    from slate.training.loop import train
    from slate.training.plan import Place

    device, given = settings.model.device, settings.given
    world = rendezvous.world if rendezvous is not None else dist.get_world_size()
    if given.nodes is not None and given.nodes != world:
        raise ConfigError(
            f"--nodes {given.nodes} differs from the {world} processes that were launched."
        )
    # torchrun's agent stops (or restarts) every worker when one fails.
    torchrun = rendezvous is None and settings.membership.on_party_loss == "continue"
    engine = _open_engine(settings, rendezvous, args.timeout, faults)
    if alone:  # its folder records its own flags (write_site_flags): --resume DIR is enough
        engine.resume_flags, engine.resume_note = "", _restart_note(args)
    place = Place(
        device=f"cuda:{local_rank()}" if device.type == "cuda" else None,
        out=_party_out_dir(settings, engine.rank, alone),
        on_party_loss="stop" if torchrun else None,
        threads=1,  # one party per process: several processes share the cores, one thread each
    )
    result = train(settings, engine=engine, progress=not args.no_progress, nodes=world,
                   resume=bool(args.resume), lr_choice=lr_choice, place=place,
                   faults=faults, figures=False)  # fmt: skip
    engine.leave()
    if result.out_dir is not None and not getattr(args, "no_plots", False):
        # Drawn once this party has left: the others need nothing more from it.
        from slate.training.outputs import draw_figures

        draw_figures(result.out_dir)
    if result.refused is not None:  # the run folder is written: stop with the reason
        from slate.training.final_check import AverageRefused

        raise AverageRefused(result.refused)
    return 0


def _restart_note(args: argparse.Namespace) -> str:
    """What a site adds to its printed resume command: with ``--external-store``, that every
    site restarts at a new ``slate rendezvous`` (the old one still holds the stopped run)."""
    if not args.external_store:
        return ""
    from slate.engines.distributed.control.launch import parse_rendezvous

    host, port = parse_rendezvous(args.rendezvous)
    roster = f" --roster {Path(args.roster).resolve()}" if args.roster else ""
    return (
        f" (run from the same directory, at every site; first stop the old 'slate rendezvous' "
        f"on {host} and start a new one there: slate rendezvous --port {port}{roster})"
    )


def _party_out_dir(settings: ResolvedConfig, rank: int, alone: bool, out: str | None = None) -> str:
    """The run folder of party ``rank`` (``out``: the run's, default ``--out``).

    With one dataset, every party writes into rank 0's folder (under torchrun, rank 0 picks it
    and tells the others). With per-party files every party writes its own: ``{rank}`` in
    ``--out`` is replaced, a party started alone writes to its ``--out``, and parties started
    together write to ``OUT/party<r>``.
    """
    from slate.data.local_data import RANK_PLACEHOLDER, party_path
    from slate.engines.distributed.wire.json_exchange import broadcast_text
    from slate.training.outputs import default_out_dir

    out = settings.outputs.out if out is None else out
    fresh = (settings.data.dataset, settings.algorithm.name)
    if out is None and alone:
        return str(default_out_dir(*fresh))
    if out is None:
        out = broadcast_text(str(default_out_dir(*fresh)) if rank == 0 else None)
    if not settings.data.per_party:
        return out
    if RANK_PLACEHOLDER in out:
        return party_path(out, rank)
    return out if alone else str(Path(out) / f"party{rank}")


def run_party(config: TrainConfig, args: argparse.Namespace, faults: FaultPlan) -> int:
    """``--rank R --rendezvous HOST:PORT``: be party R of --nodes, reading only its own files
    (``faults``: what a test injects, read once by the command)."""
    from slate.engines.distributed.control.launch import parse_rendezvous, party_rendezvous

    if args.rank is None or args.rendezvous is None:
        raise ConfigError(
            "--rank and --rendezvous go together: --rank R --rendezvous HOST:PORT runs party R "
            "and joins the others there."
        )
    if config.nodes is None:
        raise ConfigError("--rank needs --nodes N: the number of parties that will join.")
    if not 0 <= args.rank < config.nodes:
        raise ConfigError(f"--rank must lie in 0..{config.nodes - 1} (--nodes {config.nodes}), "
                          f"got {args.rank}.")  # fmt: skip
    identity = _site_identity(args, config.nodes)
    config = dataclasses.replace(config, party_files=True)  # (implied by --rank)
    from slate.training.configuration import check_inputs

    settings = _resolved(config)
    # The topology and the algorithm; this party's files are read once, by its run.
    check_inputs(settings, config.nodes)
    parse_rendezvous(args.rendezvous)  # a malformed address is refused before anything else
    folder = Path(_party_out_dir(settings, args.rank, alone=True))
    send_native_stderr_to(folder, args.rank)
    write_site_flags(folder, args)
    rendezvous = party_rendezvous(
        args.rank, config.nodes, args.rendezvous, args.timeout, args.external_store,
        identity=identity,
    )  # fmt: skip
    return _train_as_party(settings, rendezvous, args, faults, alone=True)


#: A site's own flags, kept in its run folder so that ``slate train --resume DIR`` alone restarts
#: it: the ones a checkpoint's config does not hold (they say where and as whom the site joins,
#: not what the run computes).
SITE_FLAGS_FILE = "site-flags.json"
SITE_FLAGS_FORMAT = "slate-site-flags-1"


def write_site_flags(folder: Path, args: argparse.Namespace) -> None:
    """Record this site's ``--rank``, ``--rendezvous``, ``--external-store``, ``--roster``,
    ``--key`` (as absolute paths: the key's path, never the key), ``--timeout`` and
    ``--no-plots`` in ``folder`` (:data:`SITE_FLAGS_FILE`), at every start; and this process's
    id and host, by which ``slate stop DIR`` finds the site."""
    flags = {
        "format": SITE_FLAGS_FORMAT,
        "rank": args.rank,
        "rendezvous": args.rendezvous,
        "external_store": bool(args.external_store),
        "roster": str(Path(args.roster).resolve()) if args.roster else None,
        "key": str(Path(args.key).resolve()) if args.key else None,
        "timeout": args.timeout,
        "no_plots": bool(getattr(args, "no_plots", False)),
        "pid": os.getpid(),  # for slate stop DIR (slate.cli.stop_command), on this host
        "host": socket.gethostname(),
    }
    from slate.permissions import private_files, private_folder

    path = private_folder(folder) / SITE_FLAGS_FILE  # (0700, its files 0600: slate.permissions)
    partial = path.with_suffix(".partial")
    with private_files():
        partial.write_text(json.dumps(flags, indent=1) + "\n")
    partial.replace(path)  # (never half a file, should the site be stopped while it writes)


def read_site_flags(folder: str | Path) -> dict | None:
    """The site flags recorded in ``folder`` by :func:`write_site_flags`, or None when it
    holds none (a simulator or launcher run, or a site of an older slate). A record that is
    there but unreadable is refused with one paragraph."""
    path = Path(folder) / SITE_FLAGS_FILE
    if not path.is_file():
        return None
    try:
        flags = json.loads(path.read_text())
        valid = (
            isinstance(flags, dict)
            and flags.get("format") == SITE_FLAGS_FORMAT
            and isinstance(flags.get("rank"), int)
            and isinstance(flags.get("rendezvous"), str)
            and isinstance(flags.get("timeout"), (int, float))
            and all(isinstance(flags.get(k), (str, type(None))) for k in ("roster", "key"))
        )
    except (OSError, ValueError):
        valid = False
    if not valid:
        raise ConfigError(
            f"--resume {folder}: its site flags record {path} is not one slate wrote (a site "
            "writes it when it starts: its --rank, --rendezvous, --external-store, --roster, "
            "--key and --timeout). Give those flags with --resume, or delete the file and give "
            "them."
        )
    return flags


def _site_identity(args: argparse.Namespace, nodes: int):
    """This site's key and the run's roster (``--roster``, ``--key``), checked against
    ``--rank`` and ``--nodes`` before anything else; None without them."""
    if args.roster is None and args.key is None:
        return None
    if args.roster is None or args.key is None:
        given, missing = ("--key", "--roster") if args.roster is None else ("--roster", "--key")
        raise ConfigError(
            f"{given} needs {missing}: a site proves who it is with its own --key, against the "
            "run's --roster (docs/security.md)."
        )
    from slate.security import site_identity

    return site_identity(args.roster, args.key, rank=args.rank, nodes=nodes)


def exit_worker(code: int) -> int:
    """End a party process at once, after flushing its output.

    gloo's C++ threads can abort the interpreter's normal shutdown ("terminate called without an
    active exception") after the process group is gone; the run's results are already written,
    so a worker leaves with ``os._exit`` and its real exit status.
    """
    import os

    from slate.engines.distributed.engine import opened_a_group

    if not opened_a_group():  # stopped before joining (a bad flag): a normal exit
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
