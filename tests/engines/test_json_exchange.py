"""JSON facts gathered between processes (slate.engines.distributed.wire.json_exchange): texts
that fit the first message take one exchange, longer ones two, on every member alike; what
arrives equals every member's items in member order (the JSON round trip of what was sent); a
length over the limit is refused, naming its sender, before any second exchange."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from slate.engines.distributed.wire.json_exchange import FIRST_MESSAGE, gather_json
from slate.security.messages import ANY, MalformedMessage, encode

MEMBERS = (0, 1, 2)


class Exchange:
    """An all-gather among threads, one per member, counting the exchanges each makes."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n)
        self.slots: list[torch.Tensor | None] = [None] * n
        self.calls = [0] * n

    def for_member(self, k: int):
        def all_gather(value: torch.Tensor) -> list[torch.Tensor]:
            self.calls[k] += 1
            self.slots[k] = value.clone()
            self.barrier.wait()
            parts = [s.clone() for s in self.slots]
            self.barrier.wait()  # nobody overwrites a slot before everyone has read it
            return parts

        return all_gather


def gather_all(items_of: list[list], limit: int = 1 << 20) -> tuple[list, list[int]]:
    """Every member's result of gather_json (or the error it raised), and its exchange count."""
    exchange = Exchange(len(MEMBERS))
    results: list = [None] * len(MEMBERS)

    def member(k: int) -> None:
        try:
            results[k] = gather_json(items_of[k], ANY, "test facts", limit, MEMBERS,
                                     exchange.for_member(k))  # fmt: skip
        except MalformedMessage as err:
            results[k] = err

    threads = [threading.Thread(target=member, args=(k,)) for k in range(len(MEMBERS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results, exchange.calls


def expected(items_of: list[list]) -> list:
    return [item for items in items_of for item in json.loads(json.dumps(items))]


def test_short_texts_take_one_exchange():
    items_of = [[{"rank": k, "lr": 0.1 * k, "name": "é" * k}] for k in range(3)]
    results, calls = gather_all(items_of)
    assert calls == [1, 1, 1]
    assert all(r == expected(items_of) for r in results)


@pytest.mark.parametrize("long_member", [0, 2])
def test_one_long_text_makes_every_member_take_a_second_exchange(long_member):
    items_of = [[k, "x"] for k in range(3)]
    items_of[long_member] = [long_member, "y" * (3 * FIRST_MESSAGE)]
    results, calls = gather_all(items_of)
    assert calls == [2, 2, 2]
    assert all(r == expected(items_of) for r in results)


def test_a_text_that_just_fits_takes_one_exchange_and_one_byte_more_two():
    room = FIRST_MESSAGE - 8  # (the first message starts with the length, an int64)
    for size, exchanges in ((room, 1), (room + 1, 2)):
        text = "z" * (size - len(encode([""])))
        items_of = [[text]] * 3
        assert len(encode(items_of[0])) == size
        results, calls = gather_all(items_of)
        assert calls == [exchanges] * 3
        assert all(r == expected(items_of) for r in results)


def test_a_length_over_the_limit_is_refused_naming_its_sender_after_one_exchange():
    items_of = [[0], ["w" * 5000], [2]]
    results, calls = gather_all(items_of, limit=4000)
    assert calls == [1, 1, 1]
    for r in results:
        assert isinstance(r, MalformedMessage) and "1" in str(r) and "limit 4000" in str(r)
