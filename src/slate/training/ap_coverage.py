"""Which sites' test rows the final test AP covers, after a site was lost.

With per-party test files a lost site's test rows leave with it, so the final AP of a run that
went on without it (``--on-party-loss continue``, ``--drop-party``) covers the survivors' rows
only. The closing ``test AP`` line and ``summary.json`` say so; a run that lost no site (or whose
lost sites all came back) prints its line unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["coverage_text", "lost_at"]


def lost_at(
    sites: Sequence[int], nodes: int, events: Sequence[dict[str, Any]]
) -> dict[int, int | None]:
    """Each site of ``range(nodes)`` missing from ``sites``, with the iteration of its last
    ``lost`` event (None where no event records it)."""
    missing = [rank for rank in range(nodes) if rank not in set(sites)]
    last: dict[int, int | None] = dict.fromkeys(missing)
    for event in events:
        if event.get("event") == "lost" and event.get("rank") in last:
            last[event["rank"]] = event.get("iteration")
    return last


def coverage_text(sites: Sequence[int], nodes: int, events: Sequence[dict[str, Any]]) -> str | None:
    """``over the test rows of sites 0, 1, 3 (site 2 lost at iteration 40)``, or None when
    ``sites`` holds every site of the run."""
    lost = lost_at(sites, nodes, events)
    if not lost:
        return None
    which = "site" if len(sites) == 1 else "sites"
    losses = "; ".join(_one_loss(rank, iteration) for rank, iteration in lost.items())
    return f"over the test rows of {which} {', '.join(map(str, sites))} ({losses})"


def _one_loss(rank: int, iteration: int | None) -> str:
    return f"site {rank} lost" + (f" at iteration {iteration}" if iteration is not None else "")
