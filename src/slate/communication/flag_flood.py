r"""The stop and join flags carried by the gossip messages themselves, instead of one exchange
with every party at each chunk's end.

At the end of each chunk of iterations every party must agree on two flags: whether any party
asks to stop (SIGINT, SIGTERM) and whether any party's lookout saw a returning party ask to join.
A separate exchange costs a round trip per chunk on a wide-area link. But the gossip rounds of
the chunk already link every party to every other one, a few hops at a time: if every message of
the chunk's last gossip rounds carries the OR of the flags its sender has heard of, then after
enough rounds every party has heard every party's flags (flooding; with ``base-2`` on
:math:`N = 2^k` parties, :math:`k` rounds: recursive doubling on the gossip's own schedule).

**The window.** Every party computes the same plan from public facts (topology, local steps, the
chunk's first and last iteration): the gossip rounds of the chunk, and the shortest run of its
last rounds after which every party has heard every party (:func:`flooding_start`, with the
boolean reach :math:`F = S_{L-1} \cdots S_k`, :math:`S_r = I + A_r`, :math:`A_r` the round's
links). Each party takes its own flags once, when the window opens (its first message of the
window), and each message of the window carries the OR of what its sender has heard; what
arrives in the window is OR-ed in. At the chunk's end every party then holds the same OR: its
flags are agreed without a message of their own. A flag raised after the window opened is
carried by the next chunk's window (a stop is honoured a chunk later at most). A chunk whose
rounds do not reach every party (too few rounds, a round of full averaging, a static topology
with a long diameter) gets no plan, and the flags take their own exchange, as before.

Only exchanges of parties that really send count: a round's links are the off-diagonal nonzeros
of its mixing matrix, the parties a distributed process swaps messages with in that round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from slate.topology import Topology

__all__ = ["FlagFlood", "flag_bits", "flooding_start", "gossip_iterations"]


def flag_bits(flags: list[bool]) -> int:
    """Flags as the bits of one small integer (flag ``k`` is bit ``k``)."""
    return sum(1 << k for k, flag in enumerate(flags) if flag)


def gossip_iterations(topology: Topology, every: int, start: int, end: int) -> list[int]:
    """The iterations ``t`` in ``[start, end)`` that end with a gossip round of point-to-point
    messages: :math:`(t + 1) \\bmod H = 0`, and the round :math:`\\lfloor t / H \\rfloor` is not
    an exact average (that one is an all-reduce, which carries no flags)."""
    first = start + (-(start + 1)) % every
    return [t for t in range(first, end, every) if not topology.is_full_average_at(t // every)]


def flooding_start(topology: Topology, rounds: list[int]) -> int | None:
    """The largest ``k`` such that the gossip rounds ``rounds[k:]`` (in order) carry something
    every party holds at round ``rounds[k]`` to every party; None if even all of them do not.

    Going back from the last round, :math:`F \\leftarrow F\\,(I + A_r)`: entry ``(i, j)`` of
    :math:`F` says whether party ``j``'s value reaches party ``i`` by the end."""
    n = topology.n
    if n < 2:
        return None
    cycle = max(1, topology.cycle_length)
    reach = np.eye(n, dtype=np.int64)
    links: dict[int, np.ndarray] = {}
    # Whatever floods does so within (n - 1) cycles of rounds: look back no further.
    earliest = max(0, len(rounds) - cycle * (n - 1))
    for k in range(len(rounds) - 1, earliest - 1, -1):
        key = rounds[k] % cycle
        if key not in links:
            links[key] = _links(topology, rounds[k])
        reach = np.minimum(reach @ links[key], 1)
        if reach.all():
            return k
    return None


def _links(topology: Topology, r: int) -> np.ndarray:
    """:math:`I + A_r` as 0/1 integers: who hears whom in round ``r`` (itself included)."""
    matrix = np.asarray(topology.matrix_at(r))
    return ((matrix > 0) | np.eye(len(matrix), dtype=bool)).astype(np.int64)


@dataclass
class FlagFlood:
    """One chunk's plan: flags heard from the window's messages, agreed at its ``end``.

    ``window`` is ``(first, end)``: the messages of iterations ``first <= t < end`` carry flags.
    ``snapshot`` gives this party's own flags (:func:`flag_bits`) when the window opens."""

    window: tuple[int, int]
    snapshot: Callable[[], int]
    heard: int = 0
    taken: bool = False

    @classmethod
    def plan(
        cls, topology: Topology, every: int, start: int, end: int, snapshot: Callable[[], int]
    ) -> FlagFlood | None:
        """The plan of the chunk of iterations ``[start, end)``, or None when its gossip rounds
        do not reach every party (the flags then take an exchange of their own)."""
        iterations = gossip_iterations(topology, every, start, end)
        k = flooding_start(topology, [t // every for t in iterations])
        return None if k is None else cls((iterations[k], end), snapshot)

    def carries(self, t: int) -> bool:
        """Whether the messages of iteration ``t`` carry flags."""
        return self.window[0] <= t < self.window[1]

    def outgoing(self, t: int) -> int:
        """The bits a message of iteration ``t`` carries (this party's flags taken when the
        window opens, OR what it has heard since); 0 outside the window."""
        if not self.carries(t):
            return 0
        if not self.taken:
            self.heard |= self.snapshot()
            self.taken = True
        return self.heard

    def arrived(self, t: int, bits: int) -> None:
        """A message of iteration ``t`` arrived with ``bits``."""
        if self.carries(t):
            self.heard |= bits

    def agreed(self, t: int) -> int | None:
        """The flags every party holds at iteration ``t``: those heard, if ``t`` is the window's
        end; None otherwise (the flags need an exchange of their own)."""
        if t != self.window[1]:
            return None
        if not self.taken:  # (a process that runs every party: nothing to carry)
            self.heard |= self.snapshot()
            self.taken = True
        return self.heard
