"""``python gloo_stranger.py PORT NODES GENERATION``: a stranger who connects first to the sites'
gloo listeners, sending what a real peer sends (tests/security/test_sessions.py).

gloo's TCP transport (``gloo/transport/tcp``: ``context.cc``, ``device.cc``, ``listener.cc``) opens
a process group like this: every rank binds one listening socket (its *device*), and publishes in
the store, under ``<prefix>/0//cpu//0/<rank>``, a record of its host name, its device address
(a ``sockaddr_storage`` and a sequence number, 136 bytes) and one *pair identifier* per rank::

    u64 len(host) | host | u64 len(address) | address | i64 pair id of rank 0 | ... of rank N-1

For each pair of ranks the side with the larger address connects (``Device::isInitiator``) to the
other's listener and writes, as its first 8 bytes, the pair identifier that the listener published
for it (``Device::connectAsInitiator``). The listener matches the first connection that carries
an identifier to its pair (``Listener::haveConnection``); a later connection with the same
identifier is parked and never used. Nothing authenticates the connecting side.

This client reads each site's record from the store as it appears (the store is readable by
anyone who reaches it; a signed record under a roster is plain JSON with the value in base64),
connects to the site's listener once for every other rank, writes that rank's pair identifier,
and then stays silent. It prints ``connected RANK`` once it holds a connection for each of site
RANK's pair identifiers, and runs until it is killed.
"""

from __future__ import annotations

import base64
import datetime
import json
import socket
import struct
import sys
import time

import torch.distributed as dist


def address_record(raw: bytes) -> bytes:
    """The gloo record itself: ``raw``, or the base64 body of a signed envelope."""
    if raw.startswith(b'{"'):
        return base64.b64decode(json.loads(raw)["body"])
    return raw


def listener_and_ids(record: bytes) -> tuple[tuple[str, int], list[int]]:
    """The listening ``(ip, port)`` and the pair identifiers of one rank's gloo record."""
    (host_size,) = struct.unpack_from("<Q", record, 0)
    at = 8 + host_size
    (address_size,) = struct.unpack_from("<Q", record, at)
    address = record[at + 8 : at + 8 + address_size]
    at += 8 + address_size
    ids = list(struct.unpack_from(f"<{(len(record) - at) // 8}q", record, at))
    family = struct.unpack_from("<H", address, 0)[0]
    assert family == socket.AF_INET, "an IPv4 listener"
    port = struct.unpack_from(">H", address, 2)[0]
    ip = socket.inet_ntoa(address[4:8])
    return (ip, port), ids


def main() -> None:
    port, nodes, generation = (int(a) for a in sys.argv[1:4])
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60)
    )
    held: list[socket.socket] = []
    done: set[int] = set()
    while True:
        for rank in range(nodes):
            key = f"slate/pg{generation}/0//cpu//0/{rank}"
            if rank in done or not store.check([key]):
                continue
            (ip, listen_port), ids = listener_and_ids(address_record(store.get(key)))
            for peer in range(nodes):
                if peer == rank:
                    continue
                connection = socket.create_connection((ip, listen_port))
                connection.sendall(struct.pack("<q", ids[peer]))  # what rank `peer` would send
                held.append(connection)
            done.add(rank)
            print(f"connected {rank}", flush=True)
        time.sleep(0.005)


if __name__ == "__main__":
    main()
