r"""What a site checks in the evaluation's sum before it believes it: the consensus distance and
the non-finite flag, bounded by what the site measures itself.

The evaluation's one sum (:class:`slate.training.evaluation.Evaluator`) carries, besides the
counts, two numbers from every process: its parties' share of the consensus distance,
:math:`\sum_i \lVert x_i - \bar x\rVert^2`, and a 0/1 flag "the averaged model's scores on my
test rows are non-finite". Under a roster the sum is masked, so it does not show who added
what; a participant that runs modified code can add anything. A site checks what it can:

* **The distance** is a sum of squared norms: it is never negative, never NaN, and never below
  this site's own term (which it adds itself, and every other term is :math:`\ge 0`).
  :func:`distance_problem` names a total that breaks this.
* **The flag** is a count of processes: an integer between 0 and the number of processes. When
  it is set while this site's own parameters score finite on its own test rows, another party
  raised it (its own training diverged, or it lied in the sum): :func:`flag_problem` says so and
  never blames this site.

A refused sum raises :class:`~slate.errors.SumRefused`: every site stops, keeping its own model
(:mod:`slate.training.loop`), with one paragraph that names the lie.
"""

from __future__ import annotations

import math

from slate.errors import SumRefused

__all__ = ["distance_problem", "flag_problem", "refusal"]

#: A masked float is summed to :math:`2^{-40}` per site (:data:`slate.security.masking.FLOAT_BITS`).
STEP = math.ldexp(1.0, -40)


def distance_problem(total: float, own: float, processes: int) -> str | None:
    """Why the summed consensus distance ``total`` cannot be true, given this process's own
    term ``own`` (``None``: it can)."""
    if math.isnan(total) or math.isinf(total):
        return f"the summed consensus distance is {total!r}, where a sum of squared norms is finite"
    slack = 2 * processes * STEP + 1e-12 * abs(own)  # the fixed point's rounding of every term
    if total < -slack:
        return (
            f"the summed consensus distance is {total:.6g}, negative, where it is a sum of "
            "squared norms ||x_i - x_avg||^2"
        )
    if total < own - slack:
        return (
            f"the summed consensus distance is {total:.6g}, below this site's own term "
            f"{own:.6g}, where every other site's term is a squared norm (never negative)"
        )
    return None


def flag_problem(count: float, processes: int, own_finite: bool, largest: float) -> str | None:
    """Why a non-zero summed non-finite flag ``count`` is no fault of this site (``None``: this
    site's own model scores non-finite, so its own training diverged). ``own_finite``: whether
    this site's own parameters score finite on its own test rows; ``largest``: their largest
    magnitude."""
    if not (float(count).is_integer() and 0 <= count <= processes):
        return (
            f"the summed non-finite flag is {count!r}, where it counts processes: an integer "
            f"between 0 and {processes}"
        )
    if not own_finite:
        return None
    return (
        f"the summed non-finite flag says {int(count)} site(s) found the averaged model's test "
        "scores non-finite (NaN or inf), while this site's own parameters are finite (largest "
        f"|value| {largest:.3g}) and score finite on its own test rows: another party's "
        "contribution raised it (its own training diverged, or it lied in the sum), not this site"
    )


def refusal(problem: str, iteration: int, rank: int | None) -> SumRefused:
    """The error of an evaluation sum refused at ``iteration`` (``rank``: this site's, if one)."""
    who = f"Party {rank}" if rank is not None else "This process"
    return SumRefused(
        f"{who} refused the evaluation sum at iteration {iteration}: {problem}. A lie in a sum: "
        "a participant runs modified code (a sum does not show which one). Nothing of the sum "
        "was used; every site stops here."
    )
