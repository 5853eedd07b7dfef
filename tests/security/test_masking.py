"""Pairwise masks that cancel in a sum (slate.security.masking), against references computed here:
AES block by block for the stream, plain sums for the totals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from slate.security.masking import (
    FixedPoint,
    MaskedSums,
    MaskOverflow,
    keystream_words,
    mask_info,
    pair_mask,
    pair_seed,
)


def sites(n: int, run: str = "r", session: str = "s", generation: int = 0):
    """Each site's seeds with every other, from real X25519 key agreement."""
    keys = [X25519PrivateKey.generate() for _ in range(n)]
    seeds = []
    for i in range(n):
        mine = {}
        for j in range(n):
            if i != j:
                secret = keys[i].exchange(keys[j].public_key())
                mine[j] = pair_seed(secret, mask_info(run, session, generation, i, j))
        seeds.append(mine)
    return seeds


def test_both_sides_of_a_pair_derive_the_same_seed_and_other_bindings_differ():
    seeds = sites(3)
    assert seeds[0][2] == seeds[2][0] and seeds[1][2] == seeds[2][1]
    assert len({seeds[0][1], seeds[0][2], seeds[1][2]}) == 3
    assert mask_info("r", "s", 0, 1, 2) == mask_info("r", "s", 0, 2, 1)
    infos = {mask_info(*args) for args in [("r", "s", 0, 1, 2), ("r", "t", 0, 1, 2),
                                           ("r", "s", 1, 1, 2), ("q", "s", 0, 1, 2)]}  # fmt: skip
    assert len(infos) == 4


def test_the_stream_is_aes_of_each_counter_block():
    seed = bytes(range(32))
    counter, n = 5, 7
    ecb = Cipher(algorithms.AES(seed), modes.ECB()).encryptor()
    blocks = b"".join(ecb.update(((counter << 64) + k).to_bytes(16, "big")) for k in range(4))
    expected = np.frombuffer(blocks[: 8 * n], dtype="<u8")
    assert np.array_equal(keystream_words(seed, counter, n), expected)
    assert not np.array_equal(keystream_words(seed, counter + 1, n), expected)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_masks_cancel_and_the_total_is_exact(n):
    rng = np.random.default_rng(n)
    seeds = sites(n)
    values = [rng.integers(-(2**40), 2**40, size=(3, 11)) for _ in range(n)]
    summing = [MaskedSums(i, seeds[i]) for i in range(n)]
    for _ in range(2):  # two sums in a row: each with its own masks
        sent = [summing[i].mask(values[i]) for i in range(n)]
        assert MaskedSums.total(sent).tolist() == np.sum(values, axis=0).tolist()
    assert sum(pair_mask(i, seeds[i], 9, 4) for i in range(n)).tolist() == [0, 0, 0, 0]


def test_one_masked_input_looks_uniform():
    seeds = sites(4)
    counts = np.zeros((2, 4096), dtype=np.int64)
    counts[1, 7] = 91  # a planted count, the rest zeros
    sent = MaskedSums(1, seeds[1]).mask(counts).tobytes()
    assert len(sent) > 4096
    frequency = np.bincount(np.frombuffer(sent, dtype=np.uint8), minlength=256) / len(sent)
    entropy = -(frequency[frequency > 0] * np.log2(frequency[frequency > 0])).sum()
    assert entropy >= 7.5
    assert (91).to_bytes(8, "little") not in sent


def test_fixed_point_round_trips_within_its_step_and_refuses_what_overflows():
    quantity = FixedPoint("standardisation sums", 24)
    x = np.array([0.0, 1.5, -2.25, 1234.5678, 1e-9])
    total = quantity.encode(x, 4) + quantity.encode(2 * x, 4)
    assert np.abs(quantity.decode(total) - 3 * x).max() <= quantity.step
    with pytest.raises(MaskOverflow, match=r"standardisation sums holds 1e.*20 sites"):
        quantity.encode(np.array([1.0, 1e17]), 20)
    with pytest.raises(MaskOverflow, match="nan"):
        quantity.encode(np.array([math.nan]), 2)
