"""Native messages (gloo, c10d) of a party process go to a debug log, not to the user.

torch's C++ layers write warnings and stack traces straight to file descriptor 2: a site that
loses its rendezvous prints some 40 lines of C++ frames, and every site on a real network prints
"hostname of the client socket cannot be retrieved". slate handles these faults itself and says
what happened in one paragraph, so a party process started from the command line points file
descriptor 2 at ``debug-rank<r>.log`` in its run folder, while Python's ``sys.stderr`` (slate's
own messages, and any traceback of a bug) keeps writing to the terminal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from slate.permissions import PRIVATE_FILE, private_folder

__all__ = ["DEBUG_LOG", "send_native_stderr_to"]

DEBUG_LOG = "debug-rank{rank}.log"


def send_native_stderr_to(folder: Path, rank: int) -> Path | None:
    """Redirect file descriptor 2 to ``folder/debug-rank<rank>.log`` (appended), keeping
    ``sys.stderr`` on the original stream; returns the log's path. Where ``sys.stderr`` is
    not the process's own (a caller captures it, as a test does), nothing is changed: None."""
    if sys.stderr is not sys.__stderr__:
        return None
    private_folder(folder)
    path = folder / DEBUG_LOG.format(rank=rank)
    sys.stderr.flush()
    terminal = os.dup(2)
    sys.stderr = os.fdopen(
        terminal, "w", buffering=1, encoding=sys.stderr.encoding or "utf-8",
        errors="backslashreplace",
    )  # fmt: skip
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
    os.chmod(path, PRIVATE_FILE)  # (a log from an earlier start keeps no wider mode)
    os.dup2(log, 2)
    os.close(log)
    return path
