"""What ``--roster`` costs: a 4-site w7a run with signed coordination records against the same
run without them, alternating, on this machine.

``python -m benchmarks.roster [--data-dir DIR] [--quick] [--pairs P] [--iterations I]``
prints the section's markdown lines;
``python -m benchmarks --only roster`` puts them into RESULTS.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.site_runs import Launch, run_sites

HERE = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE.parent.parent / "shared" / "data"
SITES = 4
#: The flags every site's ``slate train --rank R`` gets, signed or not (``--iterations`` apart).
FLAGS = ["--train", "train.svm", "--test", "test.svm", "--dataset", "libsvm", "--features", "300",
         "--nodes", str(SITES), "--seed", "1", "--no-progress", "--external-store",
         "--timeout", "60"]  # fmt: skip
#: Seconds one run may take before its processes are stopped and the benchmark fails.
RUN_LIMIT = 900


def slate_command(*args: str) -> list[str]:
    """The command line of ``python -m slate ARGS`` with this interpreter."""
    return [sys.executable, "-m", "slate", *args]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_sites(root: Path, w7a: Path) -> int:
    """Site r gets every 4th line (from line r) of w7a and of w7a.t, as many lines of each as
    the training set has, so that the whole training set is used; returns the rows per site."""
    with gzip.open(w7a / "w7a.gz", "rt") as handle:
        rows = sum(1 for _ in handle) // SITES
    for source, name in (("w7a.gz", "train.svm"), ("w7a.t.gz", "test.svm")):
        with gzip.open(w7a / source, "rt") as handle:
            lines = [line for line, _ in zip(handle, range(SITES * rows), strict=False)]
        for r in range(SITES):
            (root / f"site{r}").mkdir(parents=True, exist_ok=True)
            (root / f"site{r}" / name).write_text("".join(lines[r::SITES]))
    return rows


def make_roster(root: Path) -> Path:
    """One key pair per site (``slate keygen``) and their roster, rank 0 first (``slate
    roster``); returns the roster's path. Site r's private key is ``root/keys/site{r}.key``."""
    keys = root / "keys"
    keys.mkdir()
    for r in range(SITES):
        subprocess.run(slate_command("keygen", "--out", str(keys / f"site{r}")),
                       check=True, capture_output=True, text=True)  # fmt: skip
    roster = root / "roster.json"
    pubs = [str(keys / f"site{r}.pub") for r in range(SITES)]
    subprocess.run(slate_command("roster", "--out", str(roster), *pubs),
                   check=True, capture_output=True, text=True)  # fmt: skip
    return roster


def one_run(root: Path, out: str, iterations: int, roster: Path | None) -> dict:
    """One run: ``slate rendezvous`` on a free loopback port, then the 4 sites' ``slate train
    --rank R``, all started at once. Returns its wall time (start of the rendezvous to the exit
    of the last party), the largest ``wall_seconds`` of the parties' summaries, and rank 0's
    model; raises ``RuntimeError`` with every process's stderr if any exits non-zero."""
    label = "signed" if roster is not None else "plain"
    port = free_port()
    serve = slate_command("rendezvous", "--port", str(port), "--host", "127.0.0.1")
    if roster is not None:
        serve += ["--roster", str(roster)]
    sites = []
    for r in range(SITES):
        command = slate_command("train", "--rank", str(r), "--rendezvous", f"127.0.0.1:{port}",
                                *FLAGS, "--iterations", str(iterations), "--out", out)  # fmt: skip
        if roster is not None:
            command += ["--roster", str(roster), "--key", str(root / "keys" / f"site{r}.key")]
        log = root / f"site{r}" / f"{out}.err"
        sites.append(Launch(f"party {r}", command, log, {"cwd": root / f"site{r}"}))
    rendezvous = Launch("slate rendezvous", serve, root / f"{out}-rendezvous.err")
    wall = run_sites(label, rendezvous, sites, RUN_LIMIT)
    summaries = [json.loads((root / f"site{r}" / out / "summary.json").read_text())
                 for r in range(SITES)]  # fmt: skip
    model = torch.load(root / "site0" / out / "model.pt", weights_only=True)
    return {"wall": wall, "train_wall": max(s["wall_seconds"] for s in summaries), "model": model}


def same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = 0.0) -> bool:
    """Whether two state dicts hold the same names and tensors equal to ``tol`` (bit-identical
    with 0)."""
    return a.keys() == b.keys() and all(
        torch.allclose(a[key].double(), b[key].double(), rtol=0, atol=tol) for key in a
    )


def roster_cost(
    data_dir: Path, quick: bool, pairs: int | None = None, iterations: int | None = None
) -> list[str]:
    """The markdown lines of the ``--roster`` section: 4 sites on w7a, plain and signed runs
    alternating (3 pairs of 2000 iterations, 2 of 600 with ``quick``; ``pairs`` and
    ``iterations`` override), their wall times and whether rank 0's models match. The order
    within a pair alternates too (plain first, then signed first), so that a load that drifts
    during the benchmark weighs on both kinds alike.

    Raises ``RuntimeError`` if a run fails or a signed model differs from the plain one.
    """
    given, given_pairs = iterations, pairs
    iterations = iterations or (600 if quick else 2000)
    pairs = pairs or (2 if quick else 3)
    lines = ["\n## Signed coordination records (`--roster`): 4 sites on w7a\n",
             "| wall time | plain, median (s) | `--roster`, median (s) | signed / plain "
             "(medians) | per-pair ratio, min | per-pair ratio, max | rank 0's models "
             "equal to 1e-6 |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    plain: list[dict] = []
    signed: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="slate-roster-") as tmp:
        root = Path(tmp)
        rows = write_sites(root, Path(data_dir) / "w7a")
        roster = make_roster(root)
        for pair in range(pairs):
            kinds = ((plain, None), (signed, roster))
            for runs, key in kinds if pair % 2 == 0 else kinds[::-1]:
                run = one_run(root, f"{'signed' if key else 'plain'}{pair}", iterations, key)
                runs.append(run)
                kind = "signed" if key else "plain"
                print(f"pair {pair}, {kind}: {run['wall']:.2f} s (training "
                      f"{run['train_wall']:.2f} s)", file=sys.stderr, flush=True)  # fmt: skip
    reference = plain[0]["model"]
    repeatable = all(same_model(reference, run["model"]) for run in plain)
    # Under --roster every exchange is sealed and every all-reduce sums in rank order instead of
    # gloo's ring order: equal up to float summation order, not bit for bit.
    identical = all(same_model(reference, run["model"], 1e-6) for run in signed)
    for field, label in (("wall", "whole run"), ("train_wall", "training (`wall_seconds`)")):
        a = statistics.median(run[field] for run in plain)
        b = statistics.median(run[field] for run in signed)
        ratios = [s[field] / p[field] for p, s in zip(plain, signed, strict=True)]
        lines.append(f"| {label} | {a:.2f} | {b:.2f} | {b / a:.3f}x | {min(ratios):.3f}x | "
                     f"{max(ratios):.3f}x | {'yes' if identical else 'NO'} |")  # fmt: skip
    flags = (" --quick" if quick else "") + "".join(
        f" --{name} {value}" for name, value in (("pairs", given_pairs), ("iterations", given))
        if value
    )  # fmt: skip
    walls = ", ".join(f"{p['wall']:.2f} / {s['wall']:.2f}"
                      for p, s in zip(plain, signed, strict=True))  # fmt: skip
    lines += [
        f"\n`python -m benchmarks.roster{flags}`: {pairs} pairs of runs, plain then signed "
        "(signed first in every second pair), each a `slate rendezvous` on a free loopback "
        "port and 4 `slate train "
        f"--rank R --external-store` sites ({rows:,} w7a training rows each, every 4th line; "
        f"`--features 300 --seed 1 --iterations {iterations} --timeout 60`, "
        "`--on-party-loss continue`, so heartbeats run), the signed runs with `--roster` on "
        "every process and `--key` on each site (so every exchange is sealed). *Whole run* is "
        "the wall time from starting the rendezvous to the exit of the last party; *training* "
        "is the largest `wall_seconds` of the 4 sites' `summary.json`. All 5 processes share "
        "the machine's cores. "
        f"Whole-run seconds per pair (plain / signed): {walls}.",
    ]
    if not repeatable:
        raise RuntimeError("the plain runs' rank-0 models differ among themselves:\n"
                           + "\n".join(lines))  # fmt: skip
    if not identical:
        raise RuntimeError("the signed and plain runs' rank-0 models differ:\n" + "\n".join(lines))
    return lines


def main() -> None:
    """``python -m benchmarks.roster [--data-dir DIR] [--quick]``: print the section's lines."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.roster")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--quick", action="store_true", help="fewer iterations and pairs")
    parser.add_argument("--pairs", type=int, help="pairs of runs (3, or 2 with --quick)")
    parser.add_argument("--iterations", type=int, help="per run (2000, or 600 with --quick)")
    args = parser.parse_args()
    lines = roster_cost(Path(args.data_dir), args.quick, args.pairs, args.iterations)
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
