"""Native output of a party process goes to its debug log; Python's stderr stays on the terminal."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.processes
def test_native_writes_go_to_the_log_and_python_messages_stay(tmp_path):
    program = (
        "import os, sys; from pathlib import Path;"
        "from slate.engines.distributed.control.debug_log import send_native_stderr_to;"
        f"path = send_native_stderr_to(Path({str(tmp_path / 'run')!r}), 3);"
        "os.write(2, b'[W native] hostname of the client socket cannot be retrieved\\n');"
        "print('slate: error: one paragraph', file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "slate: error: one paragraph\n"
    log = (tmp_path / "run" / "debug-rank3.log").read_text()
    assert "hostname of the client socket" in log and "one paragraph" not in log


def test_the_launcher_names_the_log_of_a_party_killed_by_a_signal(capsys):
    from slate.engines.distributed.control.launch import _report_abnormal_ends

    _report_abnormal_ends([0, -9, 2, -6], ["a.log", "b.log", "c.log", "d.log"])
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "slate: party 1 ended with signal SIGKILL; its native messages are in b.log.",
        "slate: party 3 ended with signal SIGABRT; its native messages are in d.log.",
    ]
