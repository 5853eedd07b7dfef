"""``python wire_capture.py OUT train ...``: ``slate`` with every payload it hands to
``torch.distributed`` (``batch_isend_irecv``'s sends, ``all_reduce``, ``all_gather``,
``broadcast``; a run without a lost party sends nothing else) appended to ``OUT`` as it is handed
over (length-prefixed raw bytes), for the confidentiality test of sealed runs
(tests/security/test_sealed_runs.py)."""

from __future__ import annotations

import runpy
import struct
import sys

import torch
import torch.distributed as dist

OUT = open(sys.argv[1], "ab", buffering=0)  # noqa: SIM115 (the process ends with os._exit)


def record(tensor: torch.Tensor) -> None:
    data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
    OUT.write(struct.pack("<Q", len(data)) + data)


def wrap(name: str, pick):
    original = getattr(dist, name)

    def patched(*args, **kwargs):
        for tensor in pick(*args, **kwargs):
            record(tensor)
        return original(*args, **kwargs)

    setattr(dist, name, patched)


wrap("batch_isend_irecv", lambda ops: [op.tensor for op in ops if op.op.__name__ == "isend"])
wrap("all_reduce", lambda tensor, *a, **k: [tensor])
wrap("all_gather", lambda parts, tensor, *a, **k: [tensor])
wrap("broadcast", lambda tensor, *a, **k: [tensor])

sys.argv = ["slate", *sys.argv[2:]]
runpy.run_module("slate", run_name="__main__")
