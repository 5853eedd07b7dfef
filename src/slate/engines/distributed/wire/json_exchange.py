"""Small JSON facts between the distributed engine's processes, in ``uint8`` tensors.

The parties exchange schemas, counts, fingerprints and welcome records as JSON text in tensors
(:func:`gather_json`, :func:`broadcast_json`, :func:`broadcast_text`): first the lengths, then
the padded texts. Each sender's text is checked for its length, parsed and checked against its
expected shape on arrival (:mod:`slate.security.messages`), naming the sender when it is
malformed. Nothing is unpickled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from slate.security.messages import ListOf, MalformedMessage, decode, encode

__all__ = ["broadcast_json", "broadcast_text", "check_sizes", "gather_json"]


def gather_json(
    items: list[Any],
    shape: Any,
    what: str,
    limit: int,
    members: tuple[int, ...],
    all_gather: Callable[[Tensor], list[Tensor]],
) -> list[Any]:
    """Every member's ``items``, concatenated in member order (two all-gathers: the lengths,
    then the padded texts)."""
    data = encode(items)
    sizes = all_gather(torch.tensor([len(data)], dtype=torch.int64))
    check_sizes(sizes, limit, what, members)
    width = max(int(s) for s in sizes)
    padded = torch.zeros(width, dtype=torch.uint8)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    texts = all_gather(padded)
    out: list[Any] = []
    for member, size, text in zip(members, sizes, texts, strict=True):
        raw = text[: int(size)].numpy().tobytes()
        out += decode(raw, ListOf(shape), member, what, limit)
    return out


def broadcast_json(
    value: Any,
    source: int,
    shape: Any,
    what: str,
    limit: int,
    sending: bool,
    broadcast: Callable[[Tensor], None],
) -> Any:
    """``value`` of party ``source`` (``sending``: this process is it) on every member (two
    broadcasts from it: the length, then the text), checked against ``shape`` on arrival."""
    data = encode(value) if sending else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    broadcast(size)
    check_sizes([size[0]], limit, what, [source])
    text = torch.zeros(int(size[0]), dtype=torch.uint8)
    if data:
        text[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    broadcast(text)
    return decode(text.numpy().tobytes(), shape, source, what, limit)


def check_sizes(sizes: Any, limit: int, what: str, senders: Any) -> None:
    """Every announced length lies in ``1..limit``, else the sender's message is malformed."""
    for member, size in zip(senders, sizes, strict=True):
        if not 0 < int(size) <= limit:
            problem = f"a length of {int(size)} bytes (limit {limit})"
            raise MalformedMessage(member, what, problem)


def broadcast_text(text: str | None, limit: int = 4096) -> str:
    """Rank 0's ``text`` on every process of the default group (as JSON in tensors; no
    pickle): a torchrun run's folder name, chosen by rank 0."""
    data = encode(text or "") if dist.get_rank() == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, src=0)
    if not 0 < int(size) <= limit:
        raise MalformedMessage(0, "run folder name", f"a length of {int(size)} bytes")
    buf = torch.zeros(int(size), dtype=torch.uint8)
    if data:
        buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.broadcast(buf, src=0)
    return decode(buf.numpy().tobytes(), str, 0, "run folder name", limit)
