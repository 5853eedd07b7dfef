"""``--robust clip`` against a misbehaving site: the acceptance matrix of docs/security.md.

Four sites, each with its own w7a files (the training and test sets dealt out stratified,
seeded), train 2 000 iterations on the distributed engine, on the ring and on base-2 with
H = 25 and int8 compression; site 1 attacks from iteration 0 through ``SLATE_ATTACK`` (``nan``,
``scale:1e30``, ``signflip``, ``zeros``, and ``drift:K`` for K = 0.5, 1, 1.5, 3), and every run
is compared with the same run without an attacker, with and without ``--robust clip``.

``python -m benchmarks.robust_attacks [--data-dir DIR] [--iterations T] [--out DIR]
[--attacks nan,drift:3,...] [--settings ring,base-2]`` prints a markdown table: per run, the
honest sites' exit codes, the AP, its gap to the run without an attacker, which parties accused
site 1 (in every honest site's ``summary.json``: the same everywhere), and which honest sites
anyone accused.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE.parent.parent / "shared" / "data"
SITES = 4
ATTACKER = 1
ATTACKS = ("nan", "scale:1e30", "signflip", "zeros", "drift:0.5", "drift:1", "drift:1.5",
           "drift:3")  # fmt: skip
SETTINGS = {
    "ring": ["--topology", "ring"],
    "base-2, H = 25, int8": ["--topology", "base-2", "--gossip-every", "25", "--compress", "int8"],
}


def deal_sites(data_dir: Path, into: Path, seed: int = 0) -> None:
    """w7a and w7a.t dealt out to ``SITES`` folders (``train.svm``, ``test.svm``), stratified."""
    rng = random.Random(seed)
    for name, out in (("w7a.gz", "train.svm"), ("w7a.t.gz", "test.svm")):
        with gzip.open(data_dir / "w7a" / name, "rt") as f:
            rows = [line for line in f if line.strip()]
        positive = [r for r in rows if r.split()[0] in ("+1", "1")]
        negative = [r for r in rows if r.split()[0] not in ("+1", "1")]
        for group in (positive, negative):
            rng.shuffle(group)
        for site in range(SITES):
            part = positive[site::SITES] + negative[site::SITES]
            rng.shuffle(part)
            (into / str(site)).mkdir(parents=True, exist_ok=True)
            (into / str(site) / out).write_text("".join(part))


def run(sites: Path, out: Path, flags: list[str], attack: str | None, iterations: int) -> dict:
    """One 4-site run; returns the exit code and every site's summary."""
    env = {k: v for k, v in os.environ.items() if k != "SLATE_ATTACK"}
    if attack:
        env["SLATE_ATTACK"] = f"{ATTACKER}@0:{attack}"
    command = [sys.executable, "-m", "slate", "train", "--engine", "distributed", "--nodes",
               str(SITES), "--dataset", "libsvm", "--train", str(sites / "{rank}" / "train.svm"),
               "--test", str(sites / "{rank}" / "test.svm"), "--iterations", str(iterations),
               "--threads", "1", "--no-progress", "--out", str(out), *flags]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    summaries = {}
    for site in range(SITES):
        path = out / f"party{site}" / "summary.json"
        if path.exists():
            summaries[site] = json.loads(path.read_text())
    return {"code": done.returncode, "summaries": summaries, "stderr": done.stderr[-2000:]}


def accusations(summary: dict) -> dict[int, list[int]]:
    """Per accused party, the parties that accused it, as one site's summary reports them."""
    return {e["rank"]: e["accused_by"] for e in summary.get("party_events", [])
            if e.get("event") == "robust" and e.get("accused_by")}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temp folder)")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--settings", default=",".join(s.split(",")[0] for s in SETTINGS))
    args = parser.parse_args(argv)
    chosen = args.settings.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        sites = root / "sites"
        deal_sites(args.data_dir, sites)
        print("| setting | attack | honest sites' exit codes | AP | AP − no attack | site 1 "
              "accused by | honest sites accused |\n|---|---|---|---|---|---|---|")  # fmt: skip
        for label, flags in SETTINGS.items():
            slug = label.split(",")[0]
            if slug not in chosen:
                continue
            plain = run(sites, root / f"{slug}-plain", flags, None, args.iterations)
            clean = run(sites, root / f"{slug}-clean", [*flags, "--robust", "clip"], None,
                        args.iterations)  # fmt: skip
            plain_ap = plain["summaries"][0]["test_ap"]
            clean_ap = clean["summaries"][0]["test_ap"]
            print(f"| {label} | none, without `--robust` | {plain['code']} | {plain_ap:.4f} | "
                  "| | |")  # fmt: skip
            print(f"| {label} | none | {clean['code']} | {clean_ap:.4f} | | | "
                  f"{accusations(clean['summaries'][0]) or 'none'} |")  # fmt: skip
            for attack in args.attacks.split(","):
                done = run(sites, root / f"{slug}-{attack.replace(':', '_')}",
                           [*flags, "--robust", "clip"], attack, args.iterations)  # fmt: skip
                honest = [s for s in range(SITES) if s != ATTACKER]
                got = [done["summaries"].get(s) for s in honest]
                ap = got[0]["test_ap"] if got[0] else float("nan")
                seen = [accusations(s) for s in got if s is not None]
                same = len(seen) == len(honest) and all(a == seen[0] for a in seen)
                named = seen[0] if seen else {}
                by = named.pop(ATTACKER, [])
                print(
                    f"| {label} | `{attack}` | {done['code']} | {ap:.4f} | "
                    f"{ap - clean_ap:+.4f} | {', '.join(map(str, by)) or 'none'} | "
                    f"{named or 'none'}{'' if same else ' (sites differ!)'} |",
                    flush=True,
                )
                if done["code"] != 0:
                    print(done["stderr"], file=sys.stderr)


if __name__ == "__main__":
    main()
