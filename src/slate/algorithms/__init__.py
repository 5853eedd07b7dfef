"""Decentralised algorithms, one per module, and the name registry used by the CLI and configs."""

from __future__ import annotations

from slate.algorithms.base import Algorithm, AlgorithmConfig
from slate.algorithms.dpsgd import DPSGD
from slate.algorithms.slate import SLATE
from slate.errors import ConfigError

__all__ = ["ALGORITHMS", "DPSGD", "SLATE", "Algorithm", "AlgorithmConfig", "build_algorithm"]

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (SLATE, DPSGD)}


def build_algorithm(name: str, config: AlgorithmConfig) -> Algorithm:
    """Instantiate the algorithm registered under ``name``."""
    if name not in ALGORITHMS:
        raise ConfigError(
            f"Unknown --algorithm {name!r}; expected one of {', '.join(sorted(ALGORITHMS))}."
        )
    return ALGORITHMS[name](config)
