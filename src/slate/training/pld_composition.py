"""ε of a composition of Poisson-sampled Gaussian segments, by ``dp-accounting``'s PLDs, each
segment's PLD made once per process (:mod:`slate.training.accountant` asks it).

``PLDAccountant(REPLACE_ONE, interval)`` composes ``ComposedDpEvent([SelfComposedDpEvent(
PoissonSampledDpEvent(q, GaussianDpEvent(z)), n), ...])`` by its own steps
(``_maybe_compose``): each release's PLD (``from_gaussian_mechanism``) self-composed ``n``
times, composed onto the identity in turn; ε is the result's ``get_epsilon_for_delta``.
:func:`composed_epsilon` takes the same steps with the same dp-accounting objects, so its ε is
the accountant's bit for bit (``tests/training/test_accountant.py``), but keeps each segment's
PLD: a calibration's probes and a plan's summaries compose the same history segments again, and
making a segment is most of the cost (about 1.5x less CPU on a resume's calibrations).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence


def _pld_module():
    """``dp_accounting.pld.privacy_loss_distribution`` (imported on first use: it loads
    scipy)."""
    from dp_accounting.pld import privacy_loss_distribution

    return privacy_loss_distribution


@functools.lru_cache(maxsize=64)
def release_pld(q: float, z: float, interval: float):
    """dp-accounting's PLD of one Poisson-sampled Gaussian release (rate ``q``, multiplier
    ``z``) under replace-one: what ``PLDAccountant`` makes of ``PoissonSampledDpEvent(q,
    GaussianDpEvent(z))``. Composing a PLD never changes it (``compose`` and ``self_compose``
    return new ones), so one serves every composition."""
    import dp_accounting as dpa

    return _pld_module().from_gaussian_mechanism(
        standard_deviation=z, value_discretization_interval=interval, sampling_prob=q,
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE,
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def segment_pld(q: float, z: float, releases: int, interval: float):
    """:func:`release_pld` self-composed ``releases`` times: one segment of a history."""
    return release_pld(q, z, interval).self_compose(releases)


def composed_epsilon(
    events: Sequence[tuple[float, float, int]], delta: float, interval: float
) -> float:
    """ε at ``delta`` of the ``(q, z, releases)`` segments (each with ``q > 0`` and
    ``releases > 0``) composed in order onto the identity at discretisation ``interval``: the
    accountant's steps (module docstring); 0 for none."""
    if not events:
        return 0.0
    composed = _pld_module().identity(value_discretization_interval=interval)
    for q, z, n in events:
        composed = composed.compose(segment_pld(q, z, n, interval))
    return float(composed.get_epsilon_for_delta(delta))
