"""The check of a site's saved model against its own (slate.training.final_check), with the APs
computed by scikit-learn."""

from __future__ import annotations

import pytest
import torch
from sklearn.metrics import average_precision_score

from slate.training.final_check import AVERAGE_BOUND, check_average
from slate.training.final_measures import Bounds

#: Every bound but AP's open: the AP check alone.
AP_ONLY = Bounds(mean_logit=1e9, flagged_at_half=1, flagged_at_threshold=1, log_loss=1e9,
                 group_flagged=1)  # fmt: skip


def rows(seed: int = 0, n: int = 400):
    generator = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=generator) < 0.1).long()
    signal = labels.double() * 2 + torch.randn(n, generator=generator, dtype=torch.float64)
    return signal, labels


def test_a_close_average_is_accepted_and_both_aps_are_sklearns():
    own, labels = rows()
    average = own + 0.05 * torch.randn(len(own), generator=torch.Generator().manual_seed(1),
                                       dtype=torch.float64)  # fmt: skip
    check = check_average(3, average, own, labels)
    assert not check.refused and check.reason() is None
    assert check.own_ap == pytest.approx(average_precision_score(labels, own), abs=1e-12)
    assert check.average_ap == pytest.approx(average_precision_score(labels, average), abs=1e-12)
    assert check.to_dict()["saved"] == "averaged model"


def test_an_upside_down_average_is_refused_with_both_aps_in_the_message():
    own, labels = rows()
    check = check_average(2, -own, own, labels)
    assert check.refused and check.own_ap - check.average_ap > AVERAGE_BOUND
    message = check.message("run")
    assert message.startswith("Party 2 refused the final average: on this site's 400 test rows")
    assert f"{check.average_ap:.4f}" in message and "run/model.pt is its own model" in message
    assert check.to_dict()["saved"] == "own model"


def test_the_bound_is_a_strict_shortfall():
    own, labels = rows()
    check = check_average(0, own, own, labels)
    assert not check.refused  # equal: nothing lost
    better = check_average(0, own, -own, labels, bounds=AP_ONLY)
    assert not better.refused  # the average better than the own model is kept


def test_a_site_without_positives_is_not_checked_and_says_so():
    own, labels = rows()
    check = check_average(1, -own, own, torch.zeros_like(labels), bounds=AP_ONLY)
    assert not check.refused and check.average_ap is None
    assert check.reason() == "not checked: this site holds no positive test row"


def test_refused_counts_refuse_the_average_whatever_the_aps():
    own, labels = rows()
    check = check_average(1, own, own, labels, "the summed counts hold 5 positive rows")
    assert check.refused
    assert "(the summed counts hold 5 positive rows)" in check.reason()
