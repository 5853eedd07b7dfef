"""The run agreement (slate.training.agreement): every site's settings and the declarations it
received, compared before step 1."""

from __future__ import annotations

import dataclasses

import pytest

from slate.config import TrainConfig
from slate.training.agreement import RunMismatch, check_same_run, run_fingerprint
from slate.training.configuration import resolve_and_check


def fingerprints(declared_by_receiver: list[list[str]], **changed):
    config = resolve_and_check(TrainConfig(dataset="digits", nodes=3)).flags
    out = []
    for rank, digests in enumerate(declared_by_receiver):
        flags = dataclasses.replace(config, **changed) if rank == 2 else config
        out.append((rank, run_fingerprint(flags, None, digests)))
    return out


def test_the_same_settings_and_declarations_agree():
    same = ["a1", "b1", "c1"]
    check_same_run(fingerprints([same, same, same]))


def test_a_site_that_declared_differently_to_different_sites_is_named():
    """Party 1 sent one declaration to party 0 and another to parties 1 and 2: whichever order
    the fingerprints come in, party 1 is the one named."""
    seen = [["a1", "b1", "c1"], ["a1", "b2", "c1"], ["a1", "b2", "c1"]]
    with pytest.raises(RunMismatch, match="Party 1 sent different declarations") as caught:
        check_same_run(list(reversed(fingerprints(seen))))
    assert "no" in str(caught.value) and "trained" in str(caught.value)


def test_a_changed_flag_is_named_with_both_values():
    same = ["a", "b", "c"]
    with pytest.raises(RunMismatch, match=r"party 2 has --lr 0\.5 where party 0 has"):
        check_same_run(fingerprints([same, same, same], lr=0.5))
