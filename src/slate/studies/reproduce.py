"""``slate reproduce``: the paper's Table 2 and Figures 1-2, and the ablation of Tables 3-4.

Every run is an ordinary ``slate train`` run in its own folder under ``--out``
(``OUT/<dataset>/<method>/seed<k>/``). A folder that already holds a ``summary.json`` is a
finished run and is reused, so an interrupted reproduction continues where it stopped.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import statistics
import tomllib
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from slate.config import TrainConfig
from slate.errors import ConfigError, DataError
from slate.metrics import plots

__all__ = [
    "METHODS",
    "METHOD_LABELS",
    "TABLE2_DATASETS",
    "ablation",
    "dataset_available",
    "default_config_dir",
    "load_preset",
    "mean_std",
    "run_or_reuse",
    "table2",
    "train_config",
]

METHODS = ("dpsgd", "coda", "slate", "slate-m")
METHOD_LABELS = {"dpsgd": "D-PSGD", "coda": "CODA", "slate": "SLATE", "slate-m": "SLATE-M"}
TABLE2_DATASETS = ("w7a", "w8a", "mnist", "fashion-mnist", "cifar10", "tiny-imagenet")


def default_config_dir() -> Path:
    """The presets installed with slate: the ``configs/`` folder of the ``slate.studies``
    package, one TOML per paper experiment (the repository's top-level ``configs/`` links to
    it)."""
    return Path(str(resources.files("slate.studies").joinpath("configs")))


def load_preset(dataset: str, config_dir: Path) -> dict[str, Any]:
    """Read ``config_dir/<dataset>.toml``; a missing or malformed file is a ConfigError."""
    path = config_dir / f"{dataset}.toml"
    try:
        with open(path, "rb") as handle:
            preset = tomllib.load(handle)
    except FileNotFoundError as err:
        raise ConfigError(
            f"No preset {path} for dataset {dataset!r}; presets exist for "
            f"{', '.join(sorted(p.stem for p in config_dir.glob('*.toml')))}."
        ) from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"Preset {path} is not valid TOML: {err}.") from err
    return preset


def train_config(preset: dict[str, Any], method: str, seed: int, **overrides) -> TrainConfig:
    """The :class:`TrainConfig` of one run of ``method`` from a preset.

    The preset's top-level keys that are ``TrainConfig`` fields, then its ``[methods.<method>]``
    table, then the ``overrides`` that are not None (an ``iterations`` override drops the
    preset's ``eval_every``); a key that is no ``TrainConfig`` field is a ConfigError.
    """
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in preset.items() if k in fields}
    values.update(preset.get("methods", {}).get(method, {}))
    if overrides.get("iterations") is not None:
        values.pop("eval_every", None)  # a preset that sets one: take the default schedule
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"Unknown keys {unknown} in the preset for {preset.get('dataset')}.")
    return TrainConfig(**{**values, "algorithm": method, "seed": seed})


def run_or_reuse(config: TrainConfig, folder: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Train into ``folder`` unless it already holds a finished run; return its summary."""
    from slate.training.loop import train

    summary_path = folder / "summary.json"
    if summary_path.is_file():  # (one that says it is running, stopped or failed is not done)
        summary = json.loads(summary_path.read_text())
        if summary.get("state", "done") == "done":
            log(f"  reuse {folder}")
            return summary
    config = dataclasses.replace(config, out=str(folder))
    return train(config, progress=False, log=lambda _: None).summary


def _history(folder: Path) -> tuple[list[int], list[float]]:
    with open(folder / "history.csv") as handle:
        rows = list(csv.DictReader(handle))
    return [int(r["iteration"]) for r in rows], [float(r["test_ap"]) for r in rows]


def _pr_curve(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    data = np.loadtxt(folder / "pr_curve.csv", delimiter=",", skiprows=1, ndmin=2)
    return data[:, 0], data[:, 1]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def dataset_available(preset: dict[str, Any], data_dir: str | None) -> str | None:
    """None if the dataset loads, else the reason it does not."""
    from slate.data.sources import load_dataset

    try:
        load_dataset(TrainConfig(dataset=preset["dataset"], data_dir=data_dir))
    except DataError as err:
        return str(err).split(". ")[0]
    return None


def table2(
    data_dir: str | None,
    out: Path,
    datasets: Sequence[str] = TABLE2_DATASETS,
    methods: Sequence[str] = METHODS,
    seeds: Sequence[int] = (0, 1, 2),
    config_dir: Path | None = None,
    device: str = "cpu",
    iterations: int | None = None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run (or reuse) every dataset x method x seed, then write the table and the figures."""
    config_dir = config_dir or default_config_dir()
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        raise ConfigError(f"Unknown --methods {bad}; expected some of {', '.join(METHODS)}.")
    rows: list[dict[str, Any]] = []
    for dataset in datasets:
        preset = load_preset(dataset, config_dir)
        reason = dataset_available(preset, data_dir)
        if reason is not None:
            log(f"skip {dataset}: not present ({reason}).")
            continue
        rows += _table2_dataset(preset, data_dir, out, methods, seeds, device, iterations, log)
    _write_table2(rows, out)
    log(f"wrote {out / 'table2.csv'} and {out / 'table2.md'}")
    return rows


def _table2_dataset(preset, data_dir, out, methods, seeds, device, iterations, log):
    dataset = preset["dataset"]
    rows, curves, histories = [], {}, {}
    for method in methods:
        aps, seconds = [], []
        for seed in seeds:
            folder = out / dataset / method / f"seed{seed}"
            log(f"{dataset} {method} seed {seed}")
            config = train_config(
                preset, method, seed, data_dir=data_dir, device=device, iterations=iterations
            )
            summary = run_or_reuse(config, folder, log)
            aps.append(summary["test_ap"])
            seconds.append(summary["wall_seconds"])
            log(f"  test AP {summary['test_ap']:.4f} ({summary['wall_seconds']:.1f} s)")
        first = out / dataset / method / f"seed{seeds[0]}"
        precision, recall = _pr_curve(first)
        curves[METHOD_LABELS[method]] = (precision, recall, aps[0])
        steps = _history(first)[0]
        mean_curve = np.mean([_history(out / dataset / method / f"seed{s}")[1] for s in seeds], 0)
        histories[METHOD_LABELS[method]] = (steps, list(mean_curve))
        mean, std = mean_std(aps)
        rows.append({
            "dataset": dataset, "method": method, "ap_mean": mean, "ap_std": std,
            "seeds": len(seeds), "paper_ap": preset.get("paper", {}).get(method, math.nan),
            "seconds_per_run": statistics.fmean(seconds),
        })  # fmt: skip
    plots.plot_pr_curves(
        curves, out / f"figure1_pr_{dataset}.png",
        title=f"Figure 1: precision-recall on the {dataset} test set (seed {seeds[0]})",
    )  # fmt: skip
    plots.plot_ap_curves(
        histories, out / f"figure2_ap_{dataset}.png",
        title=f"Figure 2: test AP vs iterations on {dataset} (mean of {len(seeds)} seeds)",
    )  # fmt: skip
    return rows


def _write_table2(rows: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    columns = ["dataset", "method", "ap_mean", "ap_std", "seeds", "paper_ap", "seconds_per_run"]
    with open(out / "table2.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    lines = [
        "| method | " + " | ".join(datasets) + " |",
        "|---" * (len(datasets) + 1) + "|",
    ]
    for method in dict.fromkeys(r["method"] for r in rows):
        cells = []
        for dataset in datasets:
            match = [r for r in rows if r["dataset"] == dataset and r["method"] == method]
            if not match:
                cells.append("")
                continue
            r = match[0]
            cells.append(f"{r['ap_mean']:.4f} ± {r['ap_std']:.4f} (paper {r['paper_ap']:.4f})")
        lines.append(f"| {METHOD_LABELS[method]} | " + " | ".join(cells) + " |")
    (out / "table2.md").write_text(
        "Final test AP of the averaged model, N = 20 parties on a ring: ours as mean ± std over "
        "seeds, the paper's Table 2 in brackets.\n\n" + "\n".join(lines) + "\n"
    )


# Tables 3 and 4 of the paper (CIFAR-10, batch 60).
ABLATION_GRIDS = {
    "slate": {"margin": (0.1, 0.3, 0.5, 0.7, 0.9), "positives": (5, 10, 15, 20, 25)},
    "slate-m": {"margin": (0.1, 0.3), "positives": (15, 20, 25), "alpha": (0.1, 0.9)},
}


def ablation(
    dataset: str,
    data_dir: str | None,
    out: Path,
    seed: int = 0,
    config_dir: Path | None = None,
    device: str = "cpu",
    iterations: int | None = None,
    batch_size: int | None = None,
    grids: dict[str, dict[str, Sequence[float]]] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Path]:
    """The margin x b grid for SLATE (Table 3) and margin x alpha x b for SLATE-M (Table 4)."""
    preset = load_preset(dataset, config_dir or default_config_dir())
    grids = grids or ABLATION_GRIDS
    written = {}
    for method, grid in grids.items():
        rows = []
        names = list(grid)
        for values in itertools.product(*(grid[n] for n in names)):
            setting = dict(zip(names, values, strict=True))
            tag = "-".join(f"{k}{v}" for k, v in setting.items())
            config = train_config(
                preset, method, seed, data_dir=data_dir, device=device,
                iterations=iterations, batch_size=batch_size, **setting,
            )  # fmt: skip
            log(f"{dataset} {method} {setting}")
            summary = run_or_reuse(config, out / dataset / "ablation" / method / tag, log)
            rows.append({**setting, "test_ap": summary["test_ap"]})
        written[method] = _write_ablation(rows, method, dataset, out)
    return written


def _write_ablation(rows, method, dataset, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"ablation_{dataset}_{method}.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    # Heat map: rows b, columns margin (and alpha for SLATE-M), as in Tables 3-4.
    col_keys = sorted({(r["margin"], r.get("alpha")) for r in rows})
    row_keys = sorted({r["positives"] for r in rows})
    values = np.full((len(row_keys), len(col_keys)), np.nan)
    for r in rows:
        values[row_keys.index(r["positives"]), col_keys.index((r["margin"], r.get("alpha")))] = r[
            "test_ap"
        ]
    labels = [f"s={m}" + (f", α={a}" if a is not None else "") for m, a in col_keys]
    plots.plot_heatmap(
        values, [f"b={b}" for b in row_keys], labels, out / f"ablation_{dataset}_{method}.png",
        title=f"{METHOD_LABELS[method]} test AP on {dataset}", xlabel="margin",
        ylabel="positives per batch",
    )  # fmt: skip
    return path
