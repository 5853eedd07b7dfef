"""Per-site runs for tests: each site's own w7a files, a ``slate rendezvous``, one ``--rank``
process per site, and (for the trust tests) each site's key and the run's roster."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
HAVE_W7A = (SHARED / "w7a" / "w7a.t.gz").is_file()

SITE_FLAGS = ["--train", "train.svm", "--test", "test.svm", "--out", "run", "--dataset",
              "libsvm", "--features", "300", "--seed", "1", "--no-progress", "--timeout", "30",
              "--checkpoint-every", "100"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_sites(root: Path, parties: int = 4, rows: int = 600) -> None:
    """Site r gets every ``parties``-th line of the first lines of w7a and of w7a.t."""
    for source, name in (("w7a.gz", "train.svm"), ("w7a.t.gz", "test.svm")):
        with gzip.open(SHARED / "w7a" / source, "rt") as handle:
            lines = [line for line, _ in zip(handle, range(parties * rows), strict=False)]
        for r in range(parties):
            (root / f"site{r}").mkdir(parents=True, exist_ok=True)
            (root / f"site{r}" / name).write_text("".join(lines[r::parties]))


def start_party(
    root: Path,
    rank: int,
    port: int,
    *flags: str,
    kill: str = "",
    program: list[str] | None = None,
    site: str | None = None,
) -> subprocess.Popen:
    """Party ``rank`` in ``root/site<rank>`` (``root/<site>`` when given); ``program`` replaces
    ``python -m slate``."""
    command = [*(program or [sys.executable, "-m", "slate"]), "train", "--rank", str(rank),
               "--rendezvous", f"127.0.0.1:{port}", *flags]  # fmt: skip
    env = {**os.environ, "SLATE_KILL_AT": kill}
    return subprocess.Popen(command, cwd=root / (site or f"site{rank}"), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def finish(parties: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str]]:
    """Each party's exit code and output (stdout then stderr), in order; one that has not ended
    within ``timeout`` seconds of the wait for it is killed."""
    done = []
    for party in parties:
        try:
            out, err = party.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            party.kill()
            out, err = party.communicate()
        done.append((party.returncode, out + err))
    return done


def serve(port: int, *flags: str) -> subprocess.Popen:
    """``slate rendezvous`` on the loopback interface."""
    command = [sys.executable, "-m", "slate", "rendezvous", "--port", str(port), "--host",
               "127.0.0.1", *flags]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def make_roster(root: Path, parties: int, run_id: str = "trusted-run") -> Path:
    """Each site's key in its own folder (``site<r>/site<r>.key``) and the roster of them all."""
    pubs = []
    for r in range(parties):
        (root / f"site{r}").mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "slate", "keygen", "--out",
                        str(root / f"site{r}" / f"site{r}")], check=True,
                       capture_output=True)  # fmt: skip
        pubs.append(str(root / f"site{r}" / f"site{r}.pub"))
    roster = root / f"roster-{run_id}.json"
    subprocess.run([sys.executable, "-m", "slate", "roster", "--out", str(roster), "--run-id",
                    run_id, *pubs], check=True, capture_output=True)  # fmt: skip
    return roster


def identity_flags(roster: Path, rank: int) -> list[str]:
    return ["--roster", str(roster), "--key", f"site{rank}.key"]
