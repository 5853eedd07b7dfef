"""``torch.multiprocessing.spawn(fn, args, nprocs)`` for the tests that start gloo workers, as
forks of the server of :mod:`tests.forked`, which has loaded torch and slate once per test
process.

A spawned worker is a fresh interpreter: it imports torch and slate again (about 2.5 s of CPU
each, more than most of these tests' work). :func:`spawn` instead starts each rank as a fork of
that forkserver, which runs ``fn(rank, *args)`` as a spawned worker would: ``fn`` and ``args``
are pickled and ``fn``'s module imported by name (the test module itself, as spawn imports it),
with this process's current environment, working folder and ``sys.path``, its standard output
and error those of this process now (the test's capture, where pytest captures by file
descriptor). It waits for every rank as ``spawn(..., join=True)`` does: when one fails, the others
are stopped and the error raised is torch's own (:class:`ProcessRaisedException` with the failing
rank and its traceback's text, sent over a pipe; :class:`ProcessExitedException` for a rank that
ended with a non-zero status or a signal and no traceback). Unlike ``spawn``, it gives up after
``timeout`` seconds, kills every rank and raises :class:`TimeoutError`, so that a hung worker
cannot hang the suite.

Real spawned interpreters are started instead (with the same timeout) under
``SLATE_TEST_FRESH_PROCESSES=1`` (:data:`tests.forked.FRESH`), or when the workers' environment
differs from this process's in a variable read when the interpreter or torch starts
(:data:`tests.forked.AT_START`: ``OMP_``, ``ATEN_`` ...), which the forked workers would not
apply: the rule of :func:`tests.forked.forkable`.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from tests import forked

#: Seconds a stopped rank is given to end on SIGTERM before SIGKILL.
GRACE_S = 3.0


def spawn(
    fn: Callable[..., object],
    args: Sequence[Any] = (),
    nprocs: int = 1,
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=True)`` from the forkserver (module
    docstring), the ranks killed and :class:`TimeoutError` raised after ``timeout`` seconds;
    ``env``: the workers' environment (this process's by default)."""
    environment = dict(os.environ if env is None else env)
    if not _forkable(environment):
        _spawn_fresh(fn, tuple(args), nprocs, timeout, environment)
        return
    context = forked._context()
    sys.stdout.flush()
    sys.stderr.flush()
    processes, readers = [], []
    try:
        for rank in range(nprocs):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_rank,
                args=(fn, rank, tuple(args), environment, writer,
                      [forked._Fd(1), forked._Fd(2)]),
                name=f"spawned-rank-{rank}", daemon=False,
            )  # fmt: skip
            process.start()
            writer.close()
            processes.append(process)
            readers.append(reader)
        _join(processes, readers, timeout)
    finally:
        _stop(processes)
        for reader in readers:
            reader.close()


def _forkable(environment: Mapping[str, str]) -> bool:
    """Whether forks of the server would start as spawned workers under ``environment`` do: the
    rule of :func:`tests.forked.forkable` (no variable of :data:`tests.forked.AT_START` set to
    another value than here, and :data:`tests.forked.FRESH` not set)."""
    return forked.forkable([sys.executable, "-c", ""], environment)


def _rank(
    fn: Callable[..., object], rank: int, args: tuple, environment: dict[str, str],
    errors: multiprocessing.connection.Connection, fds: list[int],
) -> None:  # fmt: skip
    """In the fork: ``fn(rank, *args)`` with the caller's environment and standard output and
    error; an exception's traceback text goes to ``errors`` and the rank exits with status 1, as
    torch's spawned workers do."""
    for target, fd in enumerate(fds, start=1):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(environment)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _end_with_the_server()
    try:
        fn(rank, *args)
    except KeyboardInterrupt:
        pass  # (the parent stops every rank on an interrupt)
    except Exception:
        errors.send(traceback.format_exc())
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(1)
    finally:
        errors.close()


def _end_with_the_server() -> None:
    """Be killed when the forkserver ends (the test process has gone), as torch's workers are
    when their parent ends (``PR_SET_PDEATHSIG``; Linux only, a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # (PR_SET_PDEATHSIG)


def _join(
    processes: list[multiprocessing.process.BaseProcess],
    readers: list[multiprocessing.connection.Connection],
    timeout: float,
) -> None:
    """Wait for every rank; raise as ``ProcessContext.join`` does for the first one that failed
    (the others then stopped by the caller), or :class:`TimeoutError` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    running = dict(enumerate(processes))
    while running:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"spawned ranks {sorted(running)} of {len(processes)} still running after "
                f"{timeout:g} s: every rank killed"
            )
        ended = multiprocessing.connection.wait([p.sentinel for p in running.values()], left)
        for rank, process in list(running.items()):
            if process.sentinel not in ended:
                continue
            process.join()
            del running[rank]
            if process.exitcode != 0:
                _raise(rank, process, readers[rank])


def _raise(
    rank: int, process: multiprocessing.process.BaseProcess,
    errors: multiprocessing.connection.Connection,
) -> None:  # fmt: skip
    """The error ``torch.multiprocessing.spawn`` raises for a rank that failed."""
    assert process.pid is not None and process.exitcode is not None
    if errors.poll():
        with contextlib.suppress(EOFError):
            text = errors.recv()
            message = f"\n\n-- Process {rank} terminated with the following error:\n{text}"
            raise ProcessRaisedException(message, rank, process.pid)
    code = process.exitcode
    if code < 0:
        name = signal.Signals(-code).name
        raise ProcessExitedException(f"process {rank} terminated with signal {name}", rank,
                                     process.pid, exit_code=code, signal_name=name)  # fmt: skip
    raise ProcessExitedException(f"process {rank} terminated with exit code {code}", rank,
                                 process.pid, exit_code=code)  # fmt: skip


def _stop(processes: list[multiprocessing.process.BaseProcess]) -> None:
    """SIGTERM to every rank still running, SIGKILL to any left after :data:`GRACE_S`."""
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + GRACE_S
    for process in alive:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def _spawn_fresh(
    fn: Callable[..., object], args: tuple, nprocs: int, timeout: float,
    environment: dict[str, str],
) -> None:  # fmt: skip
    """``torch.multiprocessing.spawn`` itself (fresh interpreters under ``environment``), the
    ranks killed and :class:`TimeoutError` raised after ``timeout`` seconds."""
    import torch.multiprocessing as mp

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment)  # (what the spawned interpreters inherit)
    try:
        context = mp.start_processes(fn, args, nprocs, join=False, start_method="spawn")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert context is not None
    deadline = time.monotonic() + timeout
    try:
        while not context.join(max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"spawned ranks still running after {timeout:g} s: every rank killed"
                )
    finally:
        _stop(context.processes)
