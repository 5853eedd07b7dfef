"""``python -m benchmarks [--data-dir DIR] [--quick]``: measure, then write benchmarks/RESULTS.md.

Every number of one report comes from one run on one machine, and speed is reported as ratios
against baselines measured in the same run: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.machine import cpu_name
from benchmarks.privacy_cost import section as privacy_cost
from benchmarks.roster import roster_cost
from benchmarks.wan import add_options as add_wan_options
from benchmarks.wan import run_from_options as wan_section

HERE = Path(__file__).resolve().parent

NOTES = """
## What each column measures

* **simulator**: `PartyCompute` (one vmapped forward pass, one reverse pass) and the fused
  step-and-mix, as `slate train` runs them; **compiled**: the same with `--compile on`, its
  one-off compilation excluded (the end-to-end rows show what it costs a whole command).
* **naive loop**: one `nn.Module` and one `torch.optim.SGD` per party, mixing by a Python loop
  over each party's neighbours.
* **hand-batched**: the same iteration written by hand (`benchmarks/cases.py`): `bmm` forward,
  eq. (6)'s gradient in closed form, the CSR product with W; no autograd, no vmap. **hand-batched
  compiled** passes its gradient through `torch.compile`, the limit for the compiled simulator.
  A test checks that it computes the simulator's step.
* **evaluation share**: the run's own `evaluation_seconds` (test-set evaluations and party APs)
  over the wall time of the whole command."""


def case(name: str, model: str, nodes: int, steps: int, threads: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cases", name, model, *map(str, (nodes, steps, threads))],
        capture_output=True, text=True, check=True, cwd=HERE.parent,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def slate_run(args: list[str], env: dict[str, str] | None = None) -> dict:
    """Wall time and peak RSS of one ``slate train`` process, its summary and evaluation count."""
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "log", "w+") as log:
        start = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "slate", "train", *args, "--out", f"{tmp}/run", "--no-progress"],
            stdout=log, stderr=log, env={**os.environ, **(env or {})},
        )  # fmt: skip
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak RSS
        wall = time.perf_counter() - start
        if status != 0:
            log.seek(0)
            raise SystemExit(f"slate train {' '.join(args)} failed:\n{log.read()}")
        run = Path(tmp) / "run"
        summary = json.loads((run / "summary.json").read_text())
        evaluations = len((run / "history.csv").read_text().strip().splitlines()) - 1
    return {"wall": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "summary": summary,
            "evaluations": evaluations}  # fmt: skip


def _distributed(w8a: list[str], quick: bool) -> list[str]:
    """ms per iteration of the distributed engine, with and without party-loss recovery
    (``--on-party-loss continue``: snapshots, a flag element per gossip message, collectives
    waited for in slices, a heartbeat thread), against the simulator in the same session."""
    lines = ["\n## Distributed engine (one process per party, gloo on loopback)\n",
             "| N | distributed ms / it, continue | distributed ms / it, stop | "
             "simulator ms / it | continue / stop | distributed (continue) / simulator |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    short = [*w8a, "--iterations", "300" if quick else "1000", "--eval-every", "100000",
             "--checkpoint-every", "100000"]  # fmt: skip

    def per_iteration(run: dict) -> float:
        return 1000 * run["summary"]["wall_seconds"] / run["summary"]["iterations"]

    for nodes in (2, 4):
        distributed = [*short, "--nodes", str(nodes), "--engine", "distributed"]
        go = per_iteration(slate_run([*distributed, "--on-party-loss", "continue"]))
        stop = per_iteration(slate_run([*distributed, "--on-party-loss", "stop"]))
        sim = per_iteration(slate_run([*short, "--nodes", str(nodes)]))
        lines.append(f"| {nodes} | {go:.2f} | {stop:.2f} | {sim:.2f} | {go / stop:.2f}x | "
                     f"{go / sim:.1f}x |")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def _communication(w8a: list[str], quick: bool) -> list[str]:
    """Simulator ms per iteration when parties talk less (w8a MLP, N = 20, ring), against the
    paper's protocol (H = 1, dense) measured in the same session: rounds without gossip skip
    the mixing, and CHOCO's compression costs encoding work per edge."""
    lines = ["\n## Talking less: the simulator's cost per iteration (w8a MLP, N = 20, ring)\n",
             "| setting | ms / iteration | against H = 1, dense |", "|---|---|---|"]  # fmt: skip
    short = [*w8a, "--iterations", "500" if quick else "3000", "--eval-every", "100000",
             "--checkpoint-every", "100000", "--compile", "off"]  # fmt: skip
    settings = {
        "H = 1, dense (the paper)": [],
        "H = 25, dense": ["--gossip-every", "25"],
        "H = 1, int8": ["--compress", "int8"],
        "H = 1, topk:0.01": ["--compress", "topk:0.01"],
        "H = 25, base-2, int8": ["--gossip-every", "25", "--topology", "base-2",
                                 "--compress", "int8"],
    }  # fmt: skip
    baseline = None
    for label, flags in settings.items():
        run = slate_run([*short, *flags])["summary"]
        ms = 1000 * (run["wall_seconds"] - run["evaluation_seconds"]) / run["iterations"]
        baseline = baseline or ms
        lines.append(f"| {label} | {ms:.3f} | {ms / baseline:.2f}x |")
        print(lines[-1], flush=True)
    return lines


def write_big_table(path: Path, rows: int, seed: int = 0) -> None:
    """A CSV of ``rows`` x 30 columns as users bring them: an ID, 25 numbers (some missing),
    3 text columns of a few categories, and a label with about 5% positives."""
    rng = np.random.default_rng(seed)
    names = ["id", *[f"x{j}" for j in range(25)], "region", "channel", "plan", "label"]
    with open(path, "w") as handle:
        handle.write(",".join(names) + "\n")
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            x = rng.normal(size=(n, 25)).round(4)
            y = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(size=n) > 2.3).astype(int)
            cells = x.astype(str)
            cells[rng.random((n, 25)) < 0.01] = ""
            text = [rng.choice(list(kinds), size=n) for kinds in ("nsew", "abcdefgh", "xyz")]
            columns = [np.arange(start, start + n).astype(str), *cells.T, *text, y.astype(str)]
            handle.write("\n".join(",".join(row) for row in zip(*columns, strict=True)) + "\n")


#: Runs a program and writes its own peak RSS (VmHWM, per address space: a child's
#: ``ru_maxrss`` would start from this process's size at fork) to the file ``argv[1]``.
PEAK_WRAPPER = """
import atexit, runpy, sys
out, argv = sys.argv[1], sys.argv[2:]

def report():
    with open("/proc/self/status") as status, open(out, "w") as handle:
        handle.write(next(line.split()[1] for line in status if line.startswith("VmHWM")))

atexit.register(report)
if argv[0] == "-c":
    sys.argv = ["-c", *argv[2:]]
    exec(argv[1])
else:
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__")
"""


def _peak(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one ``python -m slate`` command."""
    return _measured(["slate", *command])


def _measured(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of ``python -m argv[0] argv[1:]`` (or ``-c`` code)."""
    with tempfile.NamedTemporaryFile(suffix=".hwm") as peak:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PEAK_WRAPPER, peak.name, *argv],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr.decode()}")
        return wall, int(Path(peak.name).read_text()) / 1024


def _whole_file_peak(run: Path, data: Path) -> tuple[float, float]:
    """The baseline: the same file read whole (``slate.inference.scoring.read_input``) and
    scored."""
    program = (
        "import sys; from slate.inference.model_file import load_model; "
        "from slate.inference.scoring import read_input, logits_of; "
        "model, pre = load_model(sys.argv[1]); "
        "logits_of(model, read_input(pre, sys.argv[2]).features)"
    )
    return _measured(["-c", program, str(run), str(data)])


def _tables(quick: bool) -> list[str]:
    """A user's large CSV: training's peak memory, and ``slate predict``/``evaluate`` streamed
    one block of rows at a time against the same file read whole, at two file sizes."""
    lines = [
        "\n## A large CSV: training, and scoring streamed against read whole\n",
        "| rows | command | seconds | rows / s | peak RSS (MB) |",
        "|---|---|---|---|---|",
    ]
    sizes = (50_000, 200_000) if quick else (250_000, 1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for rows in sizes:
            data = folder / f"table{rows}.csv"
            subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from benchmarks.__main__ import write_big_table; "
                            "write_big_table(Path(sys.argv[1]), int(sys.argv[2]))",
                            str(data), str(rows)], check=True, cwd=HERE.parent)  # fmt: skip
            run = folder / f"run{rows}"
            # a fixed step (--lr 0.01): the table's --lr auto would add five short runs
            flags = ["--dataset", "csv", "--train", str(data), "--label-column", "label",
                     "--positive-label", "1", "--id-column", "id", "--nodes", "4",
                     "--iterations", "100", "--eval-every", "100", "--no-progress",
                     "--lr", "0.01", "--out", str(run)]  # fmt: skip
            measured = {
                "slate train (read, split, encode, 100 iterations)": _peak(["train", *flags]),
                "slate predict (streamed)": _peak(
                    [
                        "predict",
                        "--run",
                        str(run),
                        "--data",
                        str(data),
                        "--out",
                        str(folder / "scores.csv"),
                    ]
                ),
                "slate evaluate (streamed)": _peak(
                    ["evaluate", "--run", str(run), "--data", str(data)]
                ),
                "read whole and score (baseline)": _whole_file_peak(run, data),
            }
            for label, (seconds, peak) in measured.items():
                lines.append(f"| {rows:,} | {label} | {seconds:.1f} | {rows / seconds:,.0f} | "
                             f"{peak:,.0f} |")  # fmt: skip
                print(lines[-1], flush=True)
            data.unlink()
    lines.append(
        "\n`python -m benchmarks --only tables` (each command a fresh process; peak RSS is its "
        "own VmHWM). The file: an ID, 25 numbers with 1% empty cells, 3 text columns and a 5% "
        "label, 30 columns in all (the 1 000 000-row file is 198 MB). `predict` and `evaluate` "
        "read one block of about 100 000 cells at a time, so their peak grows only with what "
        "they keep per row (a score, a label, the ID); the baseline reads the whole file first. "
        "Training reads the whole table: its peak is the typed columns plus the float32 matrix."
    )
    return lines


def _update_section(lines: list[str]) -> None:
    """Put one section (``lines[0]`` is its heading) into RESULTS.md in place of the old one,
    or before the headline, with the date and machine of this measurement."""
    path = HERE / "RESULTS.md"
    text = path.read_text()
    heading = lines[0].strip()
    stamp = f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}.\n"
    section = "\n" + "\n".join([lines[0], stamp, *lines[1:]]) + "\n"
    start = text.find("\n" + heading)
    if start >= 0:
        end = text.find("\n## ", start + 1 + len(heading))
        text = text[:start] + section + text[end if end >= 0 else len(text) :]
    else:
        at = text.find("\n## Headline")
        text = text[:at] + section + text[at:] if at >= 0 else text + section
    path.write_text(text)
    print(f"updated {path}")


def _end_to_end(data_dir: str, quick: bool) -> list[str]:
    """``slate train`` wall times: w8a (eager, compiled) and MNIST, with their evaluation share.

    The evaluation share is the run's own ``evaluation_seconds`` (its test-set evaluations and
    party APs, timed inside the run) over the wall time of the whole command.
    """
    lines = ["\n## End to end (`slate train`, the whole command)\n",
             "| command | wall (s) | training + evaluation (s) | evaluations | evaluation (s) | "
             "evaluation share | test AP | peak RSS (MB) |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as cache:
        inductor = {"TORCHINDUCTOR_CACHE_DIR": cache}  # starts empty: the first compile is cold
        runs = [  # dataset, flags, label
            ("w8a", [], "w8a` (default: eager)"),
            ("w8a", ["--compile", "on"], "w8a --compile on` (cold inductor cache)"),
            ("w8a", ["--compile", "on"], "w8a --compile on` (warm cache)"),
            ("mnist", [], "mnist` (default: eager)"),
        ]
        for dataset, flags, label in runs:
            if not Path(data_dir, dataset).exists():
                continue
            base = ["--dataset", dataset, "--data-dir", data_dir, *flags]
            if quick:
                base += ["--iterations", "2000" if dataset == "w8a" else "30"]
            run = slate_run(base, inductor)
            s = run["summary"]
            lines.append(f"| `slate train --dataset {label} | {run['wall']:.1f} | "
                         f"{s['wall_seconds']:.1f} | {run['evaluations']} | "
                         f"{s['evaluation_seconds']:.2f} | "
                         f"{s['evaluation_seconds'] / run['wall']:.1%} | {s['test_ap']:.4f} | "
                         f"{run['peak_rss_mb']:.0f} |")  # fmt: skip
            print(lines[-1], flush=True)
    return lines


def machine() -> str:
    cpu = cpu_name()
    return (f"{cpu}, {os.cpu_count()} logical cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, {platform.system()} {platform.release()}")  # fmt: skip


def _speed_row(model: str, nodes: int, results: dict[str, dict]) -> str:
    seconds = {name: r["seconds_per_iteration"] for name, r in results.items()}
    sim, comp, naive = seconds["simulator"], seconds["compiled"], seconds["naive"]
    hand, hand_c = seconds.get("hand"), seconds.get("hand-compiled")
    rate = lambda s: f"{1 / s:.0f}" if s else "n/a"  # noqa: E731
    ratio = lambda a, b: f"{a / b:.2f}x" if b else "n/a"  # noqa: E731
    rss = " / ".join(f"{results[k]['peak_rss_mb']:.0f}" if k in results else "n/a"
                     for k in ("simulator", "compiled", "naive", "hand"))  # fmt: skip
    return (f"| {model} | {nodes} | {rate(sim)} | {rate(comp)} | {1 / naive:.1f} | {rate(hand)} | "
            f"{rate(hand_c)} | {naive / sim:.1f}x | {naive / comp:.1f}x | {ratio(sim, hand)} | "
            f"{ratio(comp, hand_c)} | {rss} |")  # fmt: skip


def _headline(results: dict[str, dict]) -> str:
    seconds = {name: r["seconds_per_iteration"] for name, r in results.items()}
    naive = seconds["naive"]
    return "\n".join(
        f"* {label}: **{naive / seconds[key]:.1f}x** the naive per-party loop's speed; "
        f"{seconds[key] / seconds[limit]:.2f}x the time per iteration of the hand-batched kernel "
        f"({limit_label})."
        for key, label, limit, limit_label in (
            ("compiled", "Simulator, compiled", "hand-compiled", "compiled the same way"),
            ("compiled", "Simulator, compiled", "hand", "eager"),
            ("simulator", "Simulator, eager", "hand", "eager"),
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--data-dir", default=str(HERE.parent.parent / "shared" / "data"))
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    parser.add_argument(
        "--only",
        choices=("communication", "tables", "roster", "wan", "privacy-cost"),
        help="run one section and update it in RESULTS.md",
    )
    add_wan_options(parser)
    args = parser.parse_args()
    if args.only == "wan":
        wan = wan_section(args, Path(args.data_dir), args.quick)
        if wan is not None:
            _update_section(wan)
        return
    if args.only == "tables":
        _update_section(_tables(args.quick))
        return
    if args.only == "privacy-cost":
        _update_section(privacy_cost(Path(args.data_dir), args.quick))
        return
    if args.only == "roster":
        _update_section(roster_cost(Path(args.data_dir), args.quick))
        return
    if args.only == "communication":
        w8a = ["--dataset", "w8a", "--data-dir", args.data_dir]
        _update_section(_communication(w8a, args.quick))
        return
    steps = 50 if args.quick else 400
    lines = [f"# slate benchmarks\n\nMeasured {time.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}.",
             "All cases run SLATE without gradient tracking (Alg. 1 lines 7 and 9), m = 20, "
             "b = 2, on a ring; each case is a fresh process (its own peak RSS), and its time per "
             "iteration is the fastest of 5 timed segments (the machine is shared).\n"]  # fmt: skip

    lines += ["## Torch threads for small ops (w8a MLP, N = 20)\n",
              "| threads | ms / iteration |", "|---|---|"]  # fmt: skip
    for threads in (1, 2):
        r = case("simulator", "mlp", 20, steps, threads)
        lines.append(f"| {threads} | {1000 * r['seconds_per_iteration']:.3f} |")
    print("\n".join(lines), flush=True)

    lines += ["\n## Simulator against a naive per-party loop and the hand-batched limit\n",
              "| model | N | simulator it/s | compiled it/s | naive loop it/s | "
              "hand-batched it/s | hand-batched compiled it/s | simulator / naive | "
              "compiled / naive | simulator time / hand time | compiled time / hand compiled "
              "time | peak RSS sim / compiled / naive / hand (MB) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for model, nodes in (("mlp", 1), ("mlp", 4), ("mlp", 20), ("mlp", 64), ("mnist-cnn", 20)):
        n_steps = steps if model == "mlp" else max(10, steps // 20)
        results = {
            "simulator": case("simulator", model, nodes, n_steps, 2),
            "compiled": case("compiled", model, nodes, n_steps, 2),
            "naive": case("naive", model, nodes, max(5, n_steps // 4), 2),
        }
        if model == "mlp":
            results["hand"] = case("hand", model, nodes, n_steps, 2)
            results["hand-compiled"] = case("hand-compiled", model, nodes, n_steps, 2)
        lines.append(_speed_row(model, nodes, results))
        print(lines[-1], flush=True)
        if (model, nodes) == ("mlp", 20):
            headline = _headline(results)

    w8a = ["--dataset", "w8a", "--data-dir", args.data_dir]
    if Path(args.data_dir, "w8a").exists():
        lines += _end_to_end(args.data_dir, args.quick)

        lines += _distributed(w8a, args.quick)
        lines += _communication(w8a, args.quick)
    if Path(args.data_dir, "w7a").exists():
        lines += roster_cost(Path(args.data_dir), args.quick)
        lines += privacy_cost(Path(args.data_dir), args.quick)
        lines += wan_section(args, Path(args.data_dir), args.quick) or []  # root only
    lines += _tables(args.quick)
    lines += ["\n## Headline (w8a MLP, N = 20)\n", headline, NOTES]
    (HERE / "RESULTS.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
