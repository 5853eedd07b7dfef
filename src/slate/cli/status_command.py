"""``slate status HOST:PORT``: every site of a multi-site run, one line each, read from the
rendezvous store as a client that registers and writes nothing (the sites' status records,
:mod:`slate.engines.distributed.control.site_status`): its parser and its handler."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from slate.errors import ConfigError

__all__ = ["add_status_parser", "run_status"]

EXIT_UNREACHABLE = 1
HEADER = ("rank", "name", "state", "iteration", "heartbeat", "pooled AP", "finish")


def add_status_parser(sub: Any) -> None:
    """``slate status HOST:PORT [--watch [SECONDS]] [--roster FILE] [--run-id ID]``."""
    status = sub.add_parser(
        "status",
        help="show every site of a multi-site run: state, iteration, heartbeat, AP, finish",
        description="Read the sites' status records at a rendezvous store (as a client that "
        "writes nothing) and print one line per site: rank, roster name, state (starting, "
        "waiting for whom, training, evaluating, lost, done), iteration, the age of its last "
        "heartbeat, the latest pooled AP and the estimated finish.",
    )
    status.add_argument("address", metavar="HOST:PORT", help="the rendezvous store's address")
    status.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until every site is done or the store is gone",
    )
    status.add_argument(
        "--roster",
        metavar="FILE",
        help="the run's roster: only records whose signature verifies with their site's key "
        "are shown, with the sites' names; the others are counted",
    )
    status.add_argument(
        "--run-id",
        help="the run id: with --roster it must be the roster's; without, only records of that "
        "run are shown",
    )
    status.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to reach the store before giving up with status 1 (default 10)",
    )


def run_status(args: argparse.Namespace) -> int:
    """The handler: 0 once shown (with --watch, once the run ended), 1 if the store cannot be
    reached within --timeout."""
    from slate.engines.distributed.control.store_door import reach_store

    host, port = _address(args.address)
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive seconds, got {args.timeout:g}.")
    if args.watch is not None and args.watch <= 0:
        raise ConfigError(f"--watch must be positive seconds, got {args.watch:g}.")
    records = _records(args)
    store, why = reach_store(host, port, args.timeout)
    if store is None:
        print(
            f"slate status: could not reach the rendezvous store at {args.address} within "
            f"--timeout {args.timeout:g} s: {why}. Check the address, that 'slate rendezvous' "
            "(or party 0) still serves the run (a finished run takes its rendezvous with it), "
            "and that no firewall drops the port.",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    records.store = store
    return _show(records, args)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"the address must be HOST:PORT (a port in 1..65535), got {text!r}.")
    return host.strip("[]"), int(port)


def _records(args: argparse.Namespace) -> Any:
    """Records that read (and, with --roster, check) without any key of this process."""
    from slate.engines.distributed.control.store_records import Records

    roster = None
    if args.roster is not None:
        from slate.security import Roster

        roster = Roster.read(args.roster)
        if args.run_id is not None and args.run_id != roster.run_id:
            raise ConfigError(
                f"--run-id {args.run_id!r} is not the roster's run id {roster.run_id!r}."
            )
    return Records(None, roster.n if roster else 1 << 16, roster=roster, say=lambda _: None)


def _show(records: Any, args: argparse.Namespace) -> int:
    from slate.engines.distributed.control.site_view import site_rows

    while True:
        try:
            rows, ignored = site_rows(records, args.run_id)
        except (RuntimeError, OSError):  # the store went away: the run is over
            if args.watch is None:
                raise
            print("slate status: the rendezvous store is gone: the run is over.")
            return 0
        if args.watch is not None:
            print(time.strftime("%H:%M:%S"))
        print(render(rows, ignored, records.signed), flush=True)
        if args.watch is None or (rows and all(r.state == "done" for r in rows)):
            return 0
        time.sleep(args.watch)


def render(rows: list[Any], ignored: int, checked: bool) -> str:
    """The table: a header, one line per site, and the footers."""
    table = [HEADER] + [_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
             for line in table]  # fmt: skip
    if not rows:
        lines.append("(no site has published a status record yet)")
    if checked and ignored:
        lines.append(f"{ignored} records ignored: not signed by a roster site")
    if not checked:
        lines.append("(signatures not checked: give the run's --roster to check them)")
    return "\n".join(lines)


def _cells(row: Any) -> tuple[str, ...]:
    status = row.status
    if status is None:
        return (str(row.rank), row.name or "-", "not seen", "-", "-", "-", "-")
    finish = status.finish_time()
    return (
        str(row.rank),
        row.name or "-",
        row.state,
        f"{status.iteration}/{status.iterations}" if status.iterations else "-",
        f"{row.age:.1f} s ago",
        "-" if status.pooled_ap is None else f"{status.pooled_ap:.4f}",
        "-" if finish is None else _finish_text(finish),
    )


def _finish_text(when: float) -> str:
    left = max(0.0, when - time.time())
    return f"{time.strftime('%H:%M:%S', time.localtime(when))} (in {left:.0f} s)"
