"""Imported by the launcher's fork server alone (the first module of
:data:`~slate.engines.distributed.control.workers.PRELOAD`): the server's end skips the garbage
collector's passes over everything it loaded.

The server ends when the launcher does. An interpreter that has imported torch and slate spends
one to three seconds of CPU at exit in the collector's passes over those modules' objects
(measured on a 2-core machine: ``python -c "import torch"`` ends 2.9 s after its last line, 0.55 s
with :func:`gc.freeze` first). The server holds the launcher's standard output and error, so until
it is gone a caller reading them (a pipe, ``subprocess.run``) still waits, and its CPU is taken
from the cores the next run shares. :func:`gc.freeze` at exit moves every object out of the
collector's reach; the interpreter then frees the modules as it always does. The server owns no
file and no resource that only a collection would release. (Its forks, the workers, end with
``os._exit`` and run no exit handler.)
"""

from __future__ import annotations

import atexit
import gc

atexit.register(gc.freeze)
