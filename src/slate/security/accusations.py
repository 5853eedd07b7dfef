"""What ``--robust clip``'s receivers report at the end of a run, and how every site reads it:
per sender, each receiver's own report, and an exclusion as the accusation of the receiver that
made it, never as a verdict (:mod:`slate.security.robust`, "Accusations"); a persistent pull
(:mod:`slate.security.pulls`) as the suspicion of the receiver that saw it, not an exclusion."""

from __future__ import annotations

from typing import Any

from slate.errors import parties_text
from slate.security.pulls import NO_PULL, PULL_COLUMNS

__all__ = ["RECORD_SHAPE", "accusation_lines", "current_record", "events_from_records"]

#: One row of ``MessageGuard.records`` as the parties exchange it at the end of a run:
#: ``[receiver, sender, received, dropped, clipped, far, ignored, excluded_at]`` and the
#: pull's columns (:data:`slate.security.pulls.PULL_COLUMNS`): ``suspected_at, reasons,
#: share, median, consistency`` (thousandths), ``first, seen, clipped``.
RECORD_SHAPE = [int] * (8 + PULL_COLUMNS)


def current_record(row: list[int]) -> list[int]:
    """A record as :data:`RECORD_SHAPE` has it (one written before the far count gets 0, one
    written before the pull's columns gets :data:`~slate.security.pulls.NO_PULL`)."""
    row = [int(v) for v in row]
    row = [*row[:5], 0, *row[5:]] if len(row) == 7 else row
    return [*row, *NO_PULL] if len(row) == 8 else row


def pull_report(row: list[int]) -> dict[str, Any]:
    """The pull's part of one receiver's report (none for a pair no watch measured):
    ``suspected_at`` (None: not), ``reasons``, ``clipped_share``, ``median_share`` and
    ``consistency`` (at the suspicion, else at the end), ``first_iteration`` and the messages
    ``counted`` and ``counted_clipped`` then."""
    at, reasons, share, median, consistent, first, seen, clipped = row[8:]
    if share < 0:
        return {}
    why = [name for bit, name in ((1, "clipped more often"), (2, "one direction")) if reasons & bit]
    return {"pull": {
        "suspected_at": at if at >= 0 else None, "reasons": why, "clipped_share": share / 1000,
        "median_share": median / 1000 if median >= 0 else None, "consistency": consistent / 1000,
        "first_iteration": first, "counted": seen, "counted_clipped": clipped,
    }}  # fmt: skip


def events_from_records(records: list[list[int]], iteration: int) -> list[dict[str, Any]]:
    """One ``"robust"`` entry per sender from ``MessageGuard.records`` rows (from one
    process or all): its counts summed over the receivers that saw it, and each receiver's own
    report (``reports``). An exclusion is an accusation made by the receiver that excluded it,
    and only that receiver's (``accused_by``, ``accusations``): every site lists the same
    accusations, each with its accuser, not a verdict."""
    by_sender: dict[int, list[list[int]]] = {}
    for row in map(current_record, records):
        by_sender.setdefault(row[1], []).append(row)
    events = []
    for sender, rows in sorted(by_sender.items()):
        rows.sort()
        received, dropped, clipped, far = (sum(r[k] for r in rows) for k in range(2, 6))
        reports = [
            {"by": r[0], "received": r[2], "dropped": r[3], "clipped": r[4], "far": r[5],
             "ignored": r[6], "excluded_at": r[7] if r[7] >= 0 else None, **pull_report(r)}
            for r in rows
        ]  # fmt: skip
        accusations = [report for report in reports if report["excluded_at"] is not None]
        suspicions = [r for r in reports if r.get("pull", {}).get("suspected_at") is not None]
        seen_by = sorted({r[0] for r in rows})
        receivers = parties_text(seen_by)
        reason = (
            f"{dropped} dropped (non-finite), {far} farther than half the receiver's own model "
            f"and {clipped} clipped of the {received} messages received from it by {receivers}"
        )
        if accusations:
            reason += "; " + "; ".join(f"party {a['by']} {accusation_text(a)}" for a in accusations)
        else:
            reason += "; no party excluded it"
        if suspicions:
            reason += "; suspected of a persistent pull by " + parties_text(
                [r["by"] for r in suspicions]
            )
        events.append({
            "rank": sender, "iteration": iteration, "event": "robust", "reason": reason,
            "received": received, "dropped": dropped, "clipped": clipped, "far": far,
            "seen_by": seen_by, "accused_by": [a["by"] for a in accusations],
            "accusations": accusations, "reports": reports,
            "suspected_by": [r["by"] for r in suspicions], "suspicions": suspicions,
        })  # fmt: skip
    return events


def accusation_text(report: dict[str, Any]) -> str:
    """What one receiver's accusation says: ``excluded it from iteration 15: 16 of the 16
    messages it received from it were non-finite or farther than half its own model; 1984
    later messages ignored``."""
    refused = report["dropped"] + report["far"]
    return (
        f"excluded it from iteration {report['excluded_at']}: {refused} of the "
        f"{report['received']} messages it received from it were non-finite or farther "
        f"than half its own model; {report['ignored']} later messages ignored"
    )


def suspicion_text(report: dict[str, Any]) -> str:
    """What one receiver's suspicion says: the rule's evidence (:mod:`slate.security.pulls`)."""
    pull = report["pull"]
    median = "n/a" if pull["median_share"] is None else f"{pull['median_share']:.2f}"
    return (
        f"suspected of a persistent pull at iteration {pull['suspected_at']} "
        f"({' and '.join(pull['reasons'])}): {pull['counted_clipped']} of the "
        f"{pull['counted']} messages it received from it from iteration "
        f"{pull['first_iteration']} on were clipped (running share {pull['clipped_share']:.2f}, "
        f"median over its senders {median}), their excess's mean direction "
        f"{pull['consistency']:.2f} of a constant one; not excluded"
    )


def accusation_lines(events: list[dict[str, Any]]) -> list[str]:
    """One line per accusation in ``"robust"`` events: ``party 2 accuses party 1: --robust clip
    excluded it from iteration 15: ...``, then one per suspicion: ``party 0 suspects party 1:
    --robust clip suspected ...``. Each names its accuser: the line reports what that party
    says it saw, not a fact every site established."""
    robust = [e for e in events if e["event"] == "robust"]
    return [
        f"party {a['by']} accuses party {e['rank']}: --robust clip {accusation_text(a)}"
        for e in robust
        for a in e.get("accusations", [])
    ] + [
        f"party {s['by']} suspects party {e['rank']}: --robust clip {suspicion_text(s)}"
        for e in robust
        for s in e.get("suspicions", [])
    ]
