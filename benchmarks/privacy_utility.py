"""What ``--dp-epsilon`` costs in test AP: SLATE against DP-D-PSGD on w7a (or a public table),
over seeds, and against each site training alone on its own rows.

``python -m benchmarks.privacy_utility [--parties 4,20] [--iterations 2000,500] [--seeds 3]
[--epsilons 1,3,8] [--lr 0.01] [--dataset w7a] [--write]`` trains, on the simulator, every
party's share of w7a (stratified, the whole training set) and scores the final average model on
w7a.t with scikit-learn's ``average_precision_score``. ``--dataset digits`` does the same on a
public table: scikit-learn's bundled digits as slate's ``digits`` reads it (64 pixel columns of
public range 0-16 scaled by that range, digits 5-9 positive, 80% of the training positives
dropped, its seeded test split). Per N, with the same flags and iterations:

* SLATE without DP;
* SLATE's grouped clipping without noise (the secret noise source patched to zeros in this
  process): what clipping alone costs;
* SLATE and DP-D-PSGD (groups of one row, each sampled row in its own slot: standard DP-SGD)
  at each ε of ``--epsilons``;
* each site alone: one party training on its own share only, without DP (its rows never leave
  it), scored on the same test rows; the smallest ε at which the private federation's mean AP
  beats the sites' mean AP alone is the crossover (a site gains by joining above it).

``--write`` puts the section into ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.privacy import (
    DEFAULT_DATA_DIR,
    Scorer,
    Settings,
    W7a,
    deal,
    load_w7a,
    train,
    train_config,
)

#: (label, algorithm, epsilon, noise on): the rows of one N's table without DP noise.
BASE_VARIANTS = (
    ("SLATE, no DP", "slate", None, True),
    ("SLATE, grouped clipping without noise", "slate", 8.0, False),
)
ALONE = "each site alone, no DP"


def variants(epsilons: list[float]) -> list[tuple[str, str, float | None, bool]]:
    """The table's rows: the base variants, then SLATE and DP-D-PSGD at each ε."""
    private = [(f"{name}, ε = {eps:g}", algorithm, eps, True)
               for eps in epsilons for name, algorithm in (("SLATE", "slate"),
                                                           ("DP-D-PSGD", "dpsgd"))]  # fmt: skip
    return [*BASE_VARIANTS, *private]


#: Per variant: the APs over the seeds, the median milliseconds per iteration and the fewest
#: steps taken over the seeds.
Table = dict[str, tuple[list[float], float, int]]


@contextlib.contextmanager
def noise_off() -> Iterator[None]:
    """Every secret Gaussian draw zero: the mechanism's sampling and clipping without noise."""
    from slate.security.secret_random import SecretStream

    original = SecretStream.normal
    SecretStream.normal = lambda self, count, std=1.0: np.zeros(count)  # type: ignore[method-assign]
    try:
        yield
    finally:
        SecretStream.normal = original  # type: ignore[method-assign]


def one_ap(s: Settings, data: W7a, parties: int, iterations: int, algorithm: str,
           epsilon: float | None, noise: bool) -> tuple[float, float, int]:  # fmt: skip
    """Test AP of the final average, milliseconds per iteration and the steps taken (fewer
    than ``iterations`` where the budget cut the plan) of one run."""
    from sklearn.metrics import average_precision_score

    config = train_config(s, parties, epsilon, iterations, algorithm)
    with contextlib.nullcontext() if noise else noise_off():
        done = train(config, data, deal(data.y, parties, s.seed))
    ap = average_precision_score(
        data.y_test, Scorer(config, data.x.shape[1])(done.average, data.x_test)
    )
    return float(ap), 1000.0 * done.seconds_per_iteration, done.iterations


def measure(s: Settings, data: W7a, parties: int, iterations: int, seeds: int,
            epsilons: list[float], log: Any) -> Table:  # fmt: skip
    """Per variant: the APs over ``seeds`` seeds (model, partition and sampler order) and the
    median milliseconds per iteration; for :data:`ALONE`, every site's AP of every seed."""
    out = {}
    for label, algorithm, epsilon, noise in variants(epsilons):
        aps, ms, taken = [], [], []
        for seed in range(seeds):
            ap, per_it, steps = one_ap(replace(s, seed=seed), data, parties, iterations,
                                       algorithm, epsilon, noise)  # fmt: skip
            aps.append(ap)
            ms.append(per_it)
            taken.append(steps)
            log(f"N {parties} {label} seed {seed}: AP {ap:.4f}, {per_it:.2f} ms/it, {steps} steps")
        out[label] = (aps, float(np.median(ms)), min(taken))
    out[ALONE] = alone(s, data, parties, iterations, seeds, log)
    return out


def alone(s: Settings, data: W7a, parties: int, iterations: int, seeds: int,
          log: Any) -> tuple[list[float], float, int]:  # fmt: skip
    """Each site of the ``parties``-way deal training SLATE on its own share alone (one party,
    no DP, the same flags and iterations), its final model scored on w7a.t."""
    from sklearn.metrics import average_precision_score

    aps, ms = [], []
    for seed in range(seeds):
        settings = replace(s, seed=seed)
        config = train_config(settings, 1, None, iterations)
        for site, part in enumerate(deal(data.y, parties, seed)):
            done = train(config, data, [part])
            ap = average_precision_score(
                data.y_test, Scorer(config, data.x.shape[1])(done.average, data.x_test)
            )
            aps.append(float(ap))
            ms.append(1000.0 * done.seconds_per_iteration)
            log(f"N {parties} site {site} alone seed {seed}: AP {ap:.4f}")
    return aps, float(np.median(ms)), iterations


def crossover(table: Table, epsilons: list[float]) -> str:
    """The smallest ε whose SLATE mean AP beats the sites' mean AP alone, or a bound."""
    alone_mean = np.mean(table[ALONE][0])
    for eps in sorted(epsilons):
        if np.mean(table[f"SLATE, ε = {eps:g}"][0]) > alone_mean:
            return f"ε = {eps:g}"
    return f"above ε = {max(epsilons):g} (not reached)"


def load_digits_table() -> W7a:
    """slate's ``digits`` (module docstring), as the harness's arrays."""
    from slate.data.datasets import read_named_dataset
    from slate.data.spec import DataSpec

    d = read_named_dataset(DataSpec(dataset="digits"))
    return W7a(np.ascontiguousarray(d.x_train, np.float32), d.y_train.astype(np.int64),
               np.ascontiguousarray(d.x_test, np.float32), d.y_test.astype(np.int64))  # fmt: skip


#: The harness's datasets: (loader of the data directory, the section's name, the test rows).
DATASETS = {
    "w7a": (load_w7a, "w7a", "w7a.t"),
    "digits": (lambda _: load_digits_table(), "digits, a public table", "its test split"),
}


def section(s: Settings, results: dict[int, Table], iterations: dict[int, int], seeds: int,
            epsilons: list[float], command: str, seconds: float,
            dataset: str = "w7a") -> list[str]:  # fmt: skip
    from benchmarks.__main__ import machine

    _, name, test = DATASETS[dataset]
    lines = [
        f"## Utility under `--dp-epsilon`: SLATE against DP-D-PSGD ({name})\n",
        f"`{command}` on {machine()}, one process, one torch thread. Every run: `--lr {s.lr:g} "
        f"--batch-size {s.batch_size} --positives {s.positives} --dp-groups {s.groups} "
        f"--dp-clip {s.clip:g}` on a ring, the whole training set dealt to the parties "
        f"(stratified), {seeds} seed(s) (model, partition; the DP noise and sample are secret); "
        f"test AP of the final average on {test} (scikit-learn), mean ± sd over the seeds.\n",
        "| N | iterations | setting | test AP | ms / iteration | steps taken |",
        "|---|---|---|---|---|---|",
    ]
    for parties, table in results.items():
        for label, (aps, ms, steps) in table.items():
            lines.append(f"| {parties} | {iterations[parties]} | {label} | {np.mean(aps):.4f} ± "
                         f"{np.std(aps):.4f} | {ms:.2f} | {steps} |")  # fmt: skip
        for eps in epsilons:
            slate = np.mean(table[f"SLATE, ε = {eps:g}"][0])
            dpsgd = np.mean(table[f"DP-D-PSGD, ε = {eps:g}"][0])
            lines.append(f"| {parties} | | SLATE − DP-D-PSGD at ε = {eps:g} | "
                         f"{slate - dpsgd:+.4f} | | |")  # fmt: skip
        sites = table[ALONE][0]
        lines.append(f"| {parties} | | each site alone: range over sites and seeds | "
                     f"{min(sites):.4f} to {max(sites):.4f} | | |")  # fmt: skip
        lines.append(f"| {parties} | | joining pays from (SLATE's mean above the sites' mean "
                     f"alone) | {crossover(table, epsilons)} | | |")  # fmt: skip
    lines.append(f"\nThe whole invocation took {seconds:.0f} s.")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.privacy_utility")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--parties", default="4,20")
    parser.add_argument("--iterations", default="2000,500", help="per entry of --parties")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", default="1,3,8", help="the ε of the private runs")
    parser.add_argument("--lr", type=float, default=0.01, help="default: the paper's, for w7a")
    parser.add_argument("--dataset", default="w7a", choices=sorted(DATASETS))
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    parties = [int(v) for v in args.parties.split(",")]
    epsilons = [float(v) for v in args.epsilons.split(",")]
    steps = [int(v) for v in args.iterations.split(",")]
    iterations = dict(zip(parties, (steps * len(parties))[: len(parties)], strict=True))
    s = Settings(data_dir=args.data_dir, lr=args.lr)
    torch.set_num_threads(1)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    data = DATASETS[args.dataset][0](s.data_dir)
    started = time.perf_counter()
    results = {n: measure(s, data, n, iterations[n], args.seeds, epsilons, log) for n in parties}
    command = "python -m benchmarks.privacy_utility " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    lines = section(s, results, iterations, args.seeds, epsilons, command.strip(),
                    time.perf_counter() - started, args.dataset)  # fmt: skip
    print("\n".join(lines))
    if args.write:
        from benchmarks.__main__ import _update_section

        _update_section(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
