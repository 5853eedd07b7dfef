"""What sealing a message costs (``slate.security.sealing``): seal plus open per message, and the
set-up of one pair, each against a plain ``bytes`` copy of the same payload timed in the same run.

``python -m benchmarks.sealing [--repeats R]`` prints one JSON line. Payloads: the int8 message
of the w7a MLP (8,593 bytes), 1.2 KB, 600 KB, and the dense float32 message of the w7a MLP
(33,828 bytes). Every figure is the median over ``R`` timed batches of the time per operation
(each batch runs about ``BATCH_SECONDS``); the machine is shared, so the ratios are the figures
to compare, not the microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import cryptography
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from slate.communication.sealed_tensors import open_tensor, seal_tensor
from slate.security.sealing import (
    SealedChannel,
    SealingKey,
    sealed_size,
    sealing_key_record,
    verify_sealing_key_record,
)

#: name -> bytes of one message
PAYLOADS = {"int8_w7a_mlp": 8_593, "1.2KB": 1_200, "600KB": 600_000, "dense_w7a_mlp": 33_828}
BATCH_SECONDS = 0.02
RUN = "benchmark-run"


def per_call(action: Callable[[], object], repeats: int) -> float:
    """Median seconds per call of ``action`` over ``repeats`` batches of about
    ``BATCH_SECONDS`` each (the batch size is found once, first)."""
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            action()
        if time.perf_counter() - start >= BATCH_SECONDS / 4 or calls >= 1 << 20:
            break
        calls *= 2
    calls = max(1, int(calls * BATCH_SECONDS / max(time.perf_counter() - start, 1e-9)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            action()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


class Pair:
    """Two sites of one generation and their channels (a -> b and b -> a); the round grows
    with every message, as on a real channel."""

    def __init__(self) -> None:
        self.site_keys = [Ed25519PrivateKey.generate() for _ in range(2)]
        self.keys = [SealingKey.generate(RUN, 0, r) for r in range(2)]
        self.records = [
            sealing_key_record(k, s) for k, s in zip(self.keys, self.site_keys, strict=False)
        ]
        self.at_a = SealedChannel(self.keys[0], 1, self.keys[1].public_key)
        self.at_b = SealedChannel(self.keys[1], 0, self.keys[0].public_key)
        self.round = 0

    def seal_open(self, payload: bytes) -> bytes:
        self.round += 1
        return self.at_b.open(self.at_a.seal(payload, self.round), self.round)

    def seal_open_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        self.round += 1
        sealed = seal_tensor(self.at_a, tensor, self.round)
        return open_tensor(self.at_b, sealed, self.round, tensor.dtype, tensor.shape)

    def seal_only(self, payload: bytes) -> bytes:
        self.round += 1
        return self.at_a.seal(payload, self.round)

    def channel(self) -> SealedChannel:
        """One pair's set-up from the peer's public key: X25519, two HKDF derivations."""
        return SealedChannel(self.keys[0], 1, self.keys[1].public_key)

    def channel_from_record(self) -> SealedChannel:
        """The same, after verifying the peer's signed record (one Ed25519 verification)."""
        return SealedChannel.from_record(
            self.keys[0], 1, self.records[1], self.site_keys[1].public_key()
        )

    def new_generation_key(self) -> dict:
        """A site's work once per generation: a fresh X25519 key and its signed record."""
        return sealing_key_record(SealingKey.generate(RUN, 1, 0), self.site_keys[0])


def measure(repeats: int) -> dict:
    pair = Pair()
    out: dict = {"payloads": {}}
    copy_8k = None
    seal_open_8k = None
    for name, size in PAYLOADS.items():
        payload = os.urandom(size)
        buffer = bytearray(payload)
        copy = per_call(lambda buffer=buffer: bytes(buffer), repeats)
        both = per_call(lambda payload=payload: pair.seal_open(payload), repeats)
        seal = per_call(lambda payload=payload: pair.seal_only(payload), repeats)
        pair.at_b = SealedChannel(pair.keys[1], 0, pair.keys[0].public_key)  # rounds moved on
        tensor = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        through_tensor = per_call(lambda tensor=tensor: pair.seal_open_tensor(tensor), repeats)
        out["payloads"][name] = {
            "plain_bytes": size,
            "sealed_bytes": sealed_size(size),
            "overhead_percent": round(100 * (sealed_size(size) - size) / size, 3),
            "copy_us": round(copy * 1e6, 3),
            "seal_us": round(seal * 1e6, 2),
            "seal_open_us": round(both * 1e6, 2),
            "seal_open_over_copy": round(both / copy, 2),
            "tensor_seal_open_us": round(through_tensor * 1e6, 2),
            "tensor_seal_open_over_copy": round(through_tensor / copy, 2),
        }
        if name == "int8_w7a_mlp":
            copy_8k, seal_open_8k = copy, both
    assert copy_8k is not None and seal_open_8k is not None
    setup = per_call(pair.channel, repeats)
    setup_record = per_call(pair.channel_from_record, repeats)
    new_key = per_call(pair.new_generation_key, repeats)
    out["setup_per_pair"] = {
        "x25519_hkdf_us": round(setup * 1e6, 1),
        "x25519_hkdf_over_copy_8593B": round(setup / copy_8k, 1),
        "x25519_hkdf_over_seal_open_8593B": round(setup / seal_open_8k, 1),
        "with_record_verification_us": round(setup_record * 1e6, 1),
    }
    out["per_site_per_generation"] = {"keygen_and_signed_record_us": round(new_key * 1e6, 1)}
    out["machine"] = {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "cryptography": cryptography.__version__,
        "torch": torch.__version__,
        "repeats": repeats,
    }
    out["check"] = (
        verify_sealing_key_record(pair.records[1], pair.site_keys[1].public_key(), RUN, 0, 1)
        == pair.keys[1].public_key
        and pair.seal_open(b"x") == b"x"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sealing", description=__doc__)
    parser.add_argument("--repeats", type=int, default=7, help="timed batches per figure")
    args = parser.parse_args(argv)
    print(json.dumps(measure(max(1, args.repeats)), separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
