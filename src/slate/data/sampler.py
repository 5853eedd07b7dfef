"""Per-party mini-batch sampling: ``b`` positives and ``m - b`` negatives per party per step.

Each party owns two independent random streams (positives, negatives), derived from the run's
seed and the party's index alone: ``SeedSequence(seed).spawn`` child ``n``. A party's draws
therefore do not depend on N, on the other parties, or on how many steps are drawn at once, and
the distributed engine, which samples only its own party, draws exactly the simulator's indices.
Indices are drawn in bulk (a chunk of steps at a time) and moved to the device once per chunk.
Sampling is uniform with replacement from the party's own examples of each class; a party
that holds no positive draws all ``m`` from its negatives.

Under ``--dp-epsilon``, :class:`PoissonGroupSampler` replaces it (docs/privacy.md): every row is
taken independently with its class's public rate (``q+`` for positives, ``q-`` for negatives),
each taken row falls into one of ``G`` groups uniformly at random, and each group is cut or
padded to a fixed number of slots (padding: an index the caller names, a row of its table
with label -1). Its randomness is the site's secret
(:class:`slate.security.secret_random.SecretStream`), never the run's seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from slate.errors import ConfigError
from slate.security.secret_random import SecretStream

__all__ = [
    "PartySampler",
    "PoissonGroupSampler",
    "row_slots_for",
    "slots_for",
    "validate_batch_shape",
]


def validate_batch_shape(batch_size: int, positives: int) -> None:
    """``1 <= b <= m``: each batch holds ``b`` positives among ``m`` samples."""
    if batch_size < 1:
        raise ConfigError(f"--batch-size (m) must be at least 1, got {batch_size}.")
    if positives < 1:
        raise ConfigError(
            f"--positives (b) must be at least 1, got {positives}: the AP surrogate averages "
            "over the positives of each batch."
        )
    if positives > batch_size:
        raise ConfigError(
            f"--positives (b = {positives}) cannot exceed --batch-size (m = {batch_size})."
        )


def _party_streams(seed: int, party: int) -> tuple[np.random.Generator, np.random.Generator]:
    child = np.random.SeedSequence(seed, spawn_key=(party,))
    pos, neg = child.spawn(2)
    return np.random.default_rng(pos), np.random.default_rng(neg)


class PartySampler:
    """Draws global training indices of shape ``(steps, P, m)`` for the parties it serves.

    Args:
        parts: the partition (one index array per party, all N of them or just one's own).
        labels: training labels (0/1) of the whole training set.
        batch_size: ``m``; positives: ``b``.
        seed: the run's seed.
        parties: the global indices of the parties in ``parts`` (default ``0..len(parts)-1``).
    """

    def __init__(
        self,
        parts: list[np.ndarray],
        labels: np.ndarray,
        batch_size: int,
        positives: int,
        seed: int,
        parties: list[int] | None = None,
    ) -> None:
        validate_batch_shape(batch_size, positives)
        self.m, self.b = batch_size, positives
        self.parties = list(range(len(parts))) if parties is None else list(parties)
        self.positive_ids = [p[labels[p] == 1] for p in parts]
        self.negative_ids = [p[labels[p] == 0] for p in parts]
        self.streams = [_party_streams(seed, n) for n in self.parties]

    def draw(self, steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Indices for the next ``steps`` iterations: the first ``b`` of each row are positives,
        except at a party without positives, whose ``m`` are all negatives (its negative
        stream's draws; the AP surrogate has no term there, cross-entropy and CODA's negative
        terms use them all)."""
        out = np.empty((steps, len(self.parties), self.m), dtype=np.int64)
        for k, (pos_rng, neg_rng) in enumerate(self.streams):
            pos, neg = self.positive_ids[k], self.negative_ids[k]
            first = self.b if len(pos) else 0  # where the party's negatives start
            if first:
                out[:, k, :first] = pos[pos_rng.integers(0, len(pos), size=(steps, first))]
            if self.m > first:
                out[:, k, first:] = neg[neg_rng.integers(0, len(neg), size=(steps, self.m - first))]
        return torch.from_numpy(out).to(device)

    def keep(self, rows: list[int]) -> None:
        """Serve only the parties at these positions of ``parties`` (the others left the run)."""
        self.parties = [self.parties[k] for k in rows]
        self.positive_ids = [self.positive_ids[k] for k in rows]
        self.negative_ids = [self.negative_ids[k] for k in rows]
        self.streams = [self.streams[k] for k in rows]

    def state_dict(self) -> dict[str, Any]:
        """The RNG states of every stream (for checkpoints)."""
        return {"streams": [[g.bit_generator.state for g in pair] for pair in self.streams]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for pair, saved in zip(self.streams, state["streams"], strict=True):
            for gen, st in zip(pair, saved, strict=True):
                gen.bit_generator.state = st


def slots_for(expected: float) -> int:
    """Slots for a count of mean ``expected`` (a sum of independent Bernoulli draws, whose
    variance is below its mean): ``ceil(mu + sqrt(mu)) + 1``, a standard deviation above the
    mean or more. A count past it loses its last rows, and a group's positives come first
    (:class:`PoissonGroupSampler`), so what is lost is negatives: for a group of mean 16,
    1.5% of them (the expected excess of a Poisson count of mean 16 over 21 slots, over 16),
    which only lowers a row's influence. Three standard deviations would lose none, at 29
    slots for 21: 38% more rows through the model, each of them an empty slot."""
    return math.ceil(expected + math.sqrt(expected)) + 1


def row_slots_for(expected: float) -> int:
    """Slots for a step's rows when each row is its own group (a sum over rows: D-PSGD's,
    CODA's): ``ceil(mu + 3 sqrt(mu)) + 1``, three standard deviations above the mean. The rows
    fill the slots one each (:class:`PoissonGroupSampler`), so a row is lost only when a step
    takes more rows than that: for a mean of 128, 175 slots, and a step takes more with
    probability below 1e-4. The clipped sum is divided by the expected rows, so the rows kept
    per step must be that many on average (no collision loss, no class favoured)."""
    return math.ceil(expected + 3.0 * math.sqrt(expected)) + 1


def _threshold(rate: float) -> np.uint64:
    """The 64-bit word below which a row is taken at ``rate``: :math:`\\lfloor q\\,2^{64}
    \\rfloor`, at most :math:`2^{64} - 1`."""
    return np.uint64(min(int(rate * 2.0**64), 2**64 - 1))


def _rank_within_runs(keys: np.ndarray) -> np.ndarray:
    """Each element's position within its run of equal ``keys`` (sorted): 0, 1, 2, ..."""
    position = np.arange(len(keys))
    starts = np.ones(len(keys), dtype=bool)
    starts[1:] = keys[1:] != keys[:-1]
    return position - np.maximum.accumulate(np.where(starts, position, 0))


class PoissonGroupSampler:
    """Poisson sampling with public per-class rates, dealt into groups (``--dp-epsilon``).

    At every step each row of party ``k`` is taken with probability ``rates[k][0]`` (a
    positive) or ``rates[k][1]`` (a negative), independently; each taken row falls into one of
    ``groups`` groups uniformly at random, its positives first and each class in random order
    within it, and each group keeps its first ``group_size`` rows (a cut drops negatives
    before any positive). A draw is ``(steps, P, groups * group_size)`` global indices,
    group-major within a party, ``pad`` in an empty slot. Adding or removing one row
    changes one group only (its own; the others' rows and order are drawn independently of it).

    Groups of one row (``group_size == 1``: a loss that is a sum over rows) are not dealt at
    random, which would lose every row that lands on an occupied slot (about a third of them
    at 141 slots for 128 rows): the step's rows fill the slots one each, positives first and
    each class in random order, so a row is lost only when the step takes more rows than
    ``groups`` slots (:func:`row_slots_for`), and then a negative. A row's presence moves the
    others' slots but not their contributions to the sum over slots; replacing a row by another
    of its class (the relation the accountant uses) changes that one slot only.

    Args:
        parts: one index array per local party; labels: the training labels (0/1).
        rates: ``(q+, q-)`` per local party, each in ``(0, 1]``.
        groups: ``G``; group_size: the slots per group.
        streams: one secret stream per local party (:class:`SecretStream`).
        pad: the index of an empty slot (a row whose label the caller sets to -1).
        parties: the global indices of the local parties.
    """

    def __init__(
        self,
        parts: list[np.ndarray],
        labels: np.ndarray,
        rates: list[tuple[float, float]],
        groups: int,
        group_size: int,
        streams: list[SecretStream],
        pad: int,
        parties: list[int] | None = None,
    ) -> None:
        self.pad = pad
        self.parties = list(range(len(parts))) if parties is None else list(parties)
        self.groups, self.group_size = groups, group_size
        self.ids = [np.asarray(p) for p in parts]
        self.thresholds = [
            np.where(labels[p] == 1, _threshold(q_pos), _threshold(q_neg))
            for p, (q_pos, q_neg) in zip(parts, rates, strict=True)
        ]
        self.negative = [labels[p] != 1 for p in parts]
        self.streams = list(streams)

    @property
    def width(self) -> int:
        """Slots per party per step: ``groups * group_size``."""
        return self.groups * self.group_size

    def draw(self, steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Indices for the next ``steps`` iterations, ``pad`` where a slot is empty."""
        out = np.empty((steps, len(self.parties), self.width), dtype=np.int64)
        for k, stream in enumerate(self.streams):
            out[:, k] = self._draw_party(k, stream, steps)
        return torch.from_numpy(out).to(device)

    def _draw_party(self, k: int, stream: SecretStream, steps: int) -> np.ndarray:
        """One party's ``(steps, groups * group_size)`` slots. A row is taken when its 64-bit
        keystream word is below :math:`q\\,2^{64}` (probability ``q``); only the taken rows
        then draw a group and a random rank within it, behind the group's positives."""
        ids, thresholds = self.ids[k], self.thresholds[k]
        groups, size = self.groups, self.group_size
        words = stream.words(steps * len(ids)).reshape(steps, len(ids))
        step, column = np.nonzero(words < thresholds)
        if size == 1:
            return self._fill_slots(k, stream, steps, step, column)
        group = np.minimum((stream.uniform(len(step)) * groups).astype(np.int64), groups - 1)
        negative = self.negative[k][column]
        # step, group, positives first, then random
        order = np.lexsort((stream.uniform(len(step)), negative, group, step))
        step, group, column = step[order], group[order], column[order]
        rank = _rank_within_runs(step * groups + group)
        keep = rank < size
        result = np.full((steps, groups * size), self.pad, dtype=np.int64)
        result[step[keep], group[keep] * size + rank[keep]] = ids[column[keep]]
        return result

    def _fill_slots(
        self, k: int, stream: SecretStream, steps: int, step: np.ndarray, column: np.ndarray
    ) -> np.ndarray:
        """Groups of one row: each step's taken rows in slots 0, 1, 2, ..., its positives
        first, each class in random order, the rows past the last slot dropped."""
        order = np.lexsort((stream.uniform(len(step)), self.negative[k][column], step))
        step, column = step[order], column[order]
        slot = _rank_within_runs(step)
        keep = slot < self.groups
        result = np.full((steps, self.groups), self.pad, dtype=np.int64)
        result[step[keep], slot[keep]] = self.ids[k][column[keep]]
        return result

    def keep(self, rows: list[int]) -> None:
        """Serve only the parties at these positions of ``parties`` (the others left the run)."""
        self.parties = [self.parties[k] for k in rows]
        self.ids = [self.ids[k] for k in rows]
        self.thresholds = [self.thresholds[k] for k in rows]
        self.negative = [self.negative[k] for k in rows]
        self.streams = [self.streams[k] for k in rows]

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the streams are secret and never stored; a resumed or rolled-back run
        draws fresh samples (each a new release, counted by the ledger)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state
