"""Decentralised algorithms, one per module, and the name registry used by the CLI and configs."""

from __future__ import annotations

from slate.algorithms.base import Algorithm, AlgorithmConfig
from slate.algorithms.coda import CODA
from slate.algorithms.dpsgd import DPSGD
from slate.algorithms.slate import SLATE
from slate.algorithms.slate_m import SLATEM
from slate.errors import ConfigError

__all__ = [
    "ALGORITHMS",
    "CODA",
    "DPSGD",
    "SLATE",
    "SLATEM",
    "Algorithm",
    "AlgorithmConfig",
    "build_algorithm",
]

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (SLATE, SLATEM, DPSGD, CODA)}


def build_algorithm(name: str, config: AlgorithmConfig) -> Algorithm:
    """Instantiate the algorithm registered under ``name``."""
    if name not in ALGORITHMS:
        raise ConfigError(
            f"Unknown --algorithm {name!r}; expected one of {', '.join(sorted(ALGORITHMS))}."
        )
    return ALGORITHMS[name](config)
