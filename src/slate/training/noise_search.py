r"""The accountant's searches (:mod:`slate.training.accountant`): the smallest noise multiplier
``z`` whose composition meets a budget, and the most releases a budget affords.

Both search a monotone function: ``eps(z)``, the ε of a composition in which one mechanism has
multiplier ``z``, falls as ``z`` grows; ``eps(n)`` at a fixed ``z`` grows with the count ``n``.
Every answer is a point at which the accountant given (slate's, at its production
discretisation) was evaluated and met the budget; the searches only choose where to evaluate.

**Where to evaluate.** Over a narrow bracket ``[low, high]`` with ``eps(low) > epsilon >=
eps(high)``, ``log eps`` is close to linear in ``log z`` (``eps ~ 1 / z`` for a small budget,
``~ 1 / z^2`` for a large one), so the crossing is estimated by interpolating ``log eps``
linearly in ``log z``, and two points straddling the estimate by ``0.45 tol low`` each close the
bracket to ``high - low <= tol low`` when the estimate is right. A probe on the wrong side is
followed by a bisection (the geometric midpoint), so the bracket at least halves every other
step whatever the function's shape.

**Coarse to fine** (:func:`smallest_z`). The bracket is found with a coarser discretisation of
the PLD, about 10 times cheaper per evaluation and far more so at small ``z``. A PLD accountant
is pessimistic: its ε at a coarser interval is at least its ε at a finer one (the finer grid's
points lie on the coarser one, and the losses are rounded up to the grid), so the coarse answer
``z_c`` errs towards more noise: ``eps_fine(z_c) <= epsilon`` and the fine answer lies just
below it (0.0 to 1.5% below on the schedules of docs/privacy.md). Nothing rests on that: the
fine accountant is evaluated at ``z_c`` and the search goes up from it where it does not meet
the budget, and goes down (doubling its step) until a ``z`` that does not meet it brackets the
crossing, which the fine accountant alone then narrows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: The coarse phase's relative tolerance: the fine phase starts within about this of its answer.
COARSE_TOL = 1e-2


def _interpolated(low: float, e_low: float, high: float, e_high: float, epsilon: float) -> float:
    """Where ``log eps`` interpolated linearly in ``log z`` between ``(low, e_low)`` and
    ``(high, e_high)`` meets ``epsilon`` (the geometric midpoint where that is undefined)."""
    if not e_low > epsilon >= e_high > 0:
        return math.sqrt(low * high)
    t = math.log(e_low / epsilon) / math.log(e_low / e_high)
    return low * (high / low) ** t


def narrowed(
    eps: Callable[[float], float], epsilon: float, low: float, high: float, tol: float
) -> tuple[float, float]:
    """``[low, high]`` (``eps(low) > epsilon >= eps(high)``, ``eps`` falling) narrowed to
    ``high - low <= tol * low`` with the same property, by interpolated straddles and, after a
    probe on the wrong side, a bisection."""
    guess = True
    while high - low > tol * low:
        margin = 0.45 * tol * low
        if guess:
            x = _interpolated(low, eps(low), high, eps(high), epsilon) + margin
            probe = min(max(x, low + margin), high - margin)
        else:
            probe = math.sqrt(low * high)
        if eps(probe) > epsilon:
            low, guess = probe, False
            continue
        high = probe
        if not guess:
            guess = True
            continue
        below = probe - 2.0 * margin
        if below > low and high - low > tol * low:
            if eps(below) > epsilon:
                low = below
            else:
                high, guess = below, False
    return low, high


def _coarse_answer(
    eps: Callable[[float], float], epsilon: float, floor: float, ceiling: float
) -> float:
    """A ``z`` in ``[floor, ceiling]`` at which ``eps`` (the coarse accountant) meets
    ``epsilon``, within :data:`COARSE_TOL` of the smallest (``ceiling`` where none does): a
    bracket by doubling from 1 (halving below it), narrowed."""
    high = 1.0
    while eps(high) > epsilon:
        if high >= ceiling:
            return ceiling
        high = min(2.0 * high, ceiling)
    low = high / 2.0
    while eps(low) <= epsilon:
        if low <= floor:
            return floor
        high, low = low, max(low / 2.0, floor)
    return narrowed(eps, epsilon, low, high, COARSE_TOL)[1]


def smallest_z(
    fine: Callable[[float], float],
    coarse: Callable[[float], float],
    epsilon: float,
    floor: float,
    ceiling: float,
    tol: float,
) -> float | None:
    """The smallest ``z`` in ``[floor, ceiling]`` with ``fine(z) <= epsilon``, to a relative
    ``tol`` on the safe side: a ``z`` with ``fine(z) <= epsilon`` and ``fine(z / (1 + tol)) >
    epsilon`` (``floor`` where ``fine(floor)`` meets it; None where ``fine(ceiling)`` does not).
    The bracket comes from ``coarse`` (a pessimistic, cheaper accountant), the answer from
    ``fine`` alone."""
    high = _coarse_answer(coarse, epsilon, floor, ceiling)
    low: float | None = None
    step = COARSE_TOL
    while fine(high) > epsilon:  # (the coarse accountant was not pessimistic here: go up)
        if high >= ceiling:
            return None
        low, high = high, min(high * (1.0 + step), ceiling)
        step *= 2.0
    if low is None:
        # Below the coarse answer: first where eps ~ 1/z puts the crossing (at or below it
        # where eps falls faster), at least a tolerance down; then by doubling steps.
        candidate = min(high * fine(high) / epsilon, high / (1.0 + tol))
        while True:
            if high <= floor:
                return floor
            candidate = max(candidate, floor)
            if fine(candidate) > epsilon:
                low = candidate
                break
            high, candidate = candidate, candidate * (1.0 - min(step, 0.5))
            step *= 2.0
    return narrowed(fine, epsilon, low, high, tol)[1]


def most_releases(eps: Callable[[int], float], most: int, epsilon: float) -> int:
    """The largest ``n`` in ``[0, most]`` with ``eps(n) <= epsilon`` (``eps`` growing with
    ``n``, ``eps(0) = 0``, ``eps(most) > epsilon``): ``log eps`` interpolated linearly in
    ``log n`` between the bracket's ends, the estimate's floor and the count after it probed
    (``eps(n) <= epsilon < eps(n + 1)`` closes the bracket); a bisection after a miss."""
    if eps(1) > epsilon:
        return 0
    low, high, guess = 1, most, True
    while high - low > 1:
        if guess:
            e_low, e_high = eps(low), eps(high)
            t = math.log(epsilon / e_low) / math.log(e_high / e_low) if 0 < e_low < e_high else 0.5
            probe = min(max(int(low * (high / low) ** t), low + 1), high - 1)
        else:
            probe = (low + high) // 2
        if eps(probe) > epsilon:
            high, guess = probe, False
            continue
        low = probe
        if not guess:
            guess = True
            continue
        if probe + 1 < high:
            if eps(probe + 1) > epsilon:
                high = probe + 1
            else:
                low, guess = probe + 1, False
    return low
