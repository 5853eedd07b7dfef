"""What crosses the loopback interface during a run, as an eavesdropper with a raw socket sees it
(what ``--roster``'s sealing must hide): every TCP payload byte between the run's processes.

:class:`LoopbackCapture` reads every frame on ``lo`` through an ``AF_PACKET`` raw socket (root,
or ``CAP_NET_RAW``) in a thread, while a second thread notes which TCP ports the run's processes
own (their socket inodes in ``/proc/<pid>/fd``, matched in ``/proc/net/tcp*``). Other programs on
the machine also talk over loopback, so only the flows whose two ports both belong to the run
are kept. Each direction of each connection is put back together in sequence order
(:meth:`LoopbackCapture.streams`).

:func:`best_cosines` then reads every stream as float32 at the four byte alignments and gives,
for each reference vector (a party's parameters), the largest cosine of any window of its
length: about 1 when parameters crossed in clear, and small for ciphertext.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # each loopback packet is seen twice: keep the copy going out
SOL_PACKET = 263
PACKET_STATISTICS = 6
ETH_HEADER = 14  # loopback frames carry a zeroed Ethernet header
POLL_S = 0.02  # how often the run's sockets are looked up
FFT_SIZE = 1 << 16  # points of each FFT of best_cosines (a block of a long stream)
PENDING_S = 5.0  # how long a socket's inode is looked for in the TCP tables
LARGEST = 1e4  # |float32| beyond this reads as 0 in a window (no parameter is that large)


def raw_socket_refusal() -> str | None:
    """Why a raw socket on ``lo`` cannot be opened here (no root or ``CAP_NET_RAW``, or not
    Linux), or None when it can."""
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    except (AttributeError, OSError) as err:
        return f"no raw socket on this machine ({err})"
    with sock:
        try:
            sock.bind(("lo", 0))
        except OSError as err:
            return f"cannot bind a raw socket to lo ({err})"
    return None


class LoopbackCapture:
    """Capture every TCP segment on ``lo`` while it is open (a context manager), and the ports
    of the processes passed to :meth:`watch`."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        with contextlib.suppress(OSError):  # as much kernel buffer as allowed: no drops
            self.sock.setsockopt(socket.SOL_SOCKET, 33, 256 << 20)  # SO_RCVBUFFORCE
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.1)
        self.segments: dict[tuple[int, int], dict[int, bytes]] = {}  # (sport, dport) -> seq
        self.ports: set[int] = set()
        self.pids: list[int] = []
        self.dropped = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._poll, daemon=True)]  # fmt: skip

    def watch(self, pids: Iterable[int]) -> None:
        """Count the TCP ports that the processes ``pids`` own as the run's."""
        self.pids.extend(pids)

    def __enter__(self) -> LoopbackCapture:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        stats = self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        self.dropped = struct.unpack("II", stats)[1]
        self.sock.close()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                frame, address = self.sock.recvfrom(1 << 18)
            except TimeoutError:
                continue
            if address[2] == PACKET_OUTGOING:
                self._segment(frame)

    def _segment(self, frame: bytes) -> None:
        """Keep the TCP payload of an IPv4 or IPv6 frame, by flow and sequence number."""
        kind = struct.unpack_from("!H", frame, 12)[0]
        at = ETH_HEADER
        if kind == 0x0800 and frame[at + 9] == 6:  # IPv4, TCP
            end = at + struct.unpack_from("!H", frame, at + 2)[0]
            at += (frame[at] & 0x0F) * 4
        elif kind == 0x86DD and frame[at + 6] == 6:  # IPv6, TCP (no extension headers)
            end = at + 40 + struct.unpack_from("!H", frame, at + 4)[0]
            at += 40
        else:
            return
        sport, dport, seq = struct.unpack_from("!HHI", frame, at)
        payload = frame[at + (frame[at + 12] >> 4) * 4 : end]
        if payload:
            self.segments.setdefault((sport, dport), {})[seq] = payload

    def _poll(self) -> None:
        """Every ``POLL_S``: the run's processes' socket inodes, and the ports of those not yet
        found in the TCP tables. The tables (every socket of the machine) are read only while
        some inode younger than ``PENDING_S`` is unresolved: a socket's port is there once it is
        bound or connects, which follows its creation at once; the inodes that never resolve
        are the processes' other sockets (Unix, UDP)."""
        first_seen: dict[str, float] = {}
        resolved: set[str] = set()
        while not self._stop.is_set():
            now = time.monotonic()
            inodes = _socket_inodes(self.pids)
            for inode in inodes:
                first_seen.setdefault(inode, now)
            wanted = {i for i in inodes - resolved if now - first_seen[i] <= PENDING_S}
            if wanted:
                found = _tcp_ports(wanted)
                resolved |= found.keys()
                self.ports |= set(found.values())
            time.sleep(POLL_S)

    def streams(self) -> dict[tuple[int, int], bytes]:
        """The payload of each direction of each connection between two of the run's ports, in
        sequence order (a segment seen twice is kept once)."""
        out = {}
        for (sport, dport), by_seq in self.segments.items():
            if sport not in self.ports or dport not in self.ports:
                continue
            first = min(by_seq, key=lambda s: (s - next(iter(by_seq))) % (1 << 32))
            parts = sorted(((s - first) % (1 << 32), p) for s, p in by_seq.items())
            data, end = bytearray(), 0
            for offset, payload in parts:
                if offset + len(payload) > end:  # overlaps are taken once
                    data += payload[max(0, end - offset) :]
                    end = offset + len(payload)
            out[(sport, dport)] = bytes(data)
        return out


def _socket_inodes(pids: list[int]) -> set[str]:
    """The inodes of the sockets that processes ``pids`` hold open now."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    return inodes


def _tcp_ports(inodes: set[str]) -> dict[str, int]:
    """The local TCP port of each of ``inodes`` found in the machine's TCP tables (IPv4, IPv6):
    inode -> port."""
    ports = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return ports


def best_cosines(
    streams: Iterable[bytes], references: list[torch.Tensor], fft_size: int | None = None
) -> list[float]:
    """For each of ``references`` (1-D, all of one length ``d``), the largest cosine between it
    and any ``d`` consecutive float32 values of any stream, at any of the four byte alignments.

    Values that are not finite or beyond ``±LARGEST`` read as 0 (no parameter is that large, and
    it keeps the windows' sums of squares exact enough). Dot products come from an FFT
    cross-correlation and window norms from a cumulative sum, so a long stream costs
    ``O(n log n)``, not ``O(n d)``. A long stream is cut into blocks of windows, each correlated
    with one FFT of ``fft_size`` points (overlap-save; by default :data:`FFT_SIZE`, or four
    times ``d`` rounded up to a power of 2 where that is more): the same dot products, several
    times faster than one FFT of the whole stream, whose arrays do not fit in a cache. Windows
    whose norm is below a millionth of the reference's count as no match (they hold nearly
    nothing)."""
    refs = np.stack([r.detach().double().reshape(-1).numpy() for r in references])
    d, lengths = refs.shape[1], np.linalg.norm(refs, axis=1, keepdims=True)
    refs = refs / np.maximum(lengths, 1e-300)
    largest = fft_size or max(FFT_SIZE, 1 << (4 * d).bit_length())
    best = np.full(len(references), -1.0)
    spectra: dict[int, np.ndarray] = {}  # FFT size -> the references' conjugate spectra
    for raw in streams:
        for shift in range(4):
            n = (len(raw) - shift) // 4
            if n < d:
                continue
            with np.errstate(invalid="ignore"):  # (signalling NaNs among random bytes)
                x = np.frombuffer(raw, dtype="<f4", count=n, offset=shift).astype(np.float64)
            x[~(np.abs(x) <= LARGEST)] = 0.0  # (NaN and infinities too)
            size = min(largest, 1 << (n + d).bit_length())
            if size not in spectra:
                spectra[size] = np.conj(np.fft.rfft(refs, size))
            block = size - d + 1  # windows per FFT: x[k : k + d] for k in one block
            dots = np.concatenate([
                np.fft.irfft(np.fft.rfft(x[k : k + block + d - 1], size)[None] * spectra[size],
                             size)[:, : min(block, n - d + 1 - k)]
                for k in range(0, n - d + 1, block)
            ], axis=1)  # fmt: skip
            squares = np.concatenate([[0.0], np.cumsum(x * x)])
            norms = np.sqrt(np.maximum(squares[d:] - squares[:-d], 0.0))
            usable = norms > 1e-6 * lengths
            cosines = np.where(usable, dots / np.maximum(norms, 1e-300), 0.0)
            best = np.maximum(best, cosines.max(axis=1))
    return [float(b) for b in best]
