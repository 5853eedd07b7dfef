"""Reading the rendezvous store: one record in one round trip, and waits that hold.

torch's ``TCPStore`` has no plain read: ``get`` waits for its key first (two round trips), so a
record is read with ``compare_set`` (:func:`read`, one). Its waits can end early: torch's libuv
store (the default since torch 2.4) wakes every client waiting for a key whenever anyone calls
``compare_set`` on that key, even one that is absent, as every :func:`read` of a missing record
does, and then answers the missing key with an empty value. :func:`multi_get_within` and
:func:`read_within` therefore check an empty value and wait again while its key is missing; no
slate record is ever empty.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch.distributed as dist

__all__ = ["ABSENT", "RECORD_LIMIT", "multi_get_within", "read", "read_within", "wait_for"]

RECORD_LIMIT = 64 * 1024  # bytes: every coordination record is far smaller
POLL_SECONDS = 0.05
#: What :func:`read` asks ``compare_set`` to expect: no record is ever this text, so the store
#: answers with the record (or with this text where there is none) and changes nothing.
ABSENT = "\x00slate:absent"


def read(store: Any, key: str) -> str | None:
    """The text stored under ``key``, or None where there is none, in one round trip.

    ``compare_set(key, ABSENT, ABSENT)`` answers with the current value when there is one
    (:data:`ABSENT` is never one: it would be set to itself), and with :data:`ABSENT`, setting
    nothing, when the key is absent: one round trip where ``check`` then ``get`` take three."""
    raw = store.compare_set(key, ABSENT, ABSENT)
    text = _text(raw)
    return None if text == ABSENT else text


def read_within(store: Any, key: str, seconds: float) -> str | None:
    """The text stored under ``key``, waited for up to ``seconds`` when it is not there yet;
    None when it is still missing then. One round trip when it is there (:func:`read`); a
    missing key is waited for as :func:`multi_get_within` waits (two more)."""
    text = read(store, key)
    if text is not None or seconds <= 0:
        return text
    found = multi_get_within(store, [key], seconds)
    return None if found is None else _text(found[0])


def wait_for(store: Any, keys: list[str], seconds: float) -> bool:
    """Whether every one of ``keys`` is in the store within ``seconds`` (one round trip, plus
    the wait). A wait that ends early is not taken at its word: torch's store can wake it
    before its keys are there (:func:`multi_get_within`), so a caller that goes on to read
    the keys must still expect one to be missing."""
    try:
        store.wait(keys, datetime.timedelta(seconds=max(seconds, 0.001)))
    except (RuntimeError, dist.DistStoreError):  # (torch's DistError: the wait timed out)
        return False
    return True


def multi_get_within(store: Any, keys: list[str], seconds: float) -> list[bytes] | None:
    """Every one of ``keys``' values, once all are in the store, waited for up to ``seconds``;
    None when some key is still missing then. One ``multi_get`` with the store's timeout set to
    ``seconds``: two round trips (its own wait, then the read), where a ``wait`` and then a
    ``multi_get`` take three. A wait that times out is cancelled by the store's client, so
    the connection stays in step for the next call.

    The wait can end before every key is there: torch's libuv store (the default since torch
    2.4) wakes the clients waiting for a key whenever anyone calls ``compare_set`` on it, even
    on a key that is absent, which every :func:`read` of a missing record does; it then answers
    the missing key with an empty value. No slate record is ever empty, so an empty value is
    checked (one round trip): a key still missing is waited for again within ``seconds``, and
    only a key that is there with an empty value (written by someone else) is returned as it
    is. Before this check a clean run read another site's nonce record as empty and warned of a
    stranger."""
    deadline = time.monotonic() + seconds
    before = store.timeout
    try:
        while True:
            left = max(deadline - time.monotonic(), 0.001)
            store.set_timeout(datetime.timedelta(seconds=left))
            try:
                found = list(store.multi_get(keys))
            except (RuntimeError, dist.DistStoreError):  # (torch's DistError: timed out)
                return None
            empty = [key for key, value in zip(keys, found, strict=True) if not value]
            if not empty:
                return found
            if store.check(empty):  # there, and empty (or written since: read it again)
                try:
                    again = iter(store.multi_get(empty))
                except (RuntimeError, dist.DistStoreError):  # (deleted since, and not back)
                    return None
                return [value or next(again) for value in found]
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_SECONDS)  # (woken early: what woke it may do so again at once)
    finally:
        store.set_timeout(before)


def _text(value: bytes | str) -> str:
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * (RECORD_LIMIT + 1) if len(value) > RECORD_LIMIT else "\ufffd"
