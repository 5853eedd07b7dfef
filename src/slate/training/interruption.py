"""What every party says when a run is interrupted (SIGINT or SIGTERM): the iteration, which
party was asked to stop (where more than one process runs the run: one small exchange, once every
party has agreed to stop), and the command that continues the run, which works as printed at that
party (:attr:`slate.engines.base.Engine.resume_flags` and ``resume_note``)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from slate.errors import SlateError, parties_text

__all__ = ["StopOnSignal", "interrupted_message", "who_stopped"]

STOP_SHAPE = [int, int]  # one party's stop request on the wire: [rank, 1 if it asked]


def who_stopped(run: Any) -> list[int] | None:
    """The ranks of the parties whose process was asked to stop (SIGINT or SIGTERM), the same
    list at every party: one small exchange, made only once every party has agreed to stop
    (after the checkpoint is written, so it changes nothing that is resumed). None where one
    process runs every party (the simulator), or if the exchange fails (a party lost as it
    stops: the run stops all the same)."""
    party = run.engine.own_party
    if party is None:
        return None
    try:
        rows = run.engine.gather_json(
            [[party, int(run.stop_requested)]], STOP_SHAPE, "stop request"
        )
    except (SlateError, RuntimeError):  # (torch's errors are RuntimeErrors)
        return None
    return sorted({rank for rank, asked in rows if asked})


def _site_names(run: Any, ranks: list[int]) -> str:
    """``ranks`` as parties, each with its roster name where a roster is in force:
    ``party 2 (hospital-c)``."""
    rendezvous = getattr(run.engine, "rendezvous", None)
    identity = getattr(rendezvous, "identity", None)
    sites = identity.roster.sites if identity is not None else ()
    if len(ranks) == 1 or (sites and len(ranks) <= 4):
        named = [
            f"party {r} ({sites[r].name})" if 0 <= r < len(sites) else f"party {r}" for r in ranks
        ]
        return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return parties_text(ranks)


def interrupted_message(run: Any, out: Path | None, stoppers: list[int] | None = None) -> str:
    """What every party says as it stops: the iteration, who stopped the run (where more than
    one process runs it), and the command that continues it, which works as printed at this
    party (run from the same directory)."""
    t = run.iteration
    own = run.engine.own_party
    if not stoppers:
        what = f"Interrupted at iteration {t}"
    elif own is not None and stoppers == [own]:
        what = (
            f"Interrupted at iteration {t}: this site, {_site_names(run, stoppers)}, was asked "
            "to stop (SIGINT or SIGTERM) and stopped every party"
        )
    else:
        verb = "was" if len(stoppers) == 1 else "were"
        what = (
            f"Interrupted at iteration {t}: {_site_names(run, stoppers)} {verb} asked to stop "
            "(SIGINT or SIGTERM there) and stopped every party"
        )
    if out is None:
        return f"{what}; nothing was written (no run folder)."
    return (
        f"{what}; checkpoint written to {out}. Continue with: "
        f"slate train --resume {out}{run.engine.resume_flags}{run.engine.resume_note}"
    )


class StopOnSignal:
    """While active, SIGINT and SIGTERM ask the run to stop at the next safe point."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        del signum, frame
        self.run.stop_requested = True

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
