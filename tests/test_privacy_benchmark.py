"""The membership-inference harness (``python -m benchmarks.privacy``): its statistics against
sklearn and a brute-force binomial, and its planted bugs caught in quick mode on w7a."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score, roc_curve

from benchmarks import privacy
from tests.sites import HAVE_W7A, SHARED


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_and_tpr_at_low_fpr_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    members = rng.random(500) < 0.4
    scores = np.round(rng.normal(size=500) + 0.7 * members, 1)  # rounded: many ties
    assert privacy.auc(scores, members) == pytest.approx(roc_auc_score(members, scores))
    fpr, tpr, _ = roc_curve(members, scores, drop_intermediate=False)
    for limit in (0.01, 0.05, 0.2):
        assert privacy.tpr_at(scores, members, limit) == pytest.approx(tpr[fpr <= limit].max())


def _upper_by_bisection(k: int, n: int, alpha: float) -> float:
    """The p at which P(X <= k; n, p) = alpha/2, from the binomial sum itself."""
    low, high = k / n, 1.0
    for _ in range(80):
        p = (low + high) / 2
        cdf = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k + 1))
        low, high = (p, high) if cdf > alpha / 2 else (low, p)
    return (low + high) / 2


@pytest.mark.parametrize(("k", "n"), [(0, 50), (3, 50), (20, 64), (49, 50)])
def test_clopper_pearson_upper_bound_is_the_binomial_tail(k, n):
    assert privacy.clopper_pearson(k, n)[1] == pytest.approx(_upper_by_bisection(k, n, 0.05))
    low = privacy.clopper_pearson(k, n)[0]  # symmetric: the lower bound of k is 1 - upper(n - k)
    assert low == pytest.approx(0.0 if k == 0 else 1 - _upper_by_bisection(n - k, n, 0.05))


def test_epsilon_lower_bound_formula():
    """No error in 100 and 100 trials: FPR and FNR below 1 - 0.025^(1/100) each."""
    bound = 1 - 0.025 ** (1 / 100)
    expected = math.log((1 - 1e-5 - bound) / bound)
    assert privacy.epsilon_lower_bound(0, 100, 0, 100, 1e-5) == pytest.approx(expected)
    assert privacy.epsilon_lower_bound(50, 100, 50, 100, 1e-5) == 0.0


def test_lira_offline_separates_a_planted_shift_and_not_noise():
    rng = np.random.default_rng(0)
    inside = rng.random((16, 300)) < 0.5
    offsets = rng.normal(scale=3.0, size=300)  # each candidate's own level, which LiRA removes
    noise = rng.normal(size=(16, 300))
    shifted = privacy.lira_offline(offsets + noise + 1.5 * inside, inside)
    assert privacy.auc(shifted.ravel(), inside.ravel()) > 0.8
    assert privacy.auc((offsets + noise + 1.5 * inside).ravel(), inside.ravel()) < 0.7
    plain = privacy.lira_offline(offsets + noise, inside)
    assert abs(privacy.auc(plain.ravel(), inside.ravel()) - 0.5) < 0.06


@pytest.mark.skipif(not HAVE_W7A, reason="needs w7a")
def test_quick_mode_catches_both_planted_bugs_and_passes_the_production_code():
    """Quick settings on w7a: two runs of the production code send different messages, and
    the same runs with streams keyed by --seed send identical ones; with clipping skipped the
    canary's epsilon lower bound passes the accountant's, without it stays below."""
    settings = privacy.quick_settings(SHARED)
    data = privacy.load_w7a(SHARED)
    assert not privacy.same_messages(settings, data, 4)
    with privacy.noise_from_seed(settings.seed):
        assert privacy.same_messages(settings, data, 4)
    log = lambda _: None  # noqa: E731
    with privacy.clipping_skipped():
        planted = privacy.canary_audit(settings, data, 4, 2000, 8.0, log)
    assert planted.canary_norm > 10 * settings.clip  # the canary's gradient needs clipping
    assert planted.epsilon_lower > planted.epsilon_accountant
    honest = privacy.canary_audit(settings, data, 4, 2000, 8.0, log)
    assert honest.epsilon_lower <= honest.epsilon_accountant
