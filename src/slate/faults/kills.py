"""Fault injection for tests of the distributed engine: a party dies or freezes at a chosen moment.

``SLATE_KILL_AT=RANK@ITER[:MOMENT[:FAULT]][,...]`` makes distributed party ``RANK`` fail at
iteration ``ITER``, at one of these moments:

* ``setup`` (``ITER`` 0 only): before the data set-up, with the process group open and the
  others about to agree on the data with this party;
* ``step`` (the default): just before step ``ITER``;
* ``evaluation``: just before the evaluation at ``ITER`` (``0``: before the first snapshot's
  step, during the run's first collective after set-up);
* ``checkpoint``: just before writing the checkpoint of ``ITER``;
* ``rejoin`` (``ITER`` 0): when this party, returning to the run (with ``--resume``, or by
  itself after it was counted as lost), has been admitted and is about to take the members'
  average, the admission's first collective.

``FAULT`` is ``kill`` (the default: the process sends itself SIGKILL), ``freezeS``: it sends
itself SIGSTOP, and a detached ``sleep S; kill -CONT`` wakes it ``S`` seconds later, as a site
whose machine hangs (or whose network is cut) for ``S`` seconds; or ``freeze``: SIGSTOP with no
timer, so that a test wakes it (SIGCONT) on an event of its own, such as the others' first
checkpoint after they counted it lost. Each planned fault happens once.

The simulator ignores it (``--drop-party`` injects its losses). The faults plan reads the hook
(:class:`slate.faults.FaultPlan`); a malformed item is ignored, as is one of another rank.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass

__all__ = ["FAULT_ENV", "MOMENTS", "Kill", "Kills", "parse_kills"]

FAULT_ENV = "SLATE_KILL_AT"
MOMENTS = ("setup", "step", "evaluation", "checkpoint", "rejoin")
_FREEZE = re.compile(r"freeze(\d+(?:\.\d+)?)?$")


@dataclass(frozen=True)
class Kill:
    """Party ``rank`` fails at ``iteration``'s ``moment`` with ``fault`` (``kill``, ``freezeS``
    or ``freeze``)."""

    rank: int
    iteration: int
    moment: str
    fault: str


def parse_kills(spec: str | None) -> list[Kill]:
    """The well-formed items of ``RANK@ITER[:MOMENT[:FAULT]][,...]`` (module docstring), in
    order; the others are ignored."""
    kills = []
    for item in (spec or "").split(","):
        who, _, when = item.strip().partition("@")
        at, _, rest = when.partition(":")
        moment, _, fault = rest.partition(":")
        moment, fault = moment or "step", fault or "kill"
        known = fault == "kill" or _FREEZE.match(fault)
        if who.isdigit() and at.isdigit() and moment in MOMENTS and known:
            kills.append(Kill(int(who), int(at), moment, fault))
    return kills


class Kills:
    """The moments at which this process's party dies or freezes (``kills``: the plan's, of
    every rank; ``rank``: this process's own party, None in a process that runs every party)."""

    def __init__(self, kills: list[Kill] | tuple[Kill, ...] = (), rank: int | None = None) -> None:
        self.due_at: dict[str, tuple[int, str]] = {}  # moment -> (iteration, fault)
        if rank is None:
            return
        for kill in kills:
            if kill.rank == rank:
                self.due_at[kill.moment] = (kill.iteration, kill.fault)

    def check(self, moment: str, iteration: int) -> None:
        """Fail now if this is the planned moment."""
        due = self.due_at.get(moment)
        if due is None or due[0] != iteration:
            return
        del self.due_at[moment]  # a frozen party passes this moment again after a rollback
        freeze = _FREEZE.match(due[1])
        if freeze is None:
            os.kill(os.getpid(), signal.SIGKILL)
            return
        if freeze.group(1) is not None:  # (plain ``freeze``: whoever set it sends SIGCONT)
            subprocess.Popen(
                ["sh", "-c", f"sleep {freeze.group(1)}; kill -CONT {os.getpid()}"],
                start_new_session=True,
            )
        os.kill(os.getpid(), signal.SIGSTOP)
