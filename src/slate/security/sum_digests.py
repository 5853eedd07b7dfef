"""Every member of a masked sum ends with the same total, or the sum is dropped.

A masked sum (:mod:`slate.security.masking`) is made by each member sending its masked words to
every other member, and each adding what it received. A member running modified code can send
different words to different members (equivocate): the members then end with different totals,
and no check on one total sees it. So, after every masked sum, each member reports, in one small
follow-up exchange, the SHA-256 of the canonical bytes (little-endian ``uint64``) of the total it
ended with and of each member's contribution as it received it (its own as it sent it):
:func:`digest_report`. :func:`equivocation` compares the reports: when the totals differ, the sum
is dropped (:class:`SumEquivocated`), naming each sender whose contribution's digests differ
between the members that received it, where there is one.

A member can lie in its report too: it then makes its own report differ (named as such), or names
an honest sender whose contribution it claims to have received otherwise; the paragraph says so.
Every honest member gets every honest member's report, so any two honest members that ended with
different totals both see it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from slate.errors import SumRefused, parties_text

__all__ = ["DIGEST_BYTES", "SumEquivocated", "digest_report", "equivocation"]

DIGEST_BYTES = 32  # SHA-256


class SumEquivocated(SumRefused):
    """The members of a masked sum ended with different totals: the sum is dropped on every
    member, which stops keeping its own model."""


def _digest(words: np.ndarray) -> bytes:
    """SHA-256 of ``words``' canonical bytes: little-endian 64-bit words, in order."""
    return hashlib.sha256(np.ascontiguousarray(words).astype("<u8", copy=False).tobytes()).digest()


def digest_report(total: np.ndarray, parts: Sequence[np.ndarray]) -> np.ndarray:
    """This member's report: the digest of its total, then of each member's contribution as it
    holds it (member order), as ``uint8`` (``32 * (1 + len(parts))`` bytes)."""
    digests = [_digest(total), *(_digest(part) for part in parts)]
    return np.frombuffer(b"".join(digests), dtype=np.uint8).copy()


def _split(report: np.ndarray) -> list[bytes]:
    raw = np.asarray(report, dtype=np.uint8).tobytes()
    return [raw[k : k + DIGEST_BYTES] for k in range(0, len(raw), DIGEST_BYTES)]


def _groups(values: dict[int, bytes]) -> list[list[int]]:
    """The ranks grouped by equal value, largest group first."""
    by: dict[bytes, list[int]] = {}
    for rank, value in values.items():
        by.setdefault(value, []).append(rank)
    return sorted(by.values(), key=lambda ranks: (-len(ranks), ranks))


def _grouped_text(groups: list[list[int]], noun: str) -> str:
    return "; ".join(
        f"{parties_text(g)} {'hold' if len(g) > 1 else 'holds'} {noun} {chr(65 + k)}"
        for k, g in enumerate(groups)
    )


def equivocation(
    reports: Sequence[np.ndarray], members: Sequence[int], what: str
) -> SumEquivocated | None:
    """The error to raise when the members' reports (member order, :func:`digest_report`) show
    different totals; ``None`` when every member ended with the same total."""
    rows = [_split(report) for report in reports]
    totals = {rank: row[0] for rank, row in zip(members, rows, strict=True)}
    if len(set(totals.values())) == 1:
        return None
    senders = []
    for k, sender in enumerate(members):
        received = {rank: row[1 + k] for rank, row in zip(members, rows, strict=True)}
        received.pop(sender)  # (what it says it sent is its own word)
        groups = _groups(received)
        if len(groups) > 1:
            senders.append(
                f"{parties_text([sender])} sent different contributions to different members "
                f"({_grouped_text(groups, 'contribution')})"
            )
    if senders:
        who = (
            "; ".join(senders) + ": it equivocates, or a member lies about what it received "
            "(either runs modified code)"
        )
    else:
        who = (
            "every member received the same contribution from each sender, so a member lies in "
            "its report of the total (runs modified code)"
        )
    return SumEquivocated(
        f"The masked sum of the {what} was dropped: the members ended with different totals "
        f"({_grouped_text(_groups(totals), 'total')}). {who[0].upper()}{who[1:]}. A lie in a "
        "sum: nothing of it was used, and every site stops here."
    )
