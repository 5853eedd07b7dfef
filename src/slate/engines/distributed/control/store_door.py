"""A site's first connection to the rendezvous store, bounded by its ``--timeout``.

torch's ``TCPStore`` client retries a refused connection after its whole timeout (about twice
``--timeout`` in all), and waits without end for the answer to its first message when the
address is held by a server of another protocol (an HTTP server reads that message as the
start of a request line). So a site first probes the address with a plain socket, again and
again until ``--timeout`` ends while nothing listens there, and only then opens the store, on a
daemon thread that is abandoned at the deadline. The transport stays torch's: the probe sends
nothing.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
from typing import Any

import torch.distributed as dist

from slate.errors import ConfigError

__all__ = ["PROBE_INTERVAL_S", "STORE_GRACE_S", "join_store", "reach_store"]

#: Seconds between two probes of an address where nothing listens yet.
PROBE_INTERVAL_S = 0.25
#: The least time the store's own connection gets after a probe that connected late.
STORE_GRACE_S = 2.0

_FINISHED_NOTE = (
    "(A run that has finished takes its rendezvous with it: a party restarted with --resume "
    "then has nothing to rejoin.)"
)


def join_store(host: str, port: int, timeout_s: float, rank: int, rendezvous: str) -> Any:
    """A client of the rendezvous store at ``host:port`` (``rendezvous`` as the site gave it),
    or one paragraph (:class:`ConfigError`) when none answers within ``timeout_s``: nothing
    listening there, or something that does not speak the store's protocol."""
    deadline = time.monotonic() + timeout_s
    refused = _probe_until(host, port, deadline)
    if refused is not None:
        raise ConfigError(_nothing_listening(rank, rendezvous, host, port, timeout_s, refused))
    last_chance = max(deadline, time.monotonic() + STORE_GRACE_S)
    store, error = _store_within(host, port, timeout_s, last_chance)
    if store is None:
        raise ConfigError(_not_a_store(rank, rendezvous, timeout_s, error))
    return store


def reach_store(host: str, port: int, timeout_s: float) -> tuple[Any | None, str]:
    """A client of the store at ``host:port`` within ``timeout_s`` (as :func:`join_store`), or
    None and why not: ``"nothing is listening there (...)"`` or ``"... does not speak ..."``."""
    deadline = time.monotonic() + timeout_s
    refused = _probe_until(host, port, deadline)
    if refused is not None:
        return None, f"nothing is listening there (the last attempt: {refused})"
    last_chance = max(deadline, time.monotonic() + 1.0)
    store, error = _store_within(host, port, timeout_s, last_chance, register=False)
    if store is None:
        return None, f"something is listening there, but it does not answer as a store ({error})"
    return store, ""


def _probe_until(host: str, port: int, deadline: float) -> str | None:
    """None once a plain TCP connection to ``host:port`` is accepted before ``deadline``; else
    why the last attempt failed."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "no connection was accepted"
        try:
            with socket.create_connection((host, port), timeout=min(left, 5.0)):
                return None
        except OSError as err:
            reason = err.strerror or type(err).__name__
        time.sleep(min(PROBE_INTERVAL_S, max(0.0, deadline - time.monotonic())))
        if time.monotonic() >= deadline:
            return reason


def _store_within(
    host: str, port: int, timeout_s: float, deadline: float, register: bool = True
) -> tuple[Any | None, str]:
    """torch's store client, opened on a daemon thread and given up at ``deadline`` (the thread
    is left behind, blocked in torch's connect, and ends with the process); the client keeps
    ``timeout_s`` as its timeout for every later operation. Without ``register`` it does not
    add itself to the store's count of workers (it writes nothing)."""
    result: dict[str, Any] = {}

    def connect() -> None:
        try:
            result["store"] = dist.TCPStore(
                host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s),
                wait_for_workers=register,
            )  # fmt: skip
        except Exception as err:  # (reported by the caller, in one paragraph)
            result["error"] = str(err).splitlines()[0][:160] if str(err) else type(err).__name__

    thread = threading.Thread(target=connect, name="slate-store-connect", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if "store" in result:
        return result["store"], ""
    return None, result.get("error", "no valid answer to the store's first message")


def _nothing_listening(
    rank: int, rendezvous: str, host: str, port: int, timeout_s: float, reason: str
) -> str:
    return (
        f"Party {rank} could not reach the rendezvous store at {rendezvous} within --timeout "
        f"{timeout_s:g} s: nothing is listening there (the last attempt: {reason}). Check that "
        "the rendezvous is running and that the address is right: party 0 hosts it without "
        f"--external-store (start it with the same --rendezvous); with --external-store, run "
        f"'slate rendezvous --port {port}' on {host}. Check too that no firewall between this "
        f"machine and {host} drops the port. {_FINISHED_NOTE}"
    )


def _not_a_store(rank: int, rendezvous: str, timeout_s: float, error: str) -> str:
    return (
        f"Party {rank} could not reach the rendezvous store at {rendezvous} within --timeout "
        f"{timeout_s:g} s: something is listening there, but it does not speak the rendezvous "
        f"protocol (torch.distributed's TCPStore) ({error}). Check the port: another program "
        "(a web server, say) may hold it, or the address may name the wrong machine; the "
        "rendezvous is party 0 (without --external-store) or 'slate rendezvous' (with it), "
        "listening on the --rendezvous address every site gives."
    )
