"""What an undetected drift costs under ``--robust clip``: the table of docs/security.md.

One party (rank 1) sends, from iteration 0, ``SLATE_ATTACK=1@0:drift:K``: its own model moved
``K`` times the median distance to the messages it received, towards its model with the output
layer negated (:func:`slate.faults.attacks.drift_message`): a message that stays about
as far as an honest neighbour's. On the simulator with w7a, 2 000 iterations, every run with
``--robust clip``, against the same run without an attacker: N = 4 on a ring, N = 8 and 16 on a
ring, ``exponential`` and ``base-2``.

``python -m benchmarks.robust_drift [--data-dir DIR] [--iterations T] [--factors 0.5,1,1.5,3]
[--settings 4:ring,8:exponential,...]`` prints a markdown table: per run, the AP, its cost
against the run without an attacker, who accused the attacker, which honest parties were
accused (none, by the rule), and the share of the attacker's messages that were clipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE.parent.parent / "shared" / "data"
ATTACKER = 1
FACTORS = (0.5, 1.0, 1.5, 3.0)
SETTINGS = ((4, "ring"), (8, "ring"), (8, "exponential"), (8, "base-2"), (16, "ring"),
            (16, "exponential"), (16, "base-2"))  # fmt: skip


def train(out: Path, nodes: int, topology: str, factor: float | None, args) -> dict:
    """One simulator run; returns its summary (raises naming the run when it fails)."""
    env = {k: v for k, v in os.environ.items() if k != "SLATE_ATTACK"}
    if factor is not None:
        env["SLATE_ATTACK"] = f"{ATTACKER}@0:drift:{factor:g}"
    command = [sys.executable, "-m", "slate", "train", "--dataset", "w7a", "--data-dir",
               str(args.data_dir), "--nodes", str(nodes), "--topology", topology,
               "--iterations", str(args.iterations), "--robust", "clip", "--no-progress",
               "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} (SLATE_ATTACK={env.get('SLATE_ATTACK')}) "
                         f"failed:\n{done.stderr[-3000:]}")  # fmt: skip
    return json.loads((out / "summary.json").read_text())


def accusations(summary: dict) -> dict[int, list[int]]:
    """Per accused party, the parties that accused it (``party_events``' ``accused_by``)."""
    return {e["rank"]: e["accused_by"] for e in summary["party_events"]
            if e["event"] == "robust" and e.get("accused_by")}  # fmt: skip


def clipped_share(summary: dict, rank: int) -> float:
    """The share of ``rank``'s received messages that its receivers clipped."""
    for e in summary["party_events"]:
        if e["event"] == "robust" and e["rank"] == rank and e["received"]:
            return e["clipped"] / e["received"]
    return 0.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--factors", default=",".join(f"{k:g}" for k in FACTORS))
    parser.add_argument("--settings", default=",".join(f"{n}:{t}" for n, t in SETTINGS),
                        help="NODES:TOPOLOGY, comma-separated")  # fmt: skip
    args = parser.parse_args(argv)
    factors = [float(k) for k in args.factors.split(",")]
    settings = [(int(n), t) for n, t in (s.split(":") for s in args.settings.split(","))]
    print(
        "| N | topology | drift K | AP | AP − no attacker | attacker accused by | honest "
        "parties accused | attacker's messages clipped |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for nodes, topology in settings:
            clean = train(Path(tmp) / f"{nodes}-{topology}-clean", nodes, topology, None, args)
            print(f"| {nodes} | {topology} | none | {clean['test_ap']:.4f} | | | "
                  f"{accusations(clean) or 'none'} | |", flush=True)  # fmt: skip
            for k in factors:
                got = train(Path(tmp) / f"{nodes}-{topology}-{k:g}", nodes, topology, k, args)
                accused = accusations(got)
                by = accused.pop(ATTACKER, [])
                print(f"| {nodes} | {topology} | {k:g} | {got['test_ap']:.4f} | "
                      f"{got['test_ap'] - clean['test_ap']:+.4f} | "
                      f"{', '.join(map(str, by)) or 'none'} | {accused or 'none'} | "
                      f"{clipped_share(got, ATTACKER):.0%} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
