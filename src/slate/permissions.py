"""Files that hold a site's data are private to the user that runs it, whatever the umask.

A run folder holds the site's model, its checkpoints (its model and state), its set-up records
(every site's counts) and its outputs: it is created ``0700`` and everything in it ``0600``.
:func:`private_files` sets the process's umask to ``077`` while a block writes (files and
folders it creates get no group or other bits), and :func:`private_folder` makes a folder and
sets its mode, also when it existed already.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PRIVATE_FILE", "PRIVATE_FOLDER", "private_files", "private_folder"]

PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600
_PRIVATE_UMASK = 0o077


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Within the block, new files are created ``0600`` and new folders ``0700`` (at most)."""
    previous = os.umask(_PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def private_folder(path: Path | str) -> Path:
    """``path`` created (with its missing parents) and set to ``0700``."""
    folder = Path(path)
    with private_files():
        folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(PRIVATE_FOLDER)
    return folder
