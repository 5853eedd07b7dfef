"""The digests compared after every masked sum (:mod:`slate.security.sum_digests`)."""

from __future__ import annotations

import numpy as np

from slate.security.sum_digests import DIGEST_BYTES, digest_report, equivocation

MEMBERS = (0, 1, 2, 3)


def contributions() -> list[np.ndarray]:
    return [np.arange(5, dtype=np.int64) * (k + 1) for k in MEMBERS]


def reports_of(views: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Each member's report of what it received (``views[r]``: every contribution it holds)."""
    return [digest_report(np.sum(view, axis=0), view) for view in views]


def test_equal_totals_pass_and_a_report_is_one_digest_per_member_and_the_total():
    parts = contributions()
    reports = reports_of([parts] * len(MEMBERS))
    assert reports[0].dtype == np.uint8 and reports[0].size == DIGEST_BYTES * (1 + len(MEMBERS))
    assert equivocation(reports, MEMBERS, "evaluation") is None


def test_an_equivocating_sender_is_named_and_no_one_else():
    parts = contributions()
    other = list(parts)
    other[2] = parts[2] + 1  # party 2 sent party 3 another contribution
    reports = reports_of([parts, parts, parts, other])
    error = equivocation(reports, MEMBERS, "evaluation")
    assert error is not None
    text = str(error)
    assert "The masked sum of the evaluation was dropped" in text
    assert "Party 2 sent different contributions" in text
    assert "Party 0 sent" not in text and "party 1 sent" not in text.lower()
    assert "parties 0-2 hold total A; party 3 holds total B" in text


def test_a_member_that_lies_about_its_total_is_named_as_such():
    parts = contributions()
    reports = reports_of([parts] * len(MEMBERS))
    reports[1] = digest_report(np.zeros(5, dtype=np.int64), parts)
    text = str(equivocation(reports, MEMBERS, "statistics"))
    assert "a member lies in its report of the total" in text
