"""Process-wide memory settings for slate's own commands (never applied on import).

A model of a few hundred thousand parameters stacked for 20 parties makes buffers of tens of
megabytes (the MNIST CNN: 20 x 426 571 floats, 34 MB), allocated and freed every iteration.
glibc serves blocks above its mmap threshold (at most 32 MB) with fresh ``mmap`` pages and
returns them on ``free``, so every such buffer is page-faulted in again: 8 ms for 34 MB here,
against 0.7 ms for a reused one. :func:`keep_freed_memory` raises the mmap and trim thresholds so
that freed blocks stay in the heap for the next iteration. The peak memory (RSS) is unchanged;
the process simply does not hand it back between iterations. The MNIST run is 13% faster.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_THRESHOLD = 1 << 30  # 1 GiB: every per-iteration buffer of a simulated run is below it


def keep_freed_memory() -> bool:
    """Ask glibc to reuse freed large blocks instead of unmapping them; True if it could.

    A no-op (False) outside Linux or on a C library without ``mallopt`` (musl, macOS).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _THRESHOLD)
    )
