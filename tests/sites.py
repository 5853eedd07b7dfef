"""Per-site runs for tests: each site's own w7a files, a ``slate rendezvous``, one ``--rank``
process per site, and (for the trust tests) each site's key and the run's roster; and
``slate ...`` run inside the test process (:func:`slate_here`) where no process of its own is
needed: flag, identity and file errors, simulator runs and their resumes."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests import forked

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
HAVE_W7A = (SHARED / "w7a" / "w7a.t.gz").is_file()

#: A site's flags in the multi-site tests; no figures (none of those tests reads one; the
#: figures are tested in tests/training/test_figures.py and tests/metrics/test_plots.py).
SITE_FLAGS = ["--train", "train.svm", "--test", "test.svm", "--out", "run", "--dataset",
              "libsvm", "--features", "300", "--seed", "1", "--no-progress", "--timeout", "30",
              "--checkpoint-every", "100", "--no-plots"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_sites(root: Path, parties: int = 4, rows: int = 600) -> None:
    """Site r gets every ``parties``-th line of the first lines of w7a and of w7a.t."""
    for source, name in (("w7a.gz", "train.svm"), ("w7a.t.gz", "test.svm")):
        with gzip.open(SHARED / "w7a" / source, "rt") as handle:
            lines = [line for line, _ in zip(handle, range(parties * rows), strict=False)]
        for r in range(parties):
            (root / f"site{r}").mkdir(parents=True, exist_ok=True)
            (root / f"site{r}" / name).write_text("".join(lines[r::parties]))


# An audit hook that records every ``pickle.find_class`` (any unpickling of a class) to the file
# named in the SLATE_TEST_UNPICKLED variable, when that is set.
_AUDIT_HOOK = """
import os, sys

def record(event, args):
    if event == "pickle.find_class":
        with open(os.environ["SLATE_TEST_UNPICKLED"], "a") as handle:
            handle.write(repr(args) + "\\n")

if os.environ.get("SLATE_TEST_UNPICKLED"):
    sys.addaudithook(record)
"""
_MAIN = """
from slate.cli import main
sys.exit(main(sys.argv[1:]))
"""
_LOADED = """
import torch, torch.distributed
import slate.cli.commands, slate.training.loop, slate.engines.distributed.engine
sys.stdin.readline()
"""
# ``slate`` under that hook.
AUDITED = _AUDIT_HOOK + _MAIN
# ``slate`` started ahead of time (see :func:`start_party`'s ``warm``): the interpreter, torch and
# the training code are loaded, then it waits for one line on its standard input before it runs.
WARM = _AUDIT_HOOK + _LOADED + _MAIN


def start_party(
    root: Path,
    rank: int,
    port: int,
    *flags: str,
    kill: str = "",
    program: list[str] | None = None,
    site: str | None = None,
    audit: Path | None = None,
    env: dict[str, str] | None = None,
    warm: bool = False,
    fresh: bool = False,
) -> subprocess.Popen:
    """Party ``rank`` in ``root/site<rank>`` (``root/<site>`` when given); ``program`` replaces
    ``python -m slate``; with ``audit``, ``slate`` runs under the pickle audit hook of
    :data:`AUDITED`, which logs to ``audit/unpickled.log`` (see :func:`unpickled`); ``env``: test
    hooks to set in its environment. With ``warm``, the process loads Python, torch and slate
    now but starts the party only when :func:`release` tells it to (:data:`WARM`): a restart
    timed on an event then costs no interpreter start. With ``fresh``, a fresh interpreter
    instead of a fork (:func:`start`): where a test needs the process's own command line
    (``slate stop`` checks that the recorded process is a ``slate train``)."""
    if warm:
        program = [sys.executable, "-c", WARM]
    elif audit is not None:
        program = [sys.executable, "-c", AUDITED]
    command = [*(program or [sys.executable, "-m", "slate"]), "train", "--rank", str(rank),
               "--rendezvous", f"127.0.0.1:{port}", *flags]  # fmt: skip
    env = {**os.environ, "SLATE_KILL_AT": kill, **(env or {})}
    if audit is not None:
        env["SLATE_TEST_UNPICKLED"] = str(audit / "unpickled.log")
    return start(
        command,
        cwd=root / (site or f"site{rank}"),
        env=env,
        stdin=subprocess.PIPE if warm else None,
        fresh=fresh,
    )


def start(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
    stdin: int | None = None, start_new_session: bool = False, fresh: bool = False,
) -> subprocess.Popen:  # fmt: skip
    """``subprocess.Popen(command, ..., text=True, stdout=PIPE, stderr=PIPE)``; ``python -m``
    and ``python -c`` are forked from a server that has loaded torch and slate
    (:mod:`tests.forked`), which a site's process would otherwise spend most of a short run
    importing (``fresh``: a fresh interpreter all the same)."""
    if forked.forkable(command, env) and not fresh:
        return forked.popen(command, cwd=cwd, env=env, stdin=stdin,  # type: ignore[return-value]
                            start_new_session=start_new_session)  # fmt: skip
    return subprocess.Popen(command, cwd=cwd, env=env, text=True, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=start_new_session)  # fmt: skip


#: ``python PATH ARGS`` as ``python -c`` code (:func:`script`): ``sys.argv`` and ``sys.path[0]`` as
#: the interpreter sets them for a script, then the script run as ``__main__``.
_RUN_SCRIPT = """
import os, runpy, sys
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.realpath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def script(path: Path | str, *args: object) -> list[str]:
    """``[python, PATH, *ARGS]`` as a ``python -c`` command that runs the script as that would:
    ``runpy.run_path(PATH, run_name="__main__")`` with ``sys.argv`` ``[PATH, *ARGS]`` and the
    script's folder (symbolic links resolved) in place of ``-c``'s first entry of ``sys.path``.
    :func:`start` and :func:`run_command` fork it from the server that has loaded torch and
    slate (:mod:`tests.forked`) instead of starting a fresh interpreter; for a script that does
    not depend on being one (its own command line, nothing loaded before it)."""
    return [sys.executable, "-c", _RUN_SCRIPT, str(path), *(str(a) for a in args)]


def run_command(
    command: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """``subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)``, through :func:`start` (a fork for ``python -m``/``-c``); killed at the
    timeout, raising ``subprocess.TimeoutExpired`` as ``subprocess.run`` does."""
    process = start(command, cwd=cwd, env=env)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def release(party: subprocess.Popen) -> None:
    """Start the party of a process started with ``start_party(..., warm=True)``."""
    assert party.stdin is not None
    party.stdin.write("go\n")
    party.stdin.flush()  # (communicate() closes it)


def finish(parties: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str]]:
    """Each party's exit code and output (stdout then stderr), in order; one that has not ended
    within ``timeout`` seconds of the wait for it is killed."""
    done = []
    for party in parties:
        try:
            out, err = party.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            party.kill()
            out, err = party.communicate()
        done.append((party.returncode, out + err))
    return done


def unpickled(root: Path) -> str:
    """What the processes started with ``audit=root`` unpickled ("" for nothing)."""
    log = root / "unpickled.log"
    return log.read_text() if log.exists() else ""


def serve(port: int, *flags: str) -> subprocess.Popen:
    """``slate rendezvous`` on the loopback interface."""
    command = [sys.executable, "-m", "slate", "rendezvous", "--port", str(port), "--host",
               "127.0.0.1", *flags]  # fmt: skip
    return start(command)


def make_roster(root: Path, parties: int, run_id: str = "trusted-run") -> Path:
    """Each site's key in its own folder (``site<r>/site<r>.key``) and the roster of them all,
    written in this process by the functions behind ``slate keygen`` and ``slate roster``."""
    from slate.security import make_roster as roster_of
    from slate.security import write_keypair, write_roster

    pubs = []
    for r in range(parties):
        (root / f"site{r}").mkdir(parents=True, exist_ok=True)
        _, pub = write_keypair(root / f"site{r}" / f"site{r}")
        pubs.append(pub)
    return write_roster(roster_of(pubs, run_id=run_id), root / f"roster-{run_id}.json")


def identity_flags(roster: Path, rank: int) -> list[str]:
    return ["--roster", str(roster), "--key", f"site{rank}.key"]


@dataclass
class Done:
    """What :func:`slate_here` gives back, named as :class:`subprocess.CompletedProcess` names
    it, so that a test reads the same either way."""

    returncode: int
    stdout: str
    stderr: str


def slate_here(*args: str, cwd: Path | str | None = None) -> Done:
    """``slate ARGS`` in this process (:func:`slate.cli.main`), from ``cwd`` when given, with its
    standard output and error captured (tqdm's bar too: it writes to ``sys.stderr``).

    For commands that need no process of their own: a flag, identity or file error (refused
    before any site is reached), a simulator run, the resume of a simulator run, ``keygen``,
    ``roster``. Never for a run that opens a process group: such a party ends its process with
    ``os._exit`` when it leaves. torch's thread count, which a run sets, is restored after; the
    process-wide malloc setting of ``slate.cli.memory`` (speed only; finding libc starts
    ``ldconfig``) is left out."""
    import torch

    import slate.cli

    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    before = Path.cwd()
    keep = slate.cli.keep_freed_memory
    try:
        if cwd is not None:
            os.chdir(cwd)
        slate.cli.keep_freed_memory = lambda: False
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = slate.cli.main([str(a) for a in args])
    finally:
        slate.cli.keep_freed_memory = keep
        os.chdir(before)
        torch.set_num_threads(threads)
    return Done(code, out.getvalue(), err.getvalue())


def read_until(process: subprocess.Popen, text: str, timeout: float = 60) -> str:
    """What ``process`` wrote to its standard output (a pipe) until it wrote ``text``; fail
    after ``timeout`` seconds, or when it ended first. Reads the pipe itself, not through its
    buffered file, so that ``process.communicate()`` can read the rest after it."""
    assert process.stdout is not None
    fd, seen = process.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {text!r}; it wrote {seen.decode()!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"it ended before writing {text!r}; it wrote {seen.decode()!r}"
            seen += chunk
    return seen.decode()


def wait_for(
    condition: Callable[[], object],
    what: str,
    timeout: float = 120,
    process: subprocess.Popen | None = None,
) -> None:
    """Poll ``condition`` every 20 ms until it holds; fail naming ``what`` after ``timeout``
    seconds, or at once when ``process`` has ended first."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if process is not None and process.poll() is not None and not condition():
            raise AssertionError(f"the process ended (code {process.returncode}) before {what}")
        time.sleep(0.02)


def descendants(pid: int) -> dict[int, str]:
    """pid -> state (``R``, ``S``, ``T`` ...) of every process under ``pid``, read from /proc
    (a launcher's workers are forks of its fork server: its grandchildren)."""
    table: dict[int, tuple[int, str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(stat.parent.name)] = (int(fields[1]), fields[0])
    found: dict[int, str] = {}
    frontier = {pid}
    while frontier:
        frontier = {p for p, (parent, _) in table.items() if parent in frontier} - set(found)
        found.update({p: table[p][1] for p in frontier})
    return found
