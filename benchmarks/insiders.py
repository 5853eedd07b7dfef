"""A site on the roster that lies in a sum, and the honest spread behind the final-average check.

Four sites, each with its own w7a files (the training and test sets dealt out stratified, or by
a Dirichlet draw of each site's class mix), train on the distributed engine.

* **The honest spread.** Runs with no liar, in several settings; for every site, its
  ``summary.json``'s ``final_average`` gives the AP of the averaged model and of its own model
  on its own test rows. The largest shortfall ``own - average`` over every site and setting is
  what the bound of :mod:`slate.training.final_check` (0.05) must stay above.
* **The lies** (``SLATE_ATTACK``, :mod:`slate.faults.lies`), 2 000 iterations each: per
  honest site, its exit code, the first line of its error, and the AP of its ``model.pt`` on its
  own test file (``slate evaluate``) beside the AP its summary states.

``python -m benchmarks.insiders [--data-dir DIR] [--iterations T] [--only spread|lies]`` prints
both as markdown tables.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE.parent.parent / "shared" / "data"
SITES, LIAR = 4, 1
SPREAD = {
    "ring": ("stratified", ["--topology", "ring"]),
    "base-2, H = 25, int8": (
        "stratified",
        ["--topology", "base-2", "--gossip-every", "25", "--compress", "int8"],
    ),
    "ring, Dirichlet 0.5 sites": ("dirichlet", ["--topology", "ring"]),
    "exponential, Dirichlet 0.5 sites": ("dirichlet", ["--topology", "exponential"]),
    "ring, 200 iterations": ("stratified", ["--topology", "ring", "--iterations", "200"]),
}
LIES = ["final-poison", "eval-inflate", "eval-deflate", "rows:1e9", "stats-scale:1e10"]


def deal(data_dir: Path, into: Path, how: str, seed: int = 0) -> None:
    """w7a and w7a.t dealt out to ``SITES`` folders, stratified or by a Dirichlet(0.5) draw of
    each class's share per site (seeded)."""
    rng = np.random.default_rng(seed)
    shares = {label: (rng.dirichlet([0.5] * SITES) if how == "dirichlet" else None)
              for label in ("+1", "-1")}  # fmt: skip
    for name, out in (("w7a.gz", "train.svm"), ("w7a.t.gz", "test.svm")):
        with gzip.open(data_dir / "w7a" / name, "rt") as handle:
            rows = [line for line in handle if line.strip()]
        parts: list[list[str]] = [[] for _ in range(SITES)]
        for label in ("+1", "-1"):
            group = [r for r in rows if (r.split()[0] in ("+1", "1")) == (label == "+1")]
            rng.shuffle(group)
            if shares[label] is None:
                for site in range(SITES):
                    parts[site] += group[site::SITES]
            else:  # at least 5 rows of each class per site, the rest by the draw
                cuts = (np.cumsum(shares[label])[:-1] * len(group)).astype(int)
                cuts = np.clip(cuts, 5 * np.arange(1, SITES), len(group) - 5 * SITES)
                for site, piece in enumerate(np.split(np.array(group, dtype=object), cuts)):
                    parts[site] += list(piece)
        for site in range(SITES):
            rng.shuffle(parts[site])
            (into / str(site)).mkdir(parents=True, exist_ok=True)
            (into / str(site) / out).write_text("".join(parts[site]))


def run(sites: Path, out: Path, flags: list[str], attack: str | None, iterations: int) -> dict:
    """One 4-site run (the local launcher); every site's exit code, summary and error line."""
    env = {k: v for k, v in os.environ.items() if k != "SLATE_ATTACK"}
    if attack:
        env["SLATE_ATTACK"] = f"{LIAR}@{iterations if attack == 'final-poison' else 0}:{attack}"
    command = [sys.executable, "-m", "slate", "train", "--engine", "distributed", "--nodes",
               str(SITES), "--dataset", "libsvm", "--train", str(sites / "{rank}" / "train.svm"),
               "--test", str(sites / "{rank}" / "test.svm"), "--iterations", str(iterations),
               "--lr", "0.01", "--threads", "1", "--no-progress", "--out", str(out),
               *flags]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    summaries = {}
    for site in range(SITES):
        path = out / f"party{site}" / "summary.json"
        if path.exists():
            summaries[site] = json.loads(path.read_text())
    errors = [line for line in done.stderr.splitlines() if line.startswith("slate: error:")]
    return {"code": done.returncode, "summaries": summaries, "errors": errors}


def evaluated_ap(run_dir: Path, test: Path) -> float:
    """``slate evaluate`` of a site's model on its own test file."""
    out = run_dir / "evaluated"
    subprocess.run([sys.executable, "-m", "slate", "evaluate", "--run", str(run_dir), "--data",
                    str(test), "--out", str(out)], check=True, capture_output=True)  # fmt: skip
    return json.loads((out / "evaluation.json").read_text())["ap"]


def spread(data_dir: Path, root: Path, iterations: int) -> None:
    print("| setting | per site: own model AP / averaged model AP on its own test rows | "
          "largest shortfall |\n|---|---|---|")  # fmt: skip
    for label, (how, flags) in SPREAD.items():
        sites = root / f"sites-{how}"
        if not sites.exists():
            deal(data_dir, sites, how)
        slug = label.replace(" ", "").replace(",", "-").replace("=", "")
        done = run(sites, root / slug, flags, None, iterations)
        checks = [done["summaries"][s]["final_average"] for s in range(SITES)
                  if s in done["summaries"]]  # fmt: skip
        scored = [c for c in checks if c["own_model_ap_own_rows"] is not None]
        cells = ", ".join(f"{c['own_model_ap_own_rows']:.4f} / {c['average_ap_own_rows']:.4f}"
                          if c in scored else "n/a (no test positive)" for c in checks)  # fmt: skip
        worst = max(c["own_model_ap_own_rows"] - c["average_ap_own_rows"] for c in scored)
        print(f"| {label} (exit {done['code']}) | {cells} | {worst:+.4f} |", flush=True)


def lies(data_dir: Path, root: Path, iterations: int) -> None:
    sites = root / "sites-stratified"
    if not sites.exists():
        deal(data_dir, sites, "stratified")
    flags = ["--topology", "ring", "--standardize"]
    honest_run = run(sites, root / "honest", flags, None, iterations)
    honest = {s: evaluated_ap(root / "honest" / f"party{s}", sites / str(s) / "test.svm")
              for s in range(SITES) if s != LIAR}  # fmt: skip
    print("| the liar does | honest sites' exit codes | what they say | AP of each honest "
          "site's model.pt on its own test file (honest run) | its summary's AP |\n"
          "|---|---|---|---|---|")  # fmt: skip
    print(f"| nothing | {honest_run['code']} | | "
          + ", ".join(f"{ap:.4f}" for ap in honest.values()) + " | "
          + ", ".join(f"{honest_run['summaries'][s]['party_test_ap'][str(s)]:.4f}"
                      for s in honest) + " |", flush=True)  # fmt: skip
    for attack in LIES:
        out = root / attack.replace(":", "_")
        done = run(sites, out, flags, attack, iterations)
        aps, stated = [], []
        for s in honest:
            folder = out / f"party{s}"
            if (folder / "model.pt").exists():
                aps.append(f"{evaluated_ap(folder, sites / str(s) / 'test.svm'):.4f} "
                           f"({honest[s]:.4f})")  # fmt: skip
                summary = done["summaries"][s]
                stated.append(f"{summary['party_test_ap'][str(s)]:.4f}")
            else:
                aps.append("no model")
        said = done["errors"][0][len("slate: error: ") :][:160] if done["errors"] else ""
        print(f"| `{attack}` | {done['code']} | {said}... | {', '.join(aps)} | "
              f"{', '.join(stated)} |", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--only", choices=("spread", "lies"))
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temp folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        if args.only != "lies":
            spread(args.data_dir, root, args.iterations)
        if args.only != "spread":
            lies(args.data_dir, root, args.iterations)


if __name__ == "__main__":
    main()
