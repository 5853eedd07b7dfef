"""One multi-site run for the benchmarks: a ``slate rendezvous``, then every site's
``slate train --rank R``, all started at once; each process's stderr goes to its own log, and a
failed or stuck run raises with every log."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Starts a command: ``subprocess.Popen`` itself, or one that runs it in a network namespace.
Starter = Callable[..., subprocess.Popen]


@dataclass(frozen=True)
class Launch:
    """One process of a run: its name in errors, its command, where its stderr goes, and the
    rest of what ``Popen`` gets (``cwd``, ``env``)."""

    name: str
    command: list[str]
    log: Path
    options: dict[str, Any] = field(default_factory=dict)


def run_sites(
    label: str, rendezvous: Launch, sites: Sequence[Launch], limit: float,
    start: Starter = subprocess.Popen,
) -> float:  # fmt: skip
    """Start ``rendezvous``, then every site, with ``start``; wait for the sites (at most
    ``limit`` seconds in all), then for the rendezvous, which leaves once every site has left.
    Returns the seconds from starting the rendezvous to the exit of the last site. Raises
    ``RuntimeError`` with every process's exit code and stderr if one exits non-zero or the
    run takes over ``limit``; no process outlives the call."""
    launches = [rendezvous, *sites]
    processes: list[subprocess.Popen] = []
    try:
        started = time.perf_counter()
        for launch in launches:
            with open(launch.log, "w") as err:
                processes.append(start(launch.command, stdout=subprocess.DEVNULL, stderr=err,
                                       **launch.options))  # fmt: skip
        deadline = started + limit
        for site in processes[1:]:
            site.wait(timeout=max(1.0, deadline - time.perf_counter()))
        wall = time.perf_counter() - started
        processes[0].wait(timeout=60)
    except subprocess.TimeoutExpired:
        stop(processes)
        raise RuntimeError(failure(f"{label} (timed out)", launches, processes)) from None
    finally:
        stop(processes)
    if any(process.returncode != 0 for process in processes):
        raise RuntimeError(failure(label, launches, processes))
    return wall


def stop(processes: Sequence[subprocess.Popen]) -> None:
    """Kill those of ``processes`` still running (inside a namespace too), and reap them."""
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def failure(label: str, launches: Sequence[Launch], processes: Sequence[subprocess.Popen]) -> str:
    """The exit code and the whole stderr of every process of a failed run."""
    parts = [f"the {label} run failed:"]
    for launch, process in zip(launches, processes, strict=False):
        parts.append(f"--- {launch.name}: exit code {process.returncode}\n{launch.log.read_text()}")
    return "\n".join(parts)
