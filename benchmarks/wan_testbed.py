"""A wide-area network on one machine, for the WAN benchmark (``benchmarks/wan.py``).

:class:`WanTestbed` builds one network namespace per site (``slwan-site0``, ``slwan-site1``,
...) and one for the rendezvous (``slwan-rdv``), each with a TUN device ``wan0`` on the subnet
10.78.0.0/24 (site r at 10.78.0.(r+1), the rendezvous at 10.78.0.254). A userspace link
emulator (this file run as a program, :func:`emulate`) holds every ``wan0``'s file
descriptor: it reads each IPv4 packet a namespace sends and writes it to the namespace that
owns the destination address, after

* the sender's link rate: every site has one uplink of R Mbit/s, so a packet waits until the
  packets sent before it from the same namespace have been serialised, then takes
  ``size * 8 / R`` seconds of its own (:func:`departure`);
* a fixed one-way delay D, the same on every link (no jitter, no reordering, no loss except
  when more than :data:`QUEUE_LIMIT` packets of one sender are in flight, as netem's default).

This is what ``tc qdisc add dev wan0 root netem delay D rate R`` would give each site's uplink;
the emulator exists because this kernel has no netem. Downlinks are not limited, and the
emulator runs on the same cores as the sites: when they are busy, packets are delivered a few
milliseconds late (:meth:`WanTestbed.stats` says how late).

The names and the subnet differ from ``../shared/tools/wan/testbed``'s (``site0``,
10.77.0.0/24), so both can be up at once. Needs root and iproute2 (``ip``).

``python benchmarks/wan_testbed.py emulate SPEC_JSON DELAY_MS RATE_MBIT STATS_FILE`` is the
emulator process (started by :meth:`WanTestbed.up`); ``python benchmarks/wan_testbed.py
cleanup`` deletes ``slwan-*`` namespaces left behind by a process that was killed outright.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import heapq
import json
import os
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PREFIX = "slwan-"
SUBNET = "10.78.0"
RDV = "rdv"
RDV_ADDRESS = f"{SUBNET}.254"
DEVICE = "wan0"
#: Counters of ``/sys/class/net/wan0/statistics`` that :meth:`WanTestbed.counters` reads.
COUNTERS = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")
#: Packets of one sender in flight (queued or delayed) before the next is dropped (netem's).
QUEUE_LIMIT = 1000
CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
PR_SET_PDEATHSIG = 1


def site_address(rank: int) -> str:
    """The IPv4 address of site ``rank`` (10.78.0.1 for site 0)."""
    if not 0 <= rank < 253:
        raise ValueError(f"site {rank}: at most 253 sites fit the /24")
    return f"{SUBNET}.{rank + 1}"


def departure(arrival: float, link_free: float, size: int, rate_bps: float) -> float:
    """When the last bit of a packet of ``size`` bytes, handed to its sender's link at
    ``arrival``, has left it: the link first finishes what it holds (busy until
    ``link_free``), then sends at ``rate_bps`` bits per second. The packet is due at the other
    end one delay later; the link is free again at the returned time."""
    return max(arrival, link_free) + size * 8 / rate_bps


def parse_counters(text: str) -> dict[str, int]:
    """``cat`` of the :data:`COUNTERS` files (one number a line, in that order) as a dict."""
    values = text.split()
    if len(values) != len(COUNTERS):
        raise ValueError(f"expected {len(COUNTERS)} counters, got {text!r}")
    return dict(zip(COUNTERS, map(int, values), strict=True))


def counter_deltas(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Per namespace and counter, ``after - before`` (what crossed ``wan0`` in between)."""
    return {ns: {key: after[ns][key] - before[ns][key] for key in after[ns]} for ns in after}


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, what: str) -> None:
    """Move this (single-threaded) process into the network namespace open as ``fd``."""
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns {what}: {os.strerror(errno)}")


def open_tun(namespace_path: str) -> int:
    """A non-blocking file descriptor of a new TUN device :data:`DEVICE` (IP packets, no
    packet information header) created inside the network namespace at ``namespace_path``;
    the device lives as long as the descriptor. This process returns to its own namespace."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(namespace_path, os.O_RDONLY)
    try:
        _setns(there, namespace_path)
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
            request = struct.pack("16sH", DEVICE.encode(), IFF_TUN | IFF_NO_PI)
            fcntl.ioctl(fd, TUNSETIFF, request)
        finally:
            _setns(home, "back home")
    finally:
        os.close(there)
        os.close(home)
    return fd


def emulate(spec: dict[str, str], delay_ms: float, rate_mbit: float, stats_file: str) -> None:
    """The link emulator: one TUN device per namespace of ``spec`` (name -> IPv4 address), and
    every IPv4 packet read from one delivered to the device owning its destination address,
    :func:`departure` plus ``delay_ms`` after it was read. Prints ``ready`` once the devices
    exist; SIGUSR1 writes its statistics to ``stats_file`` (JSON), SIGTERM writes them and
    exits, and so does the death of the process that started it."""
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    parent = os.getppid()
    delay, rate = delay_ms / 1e3, rate_mbit * 1e6
    name_of: dict[int, str] = {}
    fd_of_address: dict[bytes, int] = {}
    for namespace, address in spec.items():
        fd = open_tun(f"/var/run/netns/{namespace}")
        name_of[fd] = namespace
        fd_of_address[bytes(int(part) for part in address.split("."))] = fd
    link_free = dict.fromkeys(name_of, 0.0)
    in_flight = dict.fromkeys(name_of, 0)
    heap: list[tuple[float, int, int, int, bytes]] = []
    sequence = 0
    sent = {namespace: {"packets": 0, "bytes": 0} for namespace in spec}
    tally = {"delivered": 0, "dropped": 0, "unroutable": 0, "late_sum": 0.0, "late_max": 0.0}

    def dump(*_: Any) -> None:
        stats = {"per_source": sent, "delivered": tally["delivered"], "dropped": tally["dropped"],
                 "unroutable": tally["unroutable"], "delay_ms": delay_ms, "rate_mbit": rate_mbit,
                 "late_mean_ms": 1e3 * tally["late_sum"] / max(tally["delivered"], 1),
                 "late_max_ms": 1e3 * tally["late_max"]}  # fmt: skip
        partial = f"{stats_file}.partial"
        Path(partial).write_text(json.dumps(stats))
        os.replace(partial, stats_file)

    def stop(*_: Any) -> None:
        dump()
        os._exit(0)

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGTERM, stop)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        stop()
    selector = selectors.DefaultSelector()
    for fd in name_of:
        selector.register(fd, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        timeout = max(0.0, heap[0][0] - time.monotonic()) if heap else 0.5
        try:
            ready = selector.select(min(timeout, 0.5))
        except InterruptedError:
            ready = []
        now = time.monotonic()
        for key, _ in ready:
            source = key.fd
            for _ in range(64):
                try:
                    packet = os.read(source, 65536)
                except BlockingIOError:
                    break
                if len(packet) < 20 or packet[0] >> 4 != 4:
                    continue  # IPv6 (router solicitations and the like): not routed
                target = fd_of_address.get(packet[16:20])
                if target is None:
                    tally["unroutable"] += 1
                    continue
                if in_flight[source] >= QUEUE_LIMIT:
                    tally["dropped"] += 1
                    continue
                link_free[source] = departure(now, link_free[source], len(packet), rate)
                sequence += 1
                heapq.heappush(heap, (link_free[source] + delay, sequence, target, source, packet))
                in_flight[source] += 1
                sent[name_of[source]]["packets"] += 1
                sent[name_of[source]]["bytes"] += len(packet)
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            due, _, target, source, packet = heapq.heappop(heap)
            in_flight[source] -= 1
            try:
                os.write(target, packet)
            except OSError:
                tally["dropped"] += 1
                continue
            tally["delivered"] += 1
            tally["late_sum"] += now - due
            tally["late_max"] = max(tally["late_max"], now - due)


def _ip(*args: str) -> subprocess.CompletedProcess:
    """``ip ARGS``, its output captured; raises ``RuntimeError`` with its stderr on failure."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def our_namespaces() -> list[str]:
    """The ``slwan-*`` network namespaces that exist now."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in listing.splitlines() if line.strip()]
    return [name for name in names if name.startswith(PREFIX)]


class WanTestbed:
    """``sites`` namespaces and a rendezvous namespace joined by the link emulator: one-way
    delay ``delay_ms`` on every link, ``rate_mbit`` Mbit/s on every sender's uplink.

    ``with WanTestbed(4, 40, 10) as bed:`` brings it up and always takes it down (an exception,
    Ctrl-C, SIGTERM turned into ``SystemExit``). Namespaces are named by role (``site0`` ...,
    ``rdv``); :meth:`exec` runs a command in one, :meth:`counters` reads every ``wan0``.
    """

    def __init__(self, sites: int, delay_ms: float = 40.0, rate_mbit: float = 10.0) -> None:
        self.addresses = {f"site{r}": site_address(r) for r in range(sites)}
        self.addresses[RDV] = RDV_ADDRESS
        self.delay_ms, self.rate_mbit = delay_ms, rate_mbit
        self.state: Path | None = None
        self.emulator: subprocess.Popen | None = None
        self.created: list[str] = []

    def namespace(self, role: str) -> str:
        """The namespace's real name: ``site0`` -> ``slwan-site0``."""
        if role not in self.addresses:
            raise KeyError(f"no namespace {role!r} (have {', '.join(self.addresses)})")
        return PREFIX + role

    def up(self) -> WanTestbed:
        """Create the namespaces, start the emulator, give each ``wan0`` its address. Refuses
        if ``slwan-*`` namespaces exist already; on failure, removes what it made."""
        if shutil.which("ip") is None:
            raise RuntimeError("the WAN testbed needs iproute2's `ip`")
        existing = our_namespaces()
        if existing:
            raise RuntimeError(
                f"namespaces {', '.join(existing)} exist already: another WAN benchmark is "
                "running, or one was killed (`python benchmarks/wan_testbed.py cleanup`)"
            )
        self.state = Path(tempfile.mkdtemp(prefix="slwan-"))
        try:
            for role in self.addresses:
                _ip("netns", "add", self.namespace(role))
                self.created.append(self.namespace(role))
                _ip("-n", self.namespace(role), "link", "set", "lo", "up")
            spec = {self.namespace(role): address for role, address in self.addresses.items()}
            log = open(self.state / "emulator.log", "w")  # noqa: SIM115 (the emulator keeps it)
            self.emulator = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "emulate", json.dumps(spec),
                 str(self.delay_ms), str(self.rate_mbit), str(self.state / "stats.json")],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            log.close()
            self._wait_ready()
            for role, address in self.addresses.items():
                _ip("-n", self.namespace(role), "addr", "add", f"{address}/24", "dev", DEVICE)
                _ip("-n", self.namespace(role), "link", "set", DEVICE, "up")
        except BaseException:
            self.down()
            raise
        return self

    def _wait_ready(self, seconds: float = 10.0) -> None:
        assert self.emulator is not None and self.state is not None
        log = self.state / "emulator.log"
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if "ready" in log.read_text():
                return
            if self.emulator.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the link emulator did not start:\n{log.read_text()}")

    def exec(self, role: str, command: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Start ``command`` inside namespace ``role`` (``ip netns exec``, which also shows
        the namespace's own ``/sys/class/net``); ``popen`` goes to ``subprocess.Popen``."""
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(role), *command], **popen)

    def counters(self) -> dict[str, dict[str, int]]:
        """Per role, the :data:`COUNTERS` of its ``wan0`` now (bytes include IP headers)."""
        folder = f"/sys/class/net/{DEVICE}/statistics"
        found = {}
        for role in self.addresses:
            done = _ip("netns", "exec", self.namespace(role), "cat",
                       *(f"{folder}/{name}" for name in COUNTERS))  # fmt: skip
            found[role] = parse_counters(done.stdout)
        return found

    def stats(self, wait: float = 2.0) -> dict[str, Any] | None:
        """The emulator's own statistics (bytes per source, lateness, drops), or None."""
        if self.emulator is None or self.state is None or self.emulator.poll() is not None:
            return None
        path = self.state / "stats.json"
        path.unlink(missing_ok=True)
        self.emulator.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if path.exists():
                return json.loads(path.read_text())
            time.sleep(0.02)
        return None

    def down(self) -> None:
        """Stop the emulator and delete the namespaces and the state folder (idempotent)."""
        if self.emulator is not None:
            if self.emulator.poll() is None:
                self.emulator.terminate()
                try:
                    self.emulator.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.emulator.kill()
                    self.emulator.wait()
            self.emulator = None
        for name in self.created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.created = []
        if self.state is not None:
            shutil.rmtree(self.state, ignore_errors=True)
            self.state = None

    def __enter__(self) -> WanTestbed:
        return self.up()

    def __exit__(self, *_: object) -> None:
        self.down()


def cleanup() -> list[str]:
    """Delete every ``slwan-*`` namespace (left by a process killed before its teardown)."""
    names = our_namespaces()
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return names


def main(argv: list[str]) -> None:
    """``emulate SPEC_JSON DELAY_MS RATE_MBIT STATS_FILE`` or ``cleanup``."""
    if argv[:1] == ["emulate"] and len(argv) == 5:
        emulate(json.loads(argv[1]), float(argv[2]), float(argv[3]), argv[4])
    elif argv == ["cleanup"]:
        with contextlib.suppress(FileNotFoundError):
            print("deleted: " + (", ".join(cleanup()) or "nothing"))
    else:
        raise SystemExit(__doc__.rsplit("\n\n", 1)[-1])


if __name__ == "__main__":
    main(sys.argv[1:])
