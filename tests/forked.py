"""``python -m slate ...`` and ``python -c CODE ...`` for the multi-site tests, forked from a
server that has loaded torch and slate once per test process.

A multi-site test starts a process per site and one for the rendezvous. Each fresh interpreter
imports torch and slate again: about 2.5 s of CPU, more than a short run's training, and most of
the suite's time. :func:`popen` instead asks a :mod:`multiprocessing` *forkserver* (started once
in this test process, with torch and slate's command, training loop and engine imported and
nothing run) for a fork, which then does what the fresh interpreter would have done: it takes
the given environment and working folder as its own, its standard streams become the given
pipes, and it runs the module (``runpy``, as ``-m`` does) or the code (as ``-c`` does) under
``sys.argv`` as the interpreter would set it. It ends the way an interpreter ends: ``atexit``'s
functions, the streams flushed, the exit status of ``SystemExit`` (1 after an uncaught exception,
whose traceback goes to its standard error).

This is how ``slate train --engine distributed --nodes N`` starts its own parties
(:mod:`slate.engines.distributed.control.workers`), so the forked site runs the code path of a
launched party. The tests of what a fresh interpreter does (``python -m slate`` at a user's
prompt, a launcher, a Python without slate) start real processes.

:class:`Forked` is the part of :class:`subprocess.Popen` the tests use, with the same meaning:
``pid``, ``returncode``, ``poll``, ``wait``, ``communicate`` (text, universal newlines, output
kept across a timeout), ``send_signal``, ``kill``, ``terminate``, ``stdin``, ``stdout``.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing
import os
import runpy
import selectors
import signal
import subprocess
import sys
import time
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from slate.engines.distributed.control.workers import SentFd

INTERRUPTED = -1  # (_exit_status: an uncaught KeyboardInterrupt, ended by SIGINT)
ROOT = str(Path(__file__).resolve().parents[1])
#: Loaded once in the server: what every site loads anyway.
PRELOAD = [
    "torch",
    "torch.distributed",
    "slate.cli",
    "slate.cli.commands",
    "slate.training.loop",
    "slate.engines.distributed.engine",
    "slate.security",
    "slate.training.accountant",
    "dp_accounting",  # (with scipy.signal: about 1.5 s of a private run's start)
    "dp_accounting.pld",
    "dp_accounting.mechanism_calibration",
    "slate.engines.distributed.control.workers",
    "sklearn.datasets",  # (a launch's workers read the data its launcher read)
    "sklearn.model_selection",
    "scipy.sparse",
    "torch._dynamo",  # (torch.optim's first optimizer imports it: about 3 s in each fork)
    "tests.preloaded_data",
    "tests.forked",
    # Last, as the launcher's server imports it: freezes what the others loaded, so that a
    # fork's collections neither walk nor copy the pages of torch's and slate's objects.
    "slate.engines.distributed.control.fork_server",
]
#: This server's ``PYTHONUNBUFFERED`` (read in the server, as it imports this module): the mode of
#: the standard streams its forks start with.
SERVER_UNBUFFERED = os.environ.get("PYTHONUNBUFFERED")
#: ``SLATE_TEST_FRESH_PROCESSES=1`` starts every process as a fresh interpreter instead (to tell
#: a fault of the fork from one of the test).
FRESH = "SLATE_TEST_FRESH_PROCESSES"


#: Variables read when the interpreter or torch starts (CPU kernels, thread pools, import
#: paths): a command given other values than this process has needs a fresh interpreter, since
#: the server imported torch with this process's.
AT_START = ("ATEN_", "MKL_", "OMP_", "KMP_", "GOMP_", "TORCH_", "LD_", "PYTHON")


def forkable(command: Sequence[str], env: Mapping[str, str] | None = None) -> bool:
    """Whether ``command`` is this interpreter with ``-m MODULE`` or ``-c CODE``, ``env``
    changes no variable of :data:`AT_START` (``PYTHONUNBUFFERED`` aside: the fork opens its
    streams under it), and :data:`FRESH` is not set."""
    if os.environ.get(FRESH):
        return False
    if env is not None:
        names = {*env, *os.environ} - {"PYTHONUNBUFFERED"}
        if any(n.startswith(AT_START) and env.get(n) != os.environ.get(n) for n in names):
            return False
    return len(command) >= 3 and command[0] == sys.executable and command[1] in ("-m", "-c")


#: A descriptor sent to a fork with its process data: the one the launcher's workers get theirs by.
_Fd = SentFd


def _context() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)  # (the server and the forks import tests.forked by name)
    context.set_forkserver_preload(PRELOAD)
    return context


def popen(
    command: Sequence[str],
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int | None = None,
    start_new_session: bool = False,
) -> Forked:
    """``subprocess.Popen(command, cwd=cwd, env=env, text=True, stdin=stdin,
    stdout=PIPE, stderr=PIPE, start_new_session=start_new_session)`` for a :func:`forkable`
    command, as a fork (module docstring)."""
    assert forkable(command, env), command
    pipes = [os.pipe(), os.pipe()]
    feed = os.pipe() if stdin == subprocess.PIPE else None
    child_in = feed[0] if feed is not None else os.open(os.devnull, os.O_RDONLY)
    fds = [_Fd(child_in), _Fd(pipes[0][1]), _Fd(pipes[1][1])]
    environment = dict(os.environ if env is None else env)
    folder = os.fspath(cwd) if cwd is not None else os.getcwd()
    process = _context().Process(
        target=_run, args=(list(command[1:]), environment, folder, fds, start_new_session)
    )
    try:
        process.start()
    finally:
        for fd in (child_in, pipes[0][1], pipes[1][1]):
            os.close(fd)
    writer = open(feed[1], "w") if feed is not None else None  # noqa: SIM115 (kept, as Popen's)
    return Forked(list(command), process, writer, pipes[0][0], pipes[1][0])


def _run(
    argv: list[str], environment: dict[str, str], folder: str, fds: list[int], session: bool
) -> None:
    """In the fork: become ``python ARGV`` run in ``folder`` with ``environment`` (in a
    session of its own with ``session``, its process group's leader)."""
    if session:
        os.setsid()
        _own_resource_tracker()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(environment)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = _output(1, "strict", line_buffering=False)
    sys.stderr = _output(2, "backslashreplace", line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    os.chdir(folder)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not session and environment.get("PYTHONUNBUFFERED") == SERVER_UNBUFFERED:
        _lend_this_server()
    code = _exit_status(lambda: _main(argv))
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        if code == INTERRUPTED:  # as the interpreter ends on an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _own_resource_tracker() -> None:
    """In a fork in a session of its own: :mod:`multiprocessing`'s resource tracker is started
    anew when the fork first needs one, as in a fresh interpreter, instead of being this
    server's client's. A launcher in its own session thus has its own server and its own
    tracker, as at a user's prompt, and what its processes leave behind (a leaked semaphore) is
    reported on its own standard error when it ends."""
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._fd = None  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._pid = None  # type: ignore[attr-defined]


def _lend_this_server() -> None:
    """In the fork: the processes it starts through a ``forkserver`` (a launcher's workers,
    :mod:`slate.engines.distributed.control.workers`) are forked by this server too, instead of
    by a server of its own, which would import torch and slate again (about 3 s of CPU per
    launch). The fork already holds what a client of this server needs (its address, its
    "alive" descriptor and the resource tracker's, set by ``multiprocessing.forkserver``), so
    only the start of a new server is skipped.

    What a worker gets is what it gets from a server of its launcher's: the same modules
    loaded (:data:`PRELOAD` holds the launcher's preload list), its own environment, folder and
    standard output and error (sent with its process data), and its exit code and signals
    through the same pipe. Two things differ, and where a test depends on them the fork keeps
    its own server: the workers are in this server's process group, not the launcher's (a
    launcher started with ``start_new_session``, whose group a test signals, keeps its own),
    and their standard streams open in this server's ``PYTHONUNBUFFERED`` mode (a launcher
    given another keeps its own)."""
    from multiprocessing import forkserver

    forkserver._forkserver.ensure_running = lambda: None  # type: ignore[method-assign]


def _output(fd: int, errors: str, line_buffering: bool) -> io.TextIOWrapper:
    """Standard output or error as the interpreter opens them: unbuffered under
    ``PYTHONUNBUFFERED`` (write-through), else buffered (standard error by line)."""
    raw = io.FileIO(fd, "w", closefd=False)
    if os.environ.get("PYTHONUNBUFFERED"):
        return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, write_through=True)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8", errors=errors,
                            line_buffering=line_buffering)  # fmt: skip


def _main(argv: list[str]) -> None:
    option, what, *rest = argv
    if option == "-m":
        sys.argv = [what, *rest]
        runpy.run_module(what, run_name="__main__", alter_sys=True)
        return
    sys.argv = ["-c", *rest]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    exec(compile(what, "<string>", "exec"), main.__dict__)  # (python -c CODE)


def _exit_status(body: Any) -> int:
    """The exit status the interpreter gives ``body()``'s ending."""
    try:
        body()
    except SystemExit as stop:
        if stop.code is None:
            return 0
        if isinstance(stop.code, int):
            return stop.code & 0xFF
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return INTERRUPTED
    except BaseException:  # (as the interpreter: print it, status 1)
        traceback.print_exc()
        return 1
    return 0


class Forked:
    """A forked ``python ...`` (module docstring), read as a :class:`subprocess.Popen`."""

    def __init__(
        self, args: list[str], process: multiprocessing.process.BaseProcess,
        stdin: IO[str] | None, stdout: int, stderr: int,
    ) -> None:  # fmt: skip
        self.args = args
        self.process = process
        self.stdin = stdin
        # text, universal newlines, as Popen(text=True) opens them (read_until reads the fd)
        self.stdout = open(stdout, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.stderr = open(stderr, encoding="utf-8", errors="replace")  # noqa: SIM115
        self._read: dict[int, list[bytes]] = {stdout: [], stderr: []}
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(
        self, input: str | None = None, timeout: float | None = None
    ) -> tuple[str, str]:
        """Both outputs to their ends and the exit; ``subprocess.TimeoutExpired`` after
        ``timeout`` seconds, what was read kept for the next call."""
        if self.stdin is not None and not self.stdin.closed:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        deadline = None if timeout is None else time.monotonic() + timeout
        open_streams = [s for s in (self.stdout, self.stderr) if not s.closed]
        with selectors.DefaultSelector() as selector:
            for stream in open_streams:
                selector.register(stream, selectors.EVENT_READ)
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        self._read[key.fd].append(chunk)
                    else:
                        selector.unregister(key.fileobj)
                        key.fileobj.close()  # type: ignore[union-attr]
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        out, err = (b"".join(parts) for parts in self._read.values())
        return _text(out), _text(err)


def _text(data: bytes) -> str:
    """As ``Popen(text=True)`` gives it: UTF-8, universal newlines."""
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
