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
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields
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
    "Bounds",
    "Distances",
    "Measure",
    "bounds_text",
    "compare",
    "own_distance",
]

DEPLOYED_RECALL = 0.9  # the recall target of the threshold a site deploys by default


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
    bound: float
    detail: str = ""

    @property
    def failed(self) -> bool:
        return not self.change <= self.bound  # (NaN fails)

    def describe(self) -> str:
        """``mean_logit: 1.2601 (own model 0.0102), a change of 1.2499 over the bound 0.5``."""
        where = f" {self.detail}" if self.detail else ""
        return (f"{self.name}{where}: averaged model {self.average:.4f}, own model "
                f"{self.own:.4f}: a change of {self.change:.4f} over the bound "
                f"{self.bound:g}")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "average": self.average, "own": self.own,
                "change": self.change, "bound": self.bound, "detail": self.detail or None,
                "failed": self.failed}  # fmt: skip


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
        earlier = [d for t, d in self.by_iteration.items() if t < scored.iteration]
        return {
            "features": run.evaluator.test_features,
            "bounds": bounds,
            "distance": own_distance(run.x, scored.parameters, size),
            "reference": max([floor, *earlier]),
        }


def compare(
    average: Tensor, own: Tensor, labels: Tensor, features: Tensor | None, bounds: Bounds,
    distance: float | None = None, reference: float | None = None,
) -> list[Measure]:  # fmt: skip
    """Every measure of the module docstring (those that can be measured on these rows)."""
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
    if distance is not None and reference is not None:
        ratio = distance / reference if reference > 0 else (0.0 if distance == 0 else math.inf)
        out.append(Measure("distance_ratio", distance, reference, ratio, bounds.distance_ratio,
                           "(squared distance to the own model, against the largest measured "
                           "at the earlier evaluations or the floor)"))  # fmt: skip
    return out


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
