"""The launcher's worker processes, forked from a server that has loaded slate once.

``slate train --engine distributed --nodes N`` runs N copies of its own command. Started as N
fresh interpreters, each would import torch, slate and the dataset's readers again (about 1.6 s
of CPU each, most of a short run). Instead the launcher starts one
:mod:`multiprocessing` *forkserver* that imports what its own process has imported of them
(:func:`preloaded`), and every worker is a fork of that server: the server has run nothing but
imports (no thread pool, no process group, no store connection), so a fork inherits no
half-held lock. A worker then sets its own environment (``RANK``, ``WORLD_SIZE``, the store's
port), takes the launcher's standard output and error as its own, and runs ``slate <argv>``
(:func:`run_command`), exactly as ``python -m slate <argv>`` would with that environment. (Its
streams are handed over explicitly, as file descriptors sent with the process's data, rather
than inherited from the server: they are the launcher's as they are when the worker starts,
whichever server forked it. Its standard input is closed, as a forkserver closes it.)

:class:`Worker` gives the launcher the part of :class:`subprocess.Popen` it uses: ``wait``,
``poll``, ``send_signal`` and ``pid``, with exit codes as ``Popen`` reports them (a death by
signal ``k`` is ``-k``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.reduction
import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SentFd", "Worker", "preloaded", "run_command", "start_workers"]

#: What a worker imports anyway, loaded once in the server: slate's command, its training loop
#: and engine (torch with them), and the readers of datasets, where this process loaded them.
PRELOAD = (
    "slate.cli",
    "slate.training.loop",
    "slate.engines.distributed.engine",
    "slate.engines.distributed.control.workers",
)
IF_LOADED = ("sklearn.datasets", "sklearn.model_selection", "scipy.sparse")
#: Imported by the server alone, after the others: freezes what they loaded (its docstring).
FREEZE = "slate.engines.distributed.control.fork_server"


def preloaded() -> list[str]:
    """The modules the fork server imports: :data:`PRELOAD`, those of :data:`IF_LOADED` that
    this process has imported (the launcher read the data the workers will read), and last
    :data:`FREEZE`."""
    return [*PRELOAD, *(name for name in IF_LOADED if name in sys.modules), FREEZE]


class SentFd:
    """A file descriptor of this process, sent to a process that a forkserver starts, with its
    process data (pickled only while the server starts it: :func:`multiprocessing.reduction.DupFd`);
    it unpickles there as that process's own descriptor (an ``int``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _received, (multiprocessing.reduction.DupFd(self.fd),)


def _received(handle: Any) -> int:
    return handle.detach()


def run_command(
    argv: Sequence[str], environment: Mapping[str, str], streams: Sequence[int] = ()
) -> None:
    """In a worker: take ``environment`` as its own, and ``streams`` (the launcher's standard
    output and error, received as file descriptors) as its descriptors 1 and 2, and run ``slate
    <argv>`` as ``python -m slate`` runs it (the package's ``__main__``, whose exit code is the
    worker's)."""
    for target, fd in enumerate(streams, start=1):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(environment)
    sys.argv = ["slate", *argv]
    runpy.run_module("slate", run_name="__main__", alter_sys=True)


class Worker:
    """One worker process (a :class:`multiprocessing.Process` of the fork server)."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""
        return self.process.exitcode

    def wait(self) -> int:
        """Wait for it to end; its exit code."""
        self.process.join()
        code = self.process.exitcode
        assert code is not None
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


def start_workers(argv: Sequence[str], environments: Sequence[Mapping[str, str]]) -> list[Worker]:
    """One worker per entry of ``environments``, each running ``slate <argv>`` with it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preloaded())
    workers = []
    for environment in environments:
        streams = [SentFd(1), SentFd(2)]  # (its descriptors, whatever sys.stdout now is)
        process = context.Process(target=run_command, args=(list(argv), dict(environment), streams))
        process.start()
        workers.append(Worker(process))
    return workers
