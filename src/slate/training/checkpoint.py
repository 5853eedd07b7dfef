"""Checkpoints: everything a run needs to continue bit for bit, written atomically.

A checkpoint holds the parameters of every party this process runs, the algorithm's state
(u, v, SLATE-M's previous iterate, CODA's a, b, alpha live inside the parameters), the BatchNorm
buffers, every party's sampling stream (its state at the start of the current chunk and how many
steps of the chunk were used), the loss accumulator, the traffic counters, the iteration, the
history rows and the resolved config. Files are written to a temporary name and moved into
place with ``os.replace``, so a crash leaves the previous checkpoint intact. They are read with
``torch.load(weights_only=True)``: nothing is unpickled.

The simulator writes ``checkpoint.pt``; distributed party ``r`` keeps its two newest
``checkpoint-rank{r}-{iteration}.pt`` files, and a resumed run continues from the newest
iteration that every party holds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from slate.data.schema import PartyCounts, Schema
from slate.errors import ConfigError

# A checkpoint records the parties' agreed schemas (slate.training.recovery.RecordedExchange), so
# that a
# returning party can replay them; these two frozen dataclasses of plain fields are allowed.
torch.serialization.add_safe_globals([PartyCounts, Schema])

__all__ = [
    "RESUMABLE_KEYS",
    "checkpoint_files",
    "differing_keys",
    "load_checkpoint",
    "newest_checkpoint",
    "save_checkpoint",
    "simulator_checkpoint",
]

SIMULATOR_NAME = "checkpoint.pt"
KEEP_PER_RANK = 2
# Config keys that may differ between a checkpoint and the command that resumes it.
RESUMABLE_KEYS = frozenset({"iterations", "out", "threads"})


def simulator_checkpoint(folder: Path) -> Path:
    return folder / SIMULATOR_NAME


def rank_checkpoint(folder: Path, rank: int, iteration: int) -> Path:
    return folder / f"checkpoint-rank{rank}-{iteration:09d}.pt"


def setup_file(folder: Path, rank: int) -> Path:
    """Party ``rank``'s set-up record, written once its data agreement is done: the run's
    config and the exchanges to replay, so that a party lost before its first checkpoint can
    still ``--resume`` (it returns with the members' average model)."""
    return folder / f"setup-rank{rank}.pt"


def newest_setup(folder: Path) -> Path | None:
    """A set-up record in ``folder`` or a party's subfolder, or None."""
    for where in (folder, *sorted(folder.glob("party*"))):
        found = sorted(where.glob("setup-rank*.pt"))
        if found:
            return found[0]
    return None


def checkpoint_files(folder: Path, rank: int) -> dict[int, Path]:
    """Party ``rank``'s checkpoints in ``folder``, keyed by iteration."""
    pattern = re.compile(rf"checkpoint-rank{rank}-(\d+)\.pt$")
    found = {}
    for path in folder.glob(f"checkpoint-rank{rank}-*.pt"):
        match = pattern.search(path.name)
        if match:
            found[int(match.group(1))] = path
    return found


def newest_checkpoint(folder: Path) -> Path:
    """A checkpoint of the run in ``folder``, to read its config from.

    The simulator's, else the newest of any party's in ``folder``, else the newest in a party's
    own subfolder (``folder/party<r>/``, where a local launch with per-party files writes).
    """
    path = simulator_checkpoint(folder)
    if path.is_file():
        return path
    for where in (folder, *sorted(folder.glob("party*"))):
        found = {}
        for candidate in where.glob("checkpoint-rank*-*.pt"):
            match = re.search(r"checkpoint-rank\d+-(\d+)\.pt$", candidate.name)
            if match:
                found[int(match.group(1))] = candidate
        if found:
            return found[max(found)]
    return path


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def prune_rank_checkpoints(folder: Path, rank: int) -> None:
    """Keep the newest :data:`KEEP_PER_RANK` checkpoints of party ``rank``."""
    files = checkpoint_files(folder, rank)
    for iteration in sorted(files)[:-KEEP_PER_RANK]:
        files[iteration].unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; a missing or damaged file is a ConfigError."""
    if not path.is_file():
        where = (
            f"in {path.parent}: neither the simulator's {SIMULATOR_NAME} nor a party's "
            "checkpoint-rank<r>-<iteration>.pt (there or under party<r>/)"
            if path.name == SIMULATOR_NAME
            else str(path)
        )
        raise ConfigError(
            f"--resume: no checkpoint {where}. A run folder holds one once the run has passed "
            "its first --checkpoint-every iterations (or was interrupted with Ctrl-C)."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unpickling or zip error: the file is not a checkpoint
        raise ConfigError(f"--resume: {path} is not a readable slate checkpoint ({err}).") from None
    if not isinstance(payload, dict) or payload.get("format") != 1:
        raise ConfigError(f"--resume: {path} is not a slate checkpoint (unknown format).")
    return payload


def differing_keys(saved: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    """Keys that the resuming command sets to a value other than the checkpoint's."""
    return sorted(
        key
        for key, value in requested.items()
        if key not in RESUMABLE_KEYS and key in saved and saved[key] != value
    )
