"""Split a training set across N parties: stratified IID (the authors' scheme) or Dirichlet.

A partition is a list of N index arrays into the training set, one per party. Both schemes are
deterministic functions of the seed, so every process of the distributed engine derives the
same partition and keeps only its own part.
"""

from __future__ import annotations

import numpy as np

from slate.errors import ConfigError, DataError, parties_text, per_party_text

__all__ = [
    "MAX_DEFAULT_PARTIES",
    "PARTITIONS",
    "check_party_counts",
    "check_run_positives",
    "dirichlet_partition",
    "make_partition",
    "parties_for_positives",
    "stratified_partition",
    "without_positives_note",
]

PARTITIONS = ("stratified", "dirichlet")

MAX_DEFAULT_PARTIES = 20  # the paper's N, and the default for a user's own file


def parties_for_positives(positives: int, b: int) -> int:
    """The default N for a table with ``positives`` training positives: the largest
    ``N <= MAX_DEFAULT_PARTIES`` whose stratified parties each hold at least ``b`` of them
    (at least 1)."""
    return max(1, min(MAX_DEFAULT_PARTIES, positives // b))


def stratified_partition(labels: np.ndarray, n_parties: int, seed: int) -> list[np.ndarray]:
    """Per class: shuffle, then party ``n`` takes positions ``n, n + N, n + 2N, ...``.

    Every party gets the same class mix and sizes that differ by at most one per class
    (REFERENCE.md, Data).
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9A57]))
    parts: list[list[np.ndarray]] = [[] for _ in range(n_parties)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        for n in range(n_parties):
            parts[n].append(members[n::n_parties])
    return [np.sort(np.concatenate(p)) for p in parts]


def dirichlet_partition(
    labels: np.ndarray, n_parties: int, alpha: float, seed: int
) -> list[np.ndarray]:
    r"""Non-IID split: class ``c``'s shuffled samples are cut by proportions :math:`p_c \sim
    \mathrm{Dir}(\alpha \mathbf{1}_N)`. Small ``alpha`` gives very skewed parties."""
    if not alpha > 0:
        raise ConfigError(f"--dirichlet-alpha must be > 0, got {alpha}.")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xD1C1]))
    parts: list[list[np.ndarray]] = [[] for _ in range(n_parties)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        shares = rng.dirichlet(np.full(n_parties, alpha))
        cuts = np.round(np.cumsum(shares)[:-1] * len(members)).astype(int)
        for n, chunk in enumerate(np.split(members, cuts)):
            parts[n].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def make_partition(
    labels: np.ndarray, n_parties: int, scheme: str, seed: int, dirichlet_alpha: float = 0.5
) -> list[np.ndarray]:
    """Dispatch on ``scheme`` (``--partition``)."""
    if n_parties < 1:
        raise ConfigError(f"--nodes must be at least 1, got {n_parties}.")
    if scheme == "stratified":
        return stratified_partition(labels, n_parties, seed)
    if scheme == "dirichlet":
        return dirichlet_partition(labels, n_parties, dirichlet_alpha, seed)
    raise ConfigError(f"Unknown --partition {scheme!r}; expected one of {', '.join(PARTITIONS)}.")


def without_positives_note(ranks: list[int]) -> str:
    """The console line for parties that hold no positive training row: they join the run
    (docs/algorithms.md, "A site without positives")."""
    one = len(ranks) == 1
    return (
        f"note: {parties_text(ranks)} hold{'s' if one else ''} no positive training row and "
        f"join{'s' if one else ''} the run all the same: {'it mixes' if one else 'they mix'} "
        "with the neighbours and the test rows are scored; the AP surrogate (slate, slate-m) "
        f"has no term there, so {'its' if one else 'their'} local gradient is zero, while "
        "dpsgd and coda train on the negatives (docs/algorithms.md)."
    )


def check_run_positives(positives: list[int]) -> None:
    """The run as a whole needs a positive training row: with none at any party no objective
    has a positive class to learn (a site without positives is fine, all of them is not)."""
    if sum(positives) == 0:
        raise DataError(
            f"No party holds a positive training row ({len(positives)} parties): there is no "
            "positive class to learn. Check --positive-label and the label column."
        )


def check_party_counts(
    labels: np.ndarray,
    parts: list[np.ndarray],
    positives: int,
    batch_size: int,
    partition: str = "stratified",
) -> list[str]:
    """Every party that holds positives needs at least ``b`` of them; a party without any
    joins (its batches are ``m`` negatives, see :class:`slate.data.sampler.PartySampler`) and
    gets a note, returned. Every party needs a negative where its batches draw one: when
    ``m > b``, or when it holds no positive. The run as a whole needs a positive."""
    pos = [int(labels[p].sum()) for p in parts]
    neg = [len(p) - k for p, k in zip(parts, pos, strict=True)]
    check_run_positives(pos)
    short = [n for n, k in enumerate(pos) if 0 < k < positives]
    if short:
        fits = max(1, int(labels.sum()) // positives)
        remedy = f"Use --nodes {fits} or fewer (the {int(labels.sum())} training positives "
        remedy += f"allow {fits} parties of {positives}), or a smaller --positives"
        if partition != "stratified":
            remedy += ", or the stratified --partition (a small --dirichlet-alpha starves parties)"
        raise DataError(
            f"Every party that holds positives must hold at least b = {positives} (--positives), "
            f"but {len(short)} of {len(parts)} parties hold fewer ({parties_text(short, False)}). "
            f"Positives per party: {per_party_text(pos)}. {remedy}."
        )
    empty = [n for n, k in enumerate(neg) if k < 1 and (batch_size > positives or pos[n] == 0)]
    if empty:
        raise DataError(
            f"No negative example at {parties_text(empty)}, but each batch needs m - b = "
            f"{batch_size - positives} negatives, and all m = {batch_size} at a party without "
            f"positives. Negatives per party: {per_party_text(neg)}."
        )
    none = [n for n, k in enumerate(pos) if k == 0]
    return [without_positives_note(none)] if none else []
