r"""An insider's lies outside gossip, for the tests of the checks that catch them (tests only).

``SLATE_ATTACK=RANK@ITER:KIND`` (:func:`slate.faults.attacks.parse_attacks`) with one of
these kinds makes distributed party ``RANK`` lie in what it contributes to a sum, while it runs
every step honestly, as a site running a modified copy of slate would:

* ``final-poison``: in the averaged model of every evaluation from ``ITER`` on (the last one is
  the model every site saves), it contributes :math:`n T - (n - 1) x` in place of its model
  :math:`x`, where :math:`T` is :math:`x` with the output layer negated: while the parties agree,
  the average becomes :math:`T`, a model that ranks the test rows upside down;
* ``eval-inflate`` / ``eval-deflate``: from ``ITER`` on, it adds :data:`PLANTED_ROWS` positives
  (``inflate``) or negatives (``deflate``) to the top score bin of its evaluation counts;
* ``rows:F``: at set-up, its row counts in the imputation and standardisation sums times ``F``;
* ``stats-scale:F``: at set-up, its sums of squared deviations (standardisation) times ``F``;
* ``fake-categories``: at set-up, :data:`FAKE_CATEGORIES` made-up categories with count
  :data:`FAKE_COUNT` in every text column's counts;
* ``impute:F``: at set-up, ``F`` added to its sum of every numeric column (imputation means).

The simulator runs every party in one process, which has no insider: it tells none of these.
The checks that catch them are :mod:`slate.data.declared` (the set-up sums and the evaluation
counts against what the sites declared) and :mod:`slate.training.final_check` (the saved model
against the site's own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from slate.faults.attacks import LIE_KINDS, Attack

__all__ = ["FAKE_CATEGORIES", "FAKE_COUNT", "PLANTED_ROWS", "Lies", "LyingExchange"]

PLANTED_ROWS = 20_000  # eval-inflate / eval-deflate: rows added to the top bin
FAKE_CATEGORIES = 60  # fake-categories: made-up names per text column ...
FAKE_COUNT = 10**6  # ... each with this count


class Lies:
    """The lies this process tells (none, unless ``SLATE_ATTACK`` names its party:
    :meth:`slate.faults.FaultPlan.lies`)."""

    def __init__(self, attacks: list[Attack] | tuple[Attack, ...] = ()) -> None:
        self.attacks = {a.kind: a for a in attacks if a.kind in LIE_KINDS}

    def _due(self, kind: str, iteration: int = 0) -> Attack | None:
        attack = self.attacks.get(kind)
        return attack if attack is not None and iteration >= attack.start else None

    def mean_input(self, x: Tensor, iteration: int, n: int, output: slice | None) -> Tensor:
        """What this party contributes to the averaged model at ``iteration`` (``x (1, d)``,
        its own; ``output``: the output layer's positions in the flat vector, ``None`` for a
        model without a final ``nn.Linear``, which it leaves alone)."""
        if self._due("final-poison", iteration) is None or output is None:
            return x
        target = x.clone()
        target[:, output] = -target[:, output]
        return n * target - (n - 1) * x

    def evaluation_counts(self, counts: Tensor, iteration: int) -> Tensor:
        """This party's ``(2, rows)`` evaluation counts as it sends them."""
        for kind, label in (("eval-inflate", 1), ("eval-deflate", 0)):
            if self._due(kind, iteration) is not None:
                counts = counts.clone()
                counts[label, -1] += PLANTED_ROWS
        return counts

    def exchange(self, exchange: Any) -> Any:
        """The data set-up's exchange as this party uses it: lying in the sums it names."""
        setup = [k for k in ("rows", "stats-scale", "fake-categories", "impute") if self._due(k)]
        return LyingExchange(exchange, self) if setup else exchange


class LyingExchange:
    """The data set-up's :class:`~slate.data.local_data.Exchange` of a lying party: its own
    contribution to a named sum is changed before it is sent."""

    def __init__(self, exchange: Any, lies: Lies) -> None:
        self.inner, self.lies = exchange, lies

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def total(self, value: Tensor, what: str = "") -> Tensor:
        return self.inner.total(self._tampered(value, what), what)

    def gather_json(self, items: list[Any], shape: Any, what: str, *limit: int) -> list[Any]:
        fake = self.lies._due("fake-categories")
        if fake is not None and what == "count of categories":
            items = [_with_fake_categories(item) for item in items]
        return self.inner.gather_json(items, shape, what, *limit)

    def _tampered(self, value: Tensor, what: str) -> Tensor:
        change: dict[str, Callable[[Tensor, float], None]] = {
            "rows": _scale_rows(what),
            "stats-scale": _scale_squares(what),
            "impute": _add_to_sums(what),
        }
        value = value.clone()
        for kind, tamper in change.items():
            attack = self.lies._due(kind)
            if attack is not None:
                tamper(value, attack.factor)
        return value


def _scale_rows(what: str) -> Callable[[Tensor, float], None]:
    def tamper(value: Tensor, factor: float) -> None:
        # the column statistics' first row and the standardisation sums' first value: rows
        if what in ("column statistics", "standardisation sums"):
            value[0] *= factor

    return tamper


def _scale_squares(what: str) -> Callable[[Tensor, float], None]:
    def tamper(value: Tensor, factor: float) -> None:
        if what == "standardisation squares":
            value *= factor

    return tamper


def _add_to_sums(what: str) -> Callable[[Tensor, float], None]:
    def tamper(value: Tensor, factor: float) -> None:
        if what == "column statistics":
            value[2] += factor

    return tamper


def _with_fake_categories(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {
        column: {**named, **{f"fake_{k}": FAKE_COUNT for k in range(FAKE_CATEGORIES)}}
        for column, named in counts.items()
    }
