"""What a run reports as it goes, besides its console lines: the log, the live files, the scalars.

* ``run.log`` in the run folder: one line per event (start, evaluation, checkpoint, a party lost
  or back, stop, end) of the ``slate`` logger hierarchy, each with its time, level, the party
  (``rank``) and the iteration; ``--log-level`` (debug, info, warning, error) sets its threshold.
  The console lines are printed as before; the log is written in addition.
* ``history.csv`` grows by a row at every evaluation, and ``summary.json`` says ``"state":
  "running"`` with the latest row while the run goes; at the end the run folder's own files
  replace them (``"state": "done"``), or the state becomes ``"stopped"`` (SIGINT, SIGTERM) or
  ``"failed"``.
* ``--tensorboard DIR``: every evaluation's AP, training loss, bytes sent and, under
  ``--dp-epsilon``, the privacy spent, as scalars of a ``torch.utils.tensorboard.SummaryWriter``
  (the ``tensorboard`` package: ``pip install 'slate[tensorboard]'``).
* the progress bar (:class:`Progress`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slate.errors import ConfigError, RunInterrupted
from slate.permissions import private_files, private_folder
from slate.training.outputs import write_history

if TYPE_CHECKING:
    from slate.training.run import Run

__all__ = [
    "LOGGER",
    "LOG_FORMAT",
    "LOG_LEVELS",
    "RUN_LOG",
    "Progress",
    "Reporter",
    "check_reporting",
]

#: The root of slate's loggers: ``slate.run`` reports a run's events.
LOGGER = logging.getLogger("slate")
LOGGER.addHandler(logging.NullHandler())  # (a library's own: nothing reaches Python's last resort)
RUN_EVENTS = logging.getLogger("slate.run")
RUN_LOG = "run.log"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMAT = "%(asctime)s %(levelname)s rank=%(rank)s iteration=%(iteration)s %(name)s: %(message)s"
INSTALL = "pip install 'slate[tensorboard]' (or: pip install tensorboard)"


def check_reporting(log_level: str, tensorboard: str | None) -> None:
    """Refuse, before training, a ``--log-level`` slate does not know, and ``--tensorboard``
    where the ``tensorboard`` package is missing, each in one paragraph."""
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}.")
    if tensorboard is not None and not _have_tensorboard():
        raise ConfigError(
            f"--tensorboard {tensorboard} writes the run's scalars with torch's SummaryWriter, "
            f"which needs the tensorboard package, and it is not installed here. Install it with "
            f"{INSTALL}, or train without --tensorboard."
        )


def _have_tensorboard() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class _Position(logging.Filter):
    """Stamps each record with the party and the iteration of the run now (unless the call gave
    its own ``rank`` and ``iteration``)."""

    def __init__(self, where: Callable[[], tuple[int, int]]) -> None:
        super().__init__()
        self.where = where

    def filter(self, record: logging.LogRecord) -> bool:
        rank, iteration = self.where()
        record.__dict__.setdefault("rank", rank)
        record.__dict__.setdefault("iteration", iteration)
        return True


class Reporter:
    """One run's ``run.log``, live ``history.csv`` and ``summary.json``, and scalars.

    ``out`` is None where this process writes no folder (a party that is not the main one, a
    candidate run of ``--lr auto``): it then logs to the ``slate`` loggers alone."""

    def __init__(self, run: Run, out: Path | None) -> None:
        self.run, self.folder = run, out
        self.written = 0  # history rows in the live history.csv
        self.handler: logging.Handler | None = None
        self.level = LOGGER.level
        self.scalars: Any = None

    @property
    def out(self) -> Path | None:
        """The run folder where this process writes it (the main party moves to the lowest
        surviving one after a loss), else None."""
        return self.folder if self.run.writes_outputs else None

    def where(self) -> tuple[int, int]:
        return self.run.engine.local_parties[0], self.run.iteration

    def open(self) -> None:
        """Start ``run.log`` (appended: a resumed run adds to it) and the SummaryWriter."""
        flags = self.run.flags
        check_reporting(flags.log_level, flags.tensorboard)
        LOGGER.setLevel(flags.log_level.upper())
        if self.out is not None:
            private_folder(self.out)
            with private_files():
                self.handler = logging.FileHandler(self.out / RUN_LOG, encoding="utf-8")
            self.handler.setFormatter(logging.Formatter(LOG_FORMAT))
            self.handler.addFilter(_Position(self.where))
            LOGGER.addHandler(self.handler)
            if flags.tensorboard is not None:
                from torch.utils.tensorboard import SummaryWriter

                rank = str(self.run.engine.local_parties[0])  # (one folder per site)
                self.scalars = SummaryWriter(log_dir=flags.tensorboard.replace("{rank}", rank))

    def close(self) -> None:
        """Close the log and the SummaryWriter; the ``slate`` logger's level is restored."""
        if self.handler is not None:
            LOGGER.removeHandler(self.handler)
            self.handler.close()
            self.handler = None
        if self.scalars is not None:
            self.scalars.close()
            self.scalars = None
        LOGGER.setLevel(self.level)

    def event(self, message: str, level: int = logging.INFO) -> None:
        """One line of ``run.log``."""
        RUN_EVENTS.log(level, message)

    def evaluated(self) -> None:
        """The history's new row: logged, appended to ``history.csv`` (rewritten when the
        history is not the file's plus one row: a resume, a roll-back), ``summary.json`` with
        ``"state": "running"``, and the scalars."""
        run = self.run
        row = run.history[-1]
        self.event(f"evaluation: {_row_text(row)}")
        self.status("training")
        if self.out is None:
            return
        with private_files():
            path = self.out / "history.csv"
            if len(run.history) == self.written + 1 and path.is_file():
                write_history(path, [row], run.validated, append=True)
            else:
                write_history(path, run.history, run.validated)
            self.written = len(run.history)
            self.write_state("running")
        if self.scalars is not None:
            self._scalars(row)

    def status(self, state: str, **more: Any) -> None:
        """This site's status for ``slate status``: ``state``, the iteration, the latest pooled
        AP (and ``more``), handed to the engine that publishes it."""
        run = self.run
        latest = run.history[-1]["test_ap"] if run.history else None
        run.engine.note_status(state=state, iteration=run.iteration, pooled_ap=latest,
                               iterations=run.settings.algorithm.iterations, **more)  # fmt: skip

    def _scalars(self, row: dict[str, float]) -> None:
        step, writer = int(row["iteration"]), self.scalars
        writer.add_scalar("ap/validation" if self.run.validated else "ap/pooled", row["test_ap"],
                          step)  # fmt: skip
        if not math.isnan(row["train_loss"]):
            writer.add_scalar("loss/train", row["train_loss"], step)
        writer.add_scalar("bytes/sent_per_party", row["comm_bytes_per_party"], step)
        if self.run.ledger is not None:
            writer.add_scalar("privacy/epsilon", self.run.ledger.summary()["epsilon"], step)
        writer.flush()

    def finished(self, summary: dict[str, Any]) -> None:
        """The end: each party's own AP as scalars (where computed) and the end's log line."""
        if self.scalars is not None:
            step = summary["iterations"]
            for key in ("party_ap_min", "party_ap_max"):
                if summary.get(key) is not None:
                    self.scalars.add_scalar(f"ap/own_{key[9:]}", summary[key], step)
            self.scalars.flush()
        self.status("training")
        self.event(f"end: test AP {summary['test_ap']:.4f}, state {summary['state']}")

    def write_state(self, state: str) -> None:
        """``summary.json`` while the run goes or after it stopped: the state, what runs and
        the latest history row (the finished run's summary replaces it)."""
        if self.out is None:
            return
        run = self.run
        summary = {
            "state": state,
            "dataset": run.flags.dataset,
            "algorithm": run.flags.algorithm,
            "engine": run.engine.name,
            "nodes": run.flags.nodes,
            "iteration": run.iteration,
            "iterations": run.settings.algorithm.iterations,
            "latest": run.history[-1] if run.history else None,
        }
        path = self.out / "summary.json"
        partial = path.with_suffix(".partial")
        with private_files():
            partial.write_text(json.dumps(summary, indent=2))
        partial.replace(path)  # (a reader never sees half a file)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Log how the training ends and, where it stops early, say so in ``summary.json``:
        ``"stopped"`` (SIGINT, SIGTERM), ``"failed"`` (any other error)."""
        try:
            yield
        except RunInterrupted:
            self.event("stop: interrupted (SIGINT or SIGTERM); checkpoint written")
            self.write_state("stopped")
            raise
        except BaseException as err:
            self.event(f"failed: {type(err).__name__}: {str(err)[:300]}", logging.ERROR)
            with contextlib.suppress(OSError):
                self.write_state("failed")
            raise


def _row_text(row: dict[str, float]) -> str:
    keys = ("test_ap", "test_auroc", "train_loss", "consensus_distance", "comm_bytes_per_party")
    return ", ".join(f"{k} {row[k]:.6g}" for k in keys)


class Progress:
    """The progress bar: at every site when each party runs at its own site (per-party files,
    where each console is its own), else on whichever process is the main one now (it moves to
    the lowest surviving party when party 0 is lost)."""

    def __init__(self, run: Run, enabled: bool) -> None:
        self.run, self.enabled, self.bar = run, enabled, None

    def show(self, postfix: str | None = None) -> None:
        if not (self.enabled and (self.run.engine.is_main or self.run.data.federated)):
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            # One process writes this bar: a thread lock, not tqdm's default, which also makes a
            # multiprocessing lock (a named semaphore). A party process ends with os._exit, so
            # that semaphore was never released and the launcher's resource tracker reported it
            # as leaked at the end of every clean run.
            tqdm.set_lock(threading.RLock())
            total = self.run.settings.algorithm.iterations
            self.bar = tqdm(total=total, initial=self.run.iteration, unit="it",
                            dynamic_ncols=True)  # fmt: skip
        self.bar.n = self.run.iteration
        if postfix is not None:
            self.bar.set_postfix(ap=postfix, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
