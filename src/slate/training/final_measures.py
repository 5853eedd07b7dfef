r"""What a site compares, beyond AP, before it keeps the final average (:mod:`.final_check`).

AP sees only the ranking of the rows. A participant that lies in the final average can keep the
ranking and still change what the site deploys: :math:`+5` on the output bias leaves AP exactly
as it was and flags every row at 0.5; a push on one input's weights changes a small group of rows
and hardly moves AP. So the site also compares the averaged model :math:`\bar x` with its own
model :math:`x_i` on **its own test rows** (exact, no exchange), each within a stated bound
(:class:`Bounds`, ``--final-check-bounds``):

* ``mean_logit``: the change of the mean logit;
* ``flagged_at_half``: the change of the share of rows flagged at score 0.5 (logit 0);
* ``flagged_at_threshold``: the change of the share flagged at the threshold the site deploys
  by default (``slate predict --at-recall 0.9`` on its own rows, each model its own threshold;
  needs both classes among the rows);
* ``log_loss``: how much worse the average's log-loss is;
* ``group_flagged``: the largest change of the share flagged (at 0.5 and at the deployed
  threshold) within a group of rows defined by the model's own inputs: for each of the
  ``groups`` most frequent two-valued input features (binary or one-hot, standardised or not),
  the rows at its larger value, when at least ``group_rows`` of them (tables only);
* ``distance_ratio``: :math:`\lVert \bar x - x_i\rVert^2` against the largest squared distance
  from its own model to the average that the site measured itself at the run's earlier
  evaluations (none after a resume: no earlier evaluation in this process), and at least
  ``distance_floor`` :math:`\cdot \lVert x_i\rVert^2`: honest sites end so close (about
  :math:`10^{-4}` on w7a) that the ratio of two such distances is noise.

The defaults were set from honest runs of 4 sites on w7a (``docs/security.md``), with margin.

**Under** ``--dp-epsilon`` the own model is a noisy reference: :math:`x_i` carries all of this
site's Gaussian noise and the average :math:`1/N` of each site's, so an honest
:math:`\bar x - x_i` is mostly noise, and fixed bounds set without noise refuse honest runs at
random (a flagged share of 34 rows moved by 0.29). Each bound in force is then the stated bound
plus the change the noise itself makes, measured by the site at the final check
(:func:`noise_floor`, :class:`NoiseFloor`):

* the noise the mechanism adds is isotropic Gaussian (:math:`N(0, \sigma^2 I)` per step at
  every site), and mixing combines whole parameter vectors, so the noise part of
  :math:`\bar x - x_i` is isotropic: its direction is uniform on the sphere and independent of
  its length. The site draws :data:`NOISE_DRAWS` models :math:`x_i + r u_k` with :math:`u_k`
  uniform on the sphere (a public seed: nothing secret) and :math:`r` the measured distance
  :math:`\lVert \bar x - x_i\rVert` (at most what ``distance_ratio`` allows), and takes each
  measure's largest change over them, the **noise floor** :math:`f`. An honest average's change
  is then exchangeable with the :math:`K` draws' changes: it exceeds their largest with
  probability at most :math:`1/(K+1)`, and :math:`b + ` :data:`NOISE_MULTIPLE` :math:`\cdot f`
  (:math:`b` the stated bound, which covers what honest runs without noise do) with much less;
* a lie is a direction, not a random one: :math:`+5` on the output bias moves the mean logit by
  5, while a random direction of the same length moves any one parameter by about
  :math:`5/\sqrt d`. So the floor stays far below what a lie does, and the check refuses it;
* the floor is measured at the final check, not taken from earlier evaluations: a run of 6
  iterations has one earlier evaluation with a nonzero distance, and one earlier sample of a
  noisy change is no bound (for a change of half-normal law, the next one exceeds 3 times it
  with probability 0.2). The
  known :math:`\sigma` alone gives no floor either: how the noise reaches
  :math:`\bar x - x_i` depends on the algorithm, momentum, mixing and compression;
* ``distance_ratio`` keeps its own reference: the noise's expected squared distance grows from
  the common start as a sum of non-increasing terms (each step's noise, contracted by the
  mixing; momentum's short lag aside), so by :math:`T` it is at most :math:`T / t` times what
  it was at an earlier evaluation :math:`t`; each earlier distance is scaled so, and the bound
  in force is :data:`NOISE_MULTIPLE` times the stated one (an honest distance fluctuates about
  its expectation; without the scaling and the multiple, a distance in its steady state
  exceeds the one before about half the time). As before, the reference is the site's own
  measurement of earlier averages, which nothing checks: a participant that lied in an earlier
  evaluation's average raised it with or without the scaling.

Without ``--dp-epsilon`` nothing of this applies: the stated bounds are the bounds in force.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from slate import metrics
from slate.errors import ConfigError, parse_bounds
from slate.metrics.operating_points import at_recall

if TYPE_CHECKING:
    from slate.training.evaluation import Scored
    from slate.training.run import Run

__all__ = [
    "DEPLOYED_RECALL",
    "NOISE_DRAWS",
    "NOISE_MULTIPLE",
    "Bounds",
    "Distances",
    "Measure",
    "NoiseFloor",
    "bounds_text",
    "compare",
    "noise_floor",
    "own_distance",
]

DEPLOYED_RECALL = 0.9  # the recall target of the threshold a site deploys by default
NOISE_DRAWS = 16  # K: the random directions of the noise floor (--dp-epsilon)
NOISE_MULTIPLE = 2.0  # the floor's multiple added to a stated bound (--dp-epsilon)
NOISE_SEED = 0  # the directions' seed: public, the draws need no secret


@dataclass(frozen=True)
class Bounds:
    """The most each measure may change (module docstring), and the groups compared."""

    ap: float = 0.05
    mean_logit: float = 0.5
    flagged_at_half: float = 0.05
    flagged_at_threshold: float = 0.1
    log_loss: float = 0.05
    group_flagged: float = 0.25
    distance_ratio: float = 1.0
    distance_floor: float = 0.01
    groups: int = 20
    group_rows: int = 30

    @classmethod
    def parse(cls, text: str | None) -> Bounds:
        """``NAME=VALUE,...`` (``--final-check-bounds``); unnamed bounds keep their defaults."""
        return parse_bounds(cls, text, "--final-check-bounds", 0.0, ("groups", "group_rows"))

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def bounds_text(text: str) -> str:
    """``--final-check-bounds``'s argparse type: the text, once :meth:`Bounds.parse` takes it."""
    try:
        Bounds.parse(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--final-check-bounds: ")) from None
    return text


@dataclass(frozen=True)
class Measure:
    """One measure of the averaged model and of the site's own on the site's rows."""

    name: str
    average: float
    own: float
    change: float  # what the bound limits
    bound: float  # the bound in force
    detail: str = ""
    stated: float | None = None  # the stated bound, where the DP noise raised it (else None)
    floor: float | None = None  # the noise floor measured (--dp-epsilon; NoiseFloor)
    why: str = ""  # why the bound in force is not the stated one

    @property
    def failed(self) -> bool:
        return not self.change <= self.bound  # (NaN fails)

    def describe(self) -> str:
        """``mean_logit: 1.2601 (own model 0.0102), a change of 1.2499 over the bound 0.5``."""
        where = f" {self.detail}" if self.detail else ""
        why = f" ({self.why})" if self.why else ""
        bound = f"{self.bound:g}" if self.stated is None else f"{self.bound:.4g}"
        return (f"{self.name}{where}: averaged model {self.average:.4f}, own model "
                f"{self.own:.4f}: a change of {self.change:.4f} over the bound "
                f"{bound}{why}")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "average": self.average, "own": self.own,
                "change": self.change, "bound": self.bound,
                "stated_bound": self.bound if self.stated is None else self.stated,
                "noise_floor": self.floor, "detail": self.detail or None,
                "failed": self.failed}  # fmt: skip


@dataclass(frozen=True)
class NoiseFloor:
    """Under ``--dp-epsilon``: each measure's largest change (``floors``, ``ap`` included: how
    much lower) between the own model and :data:`NOISE_DRAWS` models at squared distance
    ``distance`` from it in random directions (module docstring)."""

    floors: dict[str, float]
    distance: float
    draws: int = NOISE_DRAWS
    multiple: float = NOISE_MULTIPLE

    def bound(self, name: str, stated: float) -> float:
        """The bound in force: the stated bound plus ``multiple`` times the floor."""
        return stated + self.multiple * self.floors.get(name, 0.0)

    def why(self, name: str, stated: float) -> str:
        """Which bound is in force, and why (the refusal's words)."""
        return (f"in force under --dp-epsilon: the stated {stated:g} plus {self.multiple:g} x "
                f"the noise floor {self.floors.get(name, 0.0):.4f}, the largest change of "
                f"{self.draws} models as far from the own model as the average (squared "
                f"distance {self.distance:.4g}) in random directions")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"floors": dict(self.floors), "distance": self.distance, "draws": self.draws,
                "multiple": self.multiple}  # fmt: skip


def own_distance(x: Tensor, xbar: Tensor, size: int) -> float:
    """:math:`\\lVert x_i - \\bar x\\rVert^2` over the model's parameters (``x (1, d)``)."""
    return float(((x[0, :size].double() - xbar[:size].double()) ** 2).sum())


class Distances:
    """A site's squared distance from its own model to the average at each evaluation of this
    process (none after a resume), the reference of ``distance_ratio``."""

    def __init__(self) -> None:
        self.by_iteration: dict[int, float] = {}

    def record(self, run: Run, iteration: int) -> None:
        """At a site, the distance at the evaluation just made (no exchange: that evaluation's
        average, ``Evaluator.test_scores``)."""
        if run.engine.own_party is None:
            return
        average = run.evaluator.test_scores(run.x, iteration).parameters
        self.by_iteration[iteration] = own_distance(run.x, average, run.compute.layout.size)

    def check_inputs(self, run: Run, scored: Scored) -> dict[str, Any]:
        """The final check's inputs beyond the logits (``check_average``'s keywords): the
        rows' model inputs, the bounds (``--final-check-bounds``), the distance to the
        average ``scored`` and the largest this site measured at an earlier evaluation."""
        bounds = Bounds.parse(run.settings.outputs.final_check_bounds)
        size = run.compute.layout.size
        floor = bounds.distance_floor * own_distance(run.x, torch.zeros_like(run.x[0]), size)
        distance = own_distance(run.x, scored.parameters, size)
        features = run.evaluator.test_features
        if run.ledger is None:  # no noise: the stated bounds
            earlier = [d for t, d in self.by_iteration.items() if t < scored.iteration]
            return {"features": features, "bounds": bounds, "distance": distance,
                    "reference": max([floor, *earlier])}  # fmt: skip
        reference = noise_reference(self.by_iteration, scored.iteration, floor)
        allowed = reference * bounds.distance_ratio * NOISE_MULTIPLE
        buffers = {name: value[0] for name, value in run.compute.buffers.items()}
        noise = noise_floor(lambda p: run.compute.logits(p, features, buffers), run.x[0], size,
                            min(distance, allowed), run.evaluator.test_labels, features,
                            bounds)  # fmt: skip
        return {"features": features, "bounds": bounds, "distance": distance,
                "reference": reference, "noise": noise}  # fmt: skip


def noise_reference(by_iteration: dict[int, float], iteration: int, floor: float) -> float:
    """``distance_ratio``'s reference under ``--dp-epsilon``: each earlier evaluation's
    squared distance at :math:`t > 0` times :math:`T / t` (the noise's growth from the common
    start; module docstring), and at least ``floor``."""
    scaled = [d * iteration / t for t, d in by_iteration.items() if 0 < t < iteration]
    return max([floor, *scaled])


def noise_floor(
    score: Callable[[Tensor], Tensor], own: Tensor, size: int, distance: float, labels: Tensor,
    features: Tensor | None, bounds: Bounds, draws: int = NOISE_DRAWS,
) -> NoiseFloor:  # fmt: skip
    """The noise floor (module docstring): ``score`` gives a parameter vector's logits on the
    site's test rows, ``own`` is the own model's vector (its first ``size`` entries the
    parameters), ``distance`` the squared distance of the draws."""
    own_logits = score(own)
    generator = torch.Generator().manual_seed(NOISE_SEED)
    radius = math.sqrt(max(distance, 0.0))
    floors: dict[str, float] = {}
    y = labels.detach().cpu()
    both = bool(y.any()) and not bool(y.all())
    own_ap = metrics.average_precision(own_logits.detach().double().cpu(), y) if both else None
    for _ in range(draws):
        direction = torch.randn(size, generator=generator, dtype=torch.float64)
        moved = own.detach().clone()
        step = radius * direction / direction.norm().clamp(min=1e-300)
        moved[:size] += step.to(device=own.device, dtype=own.dtype)
        logits = score(moved)
        changes = {m.name: m.change for m in compare(logits, own_logits, labels, features, bounds)}
        if own_ap is not None:
            ap = metrics.average_precision(logits.detach().double().cpu(), y)
            changes["ap"] = max(0.0, float(own_ap) - float(ap))
        for name, change in changes.items():
            if math.isfinite(change):
                floors[name] = max(floors.get(name, 0.0), change)
    return NoiseFloor(floors, distance, draws)


def compare(
    average: Tensor, own: Tensor, labels: Tensor, features: Tensor | None, bounds: Bounds,
    distance: float | None = None, reference: float | None = None,
    noise: NoiseFloor | None = None,
) -> list[Measure]:  # fmt: skip
    """Every measure of the module docstring (those that can be measured on these rows);
    ``noise``: the floor under ``--dp-epsilon`` that raises the bounds in force (None: the
    stated bounds)."""
    a, b = average.detach().double().cpu(), own.detach().double().cpu()
    y = labels.detach().cpu()
    if not len(y):
        return []
    out = [
        _measure("mean_logit", float(a.mean()), float(b.mean()), bounds.mean_logit),
        _measure("flagged_at_half", _share(a, 0.0), _share(b, 0.0), bounds.flagged_at_half),
        _worse("log_loss", _log_loss(a, y), _log_loss(b, y), bounds.log_loss),
    ]
    cuts = _deployed(a, y), _deployed(b, y)
    if cuts[0] is not None and cuts[1] is not None:
        shares = _share(a, cuts[0]), _share(b, cuts[1])
        out.append(_measure("flagged_at_threshold", *shares, bounds.flagged_at_threshold,
                            "(recall >= 0.9 on the own rows)"))  # fmt: skip
    group = _groups(a, b, features, bounds, cuts)
    if group is not None:
        out.append(group)
    if noise is not None:
        out = [_with_floor(m, noise) for m in out]
    if distance is not None and reference is not None:
        ratio = distance / reference if reference > 0 else (0.0 if distance == 0 else math.inf)
        out.append(_distance_ratio(distance, reference, ratio, bounds.distance_ratio, noise))
    return out


def _with_floor(measure: Measure, noise: NoiseFloor) -> Measure:
    """``measure`` with its bound in force under ``--dp-epsilon`` (:meth:`NoiseFloor.bound`)."""
    stated = measure.bound
    return replace(measure, bound=noise.bound(measure.name, stated), stated=stated,
                   floor=noise.floors.get(measure.name, 0.0),
                   why=noise.why(measure.name, stated))  # fmt: skip


def _distance_ratio(
    distance: float, reference: float, ratio: float, stated: float, noise: NoiseFloor | None
) -> Measure:
    if noise is None:
        return Measure("distance_ratio", distance, reference, ratio, stated,
                       "(squared distance to the own model, against the largest measured at "
                       "the earlier evaluations or the floor)")  # fmt: skip
    return Measure("distance_ratio", distance, reference, ratio, stated * noise.multiple,
                   "(squared distance to the own model, against the largest measured at the "
                   "earlier evaluations, each times the steps since the start over its own, "
                   "or the floor)", stated=stated,
                   why=f"in force under --dp-epsilon: {noise.multiple:g} x the stated "
                   f"{stated:g}, as the noise's distance fluctuates about its "
                   "expectation")  # fmt: skip


def _measure(name: str, average: float, own: float, bound: float, detail: str = "") -> Measure:
    return Measure(name, average, own, abs(average - own), bound, detail)


def _worse(name: str, average: float, own: float, bound: float) -> Measure:
    return Measure(name, average, own, max(0.0, average - own), bound, "(only worse counts)")


def _share(logits: Tensor, cut: float) -> float:
    return float((logits >= cut).double().mean())


def _log_loss(logits: Tensor, labels: Tensor) -> float:
    y = labels.double()
    return float(torch.nn.functional.binary_cross_entropy_with_logits(logits, y))


def _deployed(logits: Tensor, labels: Tensor) -> float | None:
    """The logit threshold of recall >= 0.9 on these rows (None without both classes)."""
    if not bool(labels.any()) or bool(labels.all()):
        return None
    precision, recall, thresholds = metrics.precision_recall_curve(logits, labels)
    edges = np.append(np.asarray(thresholds, dtype=np.float64), np.inf)
    point = at_recall(precision, recall, edges, DEPLOYED_RECALL)
    return point.logit


def _groups(
    a: Tensor, b: Tensor, features: Tensor | None, bounds: Bounds,
    cuts: tuple[float | None, float | None],
) -> Measure | None:  # fmt: skip
    """The largest flagged-share change within a group of rows (module docstring)."""
    if features is None or features.dim() != 2 or bounds.groups <= 0:
        return None
    worst: tuple[float, str, float, float] | None = None
    for column, rows in _group_rows(features.detach().cpu(), bounds):
        for cut_a, cut_b, at in ((0.0, 0.0, "0.5"), (cuts[0], cuts[1], "the threshold")):
            if cut_a is None or cut_b is None:
                continue
            share_a, share_b = _share(a[rows], cut_a), _share(b[rows], cut_b)
            change = abs(share_a - share_b)
            if worst is None or change > worst[0]:
                text = f"(input {column + 1} at its larger value, {int(rows.sum())} rows, at {at})"
                worst = (change, text, share_a, share_b)
    if worst is None:
        return None
    change, text, share_a, share_b = worst
    return Measure("group_flagged", share_a, share_b, change, bounds.group_flagged, text)


def _group_rows(features: Tensor, bounds: Bounds) -> list[tuple[int, Tensor]]:
    """``(column, rows)`` of the most frequent two-valued columns' groups (module docstring)."""
    high = features.amax(dim=0)
    low = features.amin(dim=0)
    at_high = features == high
    two_valued = ((features == low) | at_high).all(dim=0) & (high > low)
    sizes = torch.where(two_valued, at_high.sum(dim=0), torch.zeros_like(high, dtype=torch.long))
    order = torch.argsort(sizes, descending=True, stable=True)[: bounds.groups]
    return [(int(j), at_high[:, j]) for j in order if int(sizes[j]) >= bounds.group_rows]
