"""CI runs the README's test command: ``.ci/run``'s install-and-test line is the README's, with
only ``--durations=30`` added (the slowest tests, in CI's log)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest'


def test_ci_runs_the_readme_test_command_with_durations():
    readme = [line for line in (ROOT / "README.md").read_text().splitlines() if "pytest" in line]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert COMMAND in readme
    assert ci == [f"{COMMAND} --durations=30"]
