"""``slate job init``, and a run's settings from ``slate train --job FILE``.

``slate job init [the agreed flags of slate train] --out job.toml`` writes the job file
(:mod:`slate.cli.job_file`); ``slate train --job job.toml`` takes every agreed setting from it
(:func:`with_job`), the command line giving only the site's own.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from slate.cli.job_file import agreed_settings, job_digest, read_job, write_job
from slate.cli.train_flags import add_settings
from slate.cli.train_settings import comma_items
from slate.config import TrainConfig
from slate.errors import ConfigError

__all__ = ["add_job_parser", "check_resumed_job", "run_job", "with_job"]


def add_job_parser(sub: Any) -> None:
    """``slate job init``: the agreed flags of ``slate train`` and ``--out``."""
    job = sub.add_parser(
        "job",
        help="write the job file of a multi-site run (the settings every site must share)",
    )
    actions = job.add_subparsers(dest="job_command", required=True)
    init = actions.add_parser(
        "init",
        help="write a job file from the agreed flags of slate train",
        description="Write a TOML job file holding every setting the sites of one run must "
        "agree on: the values of the flags given here, the defaults otherwise, each with its "
        "help as a comment. Every site then runs 'slate train --job FILE' with only its own "
        "flags (--rank, --key, --roster, --rendezvous, --train, --test, --out, ...).",
    )
    add_settings(init, agreed_settings())
    init.add_argument(
        "--out", required=True, metavar="FILE", help="the job file to write (never replaced)"
    )


def _value(args: argparse.Namespace, dest: str) -> Any:
    """A parsed flag's value as :class:`TrainConfig` holds it (comma lists split, pairs as
    tuples)."""
    value = getattr(args, dest)
    if isinstance(value, list):
        value = comma_items(value) if all(isinstance(v, str) for v in value) else tuple(value)
    return value


def run_job(args: argparse.Namespace) -> int:
    """``slate job init``: write the job file and say what each site runs."""
    values = {s.dest: _value(args, s.dest) for s in agreed_settings()}
    write_job(args.out, values)
    print(
        f"job file written to {args.out} (sha256 {job_digest(values)[:12]}...). Give the same "
        f"file to every site; each runs: slate train --job {args.out} --rank R --rendezvous "
        "HOST:PORT --train TRAIN --test TEST --out DIR (with --roster ROSTER --key KEY where "
        "the run has a roster)."
    )
    return 0


def with_job(config: TrainConfig, path: str, given: Mapping[str, Any]) -> TrainConfig:
    """``config`` (this site's flags) with every agreed setting and ``job_sha256`` from the job
    file at ``path``; ``given`` (the flags on the command line, by name) may hold no agreed
    setting."""
    agreed = {s.dest: s.option_strings[0] for s in agreed_settings()}
    clashing = [flag for dest, flag in agreed.items() if dest in given]
    if clashing:
        raise ConfigError(
            f"--job {path} holds every setting the sites must agree on, so the command line "
            f"may give only this site's own; it also gives {', '.join(clashing)}. Drop "
            f"{'it' if len(clashing) == 1 else 'them'} from the command line, or change the "
            "job file (every site must run with the same one)."
        )
    values = read_job(path)
    return dataclasses.replace(config, **values, job_sha256=job_digest(values))


def check_resumed_job(path: str, saved: Mapping[str, Any]) -> None:
    """``--resume DIR --job FILE``: the job file must be the one the run started with."""
    digest = job_digest(read_job(path))
    if saved.get("job_sha256") != digest:
        started = "without a job file" if saved.get("job_sha256") is None else "with another"
        raise ConfigError(
            f"--resume with --job {path}: the run in the folder was started {started} (this "
            f"one's sha256 is {digest[:12]}...). Resume without --job: the checkpoint holds "
            "the run's settings."
        )
