"""One site's set-up and teardown of the distributed engine with every store call counted:
``python tests/engines/store_calls_worker.py PORT RANK N OUT [ROSTER KEY]``.

It opens :class:`~slate.engines.distributed.engine.DistributedEngine` as a ``--rank`` site does
(``--on-party-loss continue``, the store outside the sites), then leaves at once
(:meth:`~slate.engines.distributed.engine.DistributedEngine.leave`), and writes to OUT (JSON)
every call the site made to its store connection on its main thread and on the thread that
opens the process group (gloo reads the addresses there), in order. The heartbeat, the lookout
and the roster look use connections of their own, on their own threads, and are not counted.
"""

from __future__ import annotations

import datetime
import json
import sys
import threading

import torch
import torch.distributed as dist

from slate.engines.distributed.control.rendezvous import Rendezvous
from slate.engines.distributed.engine import DistributedEngine
from slate.security.identity import site_identity

COUNTED_THREADS = ("MainThread", "slate-open-group")


class CountingStore(dist.Store):
    """A store that forwards every call to ``inner`` and records its name, on the counted
    threads only."""

    def __init__(self, inner: dist.Store, calls: list[str]) -> None:
        super().__init__()
        self.inner, self.calls = inner, calls

    def _note(self, name: str) -> None:
        if threading.current_thread().name in COUNTED_THREADS:
            self.calls.append(name)

    def set(self, key, value):
        self._note("set")
        self.inner.set(key, value)

    def get(self, key):
        self._note("get")
        return self.inner.get(key)

    def add(self, key, amount):
        self._note("add")
        return self.inner.add(key, amount)

    def compare_set(self, key, expected, desired):
        self._note("compare_set")
        return self.inner.compare_set(key, expected, desired)

    def wait(self, keys, timeout=None):
        self._note("wait")
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys):
        self._note("check")
        return self.inner.check(keys)

    def multi_get(self, keys):
        self._note("multi_get")
        return self.inner.multi_get(keys)

    @property
    def timeout(self):
        return self.inner.timeout

    def multi_set(self, keys, values):
        self._note("multi_set")
        return self.inner.multi_set(keys, values)

    def delete_key(self, key):
        self._note("delete_key")
        return self.inner.delete_key(key)

    def num_keys(self):
        self._note("num_keys")
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        self.inner.set_timeout(timeout)


def main() -> None:
    port, rank, nodes, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    identity = site_identity(sys.argv[5], sys.argv[6], rank, nodes) if len(sys.argv) > 6 else None

    def connect() -> dist.TCPStore:
        return dist.TCPStore("127.0.0.1", port, is_master=False,
                             timeout=datetime.timedelta(seconds=60))  # fmt: skip

    calls = ["connect"]
    store = CountingStore(connect(), calls)
    rendezvous = Rendezvous(store, connect, rank, nodes, outside=True, identity=identity)
    engine = DistributedEngine.open(torch.device("cpu"), rendezvous, 60.0, True, "gloo")
    set_up = len(calls)
    engine.leave()
    with open(out, "w") as handle:
        json.dump({"set_up": calls[:set_up], "teardown": calls[set_up:]}, handle)
    sys.stdout.flush()
    import os

    os._exit(0)  # (gloo's threads: as the CLI leaves)


if __name__ == "__main__":
    main()
