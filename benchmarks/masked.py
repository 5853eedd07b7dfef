"""What masked sums cost: a 4-site sealed (``--roster``) w7a run with its sums masked (the
default) against the same run with them sent unmasked (``SLATE_UNMASKED_SUMS=1``, the test and
benchmark switch), alternating, on this machine.

``python -m benchmarks.masked [--data-dir DIR] [--pairs P] [--iterations I]`` prints the
section's markdown lines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.roster import (
    DEFAULT_DATA_DIR,
    FLAGS,
    RUN_LIMIT,
    SITES,
    free_port,
    make_roster,
    same_model,
    slate_command,
    write_sites,
)
from benchmarks.site_runs import Launch, run_sites


def one_run(root: Path, out: str, iterations: int, roster: Path, masked: bool) -> dict:
    """One sealed run (rendezvous and 4 sites on loopback); its wall time and rank 0's model."""
    import torch

    env = {**os.environ}
    env.pop("SLATE_UNMASKED_SUMS", None)
    if not masked:
        env["SLATE_UNMASKED_SUMS"] = "1"
    port = free_port()
    serve = slate_command("rendezvous", "--port", str(port), "--host", "127.0.0.1",
                          "--roster", str(roster))  # fmt: skip
    sites = []
    for r in range(SITES):
        command = slate_command("train", "--rank", str(r), "--rendezvous", f"127.0.0.1:{port}",
                                *FLAGS, "--iterations", str(iterations), "--out", out,
                                "--roster", str(roster),
                                "--key", str(root / "keys" / f"site{r}.key"))  # fmt: skip
        options = {"cwd": root / f"site{r}", "env": env}
        sites.append(Launch(f"party {r}", command, root / f"site{r}" / f"{out}.err", options))
    rendezvous = Launch("slate rendezvous", serve, root / f"{out}-rendezvous.err", {"env": env})
    wall = run_sites(out, rendezvous, sites, RUN_LIMIT)
    model = torch.load(root / "site0" / out / "model.pt", weights_only=True)
    return {"wall": wall, "model": model}


def masked_cost(data_dir: Path, pairs: int, iterations: int) -> list[str]:
    """The markdown lines: medians of the whole-run wall time, masked against unmasked, the
    per-pair ratios, and whether rank 0's models agree to 1e-6."""
    runs: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="slate-masked-") as tmp:
        root = Path(tmp)
        rows = write_sites(root, Path(data_dir) / "w7a")
        roster = make_roster(root)
        for pair in range(pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)
            for masked in order:
                run = one_run(root, f"{'masked' if masked else 'unmasked'}{pair}", iterations,
                              roster, masked)  # fmt: skip
                runs[masked].append(run)
                print(f"pair {pair}, {'masked' if masked else 'unmasked'}: {run['wall']:.2f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
    plain, masked_runs = runs[False], runs[True]
    ratios = [m["wall"] / p["wall"] for p, m in zip(plain, masked_runs, strict=True)]
    a = statistics.median(r["wall"] for r in plain)
    b = statistics.median(r["wall"] for r in masked_runs)
    same = all(same_model(p["model"], m["model"], 1e-6)
               for p, m in zip(plain, masked_runs, strict=True))  # fmt: skip
    walls = ", ".join(f"{p['wall']:.2f} / {m['wall']:.2f}"
                      for p, m in zip(plain, masked_runs, strict=True))  # fmt: skip
    return [
        "\n## Masked sums under `--roster`: 4 sealed sites on w7a\n",
        "| unmasked, median (s) | masked, median (s) | masked / unmasked (medians) | "
        "per-pair ratio, median | min | max | rank 0's models equal to 1e-6 |",
        "|---|---|---|---|---|---|---|",
        f"| {a:.2f} | {b:.2f} | {b / a:.3f}x | {statistics.median(ratios):.3f}x | "
        f"{min(ratios):.3f}x | {max(ratios):.3f}x | {'yes' if same else 'NO'} |",
        f"\n`python -m benchmarks.masked --pairs {pairs} --iterations {iterations}`: {pairs} "
        f"pairs, the order alternating; 4 sites of {rows:,} w7a training rows each, every "
        "site with `--roster` and `--key` (every exchange sealed); whole-run wall time from "
        "starting the rendezvous to the exit of the last site. Seconds per pair (unmasked / "
        f"masked): {walls}.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.masked")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=600)
    args = parser.parse_args()
    print("\n".join(masked_cost(Path(args.data_dir), args.pairs, args.iterations)), flush=True)


if __name__ == "__main__":
    main()
