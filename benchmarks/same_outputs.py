"""Whether two builds of slate write the same outputs: the check behind a redesign that must not
change behaviour.

``python -m benchmarks.same_outputs run OUT [--data-dir DIR]`` writes, with the slate this
interpreter imports, three runs into ``OUT``:

* ``simulator``: ``slate train`` on digits, 4 parties, a ring, 300 iterations, checkpoints;
* ``sites``: 3 distributed sites, each with its own w7a files, a roster (sealed), 200 iterations;
* ``predict``: ``slate predict`` of site 0's model on its own test file (scores, decisions).

``python -m benchmarks.same_outputs compare A B`` compares two such folders: every tensor of
``model.pt`` and of each checkpoint bit for bit, every other checkpoint entry for equality,
``summary.json`` and ``history.csv`` without the keys that hold clock times or paths, and the
predictions byte for byte. It prints one line per difference and exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE.parent.parent / "shared" / "data"
SITES, ROWS = 3, 400
#: Keys whose values are clock times, paths or machine facts: they differ between any two runs.
CLOCK_KEYS = {"wall_seconds", "compute_seconds", "wait_seconds", "evaluation_seconds",
              "load_seconds", "elapsed_seconds", "out_dir", "estimated_wan_seconds", "device",
              "collective_round_trips", "out", "data_dir", "train", "test", "roster", "key",
              "generated", "created", "versions", "slate_version", "torch_version",
              "elapsed"}  # fmt: skip
WAIT_SECONDS = 2  # a checkpoint's ``network``: bytes, round trips, then the seconds waited


def slate(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "slate", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def finish(process: subprocess.Popen, what: str) -> None:
    out, err = process.communicate(timeout=900)
    if process.returncode != 0:
        raise SystemExit(f"{what} failed ({process.returncode}):\n{out[-2000:]}\n{err[-3000:]}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_sites(root: Path, data_dir: Path) -> None:
    for source, name in (("w7a.gz", "train.svm"), ("w7a.t.gz", "test.svm")):
        with gzip.open(data_dir / "w7a" / source, "rt") as handle:
            lines = [line for line, _ in zip(handle, range(SITES * ROWS), strict=False)]
        for r in range(SITES):
            (root / f"site{r}").mkdir(parents=True, exist_ok=True)
            (root / f"site{r}" / name).write_text("".join(lines[r::SITES]))


def run(out: Path, data_dir: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    finish(
        slate(
            "train",
            "--dataset",
            "digits",
            "--nodes",
            "4",
            "--topology",
            "ring",
            "--iterations",
            "300",
            "--eval-every",
            "100",
            "--checkpoint-every",
            "100",
            "--seed",
            "3",
            "--no-progress",
            "--out",
            str(out / "simulator"),
        ),
        "simulator",
    )
    sites = out / "sites"
    write_sites(sites, data_dir)
    pubs = []
    for r in range(SITES):
        finish(slate("keygen", "--out", str(sites / f"site{r}" / f"site{r}")), "keygen")
        pubs.append(str(sites / f"site{r}" / f"site{r}.pub"))
    finish(slate("roster", "--out", str(sites / "roster.json"), "--run-id", "same-outputs",
                 *pubs), "roster")  # fmt: skip
    port = free_port()
    parties = [
        slate("train", "--rank", str(r), "--rendezvous", f"127.0.0.1:{port}", "--nodes",
              str(SITES), "--train", "train.svm", "--test", "test.svm", "--dataset", "libsvm",
              "--features", "300", "--seed", "1", "--iterations", "200", "--eval-every", "100",
              "--checkpoint-every", "100", "--no-progress", "--timeout", "60", "--out", "run",
              "--roster", str(sites / "roster.json"), "--key", f"site{r}.key",
              cwd=sites / f"site{r}")
        for r in range(SITES)
    ]  # fmt: skip
    for r, party in enumerate(parties):
        finish(party, f"site {r}")
    site = sites / "site0"
    finish(slate("predict", "--run", str(site / "run"), "--data", str(site / "test.svm"),
                 "--out", str(out / "predict")), "predict")  # fmt: skip


def _plain(value: Any) -> Any:
    """``value`` with every clock or path key left out, at any depth."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _same_state(a: Any, b: Any, where: str, found: list[str]) -> None:
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b)):  # fmt: skip
            found.append(f"{where}: tensors differ")
    elif isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key in CLOCK_KEYS:
                continue
            if key not in a or key not in b:
                found.append(f"{where}: {key!r} only in {'B' if key not in a else 'A'}")
            else:
                _same_state(a[key], b[key], f"{where}.{key}", found)
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        if where.endswith(".network"):  # (its waits are clock times)
            a, b = a[:WAIT_SECONDS], b[:WAIT_SECONDS]
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_state(x, y, f"{where}[{k}]", found)
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    elif _plain(a) != _plain(b):
        found.append(f"{where}: {str(a)[:80]!r} != {str(b)[:80]!r}")


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return [{k: v for k, v in row.items() if k not in CLOCK_KEYS}
                for row in csv.DictReader(handle)]  # fmt: skip


def compare(a: Path, b: Path) -> list[str]:
    found: list[str] = []
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    skip = {".png", ".log", ".key", ".pub"}
    for name in sorted(files_a ^ files_b):
        if name.suffix not in skip and name.name != "roster.json":
            found.append(f"{name}: only in {'A' if name in files_a else 'B'}")
    for name in sorted(files_a & files_b):
        pa, pb = a / name, b / name
        if name.suffix == ".pt":
            _same_state(torch.load(pa, weights_only=True), torch.load(pb, weights_only=True),
                        str(name), found)  # fmt: skip
        elif name.suffix == ".json" and name.name != "roster.json":
            _same_state(json.loads(pa.read_text()), json.loads(pb.read_text()), str(name), found)
        elif name.name == "history.csv":
            if _csv_rows(pa) != _csv_rows(pb):
                found.append(f"{name}: rows differ")
        elif name.suffix in (".csv", ".svm") and pa.read_bytes() != pb.read_bytes():
            found.append(f"{name}: bytes differ")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    write = verbs.add_parser("run")
    write.add_argument("out", type=Path)
    write.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    check = verbs.add_parser("compare")
    check.add_argument("a", type=Path)
    check.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "run":
        run(args.out, args.data_dir)
        return 0
    found = compare(args.a, args.b)
    for line in found:
        print(line)
    print("same outputs" if not found else f"{len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
