r"""Sums that reveal only their total: pairwise masks that cancel (Bonawitz et al., CCS 2017).

Sites :math:`i` and :math:`j` share a secret :math:`k_{ij}` (the X25519 secret of their sealed
channel, :mod:`slate.security.sealing`). For the :math:`c`-th masked sum of a generation, site
:math:`i` adds to its encoded input

.. math::

    m_i = \sum_{j > i} \mathrm{PRG}(k_{ij}, c) - \sum_{j < i} \mathrm{PRG}(k_{ij}, c)
    \pmod{2^{64}},

so that :math:`\sum_i m_i = 0` and the sum of the masked inputs is the sum of the inputs, exactly,
while any one masked input is uniform to anyone who lacks at least one of its pair keys: a
coalition of all sites but two learns the sum of those two, no more. With two sites nothing is
hidden (each learns the other's input from the total and its own).

* **Keys.** :func:`pair_seed`: HKDF-SHA256 of the pair's X25519 secret with its own ``info``
  (:data:`MASK_FORMAT`, the run, the session, the generation and the two ranks, lower first), so
  that both sides derive the same seed and it differs from every sealing key. A new generation
  (after a loss or a return) has new X25519 keys, hence new seeds.
* **PRG.** :func:`keystream_words`: AES-256 in CTR mode from ``cryptography``, keyed by the seed,
  the counter block starting at :math:`c \cdot 2^{64}`: a fresh stream for every sum of a
  generation (a counter is never reused: :class:`MaskedSums` counts them).
* **Numbers.** Counts are exact integers. Floats are encoded in fixed point with a stated number
  of fractional bits per quantity (:class:`FixedPoint`): :math:`\mathrm{round}(x\,2^{s})`, and a
  value whose encoding, times the number of sites, would not fit in 63 bits is refused with
  :class:`MaskOverflow` (naming the quantity), never wrapped into a wrong sum.
  :class:`WideFixedPoint` carries a float in two words (:data:`SPLIT` low bits apart), so that
  40 fractional bits still leave a range of :math:`\pm 2^{63}/N` (column sums of squares in the
  :math:`10^{17}` s, the buffers' averages), with one more word that counts the values a site
  could not encode: the sum is then refused on every site alike. The parameters' average, whose
  float32 values hold 24 significant bits, goes in one word (:class:`NarrowFixedPoint`: 32
  fractional bits, a range of :math:`\pm 2^{31}/N`), at half the bytes.
* **A sum** (:func:`masked_words`, :func:`summed_words`): a site encodes its tensor, adds its
  mask, and sends the masked words to every member; each member adds every member's words (its
  own included) modulo :math:`2^{64}` and decodes: every member gets the same bits.

Everything is arithmetic on ``uint64`` (numpy), where wrapping is defined.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from slate.errors import SumRefused

__all__ = [
    "FLOAT_BITS",
    "MASK_FORMAT",
    "PARAMETER_BITS",
    "SPLIT",
    "FixedPoint",
    "MaskOverflow",
    "MaskedSums",
    "NarrowFixedPoint",
    "WideFixedPoint",
    "decode_sum",
    "encode_sum",
    "keystream_words",
    "mask_info",
    "pair_mask",
    "pair_seed",
]

MASK_FORMAT = "slate-mask-1"  # first item of HKDF's info: never a sealing key's
SEED_BYTES = 32
WORD = np.dtype("<u8")
LIMIT_BITS = 63  # a sum of encoded values must stay below 2^63 in magnitude
SPLIT = 40  # the low word of a wide value holds its 40 lowest bits (N * 2^40 < 2^63)
FLOAT_BITS = 40  # fractional bits of every float summed under masks (a step of 9.1e-13)
PARAMETER_BITS = 32  # ... but the parameters' average's, in one word (a step of 2.3e-10)


class MaskOverflow(SumRefused):
    """A value too large for its fixed-point encoding in a masked sum (refused on every site,
    which keeps its own model)."""


def mask_info(run_id: str, session: str, generation: int, a: int, b: int) -> bytes:
    """HKDF's ``info`` of the pair ``{a, b}``'s mask seed (the same for both sides)."""
    low, high = sorted((a, b))
    return f"{MASK_FORMAT}|{run_id}|{session}|{generation}|{low}|{high}".encode()


def pair_seed(shared_secret: bytes, info: bytes) -> bytes:
    """The pair's 32-byte mask seed: HKDF-SHA256 of its X25519 shared secret with ``info``."""
    return HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=None, info=info).derive(
        shared_secret
    )


def keystream_words(seed: bytes, counter: int, n: int) -> np.ndarray:
    """``n`` pseudorandom ``uint64`` words: AES-256-CTR keyed by ``seed``, its counter block
    starting at ``counter * 2^64`` (the ``counter``-th masked sum's own stream)."""
    if not 0 <= counter < 1 << 64:
        raise ValueError(f"mask counter {counter} out of range")
    start = (counter << 64).to_bytes(16, "big")
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(start)).encryptor()
    stream = encryptor.update(bytes(8 * n)) + encryptor.finalize()
    return np.frombuffer(stream, dtype=WORD).copy()


def pair_mask(rank: int, seeds: Mapping[int, bytes], counter: int, n: int) -> np.ndarray:
    """Site ``rank``'s mask for the ``counter``-th sum: the streams of its pairs with higher
    ranks added, those with lower ranks subtracted, modulo :math:`2^{64}`."""
    mask = np.zeros(n, dtype=WORD)
    for peer, seed in seeds.items():
        if peer == rank:
            raise ValueError("a site has no mask with itself")
        words = keystream_words(seed, counter, n)
        if peer > rank:
            mask += words
        else:
            mask -= words
    return mask


@dataclass(frozen=True)
class FixedPoint:
    """A float quantity in fixed point: ``bits`` fractional bits (a step of :math:`2^{-bits}`),
    summed over at most ``parties`` sites, so each encoding must stay below
    :math:`2^{63} / parties` in magnitude."""

    name: str
    bits: int

    def encode(self, values: np.ndarray, parties: int) -> np.ndarray:
        """``round(values * 2^bits)`` as ``int64``; :class:`MaskOverflow` for a value too large
        (or not finite)."""
        scaled = np.asarray(values, dtype=np.float64) * math.ldexp(1.0, self.bits)
        limit = math.ldexp(1.0, LIMIT_BITS) / max(parties, 1)
        bad = ~np.isfinite(scaled) | (np.abs(scaled) >= limit)
        if bad.any():
            value = float(np.asarray(values, dtype=np.float64).reshape(-1)[np.flatnonzero(bad)[0]])
            raise MaskOverflow(
                f"The {self.name} holds {value!r}, which the masked sum cannot carry: with "
                f"{self.bits} fractional bits and {parties} sites, each value must lie within "
                f"+-{limit / math.ldexp(1.0, self.bits):.3g}. Nothing was sent. Such a value "
                "means the data or the run went wrong (a feature on a huge scale: try "
                "--standardize, or check the file)."
            )
        return np.rint(scaled).astype(np.int64)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The float64 sum from the summed encodings."""
        return np.asarray(total, dtype=np.int64).astype(np.float64) / math.ldexp(1.0, self.bits)

    @property
    def step(self) -> float:
        return math.ldexp(1.0, -self.bits)


@dataclass
class MaskedSums:
    """One site's masked sums in one generation: its rank, a seed per other member, and the
    counter of the sums made so far (each sum's masks come from its own counter)."""

    rank: int
    seeds: dict[int, bytes]
    counter: int = field(default=0)

    def mask(self, values: np.ndarray) -> np.ndarray:
        """``values`` (``int64``, any shape) plus this site's mask for the next sum, as
        ``uint64``: what the site sends."""
        flat = np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
        masked = flat.view(WORD) + pair_mask(self.rank, self.seeds, self.counter, flat.size)
        self.counter += 1
        return masked.reshape(np.shape(values))

    @staticmethod
    def total(received: list[np.ndarray]) -> np.ndarray:
        """The sum of every site's masked values (its own included): the masks cancel, and the
        ``int64`` result is the sum of the inputs."""
        out = np.zeros_like(np.asarray(received[0], dtype=WORD))
        for masked in received:
            out += np.asarray(masked, dtype=WORD)
        return out.view(np.int64)


@dataclass(frozen=True)
class WideFixedPoint:
    r"""A float quantity in fixed point over two words: :math:`s = \mathrm{round}(x\,2^{b})`
    split as :math:`s = h\,2^{40} + l` with :math:`0 \le l < 2^{40}`; the high words and the
    low words are summed apart (the low words' sum stays below :math:`N\,2^{40} < 2^{63}`, no
    carry is lost) and the total is :math:`(\sum h)\,2^{40} + \sum l`.

    Each :math:`|h|` must stay below :math:`2^{63}/N`: with :math:`b` fractional bits a value
    may reach :math:`\pm 2^{103-b}/N` (:math:`b = 40`: :math:`\pm 2^{63}/N`). Integers held in
    floats (counts) are exact up to :math:`2^{53}`. Every conversion is exact in float64 but
    the last addition of the decoded total (one rounding, as any float sum)."""

    name: str
    bits: int = FLOAT_BITS
    range_bits: int = LIMIT_BITS + SPLIT  # a value's encoding stays below 2^range_bits / N

    def encode(self, values: np.ndarray, parties: int) -> tuple[np.ndarray, np.ndarray]:
        """``(words, bad)``: the ``2 n`` words (high words, then low words) of ``values``, and
        the mask of the values that cannot be carried (not finite, or beyond the range), which
        are encoded as 0."""
        flat = np.asarray(values, dtype=np.float64).reshape(-1)
        scaled = np.rint(flat * math.ldexp(1.0, self.bits))
        limit = math.ldexp(1.0, LIMIT_BITS + SPLIT) / max(parties, 1)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(scaled) | (np.abs(scaled) >= limit)
        scaled[bad] = 0.0
        high = np.floor(scaled * math.ldexp(1.0, -SPLIT))
        low = scaled - high * math.ldexp(1.0, SPLIT)  # exact: an integer in [0, 2^40)
        return np.concatenate([high.astype(np.int64), low.astype(np.int64)]), bad

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The float64 sums from the summed ``2 n`` words."""
        words = np.asarray(total, dtype=np.int64)
        high, low = np.split(words, 2)
        return high.astype(np.float64) * math.ldexp(1.0, SPLIT - self.bits) + low.astype(
            np.float64
        ) * math.ldexp(1.0, -self.bits)

    def refusal(self, local: np.ndarray, bad: np.ndarray, refused: int, parties: int) -> str:
        """The paragraph of a refused sum: ``refused`` values in all (``bad``: this site's)."""
        range_ = math.ldexp(1.0, self.range_bits - self.bits) / max(parties, 1)
        if bad.any():
            value = float(np.asarray(local, dtype=np.float64).reshape(-1)[np.flatnonzero(bad)[0]])
            where = f"this site's {self.name} holds {value!r}"
        else:
            where = f"another site's {self.name} holds a value (or a participant lied in the sum)"
        return (
            f"The masked sum of the {self.name} was refused on every site: {where} that it "
            f"cannot carry ({refused} value(s) in all are not finite or beyond +-{range_:.3g}, "
            f"the range of {self.bits} fractional bits over {parties} sites). Nothing of the "
            f"sum was used. {_advice(bool(bad.any()))}"
        )


def _advice(own: bool) -> str:
    """What a refused sum means: this site's value (its data or run went wrong), or another's
    (its run diverged, or it lied in the sum: nothing at this site is at fault)."""
    if own:
        return (
            "Such a value means the data or the run went wrong (a feature on a huge scale: try "
            "--standardize, or check the file; a diverging run: lower --lr)."
        )
    return (
        "This site's own values are within range: another site's data or run went wrong, or "
        "it lied in the sum (runs modified code); a sum does not show which site."
    )


@dataclass(frozen=True)
class NarrowFixedPoint(WideFixedPoint):
    r"""A float quantity in fixed point in one word: :math:`s = \mathrm{round}(x\,2^{b})`
    with :data:`PARAMETER_BITS` fractional bits, each :math:`|s| < 2^{63}/N`: a range of
    :math:`\pm 2^{63-b}/N` (:math:`b = 32`: :math:`\pm 2.1 \cdot 10^9/N`). For the parameters'
    average, whose float32 values hold 24 significant bits: the step :math:`2^{-32}` is finer than
    float32's rounding of any value above :math:`2^{-9}` in magnitude, at half the bytes of
    :class:`WideFixedPoint`. A parameter beyond the range refuses the sum on every site."""

    bits: int = PARAMETER_BITS
    range_bits: int = LIMIT_BITS

    def encode(self, values: np.ndarray, parties: int) -> tuple[np.ndarray, np.ndarray]:
        """``(words, bad)``: one word per value, and the mask of the values that cannot be
        carried (not finite, or beyond the range), which are encoded as 0."""
        scaled = np.rint(
            np.asarray(values, dtype=np.float64).reshape(-1) * math.ldexp(1.0, self.bits)
        )
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(scaled) | (
                np.abs(scaled) >= math.ldexp(1.0, LIMIT_BITS) / max(parties, 1)
            )
        scaled[bad] = 0.0
        return scaled.astype(np.int64), bad

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The float64 sums from the summed words."""
        return np.asarray(total, dtype=np.int64).astype(np.float64) * math.ldexp(1.0, -self.bits)


def _codec(name: str, narrow: bool) -> WideFixedPoint:
    return NarrowFixedPoint(name) if narrow else WideFixedPoint(name)


def encode_sum(
    values: np.ndarray, name: str, parties: int, narrow: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The words a site masks for one sum of ``values``, and the mask of its values that cannot
    be carried (all False for integers).

    Integers (any integer or bool dtype): ``int64`` words, exact, summed modulo :math:`2^{64}`
    as a plain ``int64`` sum wraps. Floats: :class:`WideFixedPoint` words (with ``narrow``,
    :class:`NarrowFixedPoint`'s) followed by one word, the count of values this site could not
    carry."""
    array = np.asarray(values)
    if array.dtype.kind in "biu":
        return array.astype(np.int64).reshape(-1), np.zeros(array.size, dtype=bool)
    words, bad = _codec(name, narrow).encode(array, parties)
    return np.concatenate([words, np.array([int(bad.sum())], dtype=np.int64)]), bad


def decode_sum(
    total: np.ndarray, like: np.ndarray, name: str, parties: int, bad: np.ndarray,
    narrow: bool = False,
) -> np.ndarray:  # fmt: skip
    """The sum (float64 for floats, ``int64`` for integers, ``like``'s shape) from the summed
    words of :func:`encode_sum`; :class:`MaskOverflow` on every site alike when any site could
    not carry one of its values (``bad``: this site's own)."""
    shape = np.shape(like)
    if np.asarray(like).dtype.kind in "biu":
        return np.asarray(total, dtype=np.int64).reshape(shape)
    refused = int(total[-1])
    codec = _codec(name, narrow)
    if refused:
        raise MaskOverflow(codec.refusal(like, bad, refused, parties))
    return codec.decode(total[:-1]).reshape(shape)
