"""What a peer may send: JSON against a declared shape (``slate.security.messages``), and the
two engines' exchanges of it."""

from __future__ import annotations

import json

import pytest

from slate.data.schema import SCHEMA_SHAPE, PartyCounts, Schema
from slate.engines.simulator import SimulatorEngine
from slate.security.messages import (
    ANY,
    ListOf,
    MalformedMessage,
    MapOf,
    as_received,
    decode,
    encode,
)
from slate.training.agreement import FINGERPRINT_SHAPE

SHAPE = {"rank": int, "rate": float, "note": (str, None), "items": ListOf([int, str], 3),
         "counts": MapOf(int, 4, int_keys=True), "free": ANY}  # fmt: skip
GOOD = {"rank": 2, "rate": 1, "note": None, "items": [[1, "a"]], "counts": {"-3": 4},
        "free": {"x": [1, {"y": None}]}}  # fmt: skip


def refused(value, shape=SHAPE, limit: int = 1 << 20) -> str:
    with pytest.raises(MalformedMessage) as caught:
        decode(encode(value), shape, 5, "test message", limit)
    assert caught.value.sender == 5 and "Party 5 sent a malformed test message" in str(caught.value)
    return caught.value.problem


def test_a_message_of_the_shape_arrives_as_sent():
    assert decode(encode(GOOD), SHAPE, 0, "test message", 1 << 20) == GOOD


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"rank": True}, "the message.rank is a bool"),  # a bool is not an int
        ({"rank": 2.0}, "the message.rank is a float"),
        ({"rate": "1"}, "the message.rate is a str"),
        ({"note": 3}, "expected one of ['str', 'null']"),
        ({"items": [[1, "a"]] * 4}, "4 items, over the limit of 3"),
        ({"items": [[1]]}, "the message.items[0] is a list, expected a list of 2 values"),
        ({"items": [["1", "a"]]}, "the message.items[0][0] is a str"),
        ({"counts": {"x": 1}}, "has the key 'x', expected an integer"),
        ({"counts": {"1": 1.5}}, "is a float, expected int"),
        ({"extra": 1}, "has the unexpected fields ['extra']"),
    ],
)
def test_every_wrong_value_is_named_where_it_is(change, where):
    assert where in refused({**GOOD, **change})


def test_a_missing_field_is_named():
    assert "lacks the fields ['free']" in refused({k: v for k, v in GOOD.items() if k != "free"})


def test_what_is_not_json_or_too_long_is_refused_before_it_is_parsed():
    with pytest.raises(MalformedMessage, match="not JSON"):
        decode(b"\x80\x04\x95 a pickle", SHAPE, 1, "test message", 1 << 20)
    with pytest.raises(MalformedMessage, match="over the limit of 10"):
        decode(b"[" * 11, SHAPE, 1, "test message", 10)
    with pytest.raises(MalformedMessage):  # nesting that would exhaust the parser
        decode(b"[" * 100_000 + b"]" * 100_000, ANY, 1, "test message", 1 << 20)
    deep = json.dumps([[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])
    nested = ListOf(ListOf(ListOf(ListOf(ANY))))
    for _ in range(30):
        nested = ListOf(nested)
    with pytest.raises(MalformedMessage, match="nested more than"):
        decode(deep.encode(), nested, 1, "test message", 1 << 20)


def test_a_schema_survives_the_wire_and_a_wrong_one_does_not():
    schema = Schema(rank=3, format="csv", n_features=4, header=("a", "y"), label_column="y",
                    label_values=("0", "1"), positive_label="1", text_columns=("a",),
                    counts=PartyCounts(10, 2, 5, 1))  # fmt: skip
    raw = decode(encode(schema.to_json()), SCHEMA_SHAPE, 3, "schema", 1 << 20)
    assert Schema.from_json(raw) == schema
    bad = {**schema.to_json(), "counts": {"train": "10"}}
    with pytest.raises(MalformedMessage, match="counts"):
        decode(encode(bad), SCHEMA_SHAPE, 3, "schema", 1 << 20)


def test_the_simulator_exchanges_through_the_same_encoding():
    """Tuples arrive as lists and keys as strings in both engines alike."""
    engine = SimulatorEngine(2)
    sent = [[0, {"lr": 0.1, "compress": ("topk", 0.1)}], [1, {"lr": 0.1, "compress": None}]]
    got = engine.gather_json(sent, FINGERPRINT_SHAPE, "run's settings")
    assert got == as_received(sent) and got[0][1]["compress"] == ["topk", 0.1]
    with pytest.raises(MalformedMessage, match="run's settings"):
        engine.gather_json([["zero", {}]], FINGERPRINT_SHAPE, "run's settings")
