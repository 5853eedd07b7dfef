r"""Whether the parties of a finished run still disagree: ``summary.json``'s ``divergence`` and
its warning line.

Gossip keeps N models, one per party, and the run's output is their average :math:`\bar x`.
When the gossip cannot keep up with what the local steps pull apart (heavy compression, rare
rounds, a poorly connected graph, non-IID parties), the average can still score well while
every party's own model is far from it. Nothing else in a run shows this, so at the end of a run
two measurements are compared with thresholds:

* the **relative consensus distance**

  .. math::

      \rho_t = \frac{\Xi_t}{\lVert \bar x_T \rVert_2^2}, \qquad
      \Xi_t = \frac1N \sum_{n=1}^N \lVert x_{n,t} - \bar x_t \rVert_2^2,

  the mean squared distance of a party's parameters to the average (``history.csv``'s
  ``consensus_distance``) over the squared norm of the final averaged model: scale-free, so
  that one threshold serves every model and data set (:math:`\sqrt{\rho}` is the typical
  party's distance as a fraction of the model's size). It *stays* large when
  :math:`\rho_{\min} = \min_t \rho_t` over the last :data:`TAIL_EVALUATIONS` evaluations (at
  least one, at most the last quarter of the run) exceeds :data:`RELATIVE_DISTANCE_LIMIT`: one
  noisy evaluation neither raises nor hides the warning. :math:`\rho_T / \rho_{\text{first
  of the tail}}` is recorded as the trend;
* the **worst party's shortfall**, when each party's own final model was scored
  (``--party-ap``): :math:`s = 1 - \min_n \mathrm{AP}_n / \mathrm{AP}(\bar x)`, the share of
  the averaged model's test AP that the worst party's own model loses. It warns above
  :data:`PARTY_SHORTFALL_LIMIT`.

The thresholds come from measured runs (w7a, N = 10, Dirichlet :math:`\alpha = 0.3`, 10 000
iterations; commands and table in ``docs/outputs.md``, "Divergence between parties"):

* healthy, the dense ring and ``int8`` (ring and ``base-2``): :math:`\rho_T \le 6.5 \cdot
  10^{-6}`, :math:`s \le 0.0023`;
* ``topk:0.01`` and ``sign`` at their default :math:`\gamma`, which reach the ring's AP there
  (five partitions for ``topk:0.01``): :math:`\rho_T \le 1.7 \cdot 10^{-4}`, :math:`s \le
  0.020`;
* apart: a ``topk:0.01`` run on non-IID w7a parties whose party APs (0.434-0.595) trailed the
  average's 0.604 unreported (distance 0.59 on a model of squared norm about 70:
  :math:`\rho \approx 8 \cdot 10^{-3}`; :math:`s = 0.28`), ``topk:0.001``
  (:math:`\rho_T = 1.6 \cdot 10^{-2}`, :math:`s = 0.034`), ``sign`` on ``base-2`` with
  ``--gossip-every 25`` (AP 0.750, but :math:`\rho_T = 1.6 \cdot 10^{-2}`, :math:`s = 0.054`),
  ``topk:0.01`` at :math:`\gamma = 0.15` (diverges to :math:`\rho_T \approx 10^{9}`).

:data:`RELATIVE_DISTANCE_LIMIT` = :math:`10^{-3}` lies 5.7x above the largest value of a run that
works and 8x below that non-IID ``topk:0.01`` run's; :data:`PARTY_SHORTFALL_LIMIT` = 0.05 lies
2.5x above the largest working shortfall and 5.6x below that run's.

**Under** ``--dp-epsilon`` (``noise=True``) both measurements are dominated by the privacy noise:
each party's own model carries its own Gaussian noise and the average :math:`1/N` of each
party's, so the consensus distance of a clean run is the noise's (4 parties on digits, 30
iterations at :math:`\varepsilon = 8`: :math:`\rho_T = 4.8 \cdot 10^{-3}`, against
:math:`1.4 \cdot 10^{-7}` without noise), and its own models' APs trail the average's for the
same reason. The limits above were set on runs without noise, and the warning's advice (a
better-connected topology, less compression) does not remove noise that each party adds by
design. How far the noise alone puts the parties apart depends on the algorithm, momentum,
mixing and compression, so no expected value is subtracted: the measurements are still recorded,
``warned`` stays false and the finding is stated as a note about the noise (``noise_note``), not
as a warning. A run that truly diverges under ``--dp-epsilon`` is therefore reported only by that
note (and, when the parameters become non-finite, by the error of
:func:`non_finite_message`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "PARTY_SHORTFALL_LIMIT",
    "RELATIVE_DISTANCE_LIMIT",
    "TAIL_EVALUATIONS",
    "Divergence",
    "advice_for",
    "assess_divergence",
    "non_finite_message",
]

#: Warn when the relative consensus distance stays above this (a party's typical distance to the
#: average above ~3% of the model's norm).
RELATIVE_DISTANCE_LIMIT = 1e-3
#: Warn when the worst party's own model loses more than this share of the averaged model's AP.
PARTY_SHORTFALL_LIMIT = 0.05
#: The evaluations, at the end of the run, over which the distance must stay large.
TAIL_EVALUATIONS = 3


@dataclass(frozen=True)
class Divergence:
    """The measurements and the verdict (``summary.json``'s ``divergence``).

    Attributes:
        relative_distance: :math:`\\rho_T`, the last evaluation's consensus distance over the
            final averaged model's squared norm (``None`` when not measured: one party, or a
            zero model).
        relative_distance_min: :math:`\\rho_{\\min}` over the last evaluations (the tail).
        distance_trend: :math:`\\rho_T / \\rho` at the tail's first evaluation (``< 1``:
            shrinking); ``None`` with one evaluation in the tail or a zero distance there.
        tail_evaluations: how many evaluations the tail holds.
        party_ap_shortfall: :math:`1 - \\min_n \\mathrm{AP}_n / \\mathrm{AP}(\\bar x)`
            (``None`` without party APs).
        warned: whether the warning fired (never under ``--dp-epsilon``).
        warning: the warning line, or ``None``.
        noise_note: under ``--dp-epsilon``, the note that replaces the warning (a limit
            passed, attributed to the privacy noise), or ``None``.
    """

    relative_distance: float | None
    relative_distance_min: float | None
    distance_trend: float | None
    tail_evaluations: int
    party_ap_shortfall: float | None
    warned: bool
    warning: str | None
    noise_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["relative_distance_limit"] = RELATIVE_DISTANCE_LIMIT
        out["party_ap_shortfall_limit"] = PARTY_SHORTFALL_LIMIT
        return out


def assess_divergence(
    distances: Sequence[float],
    mean_squared_norm: float,
    party_aps: Sequence[float],
    test_ap: float,
    advice: Sequence[str] = (),
    noise: bool = False,
) -> Divergence:
    r"""Decide whether the parties ended the run apart (module docstring).

    Args:
        distances: the consensus distance :math:`\Xi_t` of every evaluation, in order
            (``history.csv``'s column); non-finite values (not measured here) are skipped.
        mean_squared_norm: :math:`\lVert \bar x_T \rVert_2^2` of the final averaged model.
        party_aps: each party's own final model's test AP (empty: not computed).
        test_ap: the averaged model's test AP.
        advice: what to try, in words (the run's flags decide it; :func:`advice_for`).
        noise: whether the parties added privacy noise (``--dp-epsilon``): a limit passed is
            then a note about the noise, not a warning (module docstring).

    Returns:
        The measurements and, when a limit is passed, the one-line warning.
    """
    measured = [float(v) for v in distances if v is not None and math.isfinite(float(v))]
    relative = relative_min = trend = None
    tail = 0
    if measured and mean_squared_norm > 0 and math.isfinite(mean_squared_norm):
        tail = min(TAIL_EVALUATIONS, max(1, (len(measured) - 1) // 4))
        rho = [v / mean_squared_norm for v in measured[-tail:]]
        relative, relative_min = rho[-1], min(rho)
        trend = rho[-1] / rho[0] if tail > 1 and rho[0] > 0 else None
    shortfall = None
    if party_aps and test_ap > 0 and math.isfinite(test_ap):
        shortfall = 1.0 - min(party_aps) / test_ap
    far = relative_min is not None and relative_min > RELATIVE_DISTANCE_LIMIT
    spread = shortfall is not None and shortfall > PARTY_SHORTFALL_LIMIT
    if not (far or spread):
        return Divergence(relative, relative_min, trend, tail, shortfall, False, None)
    seen = _seen(measured[-1] if measured else math.nan, relative, relative_min, tail,
                 party_aps, test_ap, far, spread)  # fmt: skip
    if noise:
        note = (
            f"note: under --dp-epsilon each party's own model carries its own privacy noise and "
            f"the averaged model (the one saved) 1/N of each party's: {' and '.join(seen)}, "
            "limits set for runs without noise. This is the noise, not gossip that fails to "
            "keep up; no --topology or compression change removes it."
        )
        return Divergence(relative, relative_min, trend, tail, shortfall, False, None, note)
    tries = "; ".join(advice) if advice else "more frequent or less compressed gossip"
    warning = (
        f"warning: the parties' models diverge: {' and '.join(seen)}. Each party's own model is "
        f"far from the averaged one (the model saved). Try: {tries}."
    )
    return Divergence(relative, relative_min, trend, tail, shortfall, True, warning)


def _seen(
    distance: float,
    relative: float | None,
    relative_min: float | None,
    tail: int,
    party_aps: Sequence[float],
    test_ap: float,
    far: bool,
    spread: bool,
) -> list[str]:
    seen = []
    if far:
        assert relative is not None and relative_min is not None
        seen.append(
            f"the consensus distance is {distance:.3g}, {relative:.2e} of the averaged model's "
            f"squared norm (at least {relative_min:.2e} over the last {tail} evaluations; "
            f"limit {RELATIVE_DISTANCE_LIMIT:g})"
        )
    if spread:
        seen.append(
            f"the parties' own models score AP {min(party_aps):.4f}-{max(party_aps):.4f} against "
            f"the averaged model's {test_ap:.4f} (the worst loses "
            f"{1 - min(party_aps) / test_ap:.1%}; limit {PARTY_SHORTFALL_LIMIT:.0%})"
        )
    return seen


def advice_for(
    compress: str, consensus_step: float | None, default_step: float | None, gossip_every: int
) -> list[str]:
    """What to try against divergence, given the run's communication flags.

    A :math:`\\gamma` below the operator's default mixes too little (try the default); one
    above it amplifies the compression error (try the default); at the default, less
    compression comes first, then a smaller :math:`\\gamma`, which damps the error that heavy
    compression feeds back, at the price of slower mixing.
    """
    tries = []
    if compress != "none" and consensus_step is not None:
        default = f"{default_step:g} (the default for --compress {compress})"
        if default_step is not None and consensus_step < default_step:
            tries.append(f"a larger --consensus-step, e.g. {default}")
        elif default_step is not None and consensus_step > default_step:
            tries.append(f"a smaller --consensus-step, e.g. {default}")
        tries.append("less compression (--compress int8, or topk with a larger fraction)")
        if consensus_step == default_step:
            tries.append(f"a smaller --consensus-step, e.g. {consensus_step / 2:.3g}")
    if gossip_every > 1:
        tries.append(f"more frequent gossip (--gossip-every {max(1, gossip_every // 2)})")
    tries.append("a better-connected --topology (e.g. exponential) or a smaller --lr")
    return tries


def non_finite_message(
    losses: Any, x: Any, parties: Sequence[int], first_iteration: int, iteration: int, lr: float
) -> str:
    """Where training became non-finite, and what to try: the first non-finite loss of a step
    (``losses``: steps by local parties, the first step's iteration ``first_iteration``), else
    the first party whose parameters ``x`` (one row each) are non-finite by ``iteration``."""
    import torch

    bad = (~torch.isfinite(losses)).nonzero()
    if len(bad):
        step, row = (int(v) for v in bad[0])
        where = f"the loss of party {parties[row]} at iteration {first_iteration + step}"
    else:
        row = int((~torch.isfinite(x)).any(dim=1).nonzero()[0])
        where = f"the parameters of party {parties[row]} by iteration {iteration}"
    return (
        f"Training diverged: {where} became non-finite (NaN or inf) with --lr {lr}. Try a lower "
        f"learning rate, e.g. --lr {lr / 10:g}."
    )
