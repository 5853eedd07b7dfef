"""What the data line reads from a run's configuration: :class:`DataSpec`, built once.

``slate train`` builds it from its :class:`~slate.config.TrainConfig`
(:meth:`DataSpec.from_config`); every function of :mod:`slate.data` then takes the spec, never
the whole configuration. The entry points also accept a configuration and build the spec there
(:meth:`DataSpec.of`), so that a caller holding only a configuration needs no extra step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RANK_PLACEHOLDER", "DataSpec", "party_path", "uses_party_files"]

RANK_PLACEHOLDER = "{rank}"


@dataclass(frozen=True)
class DataSpec:
    """The configuration fields that reading, splitting, fitting and cutting the data use.

    The names and meanings are those of :class:`~slate.config.TrainConfig`'s fields of the same
    name: which dataset and files (``dataset`` ... ``download``), how a held-out part is made
    (``test_fraction``, ``split_seed``, ``validation_fraction``), how LIBSVM files and CSV tables
    are read and encoded (``n_features`` ... ``min_frequency``, ``feature_range`` the public
    range of LIBSVM values, ``schema`` the declared data dictionary), and how the training rows
    are cut into parties (``nodes`` ... ``batch_size``); ``dp_epsilon``: whether the run is
    private (what a site declares then: docs/privacy.md).
    """

    dataset: str = "digits"
    train: str | None = None
    test: str | None = None
    party_files: bool = False
    data_dir: str | None = None
    download: bool = False
    test_fraction: float = 0.25
    split_seed: int = 0
    validation_fraction: float | None = None
    n_features: int | None = None
    feature_range: tuple[float, float] | None = None
    zero_based: bool = False
    positive_label: str | None = None
    standardize: bool | None = None
    label_column: str | None = None
    id_columns: tuple[str, ...] = ()
    drop_columns: tuple[str, ...] = ()
    feature_columns: tuple[str, ...] = ()
    categorical_columns: tuple[str, ...] = ()
    na_values: tuple[str, ...] = ()
    delimiter: str | None = None
    encoding: str = "utf-8"
    missing: str = "impute"
    schema: str | None = None
    max_categories: int | None = 50
    min_frequency: int = 1
    nodes: int | None = None
    partition: str = "stratified"
    seed: int = 0
    dirichlet_alpha: float = 0.5
    positives: int | None = None
    batch_size: int | None = None
    dp_epsilon: float | None = None
    declared_bounds: str | None = None  # slate.data.plausible.SetupBounds (--declared-bounds)

    @classmethod
    def from_config(cls, config: Any) -> DataSpec:
        """The spec of a :class:`~slate.config.TrainConfig` (its fields of the same names)."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def of(cls, source: Any) -> DataSpec:
        """``source`` itself when it is a spec, else the spec of that configuration."""
        return source if isinstance(source, DataSpec) else cls.from_config(source)

    @property
    def public_range(self) -> tuple[float, float] | None:
        """The public range of LIBSVM values: ``--feature-range``, or under ``--dp-epsilon``
        :data:`~slate.config.DP_FEATURE_RANGE`; ``None``: each site declares its rows' own."""
        if self.feature_range is not None:
            return (float(self.feature_range[0]), float(self.feature_range[1]))
        if self.dp_epsilon is not None and self.dataset == "libsvm":
            from slate.config import DP_FEATURE_RANGE

            return DP_FEATURE_RANGE
        return None

    @property
    def per_party(self) -> bool:
        """Whether each party reads its own files (:func:`uses_party_files`)."""
        return uses_party_files(self)

    @property
    def read_dtype(self) -> type[np.floating]:
        """float64 when the features are standardised later, which casts them to float32 after
        scaling; float32 otherwise."""
        return np.float64 if self.standardize else np.float32


def uses_party_files(config: Any) -> bool:
    """Whether each party reads its own files (``--party-files``, or ``{rank}`` in a path)."""
    return bool(config.party_files) or any(
        RANK_PLACEHOLDER in (path or "") for path in (config.train, config.test)
    )


def party_path(template: str, rank: int) -> str:
    """``template`` with ``{rank}`` replaced by the party's index."""
    return template.replace(RANK_PLACEHOLDER, str(rank))
