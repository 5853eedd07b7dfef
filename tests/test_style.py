"""The code's style, checked by the suite, so that CI (which runs only the README's test command)
checks it too: ``ruff check`` and ``ruff format --check`` on src, tests and benchmarks
(``pyproject.toml`` holds the rules: line length 100), and no docstring, comment or document that
cites an issue number instead of stating the fact."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = ["src", "tests", "benchmarks"]
#: The word issue (or Issue, issues) and a number after it, with or without ``#``: a reference
#: to the tracker where the fact it stands for belongs.
ISSUE = re.compile(r"\b[Ii]ssues? ?#?\d+")


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *CODE],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.processes
@pytest.mark.parametrize("args", [("check",), ("format", "--check")], ids=["check", "format"])
def test_ruff_finds_nothing(args: tuple[str, ...]) -> None:
    done = _ruff(*args)
    assert done.returncode == 0, (
        f"python -m ruff {' '.join(args)} {' '.join(CODE)} exited {done.returncode}:\n"
        f"{done.stdout}{done.stderr}"
    )


def test_no_text_cites_an_issue_number() -> None:
    files = [p for folder in (*CODE, "docs") for p in (ROOT / folder).rglob("*")
             if p.suffix in {".py", ".md"} and p.is_file()]  # fmt: skip
    files.append(ROOT / "README.md")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert not found, "state the fact instead of the issue number:\n" + "\n".join(found)
