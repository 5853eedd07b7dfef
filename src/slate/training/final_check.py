r"""The model a site saves is checked against its own before it is kept.

A run ends on the averaged model :math:`\bar x = \frac1N \sum_n x_n` (Alg. 1's output): every
site saves it as ``model.pt``, and the summary's AP is that model's. The model saved is the model
evaluated: one averaging gives both (:meth:`slate.training.evaluation.Evaluator.test_scores`), so
no party can contribute one model to the evaluation and another to the saved average.

A participant can still lie in the average itself (contribute :math:`nT - (n-1)x` and the
average becomes its model :math:`T`). So, at a site of a distributed run, before it keeps
:math:`\bar x`, the site scores on **its own test rows**, exactly and with no exchange:

* :math:`a`: the AP of :math:`\bar x`, the model it would save;
* :math:`b`: the AP of its own model :math:`x_i`, which no other site wrote.

Gossip leaves every honest site's model close to the average by the end (the run's consensus
distance), so on the same rows the two APs differ little. When :math:`a < b - \delta` with
:math:`\delta =` :data:`AVERAGE_BOUND` :math:`= 0.05`, the site **refuses the average**: it
keeps its own model (``model.pt`` is :math:`x_i`, the summary's AP and curve are its own on its
own test rows), records ``final_average`` in ``summary.json``, and exits with code 2 and one
paragraph. How :math:`\delta` was set: honest runs of 4 sites on w7a (ring, base-2 with local
steps and int8, Dirichlet-split sites, a site with few positives) give :math:`b - a` of at most
0.02 (``docs/security.md``); the poisoned average scores 0.02 against 0.70. A site with no
positive test row cannot score an AP: the check is skipped there and says so.

**More than AP** (:mod:`slate.training.final_measures`): AP ignores a shift of every score and a
change to a small group of rows, so the site also compares, on the same rows, the mean logit, the
share flagged at 0.5 and at the threshold it deploys, the log-loss, the largest flagged-share
change within a group of rows defined by the model's inputs, and the distance from its own model
to the average against the distances it measured itself. Each has a stated bound
(``--final-check-bounds``, :class:`~slate.training.final_measures.Bounds`); one measure over its
bound refuses the average like the AP, and ``summary.json``'s ``final_average`` lists every
measure (``checks``), the failed ones by name (``failed``) and by how much.

**Under** ``--dp-epsilon`` the own model carries the site's own noise, which the average divides
by N, so every bound in force, :math:`\delta` included, is the stated bound plus a multiple of
the noise floor the site measures at the check (the change of models as far from its own as the
average in random directions: :mod:`slate.training.final_measures`, where the reasoning is).
``final_average`` records the stated bound (``stated_bound``), the floor (``noise_floor``) and the
bound in force (``bound``), and the refusal names the bound in force and why. Without
``--dp-epsilon`` the stated bounds are in force, unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from slate import metrics
from slate.errors import SlateError
from slate.training.final_measures import Bounds, Measure, NoiseFloor, compare

__all__ = ["AVERAGE_BOUND", "AverageCheck", "AverageRefused", "check_average", "own_model_kept"]

AVERAGE_BOUND = 0.05  # delta: the most the saved model's AP may fall below the site's own


class AverageRefused(SlateError):
    """A site refused the final average: it kept its own model (exit code 2)."""


@dataclass(frozen=True)
class AverageCheck:
    """The saved model against the site's own, on the site's own test rows."""

    rank: int
    rows: int
    average_ap: float | None  # a: the averaged model's AP (None: no positive row)
    own_ap: float | None  # b: the site's own model's AP
    bound: float = AVERAGE_BOUND  # the AP's bound in force (the stated one without DP)
    refused_counts: str | None = None  # why the final evaluation's counts were refused
    refused_sum: str | None = None  # a sum refused during the run (SumRefused's paragraph)
    measures: tuple[Measure, ...] = ()  # the measures beyond AP (slate.training.final_measures)
    noise: NoiseFloor | None = None  # under --dp-epsilon: the floor that raised the bounds
    stated_bound: float | None = None  # the AP's stated bound, where the noise raised it

    @property
    def failed(self) -> list[Measure]:
        """The measures over their bounds."""
        return [m for m in self.measures if m.failed]

    @property
    def refused(self) -> bool:
        if self.refused_counts is not None or self.refused_sum is not None:
            return True
        if self.failed:
            return True
        if self.average_ap is None or self.own_ap is None:
            return False
        return self.average_ap < self.own_ap - self.bound

    def to_dict(self) -> dict[str, Any]:
        """``summary.json``'s ``final_average``."""
        return {
            "accepted": not self.refused,
            "saved": "own model" if self.refused else "averaged model",
            "average_ap_own_rows": self.average_ap,
            "own_model_ap_own_rows": self.own_ap,
            "bound": self.bound,
            "stated_bound": self.bound if self.stated_bound is None else self.stated_bound,
            "noise_floor": None if self.noise is None else self.noise.to_dict(),
            "test_rows": self.rows,
            "reason": self.reason(),
            "checks": [m.to_dict() for m in self.measures],
            "failed": [m.name for m in self.failed],
        }

    def reason(self) -> str | None:
        if self.refused_sum is not None:
            return f"a sum was refused during the run: {self.refused_sum}"
        if self.refused_counts is not None:
            return (f"the final evaluation's counts broke the sites' declarations "
                    f"({self.refused_counts})")  # fmt: skip
        measures = "; ".join(m.describe() for m in self.failed)
        ap_failed = (self.average_ap is not None and self.own_ap is not None
                     and self.average_ap < self.own_ap - self.bound)  # fmt: skip
        if measures and not ap_failed:
            return f"on this site's {self.rows} test rows {measures}"
        if self.average_ap is None or self.own_ap is None:
            return "not checked: this site holds no positive test row" if self.rows else None
        if not self.refused:
            return None
        bound, why = f"{self.bound:g}", ""
        if self.noise is not None and self.stated_bound is not None:  # (--dp-epsilon)
            bound, why = f"{self.bound:.4g}", f" ({self.noise.why('ap', self.stated_bound)})"
        return (
            f"on this site's {self.rows} test rows the averaged model scores AP "
            f"{self.average_ap:.4f}, its own model {self.own_ap:.4f}: "
            f"{self.own_ap - self.average_ap:.4f} lower, over the bound {bound}{why}"
            + (f"; {measures}" if measures else "")
        )

    def message(self, out: Any) -> str:
        """The paragraph a site that refused the average stops with."""
        where = f"{out}/model.pt" if out is not None else "its model"
        if self.refused_sum is not None:
            return (
                f"{self.refused_sum} Party {self.rank} kept its own model: {where} is its own "
                "model, and summary.json's test AP is that model's on this site's own test rows "
                "(final_average records the refusal)."
            )
        return (
            f"Party {self.rank} refused the final average: {self.reason()}. A participant may "
            "have lied in the average (or the sites ended far apart: see the consensus distance "
            f"in history.csv). Party {self.rank} kept its own model instead: {where} is its own "
            "model, and summary.json's test AP is that model's on this site's own test rows "
            "(final_average records the refusal). Nothing from the refused average was saved."
        )


def check_average(
    rank: int, average_logits: Tensor, own_logits: Tensor, labels: Tensor,
    refused_counts: str | None = None, *, features: Tensor | None = None,
    bounds: Bounds | None = None, distance: float | None = None,
    reference: float | None = None, noise: NoiseFloor | None = None,
) -> AverageCheck:  # fmt: skip
    """Score the averaged model and the site's own on the site's test rows (module docstring);
    ``refused_counts``: why the final evaluation's counts were refused (with
    ``--on-party-loss continue``, :class:`slate.training.evaluation.Evaluator`), which refuses
    the average too. ``features``: the rows' model inputs (the groups), ``bounds`` the measures'
    bounds, ``distance`` and ``reference`` the squared distance from the own model to the
    average and the largest measured before (:func:`slate.training.final_measures.compare`);
    ``noise``: under ``--dp-epsilon``, the floor that raises every bound in force
    (:func:`slate.training.final_measures.noise_floor`; None: the stated bounds)."""
    bounds = bounds if bounds is not None else Bounds()
    measures = tuple(compare(average_logits, own_logits, labels, features, bounds, distance,
                             reference, noise))  # fmt: skip
    rows = len(labels)
    bound = bounds.ap if noise is None else noise.bound("ap", bounds.ap)
    stated = None if noise is None else bounds.ap
    if rows == 0 or not bool(labels.any()) or bool(labels.all()):
        return AverageCheck(rank, rows, None, None, bound, refused_counts, measures=measures,
                            noise=noise, stated_bound=stated)  # fmt: skip
    average = _ap(average_logits, labels)
    own = _ap(own_logits, labels)
    return AverageCheck(rank, rows, average, own, bound, refused_counts, measures=measures,
                        noise=noise, stated_bound=stated)  # fmt: skip


def _ap(logits: Tensor, labels: Tensor) -> float | None:
    value = metrics.average_precision(logits, labels)
    return None if math.isnan(value) else float(value)


def own_model_kept(rank: int, own_logits: Tensor, labels: Tensor, why: str) -> AverageCheck:
    """The check of a site that stopped on a refused sum (``why``, its paragraph) and keeps its
    own model: the own model's AP on the site's test rows, no average to compare."""
    rows = len(labels)
    own = (
        None
        if rows == 0 or not bool(labels.any()) or bool(labels.all())
        else _ap(own_logits, labels)
    )
    return AverageCheck(rank, rows, None, own, refused_sum=why)
