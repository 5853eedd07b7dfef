"""Starting the distributed engine: N local processes, or one process of a torchrun launch.

``slate train --engine distributed --nodes N`` (no torchrun variables set) is the *launcher*: it
hosts the rendezvous store on the loopback interface only, starts N copies of the same command
with ``RANK`` / ``WORLD_SIZE`` set, waits for all of them and exits with the worst exit code.
Each copy is a *worker*: it joins the process group and runs :func:`slate.train.train` with
:class:`~slate.engines.distributed.DistributedEngine`. Under ``torchrun`` the processes are
workers directly and use torchrun's rendezvous (``MASTER_ADDR`` / ``MASTER_PORT``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence

import torch.distributed as dist

from slate.errors import ConfigError

__all__ = [
    "in_worker",
    "join_rendezvous",
    "launch_local",
    "parse_rendezvous",
    "worker_process_group",
]

STORE_PORT_ENV = "SLATE_STORE_PORT"


def in_worker() -> bool:
    """True inside a process started by the launcher or by torchrun."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _loopback_listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    return sock


def launch_local(argv: Sequence[str], nodes: int, timeout_s: float) -> int:
    """Run ``python -m slate <argv>`` as ``nodes`` worker processes on this machine."""
    if nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, got {nodes}.")
    listener = _loopback_listener()
    port = listener.getsockname()[1]
    # The store takes over the socket, which listens on 127.0.0.1 only.
    store = dist.TCPStore(
        "127.0.0.1", port, nodes + 1, True, timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False, master_listen_fd=listener.detach(), use_libuv=True,
    )  # fmt: skip
    env = {**os.environ, "WORLD_SIZE": str(nodes), STORE_PORT_ENV: str(port)}
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's own sockets on loopback too
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "slate", *argv],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
        )
        for rank in range(nodes)
    ]
    try:
        codes = [w.wait() for w in workers]
    except KeyboardInterrupt:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGINT)
        codes = [w.wait() for w in workers]
    del store
    return _worst(codes)


def _worst(codes: list[int]) -> int:
    """The largest exit status, a death by signal k counting as 128 + k (as in a shell)."""
    return max(128 - c if c < 0 else c for c in codes)


def worker_process_group(backend: str, timeout_s: float) -> None:
    """Join the process group as rank ``RANK`` of ``WORLD_SIZE``."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=timeout_s)
    port = os.environ.get(STORE_PORT_ENV)
    if port is None:  # torchrun: MASTER_ADDR / MASTER_PORT
        dist.init_process_group(backend, timeout=timeout)
        return
    store = dist.TCPStore("127.0.0.1", int(port), world + 1, False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def parse_rendezvous(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6address]:PORT`` for IPv6) to ``(host, port)``."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"--rendezvous {text!r} is not HOST:PORT (for example 10.0.0.5:29500, or "
            "[::1]:29500); the port must lie in 1..65535."
        )
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


INSECURE_WARNING = (
    "warning: the rendezvous {host}:{port} is not a loopback address. torch.distributed sends "
    "parameters and counts unauthenticated and unencrypted: connect sites outside one trusted "
    "network through a VPN or SSH tunnels (docs/deployment.md)."
)


def join_rendezvous(
    backend: str, rank: int, world: int, rendezvous: str, timeout_s: float, warn=print
) -> None:
    """Join the process group as party ``rank`` of ``world`` at ``HOST:PORT``.

    Party 0 hosts torch's TCPStore there; the others connect to it. gloo's own sockets stay on
    the loopback interface when the rendezvous is a loopback address.
    """
    host, port = parse_rendezvous(rendezvous)
    if is_loopback(host):
        if sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    else:
        warn(INSECURE_WARNING.format(host=host, port=port))
    address = f"[{host}]" if ":" in host else host
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
