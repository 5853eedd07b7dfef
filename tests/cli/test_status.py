"""``slate status``: a stranger's record is not shown but counted, a site's signed record is
shown, and an address where no store answers gives status 1 within --timeout."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from slate.engines.distributed.control.site_status import SiteStatus, status_key
from slate.engines.distributed.control.store_records import Records
from slate.security import site_identity
from tests.sites import free_port, make_roster, read_until, serve, slate_here


@pytest.mark.processes
def test_a_strangers_record_is_counted_and_a_sites_signed_one_shown(tmp_path):
    roster = make_roster(tmp_path, 2)
    port = free_port()
    server = serve(port, "--roster", str(roster))
    try:
        read_until(server, "serving one run")
        store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
        stranger = SiteStatus(state="training", iteration=99, iterations=300, written=time.time())
        store.set(status_key(0), stranger.to_body())  # unsigned
        identity = site_identity(str(roster), str(tmp_path / "site1" / "site1.key"))
        signed = SiteStatus(state="training", iteration=40, iterations=300, pooled_ap=0.5,
                            written=time.time())  # fmt: skip
        Records(store, 2, identity).put(status_key(1), signed.to_body())
        shown = slate_here("status", f"127.0.0.1:{port}", "--roster", str(roster))
    finally:
        server.kill()
        server.communicate()
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1].split()[:3] == ["0", "site0", "not"]  # (not seen)
    assert lines[2].split()[:4] == ["1", "site1", "training", "40/300"]
    assert "0.5000" in lines[2] and "99" not in shown.stdout
    assert lines[-1] == "1 records ignored: not signed by a roster site"


def test_no_store_gives_status_1_within_the_timeout():
    port = free_port()
    start = time.monotonic()
    shown = slate_here("status", f"127.0.0.1:{port}", "--timeout", "1")
    assert shown.returncode == 1
    assert time.monotonic() - start < 5
    assert "could not reach the rendezvous store" in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1
