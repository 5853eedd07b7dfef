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
iteration that every party holds (:func:`resume`). Which applies follows from the engine
(:attr:`slate.engines.base.Engine.own_party`: a party with a process of its own keeps files of
its own). A distributed party also writes its set-up record once (:func:`write_setup`), and a
party returning to a run in progress replays its own newest record
(:func:`returning_record`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from slate.data.schema import PartyCounts, Schema
from slate.engines.base import Engine
from slate.engines.distributed.control.membership import Change
from slate.errors import ConfigError, parties_text
from slate.permissions import private_files, private_folder
from slate.security.messages import ListOf, MapOf

if TYPE_CHECKING:
    from slate.training.run import Run

# A checkpoint records the parties' agreed schemas (slate.engines.base.RecordedExchange), so that
# a returning party can replay them; these two frozen dataclasses of plain fields are allowed.
torch.serialization.add_safe_globals([PartyCounts, Schema])

__all__ = [
    "RESUMABLE_KEYS",
    "checkpoint_files",
    "checkpoint_path",
    "differing_keys",
    "last_checkpoint_note",
    "load_checkpoint",
    "newest_checkpoint",
    "resume",
    "returning_record",
    "save_checkpoint",
    "save_run",
    "simulator_checkpoint",
    "write_setup",
]

SIMULATOR_NAME = "checkpoint.pt"
KEEP_PER_RANK = 2
# Config keys that may differ between a checkpoint and the command that resumes it.
RESUMABLE_KEYS = frozenset({"iterations", "out", "threads"})
#: One party's checkpoints on the wire: [rank, {iteration: the members it records}].
OFFER_SHAPE = [int, MapOf(ListOf(int, 65536), 1024, int_keys=True)]


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
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, ``os.replace``), in a
    ``0700`` folder, ``0600`` (a checkpoint holds the site's model and state)."""
    private_folder(path.parent)
    tmp = path.with_name(path.name + ".tmp")
    with private_files(), open(tmp, "wb") as handle:
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


def checkpoint_path(engine: Engine, folder: Path, iteration: int) -> Path:
    """Where this process writes its checkpoint of ``iteration``: its own party's file, or the
    one file of every party."""
    party = engine.own_party
    return (
        simulator_checkpoint(folder) if party is None else rank_checkpoint(folder, party, iteration)
    )


def save_run(run: Run, out: Path | None, elapsed: float, progress: bool) -> None:
    """Write this process's checkpoint of the run now (none without a run folder); a party
    with files of its own keeps its newest :data:`KEEP_PER_RANK`."""
    if out is None:
        return
    run.faults.check("checkpoint", run.iteration)
    path = checkpoint_path(run.engine, out, run.iteration)
    state = {**run.state_dict(), "history": run.history, "elapsed": elapsed, "progress": progress}
    if run.best_model is not None:  # --early-stopping's kept model
        state["best_model"] = run.best_model.state_dict()
    save_checkpoint(path, state)
    if run.engine.own_party is not None:
        prune_rank_checkpoints(out, run.engine.own_party)


def resume(run: Run, out: Path, say: Callable[[str], None]) -> float:
    """Continue from the folder's checkpoint; returns the elapsed seconds it recorded.

    One process running every party reads its one checkpoint. Parties with files of their own
    take the newest iteration that every party then in the run holds; the parties that were
    not in the run then (lost before the crash) return to it there
    (:meth:`slate.training.recovery.PartySet.admit`).
    """
    rank = run.engine.own_party
    if rank is None:
        state = load_checkpoint(simulator_checkpoint(out))
        run.load_state_dict(state)
        run.history = [dict(r) for r in state["history"]]
        run.resumed_best = state.get("best_model")
        return state["elapsed"]
    mine = checkpoint_files(out, rank)
    held = {t: load_checkpoint(path) for t, path in mine.items()}
    offers = {str(t): state.get("members", run.party_set.members) for t, state in held.items()}
    shared = run.engine.gather_json([[rank, offers]], OFFER_SHAPE, "list of its checkpoints")
    everyone = [(r, {int(t): members for t, members in held.items()}) for r, held in shared]
    latest, members = _common_checkpoint(everyone)
    if latest is None:
        raise ConfigError(
            f"--resume {out}: party {rank} holds checkpoints of iterations {sorted(mine)}, but "
            "no iteration is held by every party that was in the run then; the parties' "
            "checkpoints do not line up (were they written by the same run?)."
        )
    own = held.get(latest) if rank in members else (held[max(held)] if held else None)
    if rank in members:
        run.load_state_dict(own, members_check=False)
        run.history = [dict(r) for r in own["history"]]
        run.resumed_best = own.get("best_model")
    returning = sorted(r for r, _ in everyone if r not in members)
    if returning:
        change = Change(run.engine.generation, tuple(run.engine.members), joined=tuple(returning),
                        position=2 * latest + 1)  # fmt: skip
        run.party_set.admit(change, own if rank in returning else None)
        verb = "returns" if len(returning) == 1 else "return"
        say(f"{parties_text(returning)} {verb} to the run at iteration {latest}")
    return float(own["elapsed"]) if own is not None and rank in members else 0.0


def _common_checkpoint(
    everyone: list[tuple[int, dict[int, list[int]]]],
) -> tuple[int | None, list[int]]:
    """The newest iteration whose members (as its checkpoints record them) all hold it."""
    holders: dict[int, set[int]] = {}
    members_at: dict[int, list[int]] = {}
    for rank, offers in everyone:
        for t, members in offers.items():
            holders.setdefault(t, set()).add(rank)
            members_at.setdefault(t, list(members))
    for t in sorted(holders, reverse=True):
        if set(members_at[t]) <= holders[t]:
            return t, members_at[t]
    return None, []


def write_setup(run: Run, out: Path, progress: bool) -> None:
    """This party's set-up record (:func:`setup_file`), for a party with files of its own."""
    party = run.engine.own_party
    if party is None:
        return
    record = {"format": 1, "config": run.flags.to_dict(), "exchanges": run.exchange.record,
              "progress": progress}  # fmt: skip
    save_checkpoint(setup_file(out, party), record)


def returning_record(
    out: str | None, engine: Engine | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A party returning to a run in progress, with its run folder ``out``: its own newest
    checkpoint (None if it never wrote one), and the record whose data set-up exchanges it
    replays (that checkpoint, else its set-up record, else None)."""
    if out is None or engine is None or engine.own_party is None:
        return None, None
    folder = Path(out)
    files = checkpoint_files(folder, engine.own_party)
    own = load_checkpoint(files[max(files)]) if files else None
    if own is not None:
        return own, own
    path = setup_file(folder, engine.own_party)
    return None, (load_checkpoint(path) if path.is_file() else None)


def last_checkpoint_note(run: Run, out: Path | None) -> str:
    """Which checkpoint a run that failed can be resumed from, for its error message."""
    if out is None:
        return "No checkpoint was written (no run folder)."
    party = run.engine.own_party
    if party is None:
        path = simulator_checkpoint(out)
        found = path if path.is_file() else None
    else:
        files = checkpoint_files(out, party)
        found = files[max(files)] if files else None
    if found is None:
        return "No checkpoint had been written yet."
    return f"The last good checkpoint is {found}."
