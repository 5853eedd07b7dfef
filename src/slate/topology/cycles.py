r"""Time-varying graphs that average exactly after a finite cycle of sparse rounds.

Both families are cycles of symmetric, doubly stochastic, nonnegative round matrices
:math:`\mathbf{W}^{(0)}, \dots, \mathbf{W}^{(L-1)}` with
:math:`\mathbf{W}^{(L-1)} \cdots \mathbf{W}^{(0)} = \mathbf{J}`: after one cycle every party holds
the exact average, although in each round a party talks to very few others.

**One-peer exponential graph** (Ying et al., "Exponential Graph is Provably Efficient for
Decentralized Deep Training", NeurIPS 2021), for :math:`N = 2^m`. In round :math:`t`, with
:math:`\tau = t \bmod m`, party :math:`i` averages with its one peer
:math:`i \oplus 2^\tau` (bitwise XOR), weights 1/2 and 1/2. The peer is :math:`i + 2^\tau` when
bit :math:`\tau` of :math:`i` is 0 and :math:`i - 2^\tau` otherwise, so this is the undirected
(hypercube) form of the paper's graph, in which :math:`i` sends to :math:`i + 2^\tau \bmod N`.
Round :math:`\tau` averages out bit :math:`\tau`, so :math:`m` rounds give :math:`\mathbf{J}`.

**Base-(k+1) graphs** (Takezawa, Sato, Niwa, Yamada, "Beyond Exponential Graph:
Communication-Efficient Topologies for Decentralized Learning via Finite-time Convergence",
NeurIPS 2023), named ``base-K`` here with :math:`K = k + 1 \ge 2`, for every :math:`N`: at most
:math:`k` neighbours per party and round. This module builds them from three pieces, following
the paper's construction but written from its description (see :func:`base_rounds` for how the
rounds relate to the paper's):

1. *k-peer hyper-hypercube* (:func:`hyper_hypercube_rounds`): when every prime factor of
   :math:`n` is at most :math:`K`, write :math:`n = f_1 \cdots f_r` with every
   :math:`2 \le f_s \le K` and :math:`r` as small as possible, view a party as its mixed-radix
   digits :math:`(d_1, \dots, d_r)`, and let round :math:`s` average, weight :math:`1/f_s`, the
   :math:`f_s` parties that differ only in digit :math:`s` (a clique, degree :math:`f_s - 1 \le
   k`). After round :math:`s` a value no longer depends on digit :math:`s`; after :math:`r`
   rounds it is the average.
2. *Simple Base-(k+1) graph* (:func:`simple_base_rounds`): for any :math:`n`, write
   :math:`n = \sum_{l=0}^{L-1} a_l K^{p_l}` in base :math:`K` (:math:`p_0 > \dots > p_{L-1}`,
   :math:`1 \le a_l \le k`) and split the parties into consecutive groups :math:`V_l` of
   :math:`a_l K^{p_l}`. *Phase 1*: every group averages itself with a hyper-hypercube.
   *Phase 2*: merge step :math:`j = 0, \dots, L - 2` lets every party of the tail
   :math:`T_{j+1} = V_{j+1} \cup \dots \cup V_{L-1}` exchange with one party of each of the
   :math:`a_j` blocks of :math:`K^{p_j}` parties of :math:`V_j` (there are enough, since
   :math:`|T_{j+1}| < K^{p_j}`): with :math:`S_j = |V_j| + |T_{j+1}|` and
   :math:`\alpha_j = |V_j| / S_j`, the tail party keeps :math:`1 - \alpha_j` and gives
   :math:`\alpha_j / a_j` to each partner, which keeps :math:`1 - \alpha_j / a_j`. After the last
   merge every tail party holds the average :math:`\bar x` (coefficient of group :math:`l`:
   :math:`\prod_{i<l} (1 - \alpha_i) \cdot \alpha_l = |V_l| / N`). The partners of step
   :math:`j` are no longer equal, but every block of :math:`V_j` received the same exchanges, so
   every block's mean is the mean of :math:`V_j`, which mass conservation makes
   :math:`\bar x`. A hyper-hypercube inside each block (:math:`p_j` rounds, run alongside the
   later merge steps) then gives every party of :math:`V_j` the average.
3. *Base-(k+1) graph* (:func:`base_rounds`): when :math:`N = s \cdot r` with :math:`s > 1` the
   largest divisor of :math:`N` whose prime factors are all at most :math:`K`, the paper also
   averages inside :math:`s` consecutive groups of :math:`r` (Simple Base-(k+1), all at once)
   and then across the :math:`r` strided groups :math:`\{c, c + r, c + 2r, \dots\}` of
   :math:`s` (hyper-hypercube); the shorter of the candidate cycles is used.

The cycle lengths are at most :math:`2 \lfloor \log_K N \rfloor + 2`.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from slate.errors import TopologyError
from slate.topology.graph import averaging_matrix, check_n
from slate.topology.schedule import Topology

__all__ = [
    "ONE_PEER_EXPONENTIAL",
    "base_graph",
    "base_rounds",
    "hyper_hypercube_rounds",
    "one_peer_exponential",
    "one_peer_exponential_rounds",
    "parse_base",
    "rebuild_cycle",
    "simple_base_rounds",
]

#: The registered name of the one-peer exponential graph.
ONE_PEER_EXPONENTIAL = "one-peer-exponential"

_BASE_NAME = re.compile(r"base-(.*)", re.IGNORECASE | re.DOTALL)

#: A round over ``n`` local parties: ``(members, weights)`` blocks of a block-diagonal matrix,
#: each ``members`` a list of local indices and ``weights`` its (len, len) block.
Block = tuple[list[int], np.ndarray]


# ---------------------------------------------------------------------------------------------
# one-peer exponential (Ying et al., 2021)
# ---------------------------------------------------------------------------------------------


def _power_of_two_exponent(n: int) -> int | None:
    """``m`` with ``n == 2**m``, or ``None``."""
    return n.bit_length() - 1 if n & (n - 1) == 0 else None


def one_peer_exponential_rounds(n: int) -> list[np.ndarray]:
    r"""The :math:`\log_2 N` rounds of the one-peer exponential graph (Ying et al., 2021).

    Round :math:`\tau` pairs party :math:`i` with :math:`i \oplus 2^\tau`, weights 1/2 each.

    Args:
        n: :math:`N`, a power of 2; ``N = 1`` gives the single round ``[[1]]``.

    Raises:
        TopologyError: if ``n`` is not a power of 2 (naming the nearest ones and ``base-2``).
    """
    n = check_n(n)
    m = _power_of_two_exponent(n)
    if m is None:
        lower = 1 << (n.bit_length() - 1)
        raise TopologyError(
            f"The one-peer exponential graph needs a number of parties N that is a power of 2, "
            f"but N = {n}; the nearest powers of 2 are {lower} and {2 * lower}. For any N use "
            f"'base-2' (Takezawa et al., 2023), which also averages exactly after a finite "
            f"cycle with one peer per party and round."
        )
    if n == 1:
        return [np.ones((1, 1))]
    idx = np.arange(n)
    rounds = []
    for tau in range(m):
        R = np.zeros((n, n))
        R[idx, idx] = 0.5
        R[idx, idx ^ (1 << tau)] = 0.5
        rounds.append(R)
    return rounds


def one_peer_exponential(n: int) -> Topology:
    """The one-peer exponential graph as a :class:`Topology` cycle (see
    :func:`one_peer_exponential_rounds`)."""
    return Topology.from_rounds(ONE_PEER_EXPONENTIAL, one_peer_exponential_rounds(n))


# ---------------------------------------------------------------------------------------------
# k-peer hyper-hypercube
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _fewest_factors(n: int, base: int) -> tuple[int, ...] | None:
    """The shortest ``(f_1, ..., f_r)`` with product ``n`` and every ``2 <= f <= base``
    (larger factors first among equally short ones), or ``None`` if there is none."""
    if n == 1:
        return ()
    best: tuple[int, ...] | None = None
    for f in range(min(base, n), 1, -1):
        if n % f:
            continue
        rest = _fewest_factors(n // f, base)
        if rest is not None and (best is None or len(rest) + 1 < len(best)):
            best = (f, *rest)
    return best


def _hyper_hypercube_blocks(members: list[int], base: int) -> list[list[Block]]:
    """The hyper-hypercube over ``members`` as rounds of clique blocks (see
    :func:`hyper_hypercube_rounds`)."""
    factors = _fewest_factors(len(members), base)
    if factors is None:
        raise TopologyError(
            f"{len(members)} parties have a prime factor above {base}: no k-peer "
            f"hyper-hypercube with cliques of at most {base} exists."
        )
    rounds: list[list[Block]] = []
    stride = 1
    for f in factors:
        blocks: list[Block] = []
        for x in range(len(members)):
            if (x // stride) % f:
                continue  # x is not the first of its clique (digit 0 at this position)
            clique = [members[x + d * stride] for d in range(f)]
            blocks.append((clique, np.full((f, f), 1.0 / f)))
        rounds.append(blocks)
        stride *= f
    return rounds


def hyper_hypercube_rounds(n: int, base: int) -> list[np.ndarray]:
    r"""The k-peer hyper-hypercube over ``n`` parties, :math:`K` = ``base`` = k + 1.

    With :math:`n = f_1 \cdots f_r` (fewest factors, each :math:`2 \le f_s \le K`), round
    :math:`s` averages, weight :math:`1/f_s`, each clique of the :math:`f_s` parties whose
    mixed-radix digits differ only in position :math:`s`; the :math:`r` rounds multiply to
    :math:`\mathbf{J}` (Takezawa et al., 2023). ``n = 1`` gives no rounds.

    Raises:
        TopologyError: if ``n`` has a prime factor above ``base``.
    """
    return [_dense(blocks, n) for blocks in _hyper_hypercube_blocks(list(range(n)), base)]


# ---------------------------------------------------------------------------------------------
# Simple Base-(k+1) and Base-(k+1) graphs (Takezawa et al., 2023)
# ---------------------------------------------------------------------------------------------


def _base_digits(n: int, base: int) -> list[tuple[int, int]]:
    """``[(a_l, p_l), ...]`` with ``n = sum a_l * base**p_l``, ``1 <= a_l < base``,
    decreasing ``p_l``."""
    digits: list[tuple[int, int]] = []
    power = 0
    while n:
        n, digit = divmod(n, base)
        if digit:
            digits.append((digit, power))
        power += 1
    return digits[::-1]


def _merge_step(source: list[int], blocks: int, tail: list[int], total: int) -> list[Block]:
    r"""One merge round: each tail party exchanges with one party of each source block.

    With :math:`\alpha = |V_j| / S_j` (``len(source) / total``) and :math:`a` = ``blocks``,
    the tail party keeps :math:`1 - \alpha` and gives :math:`\alpha / a` to each partner,
    which keeps :math:`1 - \alpha / a`.
    """
    alpha = len(source) / total
    size = len(source) // blocks
    share = alpha / blocks
    out: list[Block] = []
    for q, party in enumerate(tail):
        partners = [source[b * size + q] for b in range(blocks)]
        w = np.zeros((blocks + 1, blocks + 1))
        w[0, 0] = 1.0 - alpha
        w[0, 1:] = w[1:, 0] = share
        w[np.arange(1, blocks + 1), np.arange(1, blocks + 1)] = 1.0 - share
        out.append(([party, *partners], w))
    return out


def _parallel(cycles: list[list[list[Block]]]) -> list[list[Block]]:
    """Run cycles over disjoint parties side by side: round ``r`` holds every cycle's round
    ``r`` (a cycle that has ended leaves its parties alone)."""
    length = max((len(c) for c in cycles), default=0)
    return [[b for c in cycles if r < len(c) for b in c[r]] for r in range(length)]


def _simple_base_blocks(members: list[int], base: int) -> list[list[Block]]:
    """The Simple Base-(k+1) cycle over ``members`` as rounds of blocks (module docstring)."""
    digits = _base_digits(len(members), base)
    groups: list[list[int]] = []
    start = 0
    for a, p in digits:
        groups.append(members[start : start + a * base**p])
        start += a * base**p
    rounds = _parallel([_hyper_hypercube_blocks(g, base) for g in groups])
    merges = len(groups) - 1
    length = max((j + 1 + p for j, (_, p) in enumerate(digits[:merges])), default=0)
    phase2: list[list[Block]] = [[] for _ in range(length)]
    for j, (a, p) in enumerate(digits[:merges]):
        tail = [x for g in groups[j + 1 :] for x in g]
        phase2[j] += _merge_step(groups[j], a, tail, len(groups[j]) + len(tail))
        size = base**p
        within = [groups[j][b * size : (b + 1) * size] for b in range(a)]
        for r, blocks in enumerate(_parallel([_hyper_hypercube_blocks(w, base) for w in within])):
            phase2[j + 1 + r] += blocks
    return rounds + phase2


def _smooth_part(n: int, base: int) -> int:
    """The largest divisor of ``n`` whose prime factors are all at most ``base``."""
    smooth = 1
    for prime in range(2, base + 1):
        while n % prime == 0:
            n //= prime
            smooth *= prime
    return smooth


def _factored_blocks(n: int, base: int) -> list[list[Block]] | None:
    """Simple Base-(k+1) inside ``s`` consecutive groups of ``r``, then the hyper-hypercube
    across the ``r`` strided groups of ``s`` (``n = s * r``, ``s`` the smooth part); ``None``
    when ``s`` or ``r`` is 1."""
    s = _smooth_part(n, base)
    r = n // s
    if s == 1 or r == 1:
        return None
    inner = _parallel(
        [_simple_base_blocks(list(range(g * r, (g + 1) * r)), base) for g in range(s)]
    )
    across = _parallel([_hyper_hypercube_blocks(list(range(c, n, r)), base) for c in range(r)])
    return inner + across


def _dense(blocks: list[Block], n: int) -> np.ndarray:
    """The (n, n) round matrix of ``blocks``; parties in no block keep their value."""
    R = np.zeros((n, n))
    covered = np.zeros(n, dtype=bool)
    for members, w in blocks:
        R[np.ix_(members, members)] = w
        covered[members] = True
    R[~covered, ~covered] = 1.0
    return R


def simple_base_rounds(n: int, base: int) -> list[np.ndarray]:
    r"""The Simple Base-(k+1) cycle over ``n`` parties, :math:`K` = ``base`` (module docstring).

    ``n = 1`` gives no rounds.
    """
    return [_dense(blocks, n) for blocks in _simple_base_blocks(list(range(n)), base)]


def base_rounds(n: int, base: int) -> list[np.ndarray]:
    r"""The rounds of the Base-(k+1) graph, :math:`K = k + 1` = ``base``, for ``n`` parties.

    The shortest of three cycles, each of which multiplies to :math:`\mathbf{J}` with at most
    :math:`k` neighbours per party and round (module docstring): the hyper-hypercube (when
    every prime factor of :math:`N` is at most :math:`K`), the Simple Base-(k+1) graph, and the
    factored form (Simple Base-(k+1) inside groups, then a hyper-hypercube across them). This
    follows Takezawa et al. (2023); the weights of every round, the choice of partners inside
    a block and the fewest-factor hyper-hypercube are this module's own, and the optional
    extra edges the authors' code adds between idle parties in phase 2 (``inner_edges``), which
    speed up mixing before the cycle ends but do not change its product, are left out.
    ``n = 1`` gives the single round ``[[1]]``; ``n <= K`` the single round :math:`\mathbf{J}`.

    Raises:
        TopologyError: if ``base`` is below 2.
    """
    n = check_n(n)
    if isinstance(base, bool) or not isinstance(base, (int, np.integer)) or base < 2:
        raise TopologyError(f"The base K of a base-K graph must be an integer >= 2, got {base!r}.")
    if n == 1:
        return [averaging_matrix(1)]
    members = list(range(n))
    candidates = [_simple_base_blocks(members, base)]
    if _fewest_factors(n, base) is not None:
        candidates.append(_hyper_hypercube_blocks(members, base))
    factored = _factored_blocks(n, base)
    if factored is not None:
        candidates.append(factored)
    shortest = min(candidates, key=len)
    return [_dense(blocks, n) for blocks in shortest]


def base_graph(n: int, base: int) -> Topology:
    """The Base-(k+1) graph, :math:`K` = ``base``, as a :class:`Topology` cycle named
    ``base-K`` (see :func:`base_rounds`)."""
    return Topology.from_rounds(f"base-{int(base)}", base_rounds(n, base))


# ---------------------------------------------------------------------------------------------
# names and survivors
# ---------------------------------------------------------------------------------------------


def parse_base(name: str) -> int | None:
    """``K`` for a name ``base-K`` (case-insensitive, surrounding spaces ignored); ``None`` for a
    name that does not start with ``base-``.

    Raises:
        TopologyError: if the part after ``base-`` is not an integer of at least 2.
    """
    match = _BASE_NAME.fullmatch(name.strip())
    if match is None:
        return None
    text = match.group(1).strip()
    value = int(text) if re.fullmatch(r"[+-]?\d+", text) else None
    if value is None or value < 2:
        shown = repr(text) if text else "nothing"
        raise TopologyError(
            f"Topology {name.strip()!r} is not a valid base-K graph: K must be an integer of at "
            f"least 2 (each party then talks to at most K - 1 others per round), but 'base-' is "
            f"followed by {shown}. Use e.g. base-2 (one peer per round) or base-3 (two peers)."
        )
    return value


def rebuild_cycle(topology: Topology, n: int) -> Topology:
    """The same kind of cycle rebuilt over ``n`` parties (for the survivors of a loss).

    ``base-K`` stays ``base-K``; ``one-peer-exponential`` stays itself when ``n`` is a power of
    2 and becomes ``base-2`` (also one peer per round) otherwise; any other cycle becomes
    ``base-(d+1)`` with ``d`` the largest degree of any of its rounds (at least 1), so that no
    party talks to more peers per round than before.

    Raises:
        TopologyError: if ``topology`` has no cycle of rounds.
    """
    if topology.rounds is None:
        raise TopologyError(f"Topology '{topology.name}' has no cycle of rounds to rebuild.")
    name = topology.name
    if name == ONE_PEER_EXPONENTIAL:
        if _power_of_two_exponent(n) is not None:
            return one_peer_exponential(n)
        return base_graph(n, 2)
    base = parse_base(name) if name.lower().startswith("base-") else None
    if base is None:
        most = max(max(topology.degrees_at(t)) for t in range(topology.cycle_length))
        base = max(most, 1) + 1
    return base_graph(n, base)
