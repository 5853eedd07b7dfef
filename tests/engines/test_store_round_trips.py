"""The store round trips of a site's set-up and teardown do not grow with the number of sites.

Every call a site makes to the rendezvous store on its main thread (and on the thread where gloo
reads the addresses) waits for the store, so over a wide-area link each round trip costs an RTT.
Measured with torch's ``TCPStore`` (80 ms RTT, docs/wan.md), a call costs these round trips:
``connect`` 2, ``check`` 1, ``get`` 2 (it waits for the key first), ``add`` 1, ``multi_get`` 2
(likewise), ``compare_set`` 1, ``wait`` 1 (plus the time it waits), ``set`` 0 (no answer is
awaited: the next call's answer comes after it on the same connection).

Real processes (one per site, each running :class:`DistributedEngine.open` and ``leave`` against a
real ``TCPStore``, with every call counted by ``store_calls_worker.py``, run as a fork of the
server of tests/forked.py: :func:`tests.sites.script`), for N = 2 and N = 4, plain
and under a roster (sealed).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch.distributed as dist

from slate.engines.distributed.control import session
from tests.sites import free_port, make_roster, script, start

WORKER = Path(__file__).with_name("store_calls_worker.py")
ROUND_TRIPS = {"connect": 2, "check": 1, "get": 2, "add": 1, "multi_get": 2, "compare_set": 1,
               "wait": 1, "set": 0, "multi_set": 0, "delete_key": 1, "num_keys": 1}  # fmt: skip


#: Round trips a late site may add by polling (a wait that timed out, a record read again).
POLLS = 8


def round_trips(calls: list[str]) -> int:
    return sum(ROUND_TRIPS[call] for call in calls)


def site_calls(root: Path, nodes: int, sealed: bool) -> list[dict[str, list[str]]]:
    """Every site's counted calls, from a run of ``nodes`` sites at a fresh store (under a
    roster of theirs when ``sealed``)."""
    root = root / f"n{nodes}"
    root.mkdir(parents=True, exist_ok=True)
    roster = make_roster(root, nodes) if sealed else None
    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, nodes + 1, True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))  # fmt: skip
    session.publish_store_nonce(host)  # as 'slate rendezvous' does when it opens
    outs = [root / f"rank{r}.json" for r in range(nodes)]
    workers = []
    for r in range(nodes):
        identity = [str(roster), str(root / f"site{r}" / f"site{r}.key")] if roster else []
        # (forked from the preloaded server: what it counts is the site's calls, not its start)
        workers.append(start(script(WORKER, port, r, nodes, outs[r], *identity)))
    errors = [w.communicate(timeout=120)[1] for w in workers]
    assert [w.returncode for w in workers] == [0] * nodes, errors
    del host
    return [json.loads(out.read_text()) for out in outs]


@pytest.mark.processes
@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_set_up_and_teardown_round_trips_are_the_same_for_2_and_4_sites(tmp_path, sealed):
    small, large = (site_calls(tmp_path, n, sealed) for n in (2, 4))
    for phase in ("set_up", "teardown"):
        costs = {n: [round_trips(site[phase]) for site in sites]
                 for n, sites in ((2, small), (4, large))}  # fmt: skip
        # The same at 4 sites as at 2 for a site that never waits twice (the cheapest: party 0
        # writes the final members at no round trip); a site that starts while the others are
        # still starting may poll a few more times on a loaded machine, a cost that does not
        # depend on N (a read per member would add 3 per member to every site, the cheapest too).
        assert min(costs[2]) == min(costs[4]), (phase, costs, small, large)
        assert max(costs[2] + costs[4]) <= min(costs[2]) + POLLS, (phase, costs, small, large)
    set_up = round_trips(large[0]["set_up"])
    assert set_up <= (30 if sealed else 20), large[0]["set_up"]
