"""keep_freed_memory: glibc's thresholds are raised in the process that asks, and only there."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from slate.cli import memory


@pytest.mark.processes
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="mallopt is glibc's",
)
def test_glibc_accepts_the_thresholds() -> None:
    code = "from slate.cli.memory import keep_freed_memory; print(keep_freed_memory())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"


def test_other_platforms_are_left_alone(monkeypatch) -> None:
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert memory.keep_freed_memory() is False


@pytest.mark.processes
def test_importing_slate_changes_nothing() -> None:
    """The setting is the CLI's choice: importing the library never calls mallopt."""
    code = (
        "import ctypes\n"
        "calls = []\n"
        "class Spy(ctypes.CDLL):\n"
        "    def __getattr__(self, name):\n"
        "        calls.append(name)\n"
        "        return super().__getattr__(name)\n"
        "ctypes.CDLL = Spy\n"
        "import slate, slate.training.loop, slate.cli, slate.cli.memory\n"
        "print('mallopt' in calls)\n"
        "slate.cli.memory.keep_freed_memory()\n"
        "print('mallopt' in calls)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported, called = done.stdout.split()
    assert imported == "False"
    assert called == str(sys.platform.startswith("linux"))
