"""The accountant's searches (:mod:`slate.training.noise_search`): the calibrated ``z`` against
``dp-accounting``'s PLD accountant at slate's discretisation over a grid of rates, counts,
budgets and histories (it meets the budget there, and is within 1e-3 of the smallest ``z`` that
does); the search's paths on functions whose answers are known (a
coarse accountant that errs either way, the floor, the ceiling); the most releases a budget
affords against a scan of every count."""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
from dp_accounting.pld import pld_privacy_accountant

from slate.training.accountant import DISCRETISATION, Z_CEILING, Z_FLOOR, calibrate
from slate.training.noise_search import most_releases, narrowed, smallest_z

DELTA = 1e-5


def _epsilon(events: list[tuple[float, float, int]]) -> float:
    """``dp-accounting``'s PLD accountant itself at slate's discretisation (replace-one), on the
    events as given (not merged, not cached)."""
    fresh = pld_privacy_accountant.PLDAccountant(
        dpa.NeighboringRelation.REPLACE_ONE, value_discretization_interval=DISCRETISATION
    )
    fresh.compose(dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), n)
        for q, z, n in events
    ]))  # fmt: skip
    return fresh.get_epsilon(DELTA)


# (q, releases, epsilon, history): small and large budgets, rates and counts, with a history
GRID = [
    (0.217, 500, 8.0, ()),
    (0.5, 20, 4.0, ()),
    (0.05, 200, 1.0, ()),
    (0.2, 50, 8.0, ((0.1333, 4.0, 20),)),
    (0.8, 40, 6.0, ((0.2, 5.0, 40), (0.05, 4.0, 100))),
]


@pytest.mark.parametrize(("q", "releases", "epsilon", "history"), GRID)
def test_the_calibrated_z_is_the_smallest_to_1e_3_by_the_accountant(q, releases, epsilon, history):
    """ε at the calibrated z is within the budget by the accountant itself (fresh, the events
    unmerged), and z / 1.001 does not meet it: ε falls as z grows, so the smallest z that meets
    the budget lies in (z / 1.001, z]."""
    z = calibrate(q, releases, epsilon, DELTA, history)
    assert z is not None and Z_FLOOR < z < Z_CEILING
    assert _epsilon([*history, (q, z, releases)]) <= epsilon
    assert _epsilon([*history, (q, z / 1.001, releases)]) > epsilon


def _counted(function):
    calls: list[float] = []

    def counted(x: float) -> float:
        calls.append(x)
        return function(x)

    return counted, calls


@pytest.mark.parametrize("bias", [0.9, 0.99, 1.0, 1.003, 1.02, 1.3])
@pytest.mark.parametrize(("power", "scale"), [(1.0, 8.0), (2.0, 30.0), (1.5, 0.4)])
def test_smallest_z_whichever_way_the_coarse_accountant_errs(bias, power, scale):
    """eps(z) = scale / z^power (the crossing known), the coarse one ``bias`` times it
    (pessimistic above 1, optimistic below): the answer meets the budget by the fine function,
    is within 1e-3 of the crossing, and only the fine function decides it."""
    epsilon = 2.0
    truth = (scale / epsilon) ** (1 / power)
    fine, calls = _counted(lambda z: scale / z**power)
    z = smallest_z(fine, lambda z: bias * scale / z**power, epsilon, 0.01, 1e4, 1e-3)
    assert z is not None and z in calls and fine(z) <= epsilon
    assert truth <= z <= truth * (1 + 1e-3)
    assert len(calls) <= 12


def test_smallest_z_at_the_floor_and_past_the_ceiling():
    def eps(z: float) -> float:
        return 1 / z

    assert 0.5 <= smallest_z(eps, eps, 2.0, 0.25, 256.0, 1e-3) <= 0.5 * (1 + 1e-3)
    assert smallest_z(eps, eps, 10.0, 0.25, 256.0, 1e-3) == 0.25
    assert smallest_z(eps, lambda z: 2 / z, 5.0, 0.25, 256.0, 1e-3) == 0.25  # coarse says 0.4
    assert smallest_z(eps, eps, 1e-3, 0.25, 256.0, 1e-3) is None
    assert smallest_z(eps, lambda z: 0.5 / z, 1 / 257, 0.25, 256.0, 1e-3) is None  # optimistic
    z = smallest_z(eps, lambda z: 0.5 / z, 1 / 255, 0.25, 256.0, 1e-3)
    assert z is not None and 255.0 <= z <= 255.0 * (1 + 1e-3)
    z = smallest_z(eps, lambda z: 2 / z, 1 / 255.9, 0.25, 256.0, 1e-3)  # just below the ceiling
    assert z is not None and 255.9 <= z <= 256.0


def test_narrowed_keeps_a_bracket_of_a_step_function():
    """A function with plateaus (as a discretised accountant's can be): still a bracket."""

    def eps(z: float) -> float:
        return math.ceil(40 / z) / 10

    low, high = narrowed(eps, 1.0, 1.0, 100.0, 1e-3)
    assert eps(low) > 1.0 >= eps(high) and high - low <= 1e-3 * low


@pytest.mark.parametrize("most", [1, 2, 7, 100, 1000])
@pytest.mark.parametrize(("power", "scale"), [(0.5, 0.3), (1.0, 0.01), (0.8, 2.0)])
def test_most_releases_is_the_scan_s_answer(most, power, scale):
    def eps(n: int) -> float:
        return scale * n**power

    epsilon = 1.0
    if eps(most) <= epsilon:
        return
    scan = max(n for n in range(most + 1) if eps(n) <= epsilon)
    assert most_releases(eps, most, epsilon) == scan
