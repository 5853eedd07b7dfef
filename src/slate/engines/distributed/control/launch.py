"""Starting the distributed engine: N local processes, or one process of a torchrun launch.

``slate train --engine distributed --nodes N`` (no torchrun variables set) is the *launcher*: it
hosts the rendezvous store on the loopback interface only, starts N copies of the same command
with ``RANK`` / ``WORLD_SIZE`` set (forked from a server that loaded slate once:
:mod:`~slate.engines.distributed.control.workers`), waits for all of them and exits with the
worst exit code. Each copy is a *worker*: it joins the process group and runs
:func:`slate.training.loop.train` with
:class:`~slate.engines.distributed.engine.DistributedEngine`. Under ``torchrun`` the processes are
workers directly and use torchrun's rendezvous (``MASTER_ADDR`` / ``MASTER_PORT``).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch.distributed as dist

from slate.engines.distributed.control import session
from slate.engines.distributed.control.liveness import (
    BEATS_KEY,
    FINAL_MEMBERS_KEY,
    LEFT_KEY,
    SEEN_KEY,
    final_ranks,
    has_left,
    registered_process,
    signed_beats,
)
from slate.engines.distributed.control.rendezvous import Rendezvous
from slate.engines.distributed.control.site_view import MembershipEvents
from slate.engines.distributed.control.store_door import join_store
from slate.engines.distributed.control.store_records import Records, read_within
from slate.engines.distributed.control.workers import Worker, start_workers
from slate.errors import ConfigError, parties_text, per_party_text
from slate.security.identity import SiteIdentity
from slate.security.roster import Roster

__all__ = [
    "in_worker",
    "launch_local",
    "parse_rendezvous",
    "party_rendezvous",
    "serve_rendezvous",
    "worker_rendezvous",
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


def launch_local(
    argv: Sequence[str], nodes: int, timeout_s: float, logs: Sequence[str] = ()
) -> int:
    """Run ``python -m slate <argv>`` as ``nodes`` worker processes on this machine; ``logs``
    names each party's debug log (:mod:`slate.engines.distributed.control.debug_log`), pointed to
    when a party dies."""
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
    sys.stdout.flush()  # (the workers write to the same stdout and stderr)
    sys.stderr.flush()
    workers = start_workers(
        argv, [{**env, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(nodes)]
    )
    with _forwarding_stop_signals(workers):
        codes = [w.wait() for w in workers]
    finished = bool(store.check([FINAL_MEMBERS_KEY]))
    del store
    _report_abnormal_ends(codes, logs)
    return _exit_code(codes, finished)


def _report_abnormal_ends(codes: list[int], logs: Sequence[str]) -> None:
    """One line per party killed by a signal (SIGKILL, or SIGABRT from native code), naming
    where its native messages went."""
    for rank, code in enumerate(codes):
        if code >= 0:
            continue
        how = f"signal {signal.Signals(-code).name}"
        where = f"; its native messages are in {logs[rank]}" if rank < len(logs) else ""
        print(f"slate: party {rank} ended with {how}{where}.", file=sys.stderr)


@contextlib.contextmanager
def _forwarding_stop_signals(workers: list[Worker]) -> Iterator[None]:
    """While the workers run, SIGINT and SIGTERM to the launcher are passed on to them (each
    then stops at its next safe point with a checkpoint). The handlers are installed explicitly,
    so that this holds also where the launcher inherited SIGINT ignored (a job started with
    ``&`` by a shell without job control)."""

    def forward(signum: int, frame: object) -> None:
        del frame
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit_code(codes: list[int], finished: bool) -> int:
    """0 when the run finished (the surviving parties wrote its results), even if some parties
    were lost on the way (``summary.json`` records them); otherwise the worst exit code."""
    lost = [rank for rank, code in enumerate(codes) if code != 0]
    if finished and lost and len(lost) < len(codes):
        print(
            f"slate: the run finished without {parties_text(lost)} (exit codes: "
            f"{per_party_text({r: codes[r] for r in lost})}); summary.json's party_events "
            "records when each left.",
            file=sys.stderr,
        )
        return 0
    return _worst(codes)


def _worst(codes: list[int]) -> int:
    """The largest exit status, a death by signal k counting as 128 + k (as in a shell)."""
    return max(128 - c if c < 0 else c for c in codes)


def _client(host: str, port: int, timeout_s: float):
    """A connection to the rendezvous store at ``host:port`` (waits up to ``timeout_s`` for it)."""
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def worker_rendezvous(timeout_s: float) -> Rendezvous | None:
    """This launcher worker's rendezvous (the launcher hosts the store), or None under torchrun.

    Under torchrun the default process group is opened from ``MASTER_ADDR`` / ``MASTER_PORT``
    here, and torchrun's agent, not slate, decides what a failed worker means.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    port = os.environ.get(STORE_PORT_ENV)
    if port is None:
        dist.init_process_group(timeout=datetime.timedelta(seconds=timeout_s))
        return None
    return Rendezvous(
        store=_client("127.0.0.1", int(port), timeout_s),
        connect=lambda: _client("127.0.0.1", int(port), timeout_s),
        rank=rank,
        world=world,
        outside=True,
    )


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
    "warning: the rendezvous {host}:{port} is not a loopback address, and no --roster was "
    "given: anyone who reaches it can take a rank or forge the run's records. Give every site "
    "the run's --roster and its own --key (docs/security.md); torch.distributed also sends "
    "parameters and counts unencrypted: connect sites outside one trusted network through a "
    "VPN or SSH tunnels (docs/deployment.md)."
)
SIGNED_NOTE = (
    "note: the rendezvous {host}:{port} is not a loopback address: only the sites on the "
    "--roster take part, every record a site acts on is signed, and every message between sites "
    "is sealed (AES-256-GCM); the store's contents (addresses, host names, who is in the run) "
    "still travel unencrypted, so keep the rendezvous port reachable by the sites only "
    "(docs/security.md)."
)


def party_rendezvous(
    rank: int,
    world: int,
    rendezvous: str,
    timeout_s: float,
    external: bool,
    warn=print,
    identity: SiteIdentity | None = None,
) -> Rendezvous:
    """Party ``rank`` of ``world`` meets the others at ``HOST:PORT``.

    With ``external`` a ``slate rendezvous`` process hosts the store there and every party
    connects to it; otherwise party 0 hosts it, so that losing party 0 stops the run. gloo's own
    sockets stay on the loopback interface when the rendezvous is a loopback address.
    """
    host, port = parse_rendezvous(rendezvous)
    if is_loopback(host):
        if sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    else:
        warn((SIGNED_NOTE if identity else INSECURE_WARNING).format(host=host, port=port))
        note = choose_gloo_interface(host, port, os.environ, interface_addresses())
        if note:
            warn(note)
    hosts = rank == 0 and not external
    if hosts:
        store = _host_store(host, port, world, timeout_s, rendezvous)
    else:  # (bounded by --timeout, whatever holds the address: store_door.py)
        store = join_store(host, port, timeout_s, rank, rendezvous)
    if external:
        _check_rendezvous_roster(store, rendezvous, port, identity)
    return Rendezvous(
        store=store,
        connect=lambda: _client(host, port, timeout_s),
        rank=rank,
        world=world,
        outside=not hosts and external,
        identity=identity,
        store_nonce=session.publish_store_nonce(store) if hosts else None,
    )


def _host_store(host: str, port: int, world: int, timeout_s: float, rendezvous: str) -> Any:
    """Party 0's store, listening at ``host:port`` (refused in one paragraph when it cannot)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        return dist.TCPStore(host, port, world, True, timeout=timeout, wait_for_workers=False)
    except (RuntimeError, dist.DistStoreError) as err:
        raise ConfigError(
            f"Party 0 could not listen at {rendezvous} within --timeout {timeout_s:g} s "
            f"({str(err).splitlines()[0][:160]}). Is another process using that port?"
        ) from None


RENDEZVOUS_ROSTER_KEY = "slate/rendezvous_roster"  # the digest 'slate rendezvous' checks with
ROSTER_KEY_WAIT_S = 10.0  # how long a site waits for it (it is written within milliseconds)


def _check_rendezvous_roster(
    store: Any, rendezvous: str, port: int, identity: SiteIdentity | None
) -> None:
    """Refuse a ``slate rendezvous`` that checks records with another roster than this site's
    (or with one where this site has none, or none where it has one): it could not tell the
    run's end, or this site's records would all be ignored."""
    # 'slate rendezvous' writes it just after it starts listening: waited for when missing
    found = read_within(store, RENDEZVOUS_ROSTER_KEY, ROSTER_KEY_WAIT_S)
    if found is None:
        return  # a store that is not a 'slate rendezvous': nothing to compare
    theirs = found[:64]
    mine = identity.roster.digest if identity is not None else "none"
    if theirs == mine:
        return
    if identity is not None and theirs == "none":
        raise ConfigError(
            f"The rendezvous at {rendezvous} was started without --roster, while this site has "
            f"the roster {identity.roster.path}: it could not check the sites' records nor see "
            f"the run end. Restart it as 'slate rendezvous --port {port} --roster "
            f"{identity.roster.path}'."
        )
    if identity is None:
        raise ConfigError(
            f"The rendezvous at {rendezvous} serves a run with a roster (sha256 {theirs[:16]}...): "
            "start this site with that --roster and its own --key (docs/security.md)."
        )
    raise ConfigError(
        f"The rendezvous at {rendezvous} checks records with another roster (sha256 "
        f"{theirs[:16]}...) than this site's {identity.roster.path} (sha256 {mine[:16]}...): "
        "every site and the rendezvous need the same roster file."
    )


GLOO_INTERFACE = "GLOO_SOCKET_IFNAME"


def route_source(host: str, port: int) -> str | None:
    """This machine's IPv4 address on the route to ``host`` (no packet is sent), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return probe.getsockname()[0]
    except OSError:
        return None


def interface_addresses() -> dict[str, str]:
    """Every network interface of this machine with its IPv4 address (Linux; else empty)."""
    try:
        import fcntl
        import struct
    except ImportError:
        return {}
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address
            found[name] = socket.inet_ntoa(reply[20:24])
    return found


def choose_gloo_interface(
    host: str, port: int, env: dict[str, str], addresses: dict[str, str]
) -> str | None:
    """Check or set the interface gloo publishes to the other sites (``GLOO_SOCKET_IFNAME``).

    gloo tells the other parties the address of this interface; left to itself it may pick
    ``127.0.0.1``, which no other site can reach. A set value must name an interface with a
    non-loopback IPv4 address; an unset one is set to the interface on the route to the
    rendezvous ``host``. Returns a note for the console, or None; raises :class:`ConfigError`
    on a wrong value.
    """
    source = route_source(host, port)
    towards = next((name for name, ip in addresses.items() if ip == source), None)
    hint = f" The route to {host} leaves through {towards} ({source})." if towards else ""
    chosen = env.get(GLOO_INTERFACE)
    if chosen:
        if chosen not in addresses:
            raise ConfigError(
                f"{GLOO_INTERFACE}={chosen} names no interface with an IPv4 address on this "
                f"machine (interfaces: {', '.join(sorted(addresses)) or 'none found'}).{hint} "
                f"Set {GLOO_INTERFACE} to the interface the other sites can reach."
            )
        if ipaddress.ip_address(addresses[chosen]).is_loopback:
            raise ConfigError(
                f"{GLOO_INTERFACE}={chosen} is a loopback interface ({addresses[chosen]}), but "
                f"the rendezvous {host} is another machine: the other sites could not reach "
                f"this one.{hint} Set {GLOO_INTERFACE} to the interface they can reach."
            )
        return None
    if towards is None or ipaddress.ip_address(source).is_loopback:
        return None
    env[GLOO_INTERFACE] = towards
    return (
        f"note: the parties exchange parameters over interface {towards} ({source}), the route "
        f"to the rendezvous {host}; set {GLOO_INTERFACE} to choose another."
    )


IDLE_TIMEOUT_SECONDS = 600.0  # slate rendezvous gives up after this long without a heartbeat
#: How long ``slate rendezvous`` stays up after a run that ended without some of its parties,
#: so that a lost party restarted late learns at once that the run is over.
LINGER_SECONDS = 300.0
WATCH_SECONDS = 0.2  # how often slate rendezvous reads the store
#: How long ``slate rendezvous`` keeps serving once the run is over, so that a leaving party's
#: last read of what it saw (every 0.1 s, :func:`~slate.engines.distributed.control.liveness.
#: confirm_leave`) finds the store still there: a read of a closed store makes torch's C++ layer
#: print a stack trace into the party's debug log.
LEAVE_GRACE_SECONDS = 1.0


def _say(text: str) -> None:
    """A line of ``slate rendezvous``'s console, flushed at once: an operator who pipes it into
    a file or ``tee`` sees each line when it happens, not when the rendezvous exits."""
    print(text, flush=True)


def serve_rendezvous(
    port: int,
    host: str = "0.0.0.0",
    say=_say,
    idle_timeout: float = IDLE_TIMEOUT_SECONDS,
    roster: Roster | None = None,
    linger: float = LINGER_SECONDS,
) -> int:
    """``slate rendezvous``: host the store of one run until its parties have left.

    The store outlives any party, so that every party, rank 0 included, can be lost without
    stopping the others. It holds only coordination keys: addresses, heartbeats, membership.
    When no party's heartbeat has moved for ``idle_timeout`` seconds (0: never), the run can no
    longer finish and the rendezvous exits with status 1. With ``roster``, only an end of the
    run signed by one of its sites in this run's session counts (:class:`_EndWatch`).
    """
    if not 0 < port < 65536:
        raise ConfigError(f"--port must lie in 1..65535, got {port}.")
    try:
        store = dist.TCPStore(
            host, port, 1, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
        )
    except (RuntimeError, dist.DistStoreError) as err:
        raise ConfigError(
            f"slate rendezvous could not listen on {host}:{port} "
            f"({str(err).splitlines()[0][:160]}). Is another process using that port?"
        ) from None
    nonce = session.publish_store_nonce(store)  # before any site can look for it
    store.set(SEEN_KEY, json.dumps({"final": None, "left": []}))
    store.set(RENDEZVOUS_ROSTER_KEY, roster.digest if roster else "none")
    records = Records(store, roster.n if roster else 1 << 16, say=say, roster=roster)
    end = _EndWatch(records, nonce, say)
    watch = _Activity(records, idle_timeout, end)
    events = MembershipEvents(records, say)
    try:  # (from the line that says Ctrl-C stops it, a Ctrl-C ends here)
        say(
            f"slate rendezvous: serving one run on {host}:{port}; start the parties with "
            f"--rendezvous <this host>:{port} --external-store. Ctrl-C stops it."
        )
        while not end.over():
            events.look()
            if watch.idle():
                say(
                    f"slate rendezvous: no party has been heard from for {idle_timeout:g} s "
                    "(--idle-timeout); the run cannot finish here, so this rendezvous exits. "
                    "To go on from the last checkpoints, start 'slate rendezvous' again and "
                    "restart every party with --resume (docs/deployment.md)."
                )
                return 1
            time.sleep(WATCH_SECONDS)
        time.sleep(LEAVE_GRACE_SECONDS)  # (the leaving parties read that it saw them)
        events.looked = 0.0
        events.look()  # (the last sites' "done")
        missing = _parties_that_did_not_finish(records, end.final or ())
        if missing and linger > 0:
            say(
                f"slate rendezvous: the run is over without {missing} of its parties; serving "
                f"{linger:g} s more (--linger), so that a party restarted late learns it."
            )
            time.sleep(linger)
    except KeyboardInterrupt:
        say("slate rendezvous: stopped.")
        return 130
    say("slate rendezvous: every party has left; the run is over.")
    return 0


class _EndWatch:
    """What ``slate rendezvous`` has seen of the run's end, kept once seen.

    Under a roster it first learns the run's session from its own store nonce and the sites'
    session records (:func:`slate.engines.distributed.control.session.learn`): an earlier session's
    end records, replayed here, never verify in it. It puts its store nonce back (with one warning)
    if someone replaced or deleted it. Then it keeps every valid end record it reads, the main
    party's final members and each of their leave records, and says once if one it saw is deleted
    later (it still counts: it was signed by its site). It tells the leaving parties what it saw
    (:data:`~slate.engines.distributed.control.liveness.SEEN_KEY`), so that a party whose record was
    deleted before it was seen writes it again
    (:func:`~slate.engines.distributed.control.liveness.confirm_leave`). The run is over once the
    final members and the leave record of each of them were seen.
    """

    def __init__(self, records: Records, nonce: str, say) -> None:
        self.records, self.nonce, self.say = records, nonce, say
        self.session: str | None = None if records.signed else ""
        self.final: tuple[int, ...] | None = None
        self.left: set[int] = set()
        self._told: tuple[Any, ...] = (None, ())
        self._warned: set[str] = set()

    def over(self) -> bool:
        store, records = self.records.store, self.records
        if session.read_store_nonce(store) != self.nonce:
            self._warn(
                session.STORE_NONCE_KEY,
                f"slate rendezvous: warning: its store nonce {session.STORE_NONCE_KEY} was "
                "replaced or deleted: someone may be writing to or deleting records in the "
                "rendezvous store; written again.",
            )
            store.set(session.STORE_NONCE_KEY, self.nonce)
        if self.session is None:
            self.session = session.learn(records, self.nonce)
            if self.session is None:
                return False
            records.session = self.session
        if self.final is None:
            self.final = final_ranks(records)
        elif not store.check([FINAL_MEMBERS_KEY]):
            self._warn(FINAL_MEMBERS_KEY, self._deleted(FINAL_MEMBERS_KEY))
        for rank in self.final or ():
            key = f"{LEFT_KEY}/{rank}"
            if rank not in self.left and has_left(records, rank):
                self.left.add(rank)
            elif rank in self.left and not store.check([key]):
                self._warn(key, self._deleted(key))
        told = (self.final, tuple(sorted(self.left)))
        if told != self._told:
            store.set(SEEN_KEY, json.dumps({"final": self.final, "left": sorted(self.left)}))
            self._told = told
        return self.final is not None and self.left >= set(self.final)

    def _deleted(self, key: str) -> str:
        return (
            f"slate rendezvous: warning: the end record {key} was deleted from the store after "
            "it was written: someone may be deleting records in the rendezvous store (it was "
            "seen, and still counts)."
        )

    def _warn(self, key: str, line: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.say(line)


def _parties_that_did_not_finish(records: Records, final: tuple[int, ...]) -> int:
    """How many of the parties that registered at set-up (ranks 0, 1, ... in turn) are not
    among those the main party recorded as finishing the run."""
    started = 0
    while started < records.nodes and registered_process(records, started) is not None:
        started += 1
    return max(0, started - len(final))


class _Activity:
    """When the parties' heartbeats (:data:`BEATS_KEY`, or under a roster their signed beat
    records, read once the session is known) last moved."""

    def __init__(self, records: Records, idle_timeout: float, end: _EndWatch) -> None:
        self.records, self.idle_timeout, self.end = records, idle_timeout, end
        self.beats: Any = -1
        self.since = time.monotonic()
        self.looked = 0.0

    def idle(self) -> bool:
        now = time.monotonic()
        if now - self.looked >= 1.0 and self.end.session is not None:
            self.looked = now
            records = self.records
            beats = (
                signed_beats(records) if records.signed else int(records.store.add(BEATS_KEY, 0))
            )
            if beats != self.beats:
                self.beats, self.since = beats, now
        return self.idle_timeout > 0 and now - self.since > self.idle_timeout
