"""The measures beyond AP that a site compares before it keeps the final average
(slate.training.final_measures), on a hand-made linear model over binary inputs; under
--dp-epsilon, the bounds in force raised by the noise floor the site measures, which lets an
honest noisy average pass and still refuses a lie."""

from __future__ import annotations

import pytest
import torch

from slate.errors import ConfigError
from slate.training.final_check import check_average
from slate.training.final_measures import (
    NOISE_DRAWS,
    Bounds,
    NoiseFloor,
    compare,
    noise_floor,
    noise_reference,
    own_distance,
)


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


def linear(features):
    """A parameter vector's logits: the first 40 entries weights, the 41st the bias."""
    return lambda p: features @ p[:40] + p[40]


def noisy_site(radius: float = 1.0):
    """A site's rows, its own model (weights and bias -3), and an honest average under DP: the
    own model plus isotropic Gaussian noise of length ``radius`` (what the mechanism adds)."""
    features, weights, labels = site()
    own = torch.cat([weights, torch.tensor([-3.0], dtype=torch.float64)])
    noise = torch.randn(41, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    return features, labels, own, own + radius * noise / noise.norm()


def test_the_bound_in_force_is_the_stated_one_plus_twice_the_floor():
    noise = NoiseFloor({"group_flagged": 0.2, "ap": 0.01}, distance=0.5)
    assert noise.bound("group_flagged", 0.25) == pytest.approx(0.65)
    assert noise.bound("mean_logit", 0.5) == 0.5  # no floor measured: the stated bound
    features, weights, labels = site()
    own = logits(features, weights)
    pushed = logits(features, weights + 2.0 * (torch.arange(40) == 30).double())
    stated = compare(pushed, own, labels, features, Bounds(groups=40))
    group = next(m for m in stated if m.name == "group_flagged")
    assert group.failed and group.bound == 0.25 and group.to_dict()["noise_floor"] is None
    raised = compare(pushed, own, labels, features, Bounds(groups=40), noise=noise)
    group = next(m for m in raised if m.name == "group_flagged")
    assert group.bound == pytest.approx(0.65) and group.stated == 0.25 and group.floor == 0.2
    assert group.failed == (group.change > 0.65)
    assert "in force under --dp-epsilon: the stated 0.25 plus 2 x the noise floor 0.2000" in (
        group.describe()
    )
    assert group.to_dict()["stated_bound"] == 0.25 and group.to_dict()["bound"] == 0.65


def test_without_dp_the_stated_bounds_are_in_force_unchanged():
    features, weights, labels = site()
    own = logits(features, weights)
    check = check_average(0, own + 0.3, own, labels, features=features, distance=0.02,
                          reference=0.01)  # fmt: skip
    summary = check.to_dict()
    assert summary["bound"] == summary["stated_bound"] == 0.05
    assert summary["noise_floor"] is None
    assert all(c["bound"] == c["stated_bound"] and c["noise_floor"] is None
               for c in summary["checks"])  # fmt: skip
    assert summary["failed"] == ["distance_ratio"]  # ratio 2 over the stated 1


def test_an_honest_noisy_average_is_refused_by_the_stated_bounds_and_kept_with_the_floor():
    features, labels, own, average = noisy_site()
    score = linear(features)
    distance = float(((average - own) ** 2).sum())
    bounds = Bounds(groups=40)
    old = check_average(0, score(average), score(own), labels, features=features, bounds=bounds)
    assert old.refused  # the noise alone moves the measures past the stated bounds
    noise = noise_floor(score, own, 41, distance, labels, features, bounds)
    assert noise.draws == NOISE_DRAWS and noise.distance == distance
    assert set(noise.floors) >= {"ap", "mean_logit", "group_flagged", "log_loss"}
    check = check_average(0, score(average), score(own), labels, features=features,
                          bounds=bounds, noise=noise)  # fmt: skip
    assert not check.refused, check.reason()
    assert check.bound == pytest.approx(0.05 + 2 * noise.floors["ap"])
    assert check.to_dict()["stated_bound"] == 0.05
    assert check.to_dict()["noise_floor"]["floors"] == noise.floors


def test_under_dp_a_shifted_bias_and_a_pushed_input_are_still_refused():
    """As a site computes it (Distances.check_inputs): the honest noise's squared distance 1 is
    the reference, and the floor is measured at the lie's distance, at most what the distance
    check allows (2 x 1 x 1)."""
    features, labels, own, average = noisy_site()
    score = linear(features)
    bounds = Bounds(groups=40)
    shifted = average.clone()
    shifted[40] += 5.0
    pushed = average.clone()
    pushed[30] += 6.0
    for lie, names in ((shifted, {"mean_logit", "flagged_at_half", "log_loss"}),
                       (pushed, {"log_loss", "distance_ratio"})):  # fmt: skip
        distance = float(((lie - own) ** 2).sum())
        noise = noise_floor(score, own, 41, min(distance, 2.0), labels, features, bounds)
        check = check_average(3, score(lie), score(own), labels, features=features,
                              bounds=bounds, distance=distance, reference=1.0,
                              noise=noise)  # fmt: skip
        assert check.refused and names <= set(check.to_dict()["failed"]), check.reason()
        assert "in force under --dp-epsilon" in check.message("run")


def test_under_dp_the_distance_reference_scales_earlier_distances_by_the_steps():
    # evaluations at 0, 3 and 6, the final at 9: 0.5 * 9/3 = 1.5 and 0.6 * 9/6 = 0.9
    assert noise_reference({0: 0.0, 3: 0.5, 6: 0.6}, 9, 0.1) == pytest.approx(1.5)
    assert noise_reference({}, 9, 0.1) == 0.1  # after a resume: the floor
    measures = compare(torch.zeros(3), torch.zeros(3), torch.tensor([0, 1, 0]), None, Bounds(),
                       distance=1.8, reference=1.0, noise=NoiseFloor({}, 1.0))  # fmt: skip
    ratio = next(m for m in measures if m.name == "distance_ratio")
    assert ratio.bound == 2.0 and ratio.stated == 1.0 and not ratio.failed
