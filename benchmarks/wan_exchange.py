"""One exchange over the emulated WAN, measured and as slate's ``--wan`` estimate models it.

The estimate (:meth:`slate.communication.gossip.WanLink.seconds`) charges each kind of exchange a
number of round trips and its bytes at the link's rate. This probe times each kind on the testbed
with gloo, as slate's distributed engine calls it, so the model's constants can be checked against
the wire:

* **all-reduce** of ``k`` float32s over ``N`` sites:
  :func:`~slate.engines.base.all_reduce_round_trips` RTTs plus ``2 (N - 1) / N`` of the bytes,
  times :data:`~slate.communication.gossip.WIRE_OVERHEAD`;
* **all-gather**: :func:`~slate.engines.base.all_gather_round_trips` RTTs plus ``N - 1`` pieces;
* **exchange** with ``d`` neighbours (a gossip round: send to each, receive from each): one
  RTT plus ``d`` messages at :data:`~slate.communication.gossip.EXCHANGE_GOODPUT` of the line rate.
* **early**: the same exchange with its receives posted when the previous one arrived
  (``pause``: the other work between exchanges): half an RTT plus the messages, by the model;
  **early-2**: posted two exchanges ahead, as a training chunk posts them
  (:data:`~slate.engines.distributed.wire.transport.ROUNDS_AHEAD`).

Every probe is repeated :data:`REPEATS` times with a pause between calls (5 ms, or the
probe's: the link idles between a training run's exchanges too) and no barrier between them, as
in training; the table shows rank 0's median, or for an exchange posted ahead its mean period
less the pause (:func:`_timed`).

``python benchmarks/wan_exchange.py worker RANK SITES HOST PORT OUT`` is one site's process;
:func:`exchange_rows` starts them in the testbed's namespaces.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPEATS = 15
PAUSE_SECONDS = 0.005


@dataclass(frozen=True)
class Probe:
    """One kind of exchange: ``kind`` (``all-reduce``, ``all-gather``, ``exchange``), the
    bytes each site contributes (or sends to each neighbour), and the neighbours."""

    label: str
    kind: str
    size: int
    neighbours: int = 0
    pause: float = 0.005  # seconds of other work before each call


PROBES = (
    Probe("all-reduce, 2 float32 (the stop and join flags)", "all-reduce", 8),
    Probe("all-reduce, 16 KiB", "all-reduce", 16384),
    Probe("all-reduce, 34 KB (the mean model)", "all-reduce", 33_828),
    Probe("all-reduce, 128 KiB", "all-reduce", 131_072),
    Probe("all-gather, 8 B", "all-gather", 8),
    Probe("all-gather, 34 KB", "all-gather", 33_828),
    Probe("exchange, 1 neighbour, 8.6 KB (base-2, int8)", "exchange", 8_600, 1),
    Probe("exchange, 1 neighbour, 34 KB", "exchange", 33_828, 1),
    Probe("exchange, 2 neighbours, 8.6 KB", "exchange", 8_600, 2),
    Probe("exchange, 2 neighbours, 34 KB (the ring, float32)", "exchange", 33_828, 2),
    # Receives posted when the previous exchange arrived, as training posts them within a chunk
    Probe("exchange, 1 neighbour, 8.6 KB, posted early, 60 ms of work between", "early", 8_600,
          1, 0.06),
    Probe("exchange, 1 neighbour, 8.6 KB, posted early, 20 ms of work between", "early", 8_600,
          1, 0.02),
    Probe("exchange, 2 neighbours, 34 KB, posted early (the ring)", "early", 33_828, 2),
    # ... and two exchanges ahead, as training posts them now
    Probe("exchange, 1 neighbour, 8.6 KB, posted two early, 20 ms of work between", "early-2",
          8_600, 1, 0.02),
    Probe("exchange, 2 neighbours, 34 KB, posted two early (the ring)", "early-2", 33_828, 2),
)  # fmt: skip


def modelled_ms(probe: Probe, sites: int, rtt_ms: float, mbit_s: float) -> float:
    """What :meth:`slate.communication.gossip.WanLink.seconds` charges for ``probe``, in
    milliseconds."""
    from slate.communication.gossip import WanLink
    from slate.engines.base import all_gather_round_trips, all_reduce_round_trips

    link = WanLink(rtt_ms, mbit_s)
    if probe.kind == "all-reduce":
        trips = all_reduce_round_trips(probe.size // 4, sites)
        sent = 2 * (sites - 1) / sites * probe.size
        return 1e3 * link.seconds(0.0, 0.0, 0.0, trips, sent)
    if probe.kind == "all-gather":
        sent = (sites - 1) * probe.size
        return 1e3 * link.seconds(0.0, 0.0, 0.0, all_gather_round_trips(sites), sent)
    early = 1.0 if probe.kind.startswith("early") else 0.0
    return 1e3 * link.seconds(0.0, 1.0, probe.neighbours * probe.size, early_rounds=early)


def _timed(call: Callable[[], None], pause: float = PAUSE_SECONDS) -> float:
    """Median milliseconds of ``call`` over :data:`REPEATS`, after one warm-up call. Sites
    are lined up once, before the warm-up, then call one after the other as training does:
    a site's time includes waiting for neighbours that started later.

    An exchange posted ahead (one with ``.finish``) is timed by its period instead: the
    :data:`REPEATS` calls and their pauses back to back, over :data:`REPEATS`, less the pause.
    One call alone can look free, when the neighbour, running ahead, has already sent; what a
    training chunk pays is the period."""
    import torch.distributed as dist

    dist.barrier()
    call()
    if hasattr(call, "finish"):
        started = time.perf_counter()
        for _ in range(REPEATS):
            time.sleep(pause)
            call()
        return 1e3 * ((time.perf_counter() - started) / REPEATS - pause)
    times = []
    for _ in range(REPEATS):
        time.sleep(pause)
        started = time.perf_counter()
        call()
        times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times)


def _call_of(probe: Probe, rank: int, sites: int) -> Callable[[], None]:
    import torch
    import torch.distributed as dist

    if probe.kind == "all-reduce":
        flat = torch.zeros(probe.size // 4)
        return lambda: dist.all_reduce(flat)
    if probe.kind == "all-gather":
        piece = torch.zeros(probe.size // 4)
        parts = [torch.empty_like(piece) for _ in range(sites)]
        return lambda: dist.all_gather(parts, piece)
    # One neighbour: pairs, as base-2 gossips; two: the ring's.
    peers = [rank ^ 1] if probe.neighbours == 1 else [(rank + 1) % sites, (rank - 1) % sites]
    message = torch.zeros(probe.size, dtype=torch.uint8)
    inbox = [torch.empty_like(message) for _ in peers]
    if probe.kind.startswith("early"):
        return _early_exchange(message, peers, 2 if probe.kind == "early-2" else 1)

    def exchange() -> None:
        ops = [dist.P2POp(dist.isend, message, p) for p in peers]
        ops += [dist.P2POp(dist.irecv, box, p) for box, p in zip(inbox, peers, strict=True)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return exchange


def _early_exchange(message: Any, peers: list[int], depth: int) -> Callable[[], None]:
    """An exchange whose receives were posted ``depth`` exchanges before it (on a tag of its
    own); ``.finish()`` sends ``depth`` more messages to each peer, for the receives still
    posted."""
    import torch
    import torch.distributed as dist

    tag = 7
    posted: list[list[Any]] = []

    def post() -> None:
        posted.append([dist.irecv(torch.empty_like(message), p, tag=tag) for p in peers])

    def exchange() -> None:
        while len(posted) < depth:
            post()
        sends = [dist.isend(message, p, tag=tag) for p in peers]
        for work in posted.pop(0) + sends:
            work.wait()
        post()

    def finish() -> None:
        for _ in range(len(posted)):
            for work in [dist.isend(message, p, tag=tag) for p in peers] + posted.pop(0):
                work.wait()

    exchange.finish = finish  # type: ignore[attr-defined]
    return exchange


def worker(rank: int, sites: int, host: str, port: int, out: Path) -> None:
    """One site: join the gloo group, time every probe, and (rank 0) write the medians."""
    import torch.distributed as dist

    store = dist.TCPStore(host, port, sites, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=sites)
    medians = {}
    for probe in PROBES:
        call = _call_of(probe, rank, sites)
        medians[probe.label] = _timed(call, probe.pause)
        getattr(call, "finish", lambda: None)()
    if rank == 0:
        out.write_text(json.dumps(medians))
    dist.barrier()
    dist.destroy_process_group()


def exchange_rows(bed: Any, root: Path, port: int) -> list[dict[str, Any]]:
    """Run :func:`worker` in every site's namespace of ``bed`` (a started
    :class:`benchmarks.wan_testbed.WanTestbed`) and return each probe's measured and modelled
    milliseconds."""
    from benchmarks.wan_testbed import site_address

    sites = len(bed.addresses) - 1
    out = root / "exchange.json"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="wan0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                       env.get("PYTHONPATH")]))  # fmt: skip
    command = [sys.executable, str(Path(__file__).resolve()), "worker"]
    processes = [
        bed.exec(f"site{r}", [*command, str(r), str(sites), site_address(0), str(port), str(out)],
                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for r in range(sites)
    ]  # fmt: skip
    errors = [p.communicate(timeout=600)[1] for p in processes]
    if any(p.returncode != 0 for p in processes):
        raise RuntimeError("the exchange probe failed:\n" + "\n".join(errors))
    measured = json.loads(out.read_text())
    rtt, rate = 2 * bed.delay_ms, bed.rate_mbit
    return [{"probe": probe.label, "measured_ms": measured[probe.label],
             "modelled_ms": modelled_ms(probe, sites, rtt, rate)} for probe in PROBES]  # fmt: skip


def exchange_table(rows: list[dict[str, Any]], sites: int) -> list[str]:
    """The markdown table: each probe's median, the model's value and their ratio."""
    lines = [f"| one exchange, {sites} sites | measured (ms, median) | `--wan` model (ms) | "
             "model / measured |", "|---|---|---|---|"]  # fmt: skip
    for row in rows:
        lines.append(f"| {row['probe']} | {row['measured_ms']:.1f} | {row['modelled_ms']:.1f} | "
                     f"{row['modelled_ms'] / row['measured_ms']:.2f}x |")  # fmt: skip
    return lines


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    rank_, sites_, host_, port_, out_ = sys.argv[2:7]
    worker(int(rank_), int(sites_), host_, int(port_), Path(out_))
