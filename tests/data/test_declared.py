"""The sites' declarations and the sums checked against them (slate.data.declared), on sums
computed here by numpy from the sites' own rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slate.data.declared import (
    ALL_FEATURES,
    DeclarationBroken,
    Declared,
    evaluation_count_problem,
    value_ranges,
)
from slate.data.encoding import ColumnChoice, fit_features
from slate.data.preprocess import federated_moments
from slate.data.readers.table import RawTable
from slate.data.schema import PartyCounts


def sites(seed: int = 0, n: int = 3, width: int = 4):
    rng = np.random.default_rng(seed)
    blocks = [rng.uniform(-2, 5, size=(int(rng.integers(5, 40)), width)) for _ in range(n)]
    counts = [PartyCounts(len(b), 1, 10, 2) for b in blocks]
    declared = Declared.of(counts, [value_ranges(features=b) for b in blocks])
    return blocks, declared


def summing(blocks, tamper=None):
    """``total`` of a run whose other sites hold ``blocks[1:]``: their sums computed by numpy
    (``federated_moments`` of each alone), this process's own (``blocks[0]``) tampered."""

    def total(value, what=""):
        others = []
        for block in blocks[1:]:
            if what == "standardisation sums":
                others.append(torch.from_numpy(np.concatenate([[len(block)], block.sum(0)])))
            else:
                mean = summed_mean(blocks)
                others.append(torch.from_numpy(((block - mean) ** 2).sum(0)))
        mine = value if tamper is None else tamper(value.clone(), what)
        return mine + sum(others)

    return total


def summed_mean(blocks):
    pooled = np.concatenate(blocks)
    return pooled.mean(0)


def test_value_ranges_of_columns_and_of_features():
    numeric = {"age": np.array([40.0, np.nan, 17.0]), "empty": np.array([np.nan])}
    assert value_ranges(numeric=numeric) == {"age": [17.0, 40.0], "empty": None}
    x = np.array([[0.5, 0.25], [1.0, 0.75]])
    assert value_ranges(features=x) == {ALL_FEATURES: [0.0, 1.0]}  # zero included


def test_honest_sums_pass_and_give_the_pooled_moments():
    blocks, declared = sites()
    mean, std, rows = federated_moments(blocks[:1], summing(blocks), declared)
    pooled = np.concatenate(blocks)
    assert rows == len(pooled)
    np.testing.assert_allclose(mean, pooled.mean(0), rtol=1e-12)
    np.testing.assert_allclose(std, pooled.std(0), rtol=1e-9)


@pytest.mark.parametrize(
    ("tamper", "phrase"),
    [
        (lambda v, w: _scaled(v, w, "standardisation sums", 0, 1e9), "rows of the standardisation"),
        (lambda v, w: _scaled(v, w, "standardisation sums", 1, 1e6), "a mean of"),
        (lambda v, w: _scaled(v, w, "standardisation squares", slice(None), 1e10), "a variance"),
        (lambda v, w: _scaled(v, w, "standardisation squares", 2, -1.0), "a variance of -"),
    ],
)
def test_a_lie_in_a_standardisation_sum_is_refused(tamper, phrase):
    blocks, declared = sites(seed=1)
    with pytest.raises(DeclarationBroken, match=phrase) as caught:
        federated_moments(blocks[:1], summing(blocks, tamper), declared)
    assert "participant lied" in str(caught.value)


def _scaled(value, what, wanted, index, factor):
    if what == wanted:
        if factor < 0:  # a sum of squares below zero in total: impossible for honest rows
            value[index] = -1e6
        else:
            value[index] *= factor
    return value


def test_the_variance_bound_is_popoviciu_and_it_is_reached():
    """Half the rows at each end of the range: the largest variance any rows in it can have;
    it passes, and anything above it is refused."""
    lo, hi = 2.0, 10.0
    x = np.array([[lo], [hi]] * 5)
    declared = Declared.of([PartyCounts(10, 1, 1, 1)], [value_ranges(features=x - 0.0)])
    span = declared.column_range(ALL_FEATURES)
    assert span == (0.0, 10.0)  # zero included for LIBSVM rows
    declared = Declared.of([PartyCounts(10, 1, 1, 1)], [{ALL_FEATURES: [lo, hi]}])
    assert x.var() == (hi - lo) ** 2 / 4
    declared.check_variances([x.var()], [ALL_FEATURES])
    with pytest.raises(DeclarationBroken):
        declared.check_variances([x.var() * 1.001], [ALL_FEATURES])


def test_impossible_declarations_name_their_site():
    good = PartyCounts(10, 2, 5, 1)
    with pytest.raises(DeclarationBroken, match="Party 1 declared more positives than rows"):
        Declared.of([good, PartyCounts(10, 11, 5, 1)], [{}, {}])
    with pytest.raises(DeclarationBroken, match="Party 0 declared the range"):
        Declared.of([good], [{"age": [5.0, 1.0]}])


def test_declarations_have_one_digest_per_site_that_changes_with_any_fact():
    _, declared = sites()
    digests = declared.digests()
    assert len(digests) == 3 and len(set(digests)) == 3
    other = Declared.of(
        [declared.counts[0], PartyCounts(declared.counts[1].train + 1, 1, 10, 2),
         declared.counts[2]], list(declared.ranges),
    )  # fmt: skip
    changed = other.digests()
    assert changed[0] == digests[0] and changed[1] != digests[1] and changed[2] == digests[2]


def test_category_counts_must_add_up_to_the_declared_rows():
    declared = Declared.of([PartyCounts(6, 1, 1, 1), PartyCounts(4, 1, 1, 1)], [{}, {}])
    declared.check_category_counts({"ward": {"a": 7, "<missing>": 3}})
    with pytest.raises(DeclarationBroken, match=r"'ward'.* 60000010 rows over 62 categories"):
        fake = {f"fake_{k}": 10**6 for k in range(60)}
        declared.check_category_counts({"ward": {"a": 7, "<missing>": 3, **fake}})
    with pytest.raises(DeclarationBroken, match="negative count for 'b'"):
        declared.check_category_counts({"ward": {"a": 12, "b": -2}})


def test_a_table_fit_checks_imputation_sums_and_category_counts():
    """The encoder's fit with a federated total: honest sums pass; 1e9 added to a column's sum
    puts its mean outside the declared range."""
    table = RawTable.from_columns(
        y=[0, 1, 0, 1], lab=[12.0, np.nan, 14.0, 13.0], ward=["a", "b", None, "a"]
    )
    declared = Declared.of([PartyCounts(4, 2, 1, 1)], [value_ranges(numeric=table.numeric)])
    choice = ColumnChoice()
    encoder = fit_features([table], choice=choice, standardize=True, declared=declared)
    assert encoder.means["lab"] == pytest.approx(13.0)

    def lying(value, what=""):
        if what == "column statistics":
            value = value.clone()
            value[2] += 1e9
        return value

    with pytest.raises(DeclarationBroken, match="imputation sums of column 'lab'"):
        fit_features([table], choice=choice, standardize=True, total=lying, declared=declared)


def test_evaluation_counts_must_hold_the_declared_test_rows():
    counts = torch.tensor([[5.0, 3.0, 2.0], [0.0, 1.0, 3.0]])
    assert evaluation_count_problem(counts, 10, 4) is None
    planted = counts.clone()
    planted[1, -1] += 20_000
    assert "20004 positive" in evaluation_count_problem(planted, 10, 4)
    moved = counts.clone()
    moved[0, 0] -= 6
    moved[0, 1] += 6
    assert "negative count" in evaluation_count_problem(moved, 10, 4)
