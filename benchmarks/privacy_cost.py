"""What ``--dp-epsilon`` costs per iteration: SLATE and D-PSGD on w7a in the simulator, with and
without it.

``python -m benchmarks.privacy_cost [--data-dir DIR] [--quick]`` prints the section's markdown
lines; ``python -m benchmarks --only privacy-cost`` puts them into RESULTS.md.

Each setting is a fresh ``Run`` in this process (one torch thread), warmed up, then timed over 5
segments in an alternating order; the fastest segment gives its milliseconds per iteration (the
machine is shared). Five settings per N:

* **plain**: SLATE with the flags alone (``m`` rows of which ``b`` positives per party and step);
* **plain, the private step's rows**: ``m G`` rows of which ``b G`` positives, the rows a
  ``--dp-epsilon`` step processes on average (G groups of ``m`` slots);
* **--dp-epsilon 8**: Poisson sampling in G groups, each group's gradient clipped, secret
  Gaussian noise (:mod:`slate.algorithms.privacy`);
* **D-PSGD**, plain and at ``--dp-epsilon 8``: groups of one row (standard DP-SGD), about
  ``m G`` slots a step.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE.parent.parent / "shared" / "data"
M, B, GROUPS, LR = 16, 1, 8, 0.01
CHUNK = 100  # steps per advance (the Poisson sampler draws a chunk's samples at once)


@dataclass(frozen=True)
class Setting:
    label: str
    batch_size: int
    positives: int
    epsilon: float | None
    algorithm: str = "slate"


SETTINGS = (
    Setting("plain", M, B, None),
    Setting("plain, the private step's rows", M * GROUPS, B * GROUPS, None),
    Setting("--dp-epsilon 8", M, B, 8.0),
    Setting("D-PSGD", M, B, None, "dpsgd"),
    Setting("D-PSGD --dp-epsilon 8", M, B, 8.0, "dpsgd"),
)


def make_run(setting: Setting, parties: int, data_dir: Path):
    """A simulator :class:`slate.training.run.Run` on w7a for ``setting``."""
    from slate.config import TrainConfig
    from slate.training.configuration import resolve_and_check
    from slate.training.run import Run

    config = TrainConfig(
        dataset="w7a", data_dir=str(data_dir), algorithm=setting.algorithm, nodes=parties,
        iterations=10**6, lr=LR, batch_size=setting.batch_size, positives=setting.positives,
        dp_epsilon=setting.epsilon, dp_groups=GROUPS, seed=0, eval_every=10**9,
        checkpoint_every=10**9, party_ap=False, compile="off", threads=1,
    )  # fmt: skip
    return Run(resolve_and_check(config))


def timed_segment(run, steps: int) -> float:
    """Seconds per iteration over ``steps`` iterations, advanced in chunks."""
    start = time.perf_counter()
    left = steps
    while left > 0:
        left -= run.advance(min(CHUNK, left))
    return (time.perf_counter() - start) / steps


def measure(parties: int, steps: int, data_dir: Path, segments: int = 5) -> dict[str, float]:
    """The fastest segment's milliseconds per iteration of every setting at ``parties``."""
    torch.set_num_threads(1)
    runs = {s.label: make_run(s, parties, data_dir) for s in SETTINGS}
    for run in runs.values():
        timed_segment(run, CHUNK)  # warm-up: first chunk, allocations, the ledger's first line
    best = {label: float("inf") for label in runs}
    for segment in range(segments):
        order = list(runs) if segment % 2 == 0 else list(reversed(runs))
        for label in order:
            best[label] = min(best[label], timed_segment(runs[label], steps))
    return {label: 1000.0 * seconds for label, seconds in best.items()}


def section(data_dir: Path, quick: bool) -> list[str]:
    """The markdown section: one row per N."""
    from benchmarks.machine import cpu_name

    steps = 100 if quick else 400
    lines = [
        "## What `--dp-epsilon` costs per iteration (w7a, SLATE and D-PSGD, simulator)\n",
        f"`python -m benchmarks --only privacy-cost` on {cpu_name()}, one torch thread. Flags: "
        f"`--lr {LR:g} --batch-size {M} --positives {B} --dp-groups {GROUPS}` on a ring; each "
        f"setting's fastest of 5 segments of {steps} iterations, the settings alternating. "
        "*The private step's rows*: a plain run with `--batch-size "
        f"{M * GROUPS} --positives {B * GROUPS}`, as many rows as a `--dp-epsilon` step "
        f"processes on average ({GROUPS} groups of {M} slots). *D-PSGD*: the same flags, "
        "groups of one row under `--dp-epsilon` (standard DP-SGD).\n",
        "| N | plain (ms / it) | plain, the private step's rows (ms / it) | --dp-epsilon 8 "
        "(ms / it) | against plain | against the same rows | D-PSGD plain (ms / it) | D-PSGD "
        "--dp-epsilon 8 (ms / it) | against plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for parties in (4, 20):
        ms = measure(parties, steps, data_dir)
        plain, rows, private, dpsgd, dpsgd_private = (ms[s.label] for s in SETTINGS)
        lines.append(
            f"| {parties} | {plain:.2f} | {rows:.2f} | {private:.2f} | {private / plain:.2f}x | "
            f"{private / rows:.2f}x | {dpsgd:.2f} | {dpsgd_private:.2f} | "
            f"{dpsgd_private / dpsgd:.2f}x |"
        )
        print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.privacy_cost")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print("\n".join(section(Path(args.data_dir), args.quick)))


if __name__ == "__main__":
    main()
