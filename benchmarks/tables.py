"""``python -m benchmarks.tables DIR``: slate against gradient boosting on the CSV tables in DIR.

Every ``*.csv`` in DIR is one table whose label column is ``--label-column`` (default
``class``); its positive class is the label's rarer value. Each table is split once into a
seeded stratified 70 % training and 30 % test part (``--test-fraction``, ``--split-seed``),
written as two CSV files, and every method scores the same test rows with average precision
(AP, scikit-learn's ``average_precision_score``):

* ``slate lr=X T=Y``: ``slate train --dataset csv --train ... --test ... --threads 1`` with
  ``--lr X --iterations Y`` (each pair of ``--grid-lr`` x ``--grid-iterations``), and the rows
  named in ``--settings`` (``default``: no ``--lr`` or ``--iterations`` at all, now ``--lr
  auto`` and 5000 iterations; ``lr=0.01 T=2000``: the defaults before them; ``hidden=128``: the
  defaults with ``--hidden 128``);
* ``HistGradientBoosting``: scikit-learn's ``HistGradientBoostingClassifier(random_state=0)``
  with its defaults, text columns as categories, missing cells as missing;
* ``LightGBM``: ``LGBMClassifier(random_state=0)`` with its defaults, where ``lightgbm`` imports.

slate runs in its own process (``--slate-python``, default this interpreter), so this script
itself needs only numpy and scikit-learn (and lightgbm for its column). Printed: one Markdown
table (every slate setting's test AP, the grid's best and its setting, the boosting columns) and
each ``--lr auto`` run's choice and its cost in seconds; ``--json FILE`` keeps every number.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import average_precision_score
from sklearn.model_selection import train_test_split

MISSING = {"", "?", "NA", "N/A", "NaN", "nan", "null"}
DEFAULT_SETTINGS = ("lr=0.01 T=2000", "default")


def read_table(path: Path, label: str) -> tuple[list[str], list[list[str]], np.ndarray, str]:
    """The header, the feature cells, the 0/1 labels (1: the rarer label value) and that value."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    header, body = rows[0], rows[1:]
    at = header.index(label)
    values = [row[at].strip() for row in body]
    kinds, counts = np.unique(values, return_counts=True)
    if len(kinds) != 2:
        raise SystemExit(f"{path}: the label column {label!r} holds {len(kinds)} values, not 2.")
    positive = str(kinds[np.argmin(counts)])
    y = np.array([v == positive for v in values], dtype=np.int64)
    features = [[c for j, c in enumerate(row) if j != at] for row in body]
    return [h for j, h in enumerate(header) if j != at], features, y, positive


def encode_for_boosting(
    train: list[list[str]], test: list[list[str]]
) -> tuple[np.ndarray, np.ndarray, list[bool]]:
    """Numbers as floats (missing: NaN); a column with any other text as category codes fitted
    on the training rows (unseen or missing: NaN), flagged categorical."""
    columns_train, columns_test, categorical = [], [], []
    for j in range(len(train[0])):
        cells = [row[j].strip() for row in train]
        try:
            numeric = [np.nan if c in MISSING else float(c) for c in cells]
            numeric_test = [np.nan if r[j].strip() in MISSING else float(r[j]) for r in test]
            columns_train.append(numeric)
            columns_test.append(numeric_test)
            categorical.append(False)
        except ValueError:
            codes = {v: i for i, v in enumerate(sorted({c for c in cells if c not in MISSING}))}
            columns_train.append([codes.get(c, np.nan) for c in cells])
            columns_test.append([codes.get(r[j].strip(), np.nan) for r in test])
            categorical.append(True)
    return np.array(columns_train).T, np.array(columns_test).T, categorical


def write_csv(path: Path, header: list[str], rows: list[list[str]], labels: list[str]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*header, "label"])
        writer.writerows([*row, label] for row, label in zip(rows, labels, strict=True))


def slate_ap(python: str, train: Path, test: Path, positive: str, flags: list[str]) -> dict:
    """One ``slate train`` process; its summary's test AP, chosen lr, lr-choice and wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            python, "-m", "slate", "train", "--dataset", "csv", "--train", str(train),
            "--test", str(test), "--label-column", "label", "--positive-label", positive,
            "--threads", "1", "--no-progress", "--out", f"{tmp}/run", *flags,
        ]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
        summary = json.loads(Path(f"{tmp}/run/summary.json").read_text())
    choice = summary.get("lr_choice") or {}
    return {
        "test_ap": summary["test_ap"], "lr": summary["config"]["lr"],
        "iterations": summary["config"]["iterations"], "command_seconds": seconds,
        "wall_seconds": summary["wall_seconds"], "lr_choice_seconds": choice.get("seconds"),
    }  # fmt: skip


def setting_flags(setting: str) -> list[str]:
    """``"lr=0.1 T=5000"`` to ``["--lr", "0.1", "--iterations", "5000"]`` (``hidden=H``:
    ``--hidden H``); ``default``: none."""
    flags: list[str] = []
    for item in setting.split():
        key, _, value = item.partition("=")
        if key == "default":
            continue
        flags += {"lr": ["--lr", value], "T": ["--iterations", value],
                  "hidden": ["--hidden", value]}[key]  # fmt: skip
    return flags


def measure(table: Path, args: argparse.Namespace) -> dict[str, Any]:
    header, features, y, positive = read_table(table, args.label_column)
    rows = np.arange(len(y))
    train_rows, test_rows = train_test_split(
        rows, test_size=args.test_fraction, stratify=y, random_state=args.split_seed
    )
    work = Path(args.work) / table.stem
    work.mkdir(parents=True, exist_ok=True)
    train_path, test_path = work / "train.csv", work / "test.csv"
    names = np.where(y == 1, "1", "0")
    write_csv(train_path, header, [features[i] for i in train_rows], list(names[train_rows]))
    write_csv(test_path, header, [features[i] for i in test_rows], list(names[test_rows]))
    result: dict[str, Any] = {
        "table": table.stem, "rows": len(y), "positive": positive,
        "positive_rate": float(y.mean()), "features": len(header), "slate": {},
    }  # fmt: skip
    grid_settings = [f"lr={lr} T={t}" for lr in args.grid_lr for t in args.grid_iterations]
    for setting in dict.fromkeys([*args.settings, *grid_settings]):  # each distinct one once
        run = slate_ap(args.slate_python, train_path, test_path, "1", setting_flags(setting))
        result["slate"][setting] = run
        print(f"  {table.stem}: slate {setting}: AP {run['test_ap']:.4f} (lr {run['lr']}, "
              f"{run['command_seconds']:.1f} s)", flush=True)  # fmt: skip
    if grid_settings:
        best = max(grid_settings, key=lambda s: result["slate"][s]["test_ap"])
        result["grid_best"] = {"setting": best, "test_ap": result["slate"][best]["test_ap"]}
    x_train, x_test, categorical = encode_for_boosting(
        [features[i] for i in train_rows], [features[i] for i in test_rows]
    )
    boosting = HistGradientBoostingClassifier(random_state=0, categorical_features=categorical)
    boosting.fit(x_train, y[train_rows])
    scores = boosting.predict_proba(x_test)[:, 1]
    result["hist_gradient_boosting"] = float(average_precision_score(y[test_rows], scores))
    try:
        import lightgbm
    except ImportError:
        result["lightgbm"] = None
    else:
        model = lightgbm.LGBMClassifier(random_state=0, verbose=-1)
        model.fit(x_train, y[train_rows], categorical_feature=np.flatnonzero(categorical).tolist())
        result["lightgbm"] = float(average_precision_score(y[test_rows], model.predict_proba(
            x_test)[:, 1]))  # fmt: skip
    return result


def markdown(results: list[dict[str, Any]], settings: list[str]) -> str:
    """One row per table: its size, each named setting's AP, the grid's best, the boosters."""
    head = ["table", "rows", "positive rate", *[f"slate {s}" for s in settings],
            "slate grid best (setting)", "HistGradientBoosting", "LightGBM"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        best = r.get("grid_best")
        cells = [
            r["table"], str(r["rows"]), f"{r['positive_rate']:.1%}",
            *[f"{r['slate'][s]['test_ap']:.3f}" for s in settings],
            f"{best['test_ap']:.3f} ({best['setting']})" if best else "-",
            f"{r['hist_gradient_boosting']:.3f}",
            f"{r['lightgbm']:.3f}" if r["lightgbm"] is not None else "-",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="folder of CSV tables")
    parser.add_argument("--label-column", default="class")
    parser.add_argument("--test-fraction", type=float, default=0.3)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--settings", nargs="*", default=list(DEFAULT_SETTINGS),
                        help="named slate runs, e.g. default 'lr=0.01 T=2000' lr=auto")  # fmt: skip
    parser.add_argument("--grid-lr", nargs="*", default=["0.001", "0.01", "0.03", "0.1", "0.3"])
    parser.add_argument("--grid-iterations", nargs="*", default=["2000", "5000"])
    parser.add_argument("--slate-python", default=sys.executable)
    parser.add_argument("--work", default=None, help="where the splits go (default: temporary)")
    parser.add_argument("--only", nargs="*", default=None, help="these table names only")
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    args = parser.parse_args(argv)
    tables = sorted(args.directory.glob("*.csv"))
    if args.only:
        tables = [t for t in tables if t.stem in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        args.work = args.work or tmp
        results = []
        for table in tables:
            results.append(measure(table, args))
            if args.json is not None:
                args.json.write_text(json.dumps(results, indent=2))
    print(markdown(results, list(args.settings)))
    for r in results:
        for setting, run in r["slate"].items():
            if run["lr_choice_seconds"] is not None:
                print(
                    f"{r['table']} {setting}: lr {run['lr']}, T {run['iterations']}: the "
                    f"choice took {run['lr_choice_seconds']:.1f} s, training "
                    f"{run['wall_seconds']:.1f} s, the command {run['command_seconds']:.1f} s"
                )


if __name__ == "__main__":
    main()
