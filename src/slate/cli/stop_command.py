"""``slate stop DIR``: stop the site whose run folder is ``DIR``, as a Ctrl-C at its console
would: the site is sent SIGINT, so it finishes its step, every party agrees to stop at the same
checkpoint, and every site's last line names the site that stopped and the iteration
(:mod:`slate.training.interruption`), with the command that resumes it.

The site is found from the record it keeps in its run folder (``site-flags.json``,
:func:`slate.training.party_process.write_site_flags`): its process id and host. Only a site
started with ``--rank`` keeps one; a process that is not that site any more (it ended, or the
id was reused) is never signalled."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from slate.errors import ConfigError

__all__ = ["add_stop_parser", "run_stop"]

POLL_SECONDS = 0.2


def add_stop_parser(sub: Any) -> None:
    """``slate stop DIR [--timeout SECONDS]``."""
    stop = sub.add_parser(
        "stop",
        help="stop a site of a multi-site run from its run folder, as Ctrl-C at its console",
        description="Send SIGINT to the site whose run folder (--out) is DIR, on this machine: "
        "every party stops at the same checkpoint, and every site's last line names this site, "
        "the iteration and the command that resumes the run.",
    )
    stop.add_argument("folder", metavar="DIR", help="the site's run folder (its --out)")
    stop.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the site to end (default 120; 0: do not wait)",
    )


def run_stop(args: argparse.Namespace) -> int:
    """The handler: 0 once the site has ended (or at once with ``--timeout 0``), 1 if it is
    still running at the deadline; a folder without a running site is a ConfigError."""
    pid = _site_process(Path(args.folder))
    os.kill(pid, signal.SIGINT)
    print(f"slate stop: asked the site of {args.folder} (process {pid}) to stop", flush=True)
    deadline = time.monotonic() + max(0.0, args.timeout)
    while args.timeout > 0 and _running(pid):
        if time.monotonic() > deadline:
            print(
                f"slate stop: the site of {args.folder} (process {pid}) is still running after "
                f"{args.timeout:g} s; it stops at the next checkpoint its parties agree on.",
                file=sys.stderr,
            )
            return 1
        time.sleep(POLL_SECONDS)
    if args.timeout > 0:
        print(f"slate stop: the site of {args.folder} has stopped; its console and run.log "
              "say at which iteration, and how to resume")  # fmt: skip
    return 0


def _site_process(folder: Path) -> int:
    """The process id of the site running in ``folder``, checked: recorded there, on this
    host, alive, and a ``slate train`` process."""
    from slate.training.party_process import SITE_FLAGS_FILE, read_site_flags

    flags = read_site_flags(folder) if folder.is_dir() else None
    if flags is None or not isinstance(flags.get("pid"), int):
        raise ConfigError(
            f"slate stop {folder}: no site's record ({SITE_FLAGS_FILE} with its process id) is "
            "in that folder. Give the run folder (--out) of a site started with --rank; a "
            "simulator or launcher run stops with Ctrl-C in its console."
        )
    pid, host = flags["pid"], flags.get("host")
    if host and host != socket.gethostname():
        raise ConfigError(
            f"slate stop {folder}: the site there runs on host {host!r}, not this one "
            f"({socket.gethostname()!r}). Run slate stop on that host."
        )
    if not _running(pid) or not _is_slate_train(pid):
        raise ConfigError(
            f"slate stop {folder}: the site recorded there (process {pid}) is not running: it "
            "ended already. Its console and run.log say how; resume it with: slate train "
            f"--resume {folder}"
        )
    return pid


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (and is not a zombie, where /proc says so)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _is_slate_train(pid: int) -> bool:
    """Whether process ``pid``'s command line is a ``slate ... train`` (where /proc can tell;
    elsewhere assumed)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    text = b" ".join(words)
    return b"slate" in text and b"train" in words
