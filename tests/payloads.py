"""Searches of what sites opened (``SLATE_RECORD_OPENED``, :mod:`slate.faults.opened`) for a
planted value or text, in every encoding a payload could carry it in: JSON text, UTF-8 and
UTF-16 text, int64 (its roundings, and the masked sums' fixed point), float32 and float64, in
both byte orders."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path


def encodings(value: float) -> dict[str, bytes]:
    """``value`` as the bytes a payload could carry it in."""
    found = {"json text": repr(value).encode(), "json text (g)": f"{value:g}".encode()}
    for order, mark in (("little", "<"), ("big", ">")):
        found[f"float64 {order}"] = struct.pack(mark + "d", value)
        found[f"float32 {order}"] = struct.pack(mark + "f", value)
        for whole in {math.floor(value), math.ceil(value)}:
            found[f"int64 {whole} {order}"] = struct.pack(mark + "q", whole)
        for bits in (32, 40):  # the masked sums' fixed point (slate.security.masking)
            found[f"fixed point 2^{bits} {order}"] = struct.pack(mark + "q", round(value * 2**bits))
    return found


def text_encodings(text: str) -> dict[str, bytes]:
    """``text`` as the bytes a payload could carry it in."""
    return {
        "utf-8": text.encode(),
        "json": json.dumps(text).encode(),
        "utf-16 le": text.encode("utf-16-le"),
        "utf-16 be": text.encode("utf-16-be"),
    }


def holding(opened: Path, value: float | str, site: int) -> list[str]:
    """Every payload a site other than ``site`` opened that holds ``value`` (a number or a
    text) in one of its encodings, as ``file: encoding``."""
    forms = text_encodings(value) if isinstance(value, str) else encodings(value)
    found = []
    for path in sorted(opened.glob("rank*/*.bin")):
        if path.parent.name == f"rank{site}":
            continue
        payload = path.read_bytes()
        found += [f"{path.parent.name}/{path.name}: {name}"
                  for name, data in forms.items() if data in payload]  # fmt: skip
    return found
