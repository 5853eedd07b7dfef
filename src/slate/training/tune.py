"""``slate tune``: a grid search over the paper's grids, scored on a validation split.

The validation split is carved out of the training set (seeded, stratified), so the test set is
never looked at while choosing hyperparameters. It is made before any statistic is fitted: a
CSV table is split first and then encoded (imputation means, categories, z-scores) on the
tuning rows only, exactly as ``slate train`` would encode them given those rows as ``--train``
and the validation rows as ``--test``; other data is standardised, when asked, by the run itself
on the tuning rows. The paper's grids (Section 6.2): step size in
{0.01, 0.005, 0.001}, margin in {0.1, 0.3, 0.5, 0.7, 0.9}, SLATE-M's alpha in {0.1, 0.9}, CODA's
dual step size in {0.0001, 0.0005, 0.001}.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slate.config import TrainConfig
from slate.data.datasets import Dataset
from slate.data.sources import load_dataset
from slate.data.sources import validation_split as split_off_validation
from slate.errors import ConfigError

__all__ = ["PAPER_GRIDS", "parse_grid", "tune", "tuning_data", "validation_split"]

PAPER_GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    "slate": {"lr": (0.01, 0.005, 0.001), "margin": (0.1, 0.3, 0.5, 0.7, 0.9)},
    "slate-m": {
        "lr": (0.01, 0.005, 0.001), "margin": (0.1, 0.3, 0.5, 0.7, 0.9), "alpha": (0.1, 0.9),
    },
    "dpsgd": {"lr": (0.01, 0.005, 0.001)},
    "coda": {"lr": (0.01, 0.005, 0.001), "lr_dual": (0.0001, 0.0005, 0.001)},
}  # fmt: skip
_TUNABLE = {"lr": float, "margin": float, "alpha": float, "lr_dual": float, "positives": int}


def parse_grid(text: str) -> dict[str, tuple[float, ...]]:
    """``"lr=0.01,0.005 margin=0.1"`` to ``{"lr": (0.01, 0.005), "margin": (0.1,)}``."""
    grid = {}
    for item in text.split():
        key, _, values = item.partition("=")
        key = key.replace("-", "_")
        if key not in _TUNABLE or not values:
            raise ConfigError(
                f"--grid entry {item!r} is not KEY=V1,V2,...; keys: {', '.join(_TUNABLE)}."
            )
        try:
            grid[key] = tuple(_TUNABLE[key](v) for v in values.split(","))
        except ValueError as err:
            raise ConfigError(f"--grid entry {item!r} holds a value that is not a number.") from err
    return grid


def _check_fraction(fraction: float) -> None:
    if not 0 < fraction < 1:
        raise ConfigError(f"--validation-fraction must lie in (0, 1), got {fraction}.")


def validation_split(data: Dataset, fraction: float, seed: int) -> Dataset:
    """Replace the test set of an unencoded dataset by a seeded stratified share of its
    training set (:func:`slate.data.sources.validation_split`). An encoded table is refused:
    its statistics already saw the validation rows; :func:`tuning_data` splits the table
    before encoding it."""
    _check_fraction(fraction)
    return split_off_validation(data, fraction, seed)


def tuning_data(config: TrainConfig, fraction: float, seed: int) -> Dataset:
    """The tuning rows and the validation rows of a resolved ``config`` (module docstring).

    The same split as ``slate train --validation-fraction``: for ``--dataset csv`` the
    training table (without the test rows that ``slate train`` would hold out when no
    ``--test`` is given) is split, and the encoder is fitted on the tuning part only. The test
    rows are never read.
    """
    _check_fraction(fraction)
    data = load_dataset(config, fraction, seed)
    data.final_test = None
    return data


def tune(
    config: TrainConfig,
    grid: dict[str, tuple[float, ...]] | None = None,
    validation_fraction: float = 0.2,
    out: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train every grid point on the training part, score AP on validation, return the best."""
    from slate.training.configuration import resolve_and_check
    from slate.training.loop import train

    config = resolve_and_check(config).flags
    if config.dp_epsilon is not None:
        raise ConfigError(
            f"Refused under --dp-epsilon {config.dp_epsilon:g}: slate tune trains every grid "
            "point on the private rows and keeps the best by its AP on private validation "
            "rows, a selection that the privacy accounting does not count. Choose the "
            "hyperparameters on public data, then run slate train --dp-epsilon."
        )
    grid = grid or PAPER_GRIDS[config.algorithm]
    data = tuning_data(config, validation_fraction, config.split_seed)
    log(f"tuning {config.algorithm} on {data.describe()}")
    results = []
    names = list(grid)
    for values in itertools.product(*(grid[n] for n in names)):
        setting = dict(zip(names, values, strict=True))
        candidate = resolve_and_check(dataclasses.replace(config, **setting))  # a new config
        summary = train(candidate, data=data, write=False, progress=False, log=lambda _: None)
        results.append({**setting, "validation_ap": summary.summary["test_ap"]})
        log("  " + "  ".join(f"{k}={v}" for k, v in setting.items())
            + f"  validation AP {results[-1]['validation_ap']:.4f}")  # fmt: skip
    best = max(results, key=lambda r: r["validation_ap"])
    report = {
        "algorithm": config.algorithm, "dataset": config.dataset, "grid": grid,
        "validation": data.test_split, "results": results, "best": best,
        "best_config": dataclasses.replace(
            config, **{k: v for k, v in best.items() if k != "validation_ap"}
        ).to_dict(),
    }  # fmt: skip
    log("best: " + "  ".join(f"{k}={v}" for k, v in best.items()))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "tune.json").write_text(json.dumps(report, indent=2))
        log(f"wrote {out / 'tune.json'}")
    return report
