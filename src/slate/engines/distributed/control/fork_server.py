"""Imported by the launcher's fork server alone, after everything else it preloads
(:func:`~slate.engines.distributed.control.workers.preloaded` names it last): it moves the
preloaded objects out of the garbage collector's reach (:func:`gc.freeze`), now and again at the
server's exit.

**In the workers.** A worker is a fork of the server, so the pages holding torch's and slate's
objects are shared with the server until something writes to them. A collection of the oldest
generation in a worker walks every object it tracks and writes to each one's header: it copies
all of those pages and costs the worker about 0.3 s of CPU (measured on a 2-core machine: a full
collection in a fork of a process that loaded slate, 0.30 s of CPU and 16 850 page faults; after
:func:`gc.freeze` in the parent, 0.024 s and 480). Frozen objects are never collected; they are
the modules every worker keeps until it ends. This is the use :func:`gc.freeze`'s documentation
describes: freeze right before forking, so that forks share the parent's pages.

**At the server's exit.** The server ends when the launcher does. Without this, an interpreter
that has imported torch and slate spends one to three seconds of CPU at exit in the collector's
passes over those objects (``python -c "import torch"`` ends 2.9 s after its last line, 0.55 s
with :func:`gc.freeze` first), while it still holds the launcher's standard output and error:
a caller reading them (a pipe, ``subprocess.run``) waits that long. The server owns no file and
no resource that only a collection would release; its forks end with ``os._exit`` and run no exit
handler.
"""

from __future__ import annotations

import atexit
import gc

gc.freeze()
atexit.register(gc.freeze)
