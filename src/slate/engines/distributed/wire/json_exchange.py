"""Small JSON facts between the distributed engine's processes, in ``uint8`` tensors.

The parties exchange schemas, counts, fingerprints and welcome records as JSON text in tensors
(:func:`gather_json`, :func:`broadcast_json`, :func:`broadcast_text`): a gather sends each
length with the start of its text, and the rest (if any) in a second step; a broadcast the
length, then the text. Each sender's text is checked for its length, parsed and checked against its
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

__all__ = ["FIRST_MESSAGE", "broadcast_json", "broadcast_text", "check_sizes", "gather_json"]

#: Bytes of each member's first message in :func:`gather_json`: the text's length
#: (:data:`LENGTH_BYTES`, an int64), then the text's start. w7a's schema, feature report and run
#: settings are 265, 10 and 922 bytes: one exchange each, not two (on a wide-area link each
#: exchange is a round trip).
FIRST_MESSAGE = 2048
LENGTH_BYTES = 8


def gather_json(
    items: list[Any],
    shape: Any,
    what: str,
    limit: int,
    members: tuple[int, ...],
    all_gather: Callable[[Tensor], list[Tensor]],
) -> list[Any]:
    """Every member's ``items``, concatenated in member order. One all-gather of
    :data:`FIRST_MESSAGE` bytes from each member (its text's length, then the text's start)
    serves texts that fit; when one does not, a second all-gather carries every text's rest
    (every member sees every length after the first, so all take the same branch)."""
    data = encode(items)
    room = FIRST_MESSAGE - LENGTH_BYTES
    head = torch.zeros(FIRST_MESSAGE, dtype=torch.uint8)
    head[:LENGTH_BYTES] = torch.tensor([len(data)], dtype=torch.int64).view(torch.uint8)
    _fill(head[LENGTH_BYTES:], data[:room])
    heads = all_gather(head)
    sizes = [int(h[:LENGTH_BYTES].view(torch.int64)[0]) for h in heads]
    check_sizes(sizes, limit, what, members)
    rest = max(sizes) - room
    tails = None
    if rest > 0:
        padded = torch.zeros(rest, dtype=torch.uint8)
        _fill(padded, data[room:])
        tails = all_gather(padded)
    out: list[Any] = []
    for k, (member, size, h) in enumerate(zip(members, sizes, heads, strict=True)):
        raw = h[LENGTH_BYTES : LENGTH_BYTES + min(size, room)].numpy().tobytes()
        if tails is not None and size > room:
            raw += tails[k][: size - room].numpy().tobytes()
        out += decode(raw, ListOf(shape), member, what, limit)
    return out


def _fill(buffer: Tensor, data: bytes) -> None:
    """``data`` into the start of the ``uint8`` tensor ``buffer``."""
    if data:
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)


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
