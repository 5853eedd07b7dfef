"""Tensors through a :class:`~slate.security.sealing.SealedChannel`: what the engines send is a
``uint8`` tensor of the sealed bytes, and what they receive opens back into the tensor sent.

The sealing itself (keys, nonces from the round counter, associated data binding run,
generation, sender, receiver and round) lives in :mod:`slate.security.sealing`, which
imports no torch. This module only moves a tensor's bytes in and out: any dtype, any shape, the
bits unchanged (NaN payloads, infinities and negative zeros included). A sealed tensor has
:func:`sealed_numel` elements, the plaintext's bytes plus the 16-byte tag, so a receiver can
allocate its buffer before the message arrives.
"""

from __future__ import annotations

import torch
from torch import Tensor

from slate.security.sealing import SealedChannel, sealed_size

__all__ = ["open_tensor", "seal_tensor", "sealed_numel", "tensor_bytes"]


def tensor_bytes(tensor: Tensor) -> memoryview:
    """The bytes of ``tensor`` in row-major order, as a 1-D byte view: of its own memory
    (writable) when it is contiguous on the CPU, else of a copy."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        tensor = tensor.contiguous().cpu()
    if tensor.numel() == 0:
        return memoryview(b"")
    try:  # the quick way: numpy's buffer (a few torch calls cost more than sealing 1 KB)
        view = memoryview(tensor.numpy())
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except (TypeError, ValueError, RuntimeError):  # a dtype without a numpy or buffer format
        return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def sealed_numel(numel: int, dtype: torch.dtype) -> int:
    """Bytes (``uint8`` elements) of the sealed message of a tensor of ``numel`` elements of
    ``dtype``."""
    return sealed_size(numel * _itemsize(dtype))


def seal_tensor(channel: SealedChannel, tensor: Tensor, round: int) -> Tensor:
    """``tensor``'s bytes sealed for the channel's peer in ``round``, as a 1-D ``uint8`` CPU
    tensor of :func:`sealed_numel` elements (ready for ``isend``), written in place."""
    plain = tensor_bytes(tensor)
    out = torch.empty(sealed_size(plain.nbytes), dtype=torch.uint8)
    channel.seal_into(plain, round, tensor_bytes(out))
    return out


def open_tensor(
    channel: SealedChannel,
    sealed: Tensor | bytes,
    round: int,
    dtype: torch.dtype,
    shape: tuple[int, ...] | torch.Size,
) -> Tensor:
    """The tensor of ``dtype`` and ``shape`` that the channel's peer sealed in ``round``, from
    ``sealed`` (the received ``uint8`` tensor, or bytes), on the CPU. Raises
    :class:`~slate.security.sealing.SealedMessageRefused` naming the peer when it does not open,
    and ``ValueError`` when its size does not fit ``dtype`` and ``shape``."""
    raw = tensor_bytes(sealed) if isinstance(sealed, Tensor) else memoryview(sealed)
    expected = sealed_numel(_numel(shape), dtype)
    if raw.nbytes != expected:
        raise ValueError(
            f"a sealed message of {raw.nbytes} bytes cannot hold {dtype} of shape "
            f"{tuple(shape)} ({expected} bytes sealed)"
        )
    out = torch.empty(tuple(shape), dtype=dtype)
    channel.open_into(raw, round, tensor_bytes(out) if out.numel() else bytearray())
    return out


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _numel(shape: tuple[int, ...] | torch.Size) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count
