"""CI runs the README's test command: ``.ci/run``'s install-and-test line is the README's, with
only ``--durations=30`` added (the slowest tests, in CI's log)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest'


def test_ci_runs_the_readme_test_command_with_durations():
    readme = [line for line in (ROOT / "README.md").read_text().splitlines() if "pytest" in line]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert COMMAND in readme
    assert ci == [f"{COMMAND} --durations=30"]


FAILING = """
def test_fails():
    assert 1 == 2


def test_passes():
    pass
"""


@pytest.mark.processes
def test_the_closing_count_line_reaches_a_log_file(tmp_path):
    """``python -m pytest > log 2>&1`` with a failure: the log ends with the count line, though
    the suite's process leaves by ``os._exit`` (tests/conftest.py), on two xdist workers as the
    README's command runs. Hypothesis's pytest plugin, which these two tests do not use, is left
    out (``-p no:hypothesispytest``): importing it took about half of the three processes' CPU."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_probe.py").write_text(FAILING)
    log = tmp_path / "log"
    with open(log, "w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
             "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
             str(tmp_path)],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    lines = log.read_text().strip().splitlines()
    assert done.returncode == 1, lines[-20:]
    assert "short test summary info" in "\n".join(lines)
    assert re.fullmatch(r"1 failed, 1 passed in [\d.]+s", lines[-1]), lines[-5:]
