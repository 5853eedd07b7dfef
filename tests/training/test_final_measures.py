"""The measures beyond AP that a site compares before it keeps the final average
(slate.training.final_measures), on a hand-made linear model over binary inputs."""

from __future__ import annotations

import pytest
import torch

from slate.errors import ConfigError
from slate.training.final_check import check_average
from slate.training.final_measures import Bounds, compare, own_distance


def site(seed: int = 0, n: int = 600, d: int = 40):
    """Binary inputs, labels from the first five, and a model's logits on them."""
    generator = torch.Generator().manual_seed(seed)
    features = (torch.rand(n, d, generator=generator) < 0.2).double()
    weights = torch.zeros(d, dtype=torch.float64)
    weights[:5] = 1.5
    labels = (features @ weights + torch.randn(n, generator=generator, dtype=torch.float64)
              > 2.5).long()  # fmt: skip
    return features, weights, labels


def logits(features, weights, bias: float = -3.0):
    return features @ weights + bias


def test_an_equal_average_passes_every_measure():
    features, weights, labels = site()
    own = logits(features, weights)
    measures = compare(own, own, labels, features, Bounds(), 0.01, 0.02)
    names = {m.name for m in measures}
    assert names == {"mean_logit", "flagged_at_half", "log_loss", "flagged_at_threshold",
                     "group_flagged", "distance_ratio"}  # fmt: skip
    assert not any(m.failed for m in measures)
    assert check_average(0, own, own, labels, features=features).to_dict()["failed"] == []


def test_a_shifted_output_bias_keeps_ap_and_is_refused_by_name():
    features, weights, labels = site()
    own = logits(features, weights)
    shifted = own + 5.0  # AP exactly the same: every score moved alike
    check = check_average(2, shifted, own, labels, features=features)
    assert check.average_ap == pytest.approx(check.own_ap)
    assert check.refused
    failed = set(check.to_dict()["failed"])
    assert {"mean_logit", "flagged_at_half", "log_loss"} <= failed
    assert "mean_logit" in check.message("run") and "over the bound 0.5" in check.reason()
    assert check.to_dict()["saved"] == "own model"


def test_a_push_on_one_input_is_refused_by_its_group():
    features, weights, labels = site()
    own = logits(features, weights)
    pushed = logits(features, weights + 6.0 * (torch.arange(40) == 30).double())
    check = check_average(1, pushed, own, labels, features=features, bounds=Bounds(groups=40))
    assert check.refused and "group_flagged" in check.to_dict()["failed"]
    group = next(m for m in check.measures if m.name == "group_flagged")
    assert "input 31" in group.detail and group.change > 0.5


def test_a_far_average_is_refused_by_the_distance_the_site_measured():
    features, weights, labels = site()
    own = logits(features, weights)
    far = compare(own, own, labels, features, Bounds(), distance=1.6, reference=0.01)
    assert [m.name for m in far if m.failed] == ["distance_ratio"]
    assert own_distance(torch.ones(1, 3), torch.zeros(3), 2) == 2.0
    unmeasured = compare(own, own, labels, features, Bounds(), distance=1.6, reference=None)
    assert "distance_ratio" not in {m.name for m in unmeasured}


def test_images_have_no_groups_and_a_site_without_positives_still_compares_logits():
    features, weights, labels = site()
    own = logits(features, weights)
    names = {m.name for m in compare(own, own, labels, features.reshape(600, 1, 5, 8), Bounds())}
    assert "group_flagged" not in names
    negatives = torch.zeros_like(labels)
    check = check_average(0, own + 5.0, own, negatives, features=features)
    assert check.average_ap is None and check.refused  # no AP, but the shift is seen


def test_bounds_parse_by_name_and_refuse_a_bad_one():
    bounds = Bounds.parse("mean_logit=1, group-flagged=0.3,groups=5")
    assert (bounds.mean_logit, bounds.group_flagged, bounds.groups) == (1.0, 0.3, 5)
    assert Bounds.parse(None) == Bounds()
    with pytest.raises(ConfigError, match="no bound 'mean'"):
        Bounds.parse("mean=1")
    with pytest.raises(ConfigError, match="no number"):
        Bounds.parse("ap=x")
