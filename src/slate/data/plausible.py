r"""Whether the row counts the sites declared are plausible, and scaling no single site can steer.

A site that runs modified code can declare any row counts it likes and make every sum agree with
them (:mod:`slate.data.declared` checks sums against declarations, not declarations against
the world). Two lies measured on four w7a sites: 40 000 declared test rows (39 000 positive),
planted in the evaluation counts, moved the pooled AP from 0.715 to 0.998 (or to 0.044 with
the classes swapped); 1 000 000 declared training rows, with consistent standardisation sums,
moved the trained model's AP from 0.707 to 0.661. So before step 1 every site checks every
site's declared counts against three rules (:class:`SetupBounds`, ``--declared-bounds``):

* **test_ratio** (default 3): a site's declared test rows are at most this many times its
  declared training rows (an honest split holds out a share of the site's own rows; w7a's
  test file is 1.01 times its training file);
* **share** (default 10): a site's declared training rows, and its test rows, are at most this
  many times those of all other sites together (with at least 3 sites). Measured on w7a's
  labels split by ``--partition dirichlet`` (alpha 0.5), 300 seeds: the largest site held at
  most 1.02 times the others' rows over 20 sites, 2.8 times over 10 sites; over 4 sites 17
  times at the 99th percentile and 44 at most (raise it for such a split);
* **rate** (default 3): a site's test positive rate lies within this factor of its training
  positive rate, widened by four standard errors of the difference of the two rates (the
  two-sample binomial error at the site's pooled rate, with half a positive added). A site
  that declares no positive training row (such a site joins a run) is judged by the other
  rules only: a liar can declare that and plant positives up to the test_ratio and share
  bounds, which is why each site's headline AP is that of its own test rows.

A site outside a rule is named at every site (:class:`ImplausibleDeclaration`, exit 2), before
any sum: nothing was trained. The rules bound a lie, they cannot find one within them.

**Bounded scaling** (:func:`bound_moments`): under ``--standardize`` each site also computes the
mean and standard deviation of its own training rows, and clamps the federated ones per
feature: the standard deviation into :math:`[s_{own} / F, s_{own} F]`, the mean into
:math:`m_{own} \pm F s_{own}` (F: **scale**, default 20; a feature constant at the site is not
bounded). Measured on w7a, 20 seeds: the federated std lay within 16.7 times a site's own on
20 Dirichlet (alpha 0.5) sites and within 3.0 on stratified ones, the mean within 1.4 own stds,
so the clamp does not bind on honest uneven partitions. Where it binds, the site says so,
naming the features, in its own output; it then scales with the clamped values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from slate.data.declared import DeclarationBroken
from slate.data.schema import PartyCounts
from slate.errors import parse_bounds

__all__ = [
    "ImplausibleDeclaration",
    "SetupBounds",
    "bound_moments",
    "check_plausible",
    "plausibility_problems",
]

FLAG = "--declared-bounds"
STANDARD_ERRORS = 4.0  # the binomial slack of the rate rule
MIN_SITES_FOR_SHARE = 3


class ImplausibleDeclaration(DeclarationBroken):
    """A site declared row counts outside the plausibility rules (module docstring)."""


@dataclass(frozen=True)
class SetupBounds:
    """The plausibility rules' factors and the scaling clamp's (module docstring)."""

    test_ratio: float = 3.0
    share: float = 10.0
    rate: float = 3.0
    scale: float = 20.0

    @classmethod
    def parse(cls, text: str | None) -> SetupBounds:
        """``NAME=VALUE,...`` (``--declared-bounds``); unnamed bounds keep their defaults, and
        each is a factor of at least 1."""
        return parse_bounds(cls, text, FLAG, 1.0)

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def bounds_text(text: str) -> str:
    """``text``, once :meth:`SetupBounds.parse` accepts it (the flag's argparse type)."""
    SetupBounds.parse(text)
    return text


def _rate(positives: int, rows: int) -> float:
    return (positives + 0.5) / (rows + 1.0)


def _ratio_problem(c: PartyCounts, bound: float) -> str | None:
    if c.test > bound * max(c.train, 0):
        return (f"{c.test} test rows against {c.train} training rows (at most "
                f"{bound:g} times its training rows: test_ratio)")  # fmt: skip
    return None


def _rate_problem(c: PartyCounts, bound: float) -> str | None:
    if c.test == 0 or c.train_positives == 0:  # (a site without positives joins: judged
        return None  # by the other rules)
    p_train, p_test = _rate(c.train_positives, c.train), c.test_positives / c.test
    pooled = _rate(c.train_positives + c.test_positives, c.train + c.test)
    spread = pooled * (1 - pooled) * (1 / c.test + 1 / max(c.train, 1))
    slack = STANDARD_ERRORS * math.sqrt(spread)
    if p_train / bound - slack <= p_test <= p_train * bound + slack:
        return None
    return (f"a test positive rate of {p_test:.1%} ({c.test_positives} of {c.test}) against "
            f"{c.train_positives / max(c.train, 1):.1%} in its training rows (within a factor "
            f"of {bound:g}, give or take {STANDARD_ERRORS:g} standard errors: rate)")  # fmt: skip


def _share_problems(counts: Sequence[PartyCounts], bound: float) -> dict[int, str]:
    found: dict[int, str] = {}
    if len(counts) < MIN_SITES_FOR_SHARE:
        return found
    for what in ("train", "test"):
        rows = [getattr(c, what) for c in counts]
        for rank, n in enumerate(rows):
            others = sum(rows) - n
            if rank not in found and n > bound * max(others, 1):
                found[rank] = (f"{n} {'training' if what == 'train' else 'test'} rows, "
                               f"{n / max(others, 1):.0f} times the {others} of all other "
                               f"sites together (at most {bound:g} times: share)")  # fmt: skip
    return found


def plausibility_problems(
    counts: Sequence[PartyCounts], bounds: SetupBounds | None = None
) -> dict[int, list[str]]:
    """Per site outside a rule, what it declared against which rule (empty: all plausible)."""
    bounds = bounds or SetupBounds()
    shares = _share_problems(counts, bounds.share)
    problems: dict[int, list[str]] = {}
    for rank, c in enumerate(counts):
        found = [_ratio_problem(c, bounds.test_ratio), shares.get(rank),
                 _rate_problem(c, bounds.rate)]  # fmt: skip
        named = [p for p in found if p]
        if named:
            problems[rank] = named
    return problems


def check_plausible(counts: Sequence[PartyCounts], bounds: SetupBounds | None = None) -> None:
    """Stop the run, naming every site whose declared counts break a rule (one paragraph)."""
    problems = plausibility_problems(counts, bounds)
    if not problems:
        return
    named = "; ".join(f"party {rank} declared {', and '.join(found)}"
                      for rank, found in problems.items())  # fmt: skip
    sites = ", ".join(str(rank) for rank in problems)
    raise ImplausibleDeclaration(
        f"Implausible row counts declared before step 1: {named}. A site that declares rows it "
        "does not hold can steer the pooled AP and the feature scaling, so every site stops "
        f"here and nothing was trained. Ask the site{'s' if len(problems) > 1 else ''} {sites} "
        f"for its counts, remove it from the roster, or where such a split is honest widen "
        f"the rule at every site ({FLAG} NAME=V,..., docs/security.md)."
    )


def bound_moments(
    own: Sequence[np.ndarray],
    mean: np.ndarray,
    std: np.ndarray,
    factor: float,
    columns: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, str | None]:
    """The federated ``mean`` and ``std`` clamped by this site's own rows ``own`` (module
    docstring), and the note naming the features (``columns``, else by index) where the clamp
    bound (``None``: nowhere)."""
    rows = np.concatenate([b.reshape(len(b), -1) for b in own]).astype(np.float64)
    if rows.shape[0] == 0:
        return mean, std, None
    own_mean, own_std = rows.mean(axis=0), rows.std(axis=0)
    judged = own_std > 0
    low, high = np.where(judged, own_std / factor, std), np.where(judged, own_std * factor, std)
    new_std = np.clip(std, low, high)
    reach = factor * own_std
    new_mean = np.where(judged, np.clip(mean, own_mean - reach, own_mean + reach), mean)
    moved = np.flatnonzero((new_std != std) | (new_mean != mean))
    if moved.size == 0:
        return mean, new_std, None
    return new_mean, new_std, _clamp_note(moved, factor, columns)


def _clamp_note(moved: np.ndarray, factor: float, columns: Sequence[str] | None) -> str:
    named = [repr(columns[j]) if columns and columns[j] else str(int(j)) for j in moved[:10]]
    shown = ", ".join(named)
    more = f" and {moved.size - 10} more" if moved.size > 10 else ""
    return (
        f"note: the federated scaling of {moved.size} feature{'s' if moved.size != 1 else ''} "
        f"(index {shown}{more}) lay more than {factor:g} times off this site's own rows' "
        "standard deviation: clamped to that bound here (scale in --declared-bounds). A "
        "participant's sums may be steering the scaling; honest sites rarely differ this much."
    )
