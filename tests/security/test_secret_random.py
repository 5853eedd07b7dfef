"""slate.security.secret_random: the uniforms are the keystream words' top 53 bits, and the
Gaussians are the documented sum of four Box-Muller draws, against numpy on the same words."""

from __future__ import annotations

import numpy as np

from slate.security.secret_random import SecretStream


def test_uniforms_are_the_top_53_bits_of_the_keystream_words_plus_a_half():
    words = SecretStream.for_test(5, 0, "sample").words(1000)
    uniforms = SecretStream.for_test(5, 0, "sample").uniform(10, 100)
    expected = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    np.testing.assert_array_equal(uniforms.reshape(-1), expected)
    assert uniforms.min() > 0.0 and uniforms.max() < 1.0


def test_gaussians_are_four_box_muller_draws_summed_and_halved():
    words = SecretStream.for_test(6, 1, "noise").words(4 * 300)
    draws = SecretStream.for_test(6, 1, "noise").normal(300, std=2.5)
    u = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    u1, u2 = u[:600], u[600:]
    radius, angle = np.sqrt(-2.0 * np.log(u1)), 2.0 * np.pi * u2
    four = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)]).reshape(4, 300)
    np.testing.assert_allclose(draws, four.sum(axis=0) * 1.25, rtol=1e-12, atol=1e-12)
