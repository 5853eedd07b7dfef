"""``python -m benchmarks.consensus_step_auto``: ``--consensus-step auto``'s choice against the
operators' default gamma under SGD-like noise (docs/engines.md, ``--consensus-step auto``).

For each graph and compressor: the gamma picked by the noiseless tuning that ``auto`` used
before (CHOCO average consensus from standard normal parameters, ``max(100, 50 x cycle)``
rounds), the gamma picked now (:func:`slate.communication.choco.auto_consensus_step`), and the noisy
consensus error of each (:func:`slate.communication.choco.noisy_consensus_error`) at another seed
(1) and a longer horizon (2000 rounds) than the tuning's, as a multiple of the default's error.
"""

from __future__ import annotations

import time

import torch

from slate.communication import choco
from slate.communication.compression import parse_compressor
from slate.topology import build_topology

CASES = [("ring", 10), ("ring", 20), ("base-2", 10)]
COMPRESSORS = ["topk:0.01", "topk:0.1", "sign", "int8"]
D, CHECK_ROUNDS, CHECK_SEED = 2048, 2000, 1


def noiseless_auto(topology, compressor, d: int) -> float:
    """The earlier tuning of ``auto``: the grid value with the smallest noiseless error."""
    rounds = max(100, 50 * topology.cycle_length)
    errors = [
        choco.consensus_error_after(topology, compressor, g, d, rounds) for g in choco.GAMMA_GRID
    ]
    return choco.GAMMA_GRID[min(range(len(errors)), key=errors.__getitem__)]


def main() -> None:
    torch.set_num_threads(1)
    print("| graph | --compress | default | noiseless auto | its error | noisy auto | its error "
          "| tuning s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, n in CASES:
        topology = build_topology(name, n)
        for spec in COMPRESSORS:
            compressor = parse_compressor(spec)
            default = compressor.default_consensus_step
            started = time.perf_counter()
            new = choco.auto_consensus_step(topology, compressor, D)
            seconds = time.perf_counter() - started
            old = noiseless_auto(topology, compressor, D)
            error = {
                g: choco.noisy_consensus_error(topology, compressor, g, D, CHECK_ROUNDS, CHECK_SEED)
                for g in {old, new, default}
            }
            print(f"| {name}, N = {n} | `{spec}` | {default:.3g} | {old:.3g} | "
                  f"{error[old] / error[default]:.2f}x | {new:.3g} | "
                  f"{error[new] / error[default]:.2f}x | {seconds:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
