"""After a site is lost mid-run, the survivors' closing ``test AP`` line and their
``summary.json`` say which sites' test rows the AP covers (a lost site's rows leave with it)."""

from __future__ import annotations

import json
import re
import signal
import sys

import pytest

from tests.sites import HAVE_W7A, SITE_FLAGS, finish, free_port, start_party, write_sites

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo on Linux")

COVERS = "over the test rows of sites 0, 1 (site 2 lost at iteration 40)"


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
def test_the_survivors_name_the_sites_their_test_ap_covers(tmp_path):
    """Three ``--rank`` sites (party 0 hosts the store); site 2 SIGKILLs itself before step 40
    and the other two continue."""
    write_sites(tmp_path, parties=3, rows=200)
    port = free_port()
    flags = ["--nodes", "3", "--iterations", "100", "--on-party-loss", "continue", *SITE_FLAGS]
    parties = [start_party(tmp_path, r, port, *flags, kill="2@40") for r in range(3)]
    done = finish(parties, timeout=180)
    assert done[2][0] == -signal.SIGKILL
    for rank in (0, 1):
        code, said = done[rank]
        assert code == 0 and "Traceback" not in said, said
        result = json.loads((tmp_path / f"site{rank}" / "run" / "summary.json").read_text())
        assert result["test_ap_sites"] == [0, 1]
        assert result["test_ap_coverage"] == COVERS
        prefix = "" if rank == 0 else f"party {rank}: "
        line = next(s for s in said.splitlines() if "test AP " in s)
        assert re.fullmatch(
            rf"{prefix}test AP {result['test_ap']:.4f} \(\+-\S+, federated\) {re.escape(COVERS)}"
            rf"  AUROC {result['test_auroc']:.4f}  in \d+\.\d s",
            line,
        ), line
