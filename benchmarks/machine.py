"""What a benchmark ran on, for the lines of RESULTS.md."""

from __future__ import annotations

from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``unknown CPU`` elsewhere)."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"
