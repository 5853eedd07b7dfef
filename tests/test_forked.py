"""A forked ``python ...`` (tests/forked.py) ends, prints and reads as the fresh interpreter
does: each program below runs both ways and must give the same exit status and output."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests import forked

pytestmark = pytest.mark.processes

PROGRAMS = {
    "prints": "import sys; print('out', sys.argv[1:]); print('err', file=sys.stderr)",
    "exits 3": "import sys; sys.exit(3)",
    "exits with text": "import sys; sys.exit('bye')",
    "raises": "raise ValueError('boom')",
    "interrupted": "raise KeyboardInterrupt",
    "environment and folder": "import os; print(os.environ['FORKED_TEST'], os.getcwd())",
    "carriage returns": "import sys; sys.stderr.write('a\\rb\\r\\nc\\n')",
    "atexit": "import atexit; atexit.register(lambda: print('at exit'))",
    "reads stdin": "import sys; print(sys.stdin.readline().upper())",
    "no stdin": "import sys; print(repr(sys.stdin.read()))",
}


def _fresh(code: str, cwd, env, stdin) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-c", code, "a b", "c"], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60,
                          stdin=None if stdin is not None else subprocess.DEVNULL)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def _forked(code: str, cwd, env, stdin) -> tuple[int, str, str]:
    process = forked.popen([sys.executable, "-c", code, "a b", "c"], cwd=cwd, env=env,
                           stdin=subprocess.PIPE if stdin is not None else None)  # fmt: skip
    out, err = process.communicate(stdin, timeout=60)
    return process.returncode, out, err  # type: ignore[return-value]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_forked_program_ends_and_prints_as_a_fresh_interpreter(tmp_path, name):
    env = {**forked.os.environ, "FORKED_TEST": "set here"}
    stdin = "hello\n" if name == "reads stdin" else None
    fresh = _fresh(PROGRAMS[name], tmp_path, env, stdin)
    fork = _forked(PROGRAMS[name], tmp_path, env, stdin)
    assert fork[0] == fresh[0]
    assert fork[1] == fresh[1]
    # a traceback names the file: "<string>" both ways, the frames above it differ
    assert fork[2].splitlines()[-1:] == fresh[2].splitlines()[-1:]


def test_a_module_runs_as_python_m_runs_it(tmp_path):
    process = forked.popen([sys.executable, "-m", "slate", "--version"], cwd=tmp_path)
    out, err = process.communicate(timeout=60)
    fresh = subprocess.run([sys.executable, "-m", "slate", "--version"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (process.returncode, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_killed_fork_reports_the_signal_and_keeps_what_it_printed(tmp_path):
    code = "import time; print('started', flush=True); time.sleep(60)"
    process = forked.popen([sys.executable, "-c", code], cwd=tmp_path)
    assert process.stdout.readline() == "started\n"
    with pytest.raises(subprocess.TimeoutExpired):
        process.communicate(timeout=0.2)
    assert process.poll() is None
    process.send_signal(signal.SIGKILL)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert out == ""  # (the line read above is not read twice)


def test_a_new_session_is_its_own_process_group(tmp_path):
    code = "import os, time; print(os.getpgid(0) == os.getpid(), flush=True); time.sleep(60)"
    process = forked.popen([sys.executable, "-c", code], cwd=tmp_path, start_new_session=True)
    assert process.stdout.readline() == "True\n"
    forked.os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.returncode == -signal.SIGTERM


def test_other_cpu_kernels_or_threads_need_a_fresh_interpreter():
    """The server imported torch under this process's settings: a command asking for others
    (``ATEN_CPU_CAPABILITY``, ``OMP_NUM_THREADS``) cannot be a fork of it."""
    command = [sys.executable, "-m", "slate"]
    here = dict(forked.os.environ)
    assert forked.forkable(command, here)
    assert forked.forkable(command, {**here, "SLATE_ATTACK": "x", "PYTHONUNBUFFERED": "1"})
    assert not forked.forkable(command, {**here, "ATEN_CPU_CAPABILITY": "default"})
    assert not forked.forkable(command, {**here, "OMP_NUM_THREADS": "1"})
    assert not forked.forkable([sys.executable, "script.py"], here)


#: A launcher's start of one worker (``slate topology --help``, started by the product's own
#: code), then its exit code and whether this process started a server of its own.
LAUNCHER = """
import multiprocessing.forkserver as server, os
from slate.engines.distributed.control import workers
worker, = workers.start_workers(["topology", "--help"], [dict(os.environ)])
code = worker.wait()
print("exit", code, "own server", server._forkserver._forkserver_pid is not None, flush=True)
"""


def test_a_forked_launchers_workers_run_as_its_own_servers_would(tmp_path):
    """A launcher's workers are forked by this test process's server (no second server importing
    torch again), except in a session of its own, where the launcher starts its own server as a
    fresh launcher does (the product's path); either way a worker's output reaches the
    launcher's pipes, the same."""
    outputs = {}
    for session in (False, True):
        process = forked.popen([sys.executable, "-c", LAUNCHER], cwd=tmp_path,
                               start_new_session=session)  # fmt: skip
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        outputs[session] = out.splitlines()
    *lent_output, lent_summary = outputs[False]
    *own_output, own_summary = outputs[True]
    assert lent_output == own_output and "usage: slate topology" in lent_output[0]
    assert (lent_summary, own_summary) == ("exit 0 own server False", "exit 0 own server True")


FROZEN = """
import multiprocessing
from slate.engines.distributed.control import workers
context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(workers.preloaded())
probe = "import gc, os; os._exit(0 if gc.get_freeze_count() > 100_000 else 3)"
process = context.Process(target=exec, args=(probe,))
process.start()
process.join()
print("exit", process.exitcode, flush=True)
"""


def test_a_launchers_workers_start_with_the_preloaded_objects_frozen(tmp_path):
    """The launcher's fork server freezes what it preloaded (``control/fork_server.py``): a
    worker's collections skip torch's and slate's objects, so they neither cost a walk over them
    nor copy their pages from the server. A fresh launcher's own server (a session of its own,
    the product's path) forks a probe that exits 0 only when over 100 000 objects came frozen."""
    process = forked.popen([sys.executable, "-c", FROZEN], cwd=tmp_path, start_new_session=True)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert out.splitlines()[-1] == "exit 0", out
