"""What the training loop gets from the data line: :class:`LocalData`, the rows of the parties a
process runs, and what setting them up needs from the engine (:class:`Exchange`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from torch import Tensor

from slate.data.declared import Declared
from slate.data.schema import PartyCounts
from slate.data.spec import RANK_PLACEHOLDER, party_path, uses_party_files
from slate.errors import DataError, by_party_text

__all__ = [
    "RANK_PLACEHOLDER",
    "Exchange",
    "HeldOut",
    "LocalData",
    "describe_rows",
    "party_path",
    "row_blocks",
    "stop_on_errors",
    "uses_party_files",
]


class Exchange(Protocol):
    """What setting up per-party data needs from the engine: sums and a gather of small facts."""

    def total(self, value: Tensor, what: str = "") -> Tensor:
        """``value`` summed over every process; ``what`` names the sum."""
        ...

    def gather_json(self, items: list[Any], shape: Any, what: str) -> list[Any]: ...


@dataclass
class HeldOut:
    """Rows that are scored, not trained on: features, labels, and each local party's positions
    (per-party files; ``None`` when the rows are one pool), with the row counts over all
    parties."""

    x: np.ndarray
    y: np.ndarray
    parts: list[np.ndarray] | None
    rows: int
    positives: int
    split: str = ""  # how these rows were made, for summary.json's test_split
    declared: list[tuple[int, int]] | None = None  # per rank: (rows, positives) it reported


@dataclass
class LocalData:
    """The rows of the parties this process runs, and the held-out rows it scores.

    Attributes:
        x_train, y_train: the local parties' training rows, concatenated in party order.
        parts: each local party's positions in ``x_train``.
        x_test, y_test: the rows scored during training: the whole test set (partitioned) or
            the local parties' own test rows, or, with ``--validation-fraction``, the
            validation rows.
        test_parts: each local party's positions in ``x_test`` with per-party files; ``None``
            when the held-out set is one pool.
        n_train, n_test: row counts over all parties.
        test_split: how the held-out set was made.
        description: one line for the console.
        preprocessing: the fitted transform, applied to every feature row here.
        notes: warnings for the console (parties short of positives), the same at every
            process: the main one prints them.
        own_notes: notes about this process's own parties' rows (per-party files: values
            clipped into the public range), printed by this process, main or not, and never
            sent.
        counts: every party's row counts (per-party files only).
        declared: every party's declarations, row counts and value ranges (per-party files
            only; :mod:`slate.data.declared`).
        held_out: what ``x_test`` is: ``"test"``, or ``"validation"``.
        final_test: with ``--validation-fraction``, the test rows, read and transformed only when
            called, once training is over (every process calls it at the same point).
        test_positives: the test positives over all parties, once those rows were read.
        dictionary: the sha256 of the ``--schema`` file (a declared data dictionary), ``None``
            without one; compared by every site before step 1.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    parts: list[np.ndarray]
    x_test: np.ndarray
    y_test: np.ndarray
    test_parts: list[np.ndarray] | None
    n_train: int
    n_test: int
    test_split: str
    description: str
    preprocessing: Any = None
    notes: list[str] = field(default_factory=list)
    own_notes: list[str] = field(default_factory=list)
    counts: list[PartyCounts] = field(default_factory=list)
    declared: Declared | None = None
    held_out: str = "test"
    final_test: Callable[[], HeldOut] | None = None
    test_positives: int | None = None  # over all parties, once the final test rows are read
    dictionary: str | None = None  # the sha256 of the --schema file, where one was given

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def federated(self) -> bool:
        return self.test_parts is not None

    def describe(self) -> str:
        return self.description


def row_blocks(lengths: list[int]) -> list[np.ndarray]:
    """Consecutive position ranges of blocks of these ``lengths``."""
    offsets = np.cumsum([0, *lengths])
    return [np.arange(offsets[k], offsets[k + 1]) for k in range(len(lengths))]


def describe_rows(
    name: str, y_train: np.ndarray, y_held: np.ndarray, held_out: str, split: str
) -> str:
    """One console line: the training and held-out row counts, their positive shares, and how
    the held-out rows were made."""
    return (
        f"{name}: {len(y_train)} train ({y_train.mean():.2%} positive), "
        f"{len(y_held)} {held_out} ({y_held.mean():.2%} positive); {held_out} set: {split}"
    )


def stop_on_errors(reports: list[list[Any]]) -> None:
    """Stop every party, naming those whose report (a gathered list: the party first, an error
    or ``None`` last) holds an error."""
    failed = [(report[0], report[-1]) for report in reports if report[-1] is not None]
    if failed:
        raise DataError(by_party_text(failed))
