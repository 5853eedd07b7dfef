"""The numerically sensitive tests, again under another choice of CPU kernels.

A CPU's instruction set decides which kernels torch and MKL run (SSE4.2, AVX2, AVX-512, AMX),
and so the order in which float sums are taken. A test that claims equality across engines,
batch shapes or chunkings, or agreement with a reference at a tight tolerance, carries the
``kernels`` marker; here those tests run in a fresh ``python -m pytest`` with ATen's vector
kernels off (``ATEN_CPU_CAPABILITY=default``) and MKL held to SSE4.2
(``MKL_ENABLE_INSTRUCTIONS=SSE4_2``). A claim that holds only on one CPU's kernels fails here,
on any machine, and not first on a user's (docs/testing.md, "Exact and bounded claims").
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
OTHER_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
FEWEST = 10  # the marked tests that must run there: a marker lost from the suite fails here


@pytest.mark.kernels
def test_the_kernel_choice_is_in_force():
    """Under ``ATEN_CPU_CAPABILITY=default`` torch runs its scalar kernels (the rerun below
    reaches this test too, and so checks that its setting took effect)."""
    wanted = os.environ.get("ATEN_CPU_CAPABILITY")
    capability = torch.backends.cpu.get_cpu_capability()
    assert capability == (wanted.upper() if wanted else capability)
    if wanted is None:
        assert capability in {"DEFAULT", "VSX", "ZVECTOR", "AVX2", "AVX512", "SVE256", "SVE128"}


def marked_files() -> list[str]:
    """The test files that mark a test ``kernels`` (``pytest.mark.kernels``, ``@mark.kernels``):
    the rerun collects these, not the whole suite (collecting every test file took about half
    of its time). Every file of a test this session collected with the marker is among them
    (checked below: in the whole suite's run, that is every marked test)."""
    marker = re.compile(r"\bmark\.kernels\b")
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                  if marker.search(path.read_text()))  # fmt: skip


@pytest.mark.processes
def test_the_sensitive_tests_pass_under_other_kernels(request):
    files = marked_files()
    collected = {item.nodeid.split("::")[0] for item in request.session.items
                 if item.get_closest_marker("kernels") is not None}  # fmt: skip
    assert collected <= set(files), collected - set(files)
    env = {**os.environ, **OTHER_KERNELS}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "kernels and not processes", "-n", "0",
         "-p", "no:cacheprovider", *files],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    counts = re.search(r"^(\d+) passed\b.* in [\d.]+s", done.stdout, re.MULTILINE)
    assert counts is not None, tail  # the closing count line (tests/conftest.py prints it)
    assert int(counts.group(1)) >= FEWEST, tail
