"""Leave the test process the way a party process leaves
(``slate.training.party_process.exit_worker``).

Tests that run stores and heartbeats in this process (membership, rendezvous) can leave a native
``torch.distributed`` thread inside a blocking store call when the suite ends; the interpreter's
normal shutdown then aborts with "terminate called without an active exception" and turns a
green run into exit code 134. Once pytest has printed its summary, the process ends with
``os._exit`` and pytest's own exit status instead.
"""

from __future__ import annotations

import os
import sys

_STATUS: dict[str, int] = {}


def pytest_sessionfinish(session, exitstatus) -> None:
    _STATUS["exit"] = int(exitstatus)


def pytest_unconfigure(config) -> None:
    if "exit" not in _STATUS:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_STATUS["exit"])
