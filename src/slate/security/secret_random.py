r"""Secret randomness for differential privacy: each site's sample and noise, never ``--seed``.

Every flag of a run is public, ``--seed`` included (every site holds it), so randomness drawn
from it is known to the other sites: a known sample voids subsampling amplification, and known
noise can be subtracted. :class:`SecretStream` draws instead from AES-256 in CTR mode (pyca
``cryptography``) keyed by 32 bytes of ``os.urandom``, fresh for every stream and never stored.

* **Uniforms** (:meth:`SecretStream.uniform`): 64-bit keystream words, their top 53 bits as
  :math:`(w + \tfrac12)\,2^{-53}` in :math:`(0, 1)`, float64.
* **Gaussians** (:meth:`SecretStream.normal`): Box-Muller in float64 on those uniforms, and, as
  Opacus' secure mode does against floating-point attacks on a single sample (arXiv 2107.10138),
  each released value is the sum of four independent draws divided by 2:
  :math:`\tfrac12\sum_{i=1}^{4} N(0, \sigma^2) = N(0, \sigma^2)`.

A test may fix the key (:meth:`SecretStream.for_test`: HKDF of a test seed, the party and the
purpose), through the ``SLATE_DP_TEST_SEED`` hook of :mod:`slate.faults` only; a run under a
roster refuses it.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["SecretStream"]

_INFO = b"slate dp test stream v1"


class SecretStream:
    """A stream of secret random numbers: AES-256-CTR keyed by ``key`` (default: 32 fresh bytes
    of ``os.urandom``), the counter starting at zero."""

    def __init__(self, key: bytes | None = None) -> None:
        key = os.urandom(32) if key is None else key
        if len(key) != 32:
            raise ValueError(f"a SecretStream key is 32 bytes, got {len(key)}")
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        self.seeded = False  # a test's stream (for_test), never a real run's

    @classmethod
    def for_test(cls, seed: int, party: int, purpose: str) -> SecretStream:
        """A reproducible stream for tests: the key is HKDF-SHA256 of ``seed``, ``party`` and
        ``purpose`` (``"sample"``, ``"noise"``), so that the streams of two parties or purposes
        differ."""
        material = f"{seed}:{party}:{purpose}".encode()
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(material)
        stream = cls(key)
        stream.seeded = True
        return stream

    def words(self, count: int) -> np.ndarray:
        """``count`` uniform 64-bit words."""
        raw = self._encryptor.update(bytes(8 * count))
        return np.frombuffer(raw, dtype=np.uint64)

    def uniform(self, *shape: int) -> np.ndarray:
        """Uniforms in ``(0, 1)`` (never 0 or 1), float64, of ``shape``."""
        count = int(np.prod(shape)) if shape else 1
        return self._uniform(count).reshape(shape)

    def _uniform(self, count: int) -> np.ndarray:
        """``count`` uniforms, float64: each word's top 53 bits, plus one half, times
        :math:`2^{-53}`."""
        top = np.multiply(self.words(count) >> np.uint64(11), 2.0**-53, dtype=np.float64)
        top += 2.0**-54  # (w + 1/2) 2^-53: scaling by a power of two rounds alike
        return top

    def normal(self, count: int, std: float = 1.0) -> np.ndarray:
        r"""``count`` draws of :math:`N(0, \mathrm{std}^2)` in float64: each the sum of four
        Box-Muller draws, halved.

        A pair of uniforms :math:`(u_1, u_2)` gives the two draws :math:`r \cos\theta` and
        :math:`r \sin\theta`, with :math:`r = \sqrt{-2 \ln u_1}` and :math:`\theta = 2\pi
        u_2`; a value takes both draws of two pairs. Each pair's two draws are summed as
        :math:`r (\cos\theta + \sin\theta) = \sqrt{2}\, r \sin(\theta + \pi/4)`, the
        same number in one ``sin``. The radius is taken in numpy and the ``sin`` in torch: each
        library's faster half here."""
        pairs = 2 * count  # four draws per value, two per pair of uniforms
        uniforms = self._uniform(2 * pairs)
        radius = uniforms[:pairs]
        np.log(radius, out=radius)
        radius *= -4.0  # sqrt(2) r = sqrt(-4 ln u1)
        np.sqrt(radius, out=radius)
        angle = torch.from_numpy(uniforms[pairs:]).mul_(2.0 * math.pi).add_(0.25 * math.pi)
        draws = torch.sin(angle).mul_(torch.from_numpy(radius))
        halves = draws.view(2, count)
        return (halves[0] + halves[1]).mul_(0.5 * std).numpy()
