"""``python -m benchmarks.threads [--data-dir DIR] [--repeats R] [--cases a,b]``: how long
``slate train`` takes with ``--threads 1``, ``--threads 2`` and torch's default thread count,
on models of different sizes, and what slate's default (``--threads`` unset) now resolves to.

Each command runs in its own process and the settings are interleaved (1, 2, torch's default,
1, 2, ... for each repeat), so that the load of a shared machine falls on all of them alike.
The time is the run's own ``wall_seconds`` (``summary.json``: the training loop and its
evaluations, not the interpreter's start or the data's read). Printed: each setting's median
and range, and the median and range of its ratio to ``--threads 1`` over the repeats.

"torch's default" is the thread count torch picks by itself (one per core); since slate now
resolves ``--threads`` itself, the benchmark passes ``--threads`` equal to that count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

#: name -> (slate train flags, what it is); ``{data}`` is ``--data-dir``, ``{table}`` a CSV.
CASES: dict[str, tuple[list[str], str]] = {
    "table": (
        ["--dataset", "csv", "--train", "{table}", "--label-column", "label",
         "--positive-label", "1", "--iterations", "3000", "--lr", "0.01"],
        "CSV, 4000 rows x 10 features, MLP, N from the positives",
    ),
    "digits": (["--dataset", "digits", "--iterations", "3000"], "sklearn digits, MLP, N=8"),
    "w7a": (
        ["--dataset", "w7a", "--data-dir", "{data}", "--iterations", "1500"],
        "w7a (300 features), MLP, N=20",
    ),
    "w7a-h4": (
        ["--dataset", "w7a", "--data-dir", "{data}", "--iterations", "1500", "--hidden", "4"],
        "w7a, MLP with 4 hidden units, N=20",
    ),
    "w7a-h8": (
        ["--dataset", "w7a", "--data-dir", "{data}", "--iterations", "1500", "--hidden", "8"],
        "w7a, MLP with 8 hidden units, N=20",
    ),
    "digits-h128": (
        ["--dataset", "digits", "--iterations", "2000", "--hidden", "128"],
        "sklearn digits, MLP with 128 hidden units, N=8",
    ),
    "mnist": (
        ["--dataset", "mnist", "--data-dir", "{data}", "--iterations", "40"],
        "MNIST, CNN, N=20",
    ),
}  # fmt: skip


def write_table(path: Path, rows: int = 4000, features: int = 10, seed: int = 0) -> None:
    """A small imbalanced table (about 20% positive) of ``rows`` rows."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features))
    logit = x @ rng.normal(size=features) - 3.0
    y = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    lines = [",".join([f"f{i}" for i in range(features)] + ["label"])]
    for row, label in zip(x, y, strict=True):
        lines.append(",".join([*(f"{v:.4f}" for v in row), str(label)]))
    path.write_text("\n".join(lines) + "\n")


def run_once(flags: list[str], threads: int | None, out: Path) -> tuple[float, dict]:
    """One ``slate train`` in a fresh process: its ``wall_seconds`` and resolved config."""
    command = [sys.executable, "-m", "slate", "train", *flags, "--no-progress", "--out", str(out)]
    if threads is not None:
        command += ["--threads", str(threads)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text())
    return summary["wall_seconds"], summary["config"]


def measure(name: str, flags: list[str], repeats: int, folder: Path) -> dict:
    """Interleaved runs of one case; the medians, ranges and ratios to ``--threads 1``."""
    cores = torch.get_num_threads()
    settings = {"1": 1, "2": 2, f"default ({cores})": cores, "slate default": None}
    if cores == 2:  # torch's default is --threads 2 here
        del settings["default (2)"]
    times: dict[str, list[float]] = {label: [] for label in settings}
    resolved = None
    for repeat in range(repeats):
        for label, threads in settings.items():
            out = folder / f"{name}-{repeat}-{label.split()[0]}-{threads}"
            seconds, config = run_once(flags, threads, out)
            times[label].append(seconds)
            if threads is None:
                resolved = config["threads"]
    ones = times["1"]
    ratios = {
        label: [t / one for t, one in zip(values, ones, strict=True)]
        for label, values in times.items()
    }
    return {"times": times, "ratios": ratios, "resolved": resolved}


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.threads", description=__doc__)
    parser.add_argument("--data-dir", default=os.environ.get("SLATE_DATA", "/work/shared/data"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    args = parser.parse_args(argv)
    print(f"cores torch sees: {torch.get_num_threads()}; repeats {args.repeats}, interleaved")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        table = folder / "table.csv"
        write_table(table)
        for name in args.cases.split(","):
            template, what = CASES[name]
            flags = [f.format(data=args.data_dir, table=table) for f in template]
            started = time.perf_counter()
            result = measure(name, flags, args.repeats, folder)
            print(f"\n{name}: {what} (slate's default resolved to --threads {result['resolved']};"
                  f" {time.perf_counter() - started:.0f} s in all)")  # fmt: skip
            print(f"  {'setting':<16} {'wall s, median [min-max]':<28} ratio to --threads 1")
            for label, values in result["times"].items():
                print(f"  {label:<16} {_span(values):<28} {_span(result['ratios'][label])}")


if __name__ == "__main__":
    main()
