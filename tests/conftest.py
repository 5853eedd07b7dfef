"""The suite's own rules, checked on every test, and how the test process leaves.

Processes. A test that starts an OS process (``python -m slate``, a launcher, torch.distributed
workers, a fork) carries the ``processes`` marker, so that ``python -m pytest -m "not
processes"`` is a quick inner loop that really starts none. An unmarked test that starts one
fails, naming itself: ``subprocess``'s child creation, ``os.fork`` and multiprocessing's
``fork_exec`` refuse for the test's duration. Fixtures wider than one test (module, session) are
set up before this check and may start processes; the tests that use them are marked too.
``ctypes.util.find_library`` (which runs ``ldconfig``; ``slate.cli.main`` asks it for libc) is
answered once per test process and remembered.

Workers. The suite runs on pytest-xdist workers with ``--dist loadgroup`` (pyproject.toml). A
test that uses a module-scoped fixture of its own module (a study, reference runs) joins an
``xdist_group`` named after the module, unless it names a group itself, so that the fixture is
made once, on one worker, and not once on each. A worker whose pytest drops xdist's group
suffix from the node ids (pytest 9.2 with pytest-xdist 3.8: every group would be spread over
both workers, and timing tests would run beside process-heavy ones) stops the suite at
collection, naming the cause.

Bytecode. Before any test (in the controller, before xdist's workers start), slate's own
modules are compiled to ``__pycache__`` (``compileall``): where ``PYTHONDONTWRITEBYTECODE`` is
set, as on the machines the suite runs on, every ``python -m slate`` a test starts would
otherwise compile them again (about 0.2 s of its 1.6 s start, over hundreds of starts).

Leaving. The process leaves the way a party process leaves
(``slate.training.party_process.exit_worker``): tests that run stores and heartbeats in this
process (membership, rendezvous) can leave a native ``torch.distributed`` thread inside a
blocking store call when the suite ends; the interpreter's normal shutdown then aborts with
"terminate called without an active exception" and turns a green run into exit code 134. Once
pytest has printed its summary, the process ends with ``os._exit`` and pytest's own exit status
instead, after flushing every stream the terminal report was written to (with output sent to a
file or a pipe, as in CI's log, the closing "N passed, M failed in S s" line must reach it:
``tests/test_ci_command.py``). An xdist worker is left to xdist, which must first send its
results to the controller.
"""

from __future__ import annotations

import _posixsubprocess
import ctypes.util
import functools
import gc
import os
import subprocess
import sys

import pytest

_STATUS: dict[str, int] = {}

ctypes.util.find_library = functools.cache(ctypes.util.find_library)
ctypes.util.find_library("c")


@pytest.fixture(autouse=True)
def _processes_are_marked(request, monkeypatch):
    """Fail an unmarked test that starts an OS process (see the module's docstring)."""
    if request.node.get_closest_marker("processes") is not None:
        yield
        return
    name = request.node.nodeid

    def refuse(*args, **kwargs):
        raise AssertionError(
            f"{name} starts an OS process but has no @pytest.mark.processes marker "
            '(python -m pytest -m "not processes" must start none)'
        )

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse)
    yield


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):
        return  # (the controller compiled them)
    import compileall

    import slate

    compileall.compile_dir(os.path.dirname(slate.__file__), quiet=1, workers=1)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """One worker for the tests that share a module-scoped fixture (see the docstring)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::")[0]
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d.scope == "module" and d.baseid == module for ds in defs for d in ds):
            item.add_marker(pytest.mark.xdist_group(module))


@pytest.hookimpl(tryfirst=True)  # before an xdist worker sends its collection
def pytest_collection_finish(session) -> None:
    """On an xdist worker under ``--dist loadgroup``, every grouped test's node id must carry
    its group (``...@group``): the controller groups by that suffix alone.

    Then the objects loaded so far (torch, slate, the collected tests: about 300 000) are frozen
    out of the garbage collector's reach (:func:`gc.freeze`): they live until the process ends,
    and every full collection during the tests would walk them again (measured on 911 in-process
    tests: 3.4 s of CPU in full collections on one worker, 1.9 s frozen)."""
    gc.freeze()
    config = session.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    lost = [i.nodeid for i in session.items
            if i.get_closest_marker("xdist_group") is not None and "@" not in i.nodeid]  # fmt: skip
    if lost:
        message = (
            f"pytest-xdist's --dist loadgroup cannot group with this pytest ({pytest.__version__}"
            f"): {len(lost)} grouped tests, such as {lost[0]}, have no '@group' in their node "
            "id, so module fixtures would be made on every worker and timing tests would run "
            "beside process-heavy ones. Install the pytest that pyproject.toml's test extra "
            "names (pip install -e '.[test]')."
        )
        print(f"\n{message}", file=sys.__stderr__, flush=True)  # (xdist shows no worker error)
        raise pytest.UsageError(message)


def pytest_sessionfinish(session, exitstatus) -> None:
    _STATUS["exit"] = int(exitstatus)


def pytest_unconfigure(config) -> None:
    if "exit" not in _STATUS or hasattr(config, "workerinput"):
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    streams = [sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__]
    if reporter is not None:
        reporter._tw.flush()  # the closing count line, written to a file or pipe too
        streams.append(reporter._tw._file)
    for stream in streams:
        if stream is not None and not stream.closed:
            stream.flush()
    os._exit(_STATUS["exit"])
