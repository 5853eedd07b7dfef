"""Every ``python -m slate`` process (the suite starts about a hundred) pays for what it imports:
scikit-learn costs about 2 s, matplotlib 0.5 s and ``torch._dynamo`` 1 s on a 2-core machine.
The command line and a LIBSVM run load none of them before they are needed: scikit-learn is
imported by the first stratified split (or the digits dataset), matplotlib by the first figure,
and a run with ``--no-plots`` draws none.

One fresh interpreter, because this test process has imported everything already.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.sites import HAVE_W7A, write_sites

pytestmark = pytest.mark.processes

HEAVY = ("sklearn", "matplotlib", "scipy", "torch._dynamo")

PROGRAM = """
import sys
HEAVY = {heavy!r}

def loaded():
    return sorted(h for h in HEAVY if h in sys.modules)

from slate.cli import main
from slate.cli.parser import build_parser
import slate.data.datasets, slate.data.readers.libsvm, slate.engines.distributed.control.launch
import slate.inference.predict, slate.training.loop, slate.training.outputs

build_parser()
print("after import:", loaded())
assert main([
    "train", "--train", "train.svm", "--test", "test.svm", "--dataset", "libsvm",
    "--features", "300", "--nodes", "2", "--iterations", "20", "--eval-every", "10",
    "--no-progress", "--no-plots", "--out", "bare",
]) == 0
print("after train --no-plots:", loaded())
assert main([
    "train", "--train", "train.svm", "--test", "test.svm", "--dataset", "libsvm",
    "--features", "300", "--nodes", "2", "--iterations", "20", "--eval-every", "10",
    "--no-progress", "--out", "run",
]) == 0
print("after train:", loaded())
"""


@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
def test_the_command_line_and_a_libsvm_run_load_heavy_modules_only_when_used(tmp_path):
    write_sites(tmp_path, parties=1, rows=400)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(heavy=HEAVY)],
        cwd=tmp_path / "site0", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("after")]
    # The run's figures are the one use: matplotlib, and nothing else heavy; none without them.
    assert lines == [
        "after import: []", "after train --no-plots: []", "after train: ['matplotlib']",
    ], done.stdout  # fmt: skip
    assert (tmp_path / "site0" / "run" / "pr_curve.png").stat().st_size > 0
    assert not list((tmp_path / "site0" / "bare").glob("*.png"))
