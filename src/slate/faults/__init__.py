"""Faults injected for the tests, never in a real run: the ``SLATE_*`` environment hooks, read
once into a :class:`FaultPlan` (:mod:`slate.faults.fault_plan`) that the code which injects them
receives as an argument.

``kills.py``: a party killed or frozen at a moment; ``attacks.py``: what a party sends its
neighbours, corrupted; ``lies.py``: an insider's lies in a sum; ``tamper.py``: a sealed message
flipped, replayed or relayed; ``opened.py``: the sealed messages a party opens, recorded, and
sums sent unmasked for comparison.
"""

from __future__ import annotations

from slate.faults.fault_plan import FaultPlan

__all__ = ["FaultPlan"]
