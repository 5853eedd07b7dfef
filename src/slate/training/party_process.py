"""One party's process of a distributed run, started from the command line.

``slate train --engine distributed`` without torchrun's variables is the *launcher*
(:func:`launch`); each process it starts, or torchrun starts, is a *worker* (:func:`run_worker`);
``slate train --rank R --rendezvous HOST:PORT`` runs one party at its own site
(:func:`run_party`). Each opens the :class:`~slate.engines.distributed.engine.DistributedEngine`,
trains, leaves with the others and ends with :func:`exit_worker`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slate.config import TrainConfig
from slate.engines.distributed.control.debug_log import DEBUG_LOG, send_native_stderr_to
from slate.errors import ConfigError

if TYPE_CHECKING:
    from slate.data.datasets import Dataset
    from slate.faults import FaultPlan
    from slate.training.configuration import ResolvedConfig
    from slate.training.lr_choice import LrChoice

__all__ = ["exit_worker", "launch", "run_party", "run_worker", "with_default_parties"]


def launch(config: TrainConfig, argv: Sequence[str], timeout: float) -> int:
    """Check the input once here, then start one worker process per party."""
    from slate.engines.distributed.control.launch import launch_local
    from slate.training.configuration import check_inputs, resolve_and_check
    from slate.training.loop import train
    from slate.training.lr_choice import resolve_auto_lr
    from slate.training.outputs import default_out_dir

    settings, data = with_default_parties(resolve_and_check(config))
    check_inputs(settings, data)  # the dataset read to choose N is not read again
    forwarded = list(argv)
    if settings.flags.lr == "auto":  # chosen once here, after the checks; each party gets it
        settings, data, choice = resolve_auto_lr(settings, data, print, train)
        forwarded += ["--lr", repr(settings.flags.lr)]
        if choice is not None:
            forwarded += ["--lr-choice", json.dumps(choice.to_dict())]
    resolved = settings.flags
    if config.out is None:
        forwarded += ["--out", str(default_out_dir(resolved))]
    if config.nodes is None:
        forwarded += ["--nodes", str(resolved.nodes)]
    out = config.out or str(default_out_dir(resolved))
    logs = [
        str(Path(_party_out_dir(dataclasses.replace(resolved, out=out), r, alone=False))
            / DEBUG_LOG.format(rank=r))
        for r in range(resolved.nodes)
    ]  # fmt: skip
    return launch_local(forwarded, resolved.nodes, timeout, logs)


def with_default_parties(settings: ResolvedConfig) -> tuple[ResolvedConfig, Dataset | None]:
    """A user's own file without ``--nodes``: N from its positives, said in one line
    (:func:`slate.data.sources.default_parties`), and the dataset read to count them, for the
    run (or the launcher's check) to use; ``(settings, None)`` where no dataset was read.
    ``settings`` is checked already: every flag (--out first) before any data is read."""
    from slate.data.sources import default_parties

    chosen = default_parties(settings.given, settings.flags)
    if chosen is None:
        return settings, None
    nodes, data, note = chosen
    if note:
        print(note)
    return settings.replace(nodes=nodes), data


def run_worker(config: TrainConfig, args: argparse.Namespace, faults: FaultPlan) -> int:
    """A process started by the launcher (or by torchrun): join the others and train
    (``faults``: what a test injects, read once by the command)."""
    from slate.engines.distributed.control.launch import worker_rendezvous

    if config.out is not None:  # the local launcher always names the run folder
        rank = int(os.environ["RANK"])
        send_native_stderr_to(Path(_party_out_dir(config, rank, alone=False)), rank)
    from slate.training.lr_choice import LrChoice

    rendezvous = worker_rendezvous(args.timeout)
    choice = getattr(args, "lr_choice", None)
    lr_choice = LrChoice.from_dict(json.loads(choice)) if choice else None
    return _train_as_party(_resolved(config), rendezvous, args, faults, alone=False,
                           lr_choice=lr_choice)  # fmt: skip


def _resolved(config: TrainConfig) -> ResolvedConfig:
    """This process's one resolution and check of its flags."""
    from slate.training.configuration import resolve_and_check

    return resolve_and_check(config)


def _open_engine(settings: ResolvedConfig, rendezvous, timeout: float, faults: FaultPlan):
    """The distributed engine of this party: recovering from a lost party where it can (and
    tampering with its sealed messages where a test says so)."""
    from slate.engines.distributed.engine import DistributedEngine
    from slate.engines.distributed.wire.transport import backend_for

    device = settings.model.device
    if rendezvous is None:  # torchrun opened the default group; its agent handles failures
        return DistributedEngine(device)
    recover = settings.membership.on_party_loss == "continue"
    tamper = faults.tamper(rendezvous.rank)
    return DistributedEngine.open(device, rendezvous, timeout, recover, backend_for(device), tamper)


def _train_as_party(
    settings: ResolvedConfig,
    rendezvous,
    args: argparse.Namespace,
    faults: FaultPlan,
    alone: bool,
    lr_choice: LrChoice | None = None,
) -> int:
    """Train as this process's party, then leave together with the others."""
    import torch.distributed as dist

    from slate.engines.distributed.engine import local_rank
    from slate.training.loop import train

    device, given = settings.model.device, settings.given
    world = rendezvous.world if rendezvous is not None else dist.get_world_size()
    if given.nodes is not None and given.nodes != world:
        raise ConfigError(
            f"--nodes {given.nodes} differs from the {world} processes that were launched."
        )
    if rendezvous is None and settings.membership.on_party_loss == "continue":
        # torchrun's agent stops (or restarts) every worker when one fails.
        settings = settings.replace(on_party_loss="stop")
    engine = _open_engine(settings, rendezvous, args.timeout, faults)
    changes: dict[str, Any] = {}
    if device.type == "cuda":
        changes["device"] = f"cuda:{local_rank()}"
    changes["out"] = _party_out_dir(settings.flags, engine.rank, alone)
    # One party per process: several processes share the cores, so one thread each.
    settings = settings.replace(**changes, nodes=world, threads=settings.flags.threads or 1)
    result = train(settings, engine=engine, progress=not args.no_progress,
                   resume=bool(args.resume), lr_choice=lr_choice, faults=faults)  # fmt: skip
    engine.leave()
    if result.refused is not None:  # the run folder is written: stop with the reason
        from slate.training.final_check import AverageRefused

        raise AverageRefused(result.refused)
    return 0


def _party_out_dir(config: TrainConfig, rank: int, alone: bool) -> str:
    """The run folder of party ``rank``.

    With one dataset, every party writes into rank 0's folder (under torchrun, rank 0 picks it
    and tells the others). With per-party files every party writes its own: ``{rank}`` in
    ``--out`` is replaced, a party started alone writes to its ``--out``, and parties started
    together write to ``OUT/party<r>``.
    """
    from slate.data.local_data import RANK_PLACEHOLDER, party_path, uses_party_files
    from slate.engines.distributed.wire.json_exchange import broadcast_text
    from slate.training.outputs import default_out_dir

    out = config.out
    if out is None and alone:
        return str(default_out_dir(config))
    if out is None:
        out = broadcast_text(str(default_out_dir(config)) if rank == 0 else None)
    if not uses_party_files(config):
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
    config = dataclasses.replace(config, party_files=True)
    from slate.training.configuration import check_inputs

    settings = _resolved(config)
    check_inputs(settings)  # the topology and the algorithm; this party's files are read once
    parse_rendezvous(args.rendezvous)  # a malformed address is refused before anything else
    send_native_stderr_to(Path(_party_out_dir(config, args.rank, alone=True)), args.rank)
    rendezvous = party_rendezvous(
        args.rank, config.nodes, args.rendezvous, args.timeout, args.external_store,
        identity=identity,
    )  # fmt: skip
    return _train_as_party(settings, rendezvous, args, faults, alone=True)


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
