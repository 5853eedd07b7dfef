"""What a peer may send: JSON text checked against a declared shape, never a pickle.

Every fact that parties exchange besides tensors (schemas, row counts, run fingerprints,
checkpoint offers, the record a returning party receives) travels as UTF-8 JSON inside a
``uint8`` tensor. The receiver parses it with :func:`decode`, which refuses anything over the
exchange's byte limit, anything that is not JSON, and any value whose structure differs from
the exchange's *shape*; the error names the sender. Parsing JSON builds only lists, dicts,
strings, numbers, booleans and None: no code from a peer ever runs (contrast
``torch.distributed.all_gather_object``, which unpickles what arrives).

Shapes are plain Python values:

* ``int``, ``float`` (an int is accepted too), ``str``, ``bool``, ``None``: that scalar
  (``bool`` is never taken for an ``int``);
* a tuple of shapes: any one of them (``(str, None)``: a string or null);
* ``{"name": shape, ...}``: an object with exactly these keys;
* ``[shape_0, shape_1, ...]``: a list of exactly that many values, each of its own shape;
* :class:`ListOf` and :class:`MapOf`: a list, or an object with free string keys, of one shape;
* :data:`ANY`: any JSON value (for facts that are only compared or stored, never interpreted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slate.errors import SlateError

__all__ = [
    "ANY",
    "ListOf",
    "MalformedMessage",
    "MapOf",
    "as_received",
    "check_shape",
    "decode",
    "encode",
]

MAX_DEPTH = 32  # nesting deeper than this is refused before it is walked


class MalformedMessage(SlateError):
    """A peer sent a message that is not what the protocol allows; names the sender."""

    def __init__(self, sender: int | str, what: str, problem: str) -> None:
        self.sender, self.what, self.problem = sender, what, problem
        super().__init__(
            f"Party {sender} sent a malformed {what}: {problem}. Nothing it sent was used; a "
            "site that sends such messages runs modified or incompatible code (every site must "
            "run the same slate version)."
        )


@dataclass(frozen=True)
class ListOf:
    """A JSON list of at most ``max_items`` values of shape ``item``."""

    item: Any
    max_items: int = 1_000_000


@dataclass(frozen=True)
class MapOf:
    """A JSON object with free string keys (at most ``max_items``), each value of ``value``;
    with ``int_keys``, every key is a decimal integer (``int(key)`` cannot fail)."""

    value: Any
    max_items: int = 1_000_000
    int_keys: bool = False


ANY = object()  # any JSON value


def encode(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (tuples become lists; NaN and infinity are allowed)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def as_received(value: Any) -> Any:
    """``value`` as a peer would receive it (tuples as lists, object keys as strings)."""
    return json.loads(encode(value))


def decode(data: bytes, shape: Any, sender: int | str, what: str, limit: int) -> Any:
    """Parse ``data`` from ``sender`` and check it against ``shape``.

    Raises :class:`MalformedMessage` naming ``sender`` and ``what`` when ``data`` is longer
    than ``limit`` bytes, is not UTF-8 JSON, or does not have the shape.
    """
    if len(data) > limit:
        raise MalformedMessage(sender, what, f"{len(data)} bytes, over the limit of {limit}")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise MalformedMessage(sender, what, f"not JSON ({str(err)[:80]})") from None
    check_shape(value, shape, sender, what)
    return value


def check_shape(value: Any, shape: Any, sender: int | str, what: str) -> None:
    """Raise :class:`MalformedMessage` unless ``value`` has ``shape`` (module docstring)."""
    problem = _mismatch(value, shape, "the message", 0)
    if problem is not None:
        raise MalformedMessage(sender, what, problem)


def _mismatch(value: Any, shape: Any, where: str, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"{where} is nested more than {MAX_DEPTH} levels deep"
    if shape is ANY:
        return None
    if isinstance(shape, tuple):
        if any(_mismatch(value, one, where, depth) is None for one in shape):
            return None
        return f"{where} is {_kind(value)}, expected one of {[_name(s) for s in shape]}"
    if isinstance(shape, ListOf):
        return _list_mismatch(value, shape, where, depth)
    if isinstance(shape, MapOf):
        return _map_mismatch(value, shape, where, depth)
    if isinstance(shape, dict):
        return _record_mismatch(value, shape, where, depth)
    if isinstance(shape, list):
        return _row_mismatch(value, shape, where, depth)
    if _is_scalar(value, shape):
        return None
    return f"{where} is {_kind(value)}, expected {_name(shape)}"


def _is_scalar(value: Any, shape: Any) -> bool:
    if shape is None:
        return value is None
    if shape is bool:
        return isinstance(value, bool)
    if shape is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if shape is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return shape is str and isinstance(value, str)


def _list_mismatch(value: Any, shape: ListOf, where: str, depth: int) -> str | None:
    if not isinstance(value, list):
        return f"{where} is {_kind(value)}, expected a list"
    if len(value) > shape.max_items:
        return f"{where} holds {len(value)} items, over the limit of {shape.max_items}"
    for k, item in enumerate(value):
        problem = _mismatch(item, shape.item, f"{where}[{k}]", depth + 1)
        if problem is not None:
            return problem
    return None


def _map_mismatch(value: Any, shape: MapOf, where: str, depth: int) -> str | None:
    if not isinstance(value, dict):
        return f"{where} is {_kind(value)}, expected an object"
    if len(value) > shape.max_items:
        return f"{where} holds {len(value)} keys, over the limit of {shape.max_items}"
    for key, item in value.items():
        if shape.int_keys and not _decimal(key):
            return f"{where} has the key {key[:40]!r}, expected an integer"
        problem = _mismatch(item, shape.value, f"{where}[{key[:40]!r}]", depth + 1)
        if problem is not None:
            return problem
    return None


def _row_mismatch(value: Any, shape: list, where: str, depth: int) -> str | None:
    if not isinstance(value, list) or len(value) != len(shape):
        return f"{where} is {_kind(value)}, expected a list of {len(shape)} values"
    for k, (item, item_shape) in enumerate(zip(value, shape, strict=True)):
        problem = _mismatch(item, item_shape, f"{where}[{k}]", depth + 1)
        if problem is not None:
            return problem
    return None


def _record_mismatch(value: Any, shape: dict, where: str, depth: int) -> str | None:
    if not isinstance(value, dict):
        return f"{where} is {_kind(value)}, expected an object"
    if set(value) != set(shape):
        extra = [key[:40] for key in sorted(set(value) - set(shape))[:3]]
        missing = sorted(set(shape) - set(value))[:3]
        if extra:
            return f"{where} has the unexpected fields {extra}"
        return f"{where} lacks the fields {missing}"
    for key, item_shape in shape.items():
        problem = _mismatch(value[key], item_shape, f"{where}.{key}", depth + 1)
        if problem is not None:
            return problem
    return None


def _decimal(key: str) -> bool:
    digits = key[1:] if key.startswith("-") else key
    return 0 < len(digits) <= 18 and digits.isascii() and digits.isdigit()


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _name(shape: Any) -> str:
    if shape is None:
        return "null"
    if isinstance(shape, type):
        return shape.__name__
    return type(shape).__name__
