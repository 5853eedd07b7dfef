"""Per-party mini-batch sampling: ``b`` positives and ``m - b`` negatives per party per step.

Each party owns two independent random streams (positives, negatives), derived from the run's
seed and the party's index alone: ``SeedSequence(seed).spawn`` child ``n``. A party's draws
therefore do not depend on N, on the other parties, or on how many steps are drawn at once, and
the distributed engine, which samples only its own party, draws exactly the simulator's indices.
Indices are drawn in bulk (a chunk of steps at a time) and moved to the device once per chunk.
Sampling is uniform with replacement from the party's own examples of each class.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from slate.errors import ConfigError

__all__ = ["PartySampler", "validate_batch_shape"]


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
        """Indices for the next ``steps`` iterations: the first ``b`` of each row are positives."""
        out = np.empty((steps, len(self.parties), self.m), dtype=np.int64)
        for k, (pos_rng, neg_rng) in enumerate(self.streams):
            pos = self.positive_ids[k]
            out[:, k, : self.b] = pos[pos_rng.integers(0, len(pos), size=(steps, self.b))]
            if self.m > self.b:
                neg = self.negative_ids[k]
                out[:, k, self.b :] = neg[
                    neg_rng.integers(0, len(neg), size=(steps, self.m - self.b))
                ]
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
