"""Every site of a run as the rendezvous store shows it: the rows of ``slate status`` and the
membership events that ``slate rendezvous`` prints.

Both read the sites' status records (:mod:`slate.engines.distributed.control.site_status`) as a
client that writes nothing. A site whose record has not moved for :data:`LOST_SECONDS` (and that
is not done) counts as lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from slate.engines.distributed.control import session
from slate.engines.distributed.control.site_status import SiteStatus, read_statuses
from slate.engines.distributed.control.store_records import Records

__all__ = ["LOST_SECONDS", "MembershipEvents", "SiteRow", "present_ranks", "site_rows"]

LOST_SECONDS = 10.0  # a status record older than this (and not done) means the site is lost
GAP = 8  # without a roster, ranks are looked for until this many in a row are absent


def present_ranks(records: Records) -> list[int]:
    """The ranks of the run: the roster's, or without one the ranks that published their
    roster digest (``slate/roster/<r>``, the first record a site writes)."""
    if records.signed:
        return list(range(records.nodes))
    found, rank = [], 0
    while rank < (found[-1] if found else -1) + GAP + 1:
        if records.store.check([f"slate/roster/{rank}"]):
            found.append(rank)
        rank += 1
    return found


def site_name(records: Records, rank: int) -> str:
    """A rank as shown: ``2 (hospital-c)`` under a roster, else ``2``."""
    roster = records.roster
    return f"{rank} ({roster.sites[rank].name})" if roster is not None else str(rank)


@dataclass
class SiteRow:
    """One line of ``slate status``."""

    rank: int
    name: str
    status: SiteStatus | None
    age: float | None  # seconds since the site wrote its record (its clock against ours)

    @property
    def state(self) -> str:
        """starting, waiting for sites ..., training, evaluating, lost or done ("-": unseen)."""
        status = self.status
        if status is None:
            return "-"
        if status.state != "done" and self.age is not None and self.age > LOST_SECONDS:
            return "lost"
        if status.state == "waiting" and status.waiting:
            return "waiting for " + ", ".join(str(r) for r in status.waiting)
        return status.state


def learn_session(records: Records) -> None:
    """Under a roster: the run's session, once the sites agreed on it with this store's nonce
    (records bound to another session are then refused); nothing before, or without one."""
    if records.signed and not records.session:
        nonce = session.read_store_nonce(records.store)
        found = None if nonce is None else session.learn(records, nonce)
        if found is not None:
            records.session = found


def site_rows(records: Records, run_id: str | None = None) -> tuple[list[SiteRow], int]:
    """Every rank's row, and how many status records were ignored (not signed by their site;
    without a roster, with ``run_id``: not of that run)."""
    learn_session(records)
    ranks = present_ranks(records)
    found = read_statuses(records, ranks, run_id)
    now = time.time()
    rows = []
    for rank in ranks:
        status = found.statuses.get(rank)
        age = None if status is None else max(0.0, now - status.written)
        name = records.roster.sites[rank].name if records.roster is not None else ""
        rows.append(SiteRow(rank, name, status, age))
    return rows, found.ignored


class MembershipEvents:
    """For ``slate rendezvous``: one line per membership event, read from the status records
    at most once a second: a site joined (its first record), was lost (its record stopped
    moving), rejoined (a record again, or of a new process), or left (done)."""

    def __init__(self, records: Records, say: Callable[[str], None]) -> None:
        self.records, self.say = records, say
        self.known: dict[int, tuple[str, str]] = {}  # rank -> (process, "in" | "lost" | "done")
        self.moved: dict[int, tuple[float, float]] = {}  # rank -> (written, when seen to move)
        self.looked = 0.0

    def look(self) -> None:
        """Read the records (once a second at most) and say what changed."""
        now = time.monotonic()
        if now - self.looked < 1.0:
            return
        self.looked = now
        learn_session(self.records)
        ranks = present_ranks(self.records)
        for rank, status in read_statuses(self.records, ranks).statuses.items():
            if status is not None:
                self._follow(rank, status, now)

    def _follow(self, rank: int, status: SiteStatus, now: float) -> None:
        last = self.moved.get(rank)
        if last is None or status.written != last[0]:
            self.moved[rank] = (status.written, now)
        silent = now - self.moved[rank][1] > LOST_SECONDS
        before = self.known.get(rank)
        state = "done" if status.state == "done" else ("lost" if silent else "in")
        if before is not None and before == (status.process, state):
            return
        self.known[rank] = (status.process, state)
        self.say(self._line(rank, status, before, state))

    def _line(
        self, rank: int, status: SiteStatus, before: tuple[str, str] | None, state: str
    ) -> str:
        who = f"site {site_name(self.records, rank)}"
        stamp = time.strftime("%H:%M:%S")
        if state == "done":
            what = f"left: done at iteration {status.iteration}"
        elif state == "lost":
            what = f"lost: no status for {LOST_SECONDS:g} s (at iteration {status.iteration})"
        elif before is None:
            what = f"joined ({status.process})"
        else:
            what = f"rejoined ({status.process}) at iteration {status.iteration}"
        return f"slate rendezvous: {stamp} {who} {what}"
