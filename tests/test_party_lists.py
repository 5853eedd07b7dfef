"""Parties named in a message: runs of ranks, a count past a few, groups by value or by message.

The reference for :func:`ranges_text` is the text read back: the numbers it names must be the
input's (or, cut short, its smallest numbers plus the count it says are left), every run must be
maximal, and a run is written ``first-last`` exactly when it holds three numbers or more. The
errors that list parties are checked at 1000 parties: on a constructed partition and on the real
``slate train --dataset w8a --nodes 1000``, each one short paragraph that names the count.
"""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slate.cli import main
from slate.data.partition import check_party_counts, make_partition
from slate.errors import (
    FEW,
    GROUPS_SHOWN,
    RUNS_SHOWN,
    DataError,
    by_party_text,
    parties_text,
    per_party_text,
    ranges_text,
)
from tests.sites import SHARED


def read_ranges(text: str) -> tuple[list[list[int]], int]:
    """The runs a ranges text writes, each as its numbers, and the count it says is left."""
    left = 0
    more = re.fullmatch(r"(.*) and (\d+) more", text)
    if more:
        text, left = more.group(1), int(more.group(2))
    runs = []
    for piece in text.split(", "):
        first, _, last = piece.partition("-")
        runs.append(list(range(int(first), int(last or first) + 1)))
    return runs, left


def read_parties(text: str, counted: bool = True) -> list[int]:
    """The ranks a parties text names (written out in full); ``counted``: as
    :func:`parties_text` writes them by default (a count in front past a few)."""
    if m := re.fullmatch(r"party (\d+)", text):
        return [int(m.group(1))]
    m = re.fullmatch(r"parties (.*)", text) or re.fullmatch(r"(\d+) parties \((.*)\)", text)
    assert m, text
    runs, left = read_ranges(m.group(m.lastindex))
    assert left == 0, text
    ranks = [r for run in runs for r in run]
    if m.lastindex == 2:
        assert int(m.group(1)) == len(ranks) > FEW, text
    else:
        assert len(ranks) > 1 and (len(ranks) <= FEW or not counted), text
    return ranks


@pytest.mark.parametrize(
    ("numbers", "text"),
    [
        ([0, 1, 2, 3, 7, 9, 10, 11], "0-3, 7, 9-11"),
        ([11, 3, 3, 9, 0, 2, 1, 10, 7], "0-3, 7, 9-11"),
        ([4, 5], "4, 5"),
        ([5], "5"),
        ([], "none"),
        (range(1000), "0-999"),
        (range(0, 1000, 2), "0, 2, 4, 6, 8, 10 and 494 more"),
    ],
)
def test_ranges_text_examples(numbers, text) -> None:
    assert ranges_text(numbers) == text


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 60), min_size=1), st.one_of(st.none(), st.integers(1, 8)))
def test_ranges_text_reads_back_as_maximal_runs(numbers: set[int], most: int | None) -> None:
    text = ranges_text(numbers, most)
    runs, left = read_ranges(text)
    shown = [n for run in runs for n in run]
    ordered = sorted(numbers)
    assert shown == ordered[: len(shown)] and left == len(ordered) - len(shown)
    pieces = text.removesuffix(f" and {left} more").split(", ")
    if most is not None:
        assert len(pieces) <= most
        assert left == 0 or len(pieces) >= most - 1  # cut short only when the pieces ran out
    else:
        assert left == 0
    for piece, run in zip(pieces, runs, strict=True):
        assert ("-" in piece) == (len(run) >= 3), text
    # Maximal: no number just after a written run is in the input, unless it is the next
    # piece of a run of two (written as two numbers) or the list was cut there.
    for k, run in enumerate(runs):
        following = run[-1] + 1
        if following in numbers and k + 1 < len(runs):
            assert len(runs[k + 1]) == 1 and runs[k + 1][0] == following, text
            assert len(run) == 1 and (following + 1 not in numbers or k + 2 == len(runs)), text


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 40), min_size=1))
def test_parties_text_names_every_party_and_counts_past_a_few(ranks: set[int]) -> None:
    text = parties_text(ranks)
    if len(ranks) == 1:
        assert text == f"party {min(ranks)}"
    elif len(ranks) <= FEW:
        assert text.startswith("parties ")
    else:
        assert text.startswith(f"{len(ranks)} parties (")
    runs, left = read_ranges(re.sub(r"^(party|parties|\d+ parties \()|\)$", "", text).strip())
    shown = [r for run in runs for r in run]
    assert shown == sorted(ranks)[: len(shown)] and len(shown) + left == len(ranks)


def test_parties_text_examples() -> None:
    assert parties_text([3]) == "party 3"
    assert parties_text([0, 1, 2, 3, 7]) == "parties 0-3, 7"
    assert parties_text(range(1000)) == "1000 parties (0-999)"
    assert parties_text(range(109, 1000), counted=False) == "parties 109-999"
    assert parties_text([]) == "no party"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, GROUPS_SHOWN - 1), min_size=1, max_size=RUNS_SHOWN + 1))
def test_per_party_text_reads_back_as_the_values(values: list[int]) -> None:
    text = per_party_text(values)
    found: dict[int, int] = {}
    groups = text.split("; ")
    for group in groups:
        who, _, value = group.rpartition(": ")
        for rank in read_parties(who):
            assert rank not in found
            found[rank] = int(value)
    assert [found[n] for n in range(len(values))] == values
    assert [int(g.rpartition(": ")[2]) for g in groups] == sorted(set(values))  # smallest first


def test_per_party_text_sums_up_past_the_shown_groups() -> None:
    values = {r: r % 7 for r in range(70)}  # 7 values, 10 parties each
    text = per_party_text(values)
    assert text.startswith("10 parties (0, 7, 14, 21, 28, 35 and 4 more): 0; ")
    assert text.endswith("; the other 30 parties: 4-6")
    assert text.count("; ") == GROUPS_SHOWN
    assert per_party_text(["b", "a", "b"]) == "parties 0, 2: b; party 1: a"


def test_by_party_text_groups_parties_with_the_same_message() -> None:
    items = [(2, "no file x."), (0, "no rows"), (1, "no rows"), (5, "e"), (3, "c"), (4, "d")]
    assert by_party_text(items) == (
        "Parties 0, 1: no rows. Party 2: no file x. Party 3: c. Party 4: d. Party 5: 1 other "
        "messages, not shown."
    )
    lead = (" could not read its data", " could not read their data")
    assert by_party_text([(1, "x"), (4, "x"), (2, "y")], lead) == (
        "Parties 1, 4 could not read their data: x. Party 2 could not read its data: y."
    )
    many = by_party_text((r, "gone") for r in range(1000))
    assert many == "1000 parties (0-999): gone."


def test_a_thousand_parties_short_of_positives_make_one_short_paragraph() -> None:
    labels = np.zeros(60000, dtype=np.int64)
    labels[::40] = 1  # 1500 positives
    parts = make_partition(labels, 1000, "stratified", seed=0)
    held = [int(labels[p].sum()) for p in parts]
    short = [n for n, k in enumerate(held) if k < 2]
    assert 0 < len(short) < 1000  # the brute-force count that the message must give
    with pytest.raises(DataError) as info:
        check_party_counts(labels, parts, positives=2, batch_size=10)
    message = str(info.value)
    assert len(message) < 600 and "\n" not in message, message
    assert f"{len(short)} of 1000 parties hold fewer" in message
    listed = re.search(r"hold fewer \((parties [^)]*)\)", message)
    assert listed and read_parties(listed.group(1), counted=False) == short, message
    for k in sorted(set(held)):
        ranks = [n for n, h in enumerate(held) if h == k]
        assert f"{parties_text(ranks)}: {k}" in message


@pytest.mark.skipif(not (SHARED / "w8a" / "w8a.gz").is_file(), reason="w8a not in shared")
def test_w8a_on_a_thousand_parties_is_refused_in_one_short_paragraph(tmp_path, capsys) -> None:
    with gzip.open(SHARED / "w8a" / "w8a.gz", "rt") as handle:
        all_positives = sum(line.startswith("+1") for line in handle)
    code = main(["train", "--dataset", "w8a", "--data-dir", str(SHARED), "--nodes", "1000",
                 "--iterations", "1", "--no-progress", "--out", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err) < 600 and "\n" not in err and "Traceback" not in err, err
    found = re.search(r"the (\d+) training positives allow (\d+) parties of 2", err)
    assert found, err
    positives = int(found.group(1))
    assert 0.74 * all_positives < positives < 0.76 * all_positives  # the 25% split's training
    assert int(found.group(2)) == positives // 2
    # Stratified: each party holds floor(P/1000) or one more, so P mod 1000 hold 2.
    assert positives < 2000
    assert f"{1000 - positives % 1000} of 1000 parties hold fewer" in err, err
