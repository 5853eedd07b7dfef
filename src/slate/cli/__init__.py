"""The ``slate`` command line: ``train``, ``topology``, ``reproduce``, ``tune``, ``rendezvous``,
``keygen``, ``roster``, ``schema``, ``status``, ``stop`` and ``job`` for multi-site runs, and
``predict``, ``evaluate``, ``export``, ``calibrate``, ``plot`` for a trained run.

Errors caused by the user's input (:class:`slate.errors.SlateError`) are printed as one paragraph
with exit code 2; an interrupted run exits with 130. No traceback reaches the user for either.

A ``slate rendezvous`` process ends with ``os._exit`` once it has served its run and flushed its
output (:func:`_end_server_process`): it writes no file, and the interpreter's normal shutdown
with torch loaded costs about 0.3 s of CPU, on the cores the sites share.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from collections.abc import Sequence

from slate.cli.commands import (
    is_worker,
    restore_site_flags,
    run_calibrate,
    run_evaluate,
    run_export,
    run_plot,
    run_predict,
    run_rendezvous,
    run_topology,
    run_train,
    run_tune,
)
from slate.cli.identity_commands import run_keygen, run_roster
from slate.cli.job_command import run_job
from slate.cli.memory import keep_freed_memory
from slate.cli.parser import build_parser
from slate.cli.reproduce_command import run_reproduce
from slate.cli.schema_command import run_schema
from slate.cli.status_command import run_status
from slate.cli.stop_command import run_stop
from slate.errors import RunInterrupted, SlateError
from slate.training.party_process import exit_worker

__all__ = ["build_parser", "main"]

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``slate`` console script and ``python -m slate``."""
    own_process = argv is None  # the console script or ``python -m slate``, not a caller's call
    if own_process:
        _exit_without_collecting()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command != "topology":
        keep_freed_memory()  # large per-iteration buffers are reused, not page-faulted in again
    handlers = {
        "topology": run_topology,
        "reproduce": run_reproduce,
        "tune": run_tune,
        "predict": run_predict,
        "evaluate": run_evaluate,
        "export": run_export,
        "calibrate": run_calibrate,
        "plot": run_plot,
        "rendezvous": run_rendezvous,
        "keygen": run_keygen,
        "roster": run_roster,
        "schema": run_schema,
        "status": run_status,
        "stop": run_stop,
        "job": run_job,
    }
    try:
        if args.command == "train":
            restore_site_flags(args, argv)  # (--resume DIR of a site: its own flags, recorded)
            return exit_worker(run_train(args, argv)) if is_worker(args) else run_train(args, argv)
        if args.command == "rendezvous" and own_process:
            return _end_server_process(run_rendezvous(args))
        return handlers[args.command](args)
    except RunInterrupted as err:
        print(f"slate: {err}", file=sys.stderr)
        return exit_worker(EXIT_INTERRUPTED) if is_worker(args) else EXIT_INTERRUPTED
    except SlateError as err:
        print(f"slate: error: {err}", file=sys.stderr)
        return exit_worker(EXIT_USER_ERROR) if is_worker(args) else EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("slate: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED


def _exit_without_collecting() -> None:
    """At this process's exit, move every object out of the garbage collector's reach
    (:func:`gc.freeze`) before the interpreter frees its modules.

    The collector's passes over torch's and slate's objects at exit cost one to three seconds
    of CPU on a 2-core machine (``python -c "import torch"`` ends 2.9 s after its last line,
    0.55 s with :func:`gc.freeze` first), after the command has printed its last line. Exit
    handlers registered before this one (``logging``'s, which flushes and closes the log
    handlers) still run, after it; slate closes every file it writes itself."""
    atexit.register(gc.freeze)


def _end_server_process(code: int) -> int:
    """End a ``slate rendezvous`` process that served its run (or stopped on Ctrl-C or
    ``--idle-timeout``) at once, with ``code``, after flushing its output: it holds no file
    open for writing and registers no exit handler, so the interpreter's shutdown (about 0.3 s
    of CPU with torch loaded) would only cost the sites' shared cores. A user error raised
    before it serves ends normally, through :func:`main`'s handlers."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
