"""``python -m benchmarks [--data-dir DIR] [--quick]``: measure, then write benchmarks/RESULTS.md.

Every number of one report comes from one run on one machine, and speed is reported as ratios
against baselines measured in the same run: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def case(name: str, model: str, nodes: int, steps: int, threads: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cases", name, model, *map(str, (nodes, steps, threads))],
        capture_output=True, text=True, check=True, cwd=HERE.parent,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def slate_run(args: list[str]) -> dict:
    """Wall time and peak RSS of one ``slate train`` process, and its summary."""
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "slate", "train", *args, "--out", tmp,
                        "--no-progress"], check=True, capture_output=True)  # fmt: skip
        wall = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    return {"wall": wall, "peak_rss_mb": max(peak, before) / 1024, "summary": summary}


def machine() -> str:
    cpu = "unknown CPU"
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (f"{cpu}, {os.cpu_count()} logical cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, {platform.system()} {platform.release()}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--data-dir", default=str(HERE.parent.parent / "shared" / "data"))
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    args = parser.parse_args()
    steps = 50 if args.quick else 400
    lines = [f"# slate benchmarks\n\nMeasured {time.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}.",
             "All cases run SLATE without gradient tracking (Alg. 1 lines 7 and 9), m = 20, "
             "b = 2, on a ring; each case is a fresh process (its own peak RSS).\n"]  # fmt: skip

    lines += ["## Torch threads for small ops (w8a MLP, N = 20)\n",
              "| threads | ms / iteration |", "|---|---|"]  # fmt: skip
    for threads in (1, 2):
        r = case("simulator", "mlp", 20, steps, threads)
        lines.append(f"| {threads} | {1000 * r['seconds_per_iteration']:.3f} |")
    print("\n".join(lines), flush=True)

    lines += ["\n## Simulator against a naive per-party loop and the hand-batched limit\n",
              "| model | N | simulator it/s | naive loop it/s | hand-batched it/s | "
              "simulator / naive | simulator time / limit time | peak RSS sim / naive / hand "
              "(MB) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for model, nodes in (("mlp", 1), ("mlp", 4), ("mlp", 20), ("mlp", 64), ("mnist-cnn", 20)):
        n_steps = steps if model == "mlp" else max(10, steps // 20)
        sim = case("simulator", model, nodes, n_steps, 2)
        naive = case("naive", model, nodes, max(5, n_steps // 4), 2)
        hand = case("hand", model, nodes, n_steps, 2) if model == "mlp" else None
        s, n_ = sim["seconds_per_iteration"], naive["seconds_per_iteration"]
        h = hand["seconds_per_iteration"] if hand else None
        lines.append(
            f"| {model} | {nodes} | {1 / s:.0f} | {1 / n_:.1f} | "
            f"{f'{1 / h:.0f}' if h else 'n/a'} | {n_ / s:.1f}x | "
            f"{f'{s / h:.2f}x' if h else 'n/a'} | {sim['peak_rss_mb']:.0f} / "
            f"{naive['peak_rss_mb']:.0f} / {hand['peak_rss_mb'] if hand else 0:.0f} |"
        )
        print(lines[-1], flush=True)

    w8a = ["--dataset", "w8a", "--data-dir", args.data_dir]
    if Path(args.data_dir, "w8a").exists():
        iterations = ["--iterations", "1000"] if args.quick else []
        e2e = slate_run([*w8a, *iterations])
        s = e2e["summary"]
        lines += ["\n## End to end\n",
                  f"`slate train --dataset w8a --data-dir DIR` (SLATE, N = 20, {s['iterations']} "
                  f"iterations, {len(s['config']) and 20} evaluations included): "
                  f"**{e2e['wall']:.1f} s** wall for the whole command (training and evaluation "
                  f"{s['wall_seconds']:.1f} s), test AP {s['test_ap']:.4f}, peak RSS "
                  f"{e2e['peak_rss_mb']:.0f} MB."]  # fmt: skip
        print(lines[-1], flush=True)

        lines += ["\n## Distributed engine (one process per party, gloo on loopback)\n",
                  "| N | distributed ms / iteration | simulator ms / iteration | ratio |",
                  "|---|---|---|---|"]  # fmt: skip
        short = [*w8a, "--iterations", "300" if args.quick else "1000", "--eval-every", "100000",
                 "--checkpoint-every", "100000"]  # fmt: skip
        for nodes in (2, 4):
            dist_run = slate_run([*short, "--nodes", str(nodes), "--engine", "distributed"])
            sim_run = slate_run([*short, "--nodes", str(nodes)])
            d = dist_run["summary"]["wall_seconds"] / dist_run["summary"]["iterations"]
            m = sim_run["summary"]["wall_seconds"] / sim_run["summary"]["iterations"]
            lines.append(f"| {nodes} | {1000 * d:.2f} | {1000 * m:.2f} | {d / m:.1f}x |")
            print(lines[-1], flush=True)
    (HERE / "RESULTS.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
