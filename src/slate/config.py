"""The resolved configuration of a run, and the paper's per-dataset defaults.

Every flag of ``slate train`` is a field of :class:`TrainConfig`. A flag left unset takes the
dataset's default from :data:`DATASET_DEFAULTS` (the hyperparameters of the paper's runs,
REFERENCE.md), then the generic default. The resolved config is stored in ``summary.json``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DATASET_DEFAULTS", "TrainConfig", "resolve_config"]

# The paper's runs: N = 20 parties on a ring (REFERENCE.md, Hyperparameters).
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": {
        "iterations": 1000,
        "batch_size": 20,
        "positives": 4,
        "lr": 0.05,
        "margin": 0.5,
        "nodes": 8,
        "model": "mlp",
        "hidden": 28,
    },
    "w7a": {
        "iterations": 10000,
        "batch_size": 20,
        "positives": 2,
        "lr": 0.01,
        "margin": 0.1,
        "nodes": 20,
        "model": "mlp",
        "hidden": 28,
    },
    "w8a": {
        "iterations": 10000,
        "batch_size": 20,
        "positives": 2,
        "lr": 0.01,
        "margin": 0.1,
        "nodes": 20,
        "model": "mlp",
        "hidden": 28,
    },
    "mnist": {
        "iterations": 300,
        "batch_size": 20,
        "positives": 3,
        "lr": 0.01,
        "margin": 0.1,
        "nodes": 20,
        "model": "mnist-cnn",
    },
    "fashion-mnist": {
        "iterations": 300,
        "batch_size": 20,
        "positives": 5,
        "lr": 0.005,
        "margin": 0.1,
        "nodes": 20,
        "model": "fashion-mnist-cnn",
    },
    "cifar10": {
        "iterations": 2000,
        "batch_size": 60,
        "positives": 20,
        "lr": 0.01,
        "margin": 0.1,
        "nodes": 20,
        "model": "cifar10-cnn",
    },
    # The paper gives no iteration count for Tiny-ImageNet and tunes lr and margin on a grid.
    "tiny-imagenet": {
        "iterations": 2000,
        "batch_size": 200,
        "positives": 35,
        "lr": 0.01,
        "margin": 0.1,
        "nodes": 20,
        "model": "resnet18",
    },
    "libsvm": {"model": "mlp"},
    "csv": {"model": "mlp"},
}

_GENERIC_DEFAULTS: dict[str, Any] = {
    "iterations": 2000,
    "batch_size": 20,
    "positives": 2,
    "lr": 0.01,
    "margin": 0.1,
    "nodes": 20,
    "model": "mlp",
    "hidden": 28,
}


@dataclass
class TrainConfig:
    """Everything that determines a run. ``None`` means "take the dataset's default"."""

    dataset: str = "digits"
    data_dir: str | None = None
    train: str | None = None
    test: str | None = None
    label_column: str | None = None
    positive_label: str | None = None
    n_features: int | None = None
    test_fraction: float = 0.25
    split_seed: int = 0
    download: bool = False
    algorithm: str = "slate"
    nodes: int | None = None
    topology: str = "ring"
    fed_period: int = 10
    iterations: int | None = None
    batch_size: int | None = None
    positives: int | None = None
    lr: float | None = None
    margin: float | None = None
    gradient_tracking: bool = False
    partition: str = "stratified"
    dirichlet_alpha: float = 0.5
    model: str | None = None
    hidden: int | None = None
    eval_every: int | None = None
    seed: int = 0
    out: str | None = None
    device: str = "cpu"
    threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_config(config: TrainConfig) -> TrainConfig:
    """Fill every ``None`` field from the dataset's defaults, then the generic ones."""
    defaults = {**_GENERIC_DEFAULTS, **DATASET_DEFAULTS.get(config.dataset, {})}
    updates = {key: value for key, value in defaults.items() if getattr(config, key) is None}
    resolved = dataclasses.replace(config, **updates)
    if resolved.eval_every is None:
        resolved.eval_every = max(1, resolved.iterations // 20)
    return resolved
