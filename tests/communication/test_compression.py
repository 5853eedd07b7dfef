"""Tests of slate.communication.compression against brute-force numpy references, one row at a
time."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from slate.communication.compression import (
    Compressor,
    Int8Compressor,
    NoCompressor,
    SignCompressor,
    TopKCompressor,
    compressor_forms,
    parse_compressor,
)
from slate.errors import ConfigError

SPECS = ("none", "int8", "topk:0.01", "topk:0.3", "topk:1", "sign")
DIMS = (1, 2, 7, 8, 9, 100, 255, 256, 257, 513, 1031)
INT8_DELTA = 1 - 256 / 254**2


# ---------------------------------------------------------------------------------------------
# Brute-force references: plain Python loops over rows and entries, little-endian bytes.


def _f32(x: float) -> np.float32:
    return np.float32(x)


def ref_none(row: np.ndarray) -> tuple[bytes, np.ndarray]:
    v = row.astype(np.float32)
    return v.astype("<f4").tobytes(), v


def ref_int8(row: np.ndarray) -> tuple[bytes, np.ndarray]:
    v = row.astype(np.float32)
    codes, scales, decoded = [], [], []
    for start in range(0, len(v), 256):
        block = v[start : start + 256]
        scale = _f32(np.max(np.abs(block))) / _f32(127)
        scales.append(scale)
        for value in block:
            q = 0 if scale == 0 else int(np.clip(np.round(value / scale), -127, 127))
            codes.append(q)
            decoded.append(_f32(q) * scale)
    payload = np.array(codes, dtype=np.int8).tobytes() + np.array(scales, "<f4").tobytes()
    return payload, np.array(decoded, dtype=np.float32)


def ref_topk(row: np.ndarray, fraction: float) -> tuple[bytes, np.ndarray]:
    v = row.astype(np.float32)
    d = len(v)
    k = max(1, math.ceil(round(fraction * d, 9)))
    order = sorted(range(d), key=lambda j: (-abs(float(v[j])), j))
    kept = sorted(order[:k])
    decoded = np.zeros(d, dtype=np.float32)
    decoded[kept] = v[kept]
    payload = np.array(kept, "<i4").tobytes() + v[kept].astype("<f4").tobytes()
    return payload, decoded


def ref_pairwise_sum(values: list[float]) -> float:
    """The documented fixed tree: pad to a power of two, add the second half onto the first."""
    width = 1
    while width < len(values):
        width *= 2
    values = values + [0.0] * (width - len(values))
    while len(values) > 1:
        half = len(values) // 2
        values = [values[i] + values[i + half] for i in range(half)]
    return values[0]


def ref_sign(row: np.ndarray) -> tuple[bytes, np.ndarray]:
    v = row.astype(np.float32)
    d = len(v)
    packed = bytearray()
    for i in range(0, d, 8):
        byte = 0
        for j, value in enumerate(v[i : i + 8]):
            if value >= 0:
                byte |= 1 << j
        packed.append(byte)
    scale = _f32(ref_pairwise_sum([abs(float(x)) for x in v]) / d)
    decoded = np.where(v >= 0, scale, -scale).astype(np.float32)
    return bytes(packed) + struct.pack("<f", scale), decoded


def reference(spec: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Payload and decoded values of every row of ``x`` by the brute-force reference."""
    if spec == "none":
        ref = ref_none
    elif spec == "int8":
        ref = ref_int8
    elif spec == "sign":
        ref = ref_sign
    else:
        fraction = float(spec.split(":")[1])
        ref = lambda row: ref_topk(row, fraction)  # noqa: E731
    rows = [ref(row) for row in x]
    payload = np.array([np.frombuffer(p, dtype=np.uint8) for p, _ in rows]).reshape(len(x), -1)
    decoded = np.array([c for _, c in rows], dtype=np.float32).reshape(x.shape)
    return payload, decoded


def random_rows(r: int, d: int, seed: int, kind: str = "gauss") -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "gauss":
        return rng.standard_normal((r, d))
    if kind == "heavy":
        return rng.standard_cauchy((r, d))
    if kind == "sparse":
        return rng.standard_normal((r, d)) * (rng.random((r, d)) < 0.05)
    if kind == "ties":
        return rng.integers(-3, 4, size=(r, d)).astype(np.float64)
    if kind == "scales":
        return rng.standard_normal((r, d)) * 10.0 ** rng.integers(-20, 20, size=(r, 1))
    raise ValueError(kind)


def contraction_delta(spec: str, x: np.ndarray) -> np.ndarray:
    """The documented delta of each row."""
    d = x.shape[1]
    if spec == "none":
        return np.ones(len(x))
    if spec == "int8":
        return np.full(len(x), INT8_DELTA)
    if spec == "sign":
        return np.sum(np.abs(x), axis=1) ** 2 / (d * np.sum(x**2, axis=1))
    k = parse_compressor(spec).k(d)  # type: ignore[attr-defined]
    return np.full(len(x), k / d)


# ---------------------------------------------------------------------------------------------
# Payloads and decoded values equal the references.


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("d", DIMS)
def test_payload_bytes_is_the_encoded_width(spec: str, d: int) -> None:
    c = parse_compressor(spec)
    payload = c.encode(torch.randn(3, d))
    assert payload.dtype == torch.uint8
    assert payload.is_contiguous()
    assert payload.shape == (3, c.payload_bytes(d))


@pytest.mark.parametrize(
    ("spec", "d", "expected"),
    [
        ("none", 1, 4),
        ("none", 1000, 4000),
        ("int8", 1, 5),
        ("int8", 256, 260),
        ("int8", 257, 265),
        ("int8", 1000, 1016),
        ("topk:0.01", 1, 8),
        ("topk:0.01", 100, 8),
        ("topk:0.01", 101, 16),
        ("topk:0.07", 100, 56),
        ("topk:1", 9, 72),
        ("sign", 1, 5),
        ("sign", 8, 5),
        ("sign", 9, 6),
        ("sign", 1000, 129),
    ],
)
def test_payload_bytes_by_formula(spec: str, d: int, expected: int) -> None:
    assert parse_compressor(spec).payload_bytes(d) == expected


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("d", (1, 9, 255, 257, 1031))
@pytest.mark.parametrize("kind", ("gauss", "heavy", "sparse", "ties", "scales"))
@pytest.mark.kernels
def test_encode_and_decode_match_the_reference(spec: str, d: int, kind: str) -> None:
    x = random_rows(4, d, seed=d, kind=kind)
    c = parse_compressor(spec)
    payload = c.encode(torch.from_numpy(x).float())
    expected_payload, expected_values = reference(spec, x)
    np.testing.assert_array_equal(payload.numpy(), expected_payload)
    decoded = c.decode(payload, d, torch.float32)
    np.testing.assert_array_equal(decoded.numpy(), expected_values)


def test_none_round_trip_is_exact_in_float32() -> None:
    x = torch.randn(5, 333) * 1e3
    c = NoCompressor()
    assert torch.equal(c.compress(x), x)
    assert torch.equal(c.encode(x).view(torch.float32), x)


def test_sign_scale_is_the_mean_magnitude() -> None:
    x = random_rows(6, 5000, seed=1, kind="heavy")
    payload = SignCompressor().encode(torch.from_numpy(x))
    scale = payload[:, -4:].clone().view(torch.float32).squeeze(1).double().numpy()
    exact = np.array([math.fsum(np.abs(row.astype(np.float32).astype(np.float64))) for row in x])
    np.testing.assert_allclose(scale, exact / x.shape[1], rtol=2**-23)


# ---------------------------------------------------------------------------------------------
# Hand-built layouts.


def test_sign_bit_layout() -> None:
    x = torch.tensor([[1.0, -2.0, 0.0, -0.0, 3.0, -1.0, 1.0, 1.0, -1.0]])
    payload = SignCompressor().encode(x)
    # Bits of byte 0, entry 0 first: 1 0 1 1 1 0 1 1 (0 and -0 are non-negative) = 221; byte 1
    # holds entry 8 (negative) and seven zero padding bits.
    scale = struct.pack("<f", np.float32(10.0 / 9.0))
    assert payload[0].tolist() == [0b11011101, 0, *scale]
    expected = torch.tensor([[1.0, -1, 1, 1, 1, -1, 1, 1, -1]]) * torch.tensor(10.0 / 9.0)
    assert torch.equal(SignCompressor().compress(x), expected)


def test_int8_layout() -> None:
    x = torch.zeros(1, 258)
    x[0, 0], x[0, 1], x[0, 2] = 2.54, -1.27, 0.005  # block 0: scale 0.02
    x[0, 256], x[0, 257] = 0.0, 0.0  # block 1: zero
    payload = Int8Compressor().encode(x)[0]
    scale = np.float32(2.54) / np.float32(127)
    codes = payload[:258].clone().view(torch.int8)
    assert codes[:3].tolist() == [127, int(np.round(np.float32(-1.27) / scale)), 0]
    assert codes[3:].abs().sum() == 0
    assert payload[258:262].tolist() == list(struct.pack("<f", scale))
    assert payload[262:].tolist() == [0, 0, 0, 0]


def test_int8_rounds_half_to_even() -> None:
    # max 127 gives scale 1 exactly, so 2.5 -> 2, 3.5 -> 4, -0.5 -> 0.
    x = torch.tensor([[127.0, 2.5, 3.5, -0.5, -1.5]])
    assert Int8Compressor().compress(x).tolist() == [[127.0, 2.0, 4.0, -0.0, -2.0]]


def test_topk_layout_and_ties() -> None:
    x = torch.tensor([[1.0, -2.0, 2.0, -2.0, 3.0, -1.0, 1.0, 1.0, -1.0, 0.0]])
    c = parse_compressor("topk:0.3")
    payload = c.encode(x)[0]
    # k = 3: |3| at index 4, then the two lowest indices of the tied |2| (1 and 2), ascending.
    assert payload[:12].clone().view(torch.int32).tolist() == [1, 2, 4]
    assert payload[12:].clone().view(torch.float32).tolist() == [-2.0, 2.0, 3.0]
    assert c.compress(x).tolist() == [[0.0, -2.0, 2.0, 0.0, 3.0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("fraction", (0.001, 0.01, 0.07, 0.2, 0.5, 1.0))
def test_topk_keeps_exactly_the_k_largest(fraction: float) -> None:
    x = torch.randn(8, 997, dtype=torch.float64)
    c = TopKCompressor(fraction)
    k = c.k(997)
    assert k == max(1, math.ceil(round(fraction * 997, 9)))
    out = c.compress(x)
    kept = out != 0
    assert kept.sum(dim=1).tolist() == [k] * 8
    assert torch.equal(out[kept], x.float().double()[kept])
    smallest_kept = torch.where(kept, x.abs(), torch.inf).amin(dim=1)
    largest_dropped = torch.where(kept, -torch.inf, x.abs()).amax(dim=1)
    assert bool((smallest_kept >= largest_dropped).all())


def test_topk_k_uses_the_decimal_fraction() -> None:
    assert 0.07 * 100 > 7
    assert TopKCompressor(0.07).k(100) == 7
    assert TopKCompressor(0.01).k(1) == 1
    assert TopKCompressor(0.01).k(250) == 3
    assert TopKCompressor(1.0).k(13) == 13


# ---------------------------------------------------------------------------------------------
# Contraction, zeros, dtypes, shapes, determinism.


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kind", ("gauss", "heavy", "sparse", "ties", "scales"))
def test_contraction(spec: str, kind: str) -> None:
    x = random_rows(16, 1000, seed=7, kind=kind)
    c = parse_compressor(spec)
    out = c.compress(torch.from_numpy(x)).numpy()
    error = np.sum((out - x) ** 2, axis=1)
    norm = np.sum(x**2, axis=1)
    bound = (1 - contraction_delta(spec, x)) * norm
    # float32 rounding of the input and of the values on the wire: 2^-24 relative per entry.
    assert np.all(error <= bound + 1e-6 * norm)
    if spec == "sign":  # least-squares scale: the bound holds with equality
        np.testing.assert_allclose(error, bound, rtol=1e-5, atol=1e-6 * norm.max())


@pytest.mark.parametrize("spec", SPECS)
def test_zero_rows(spec: str) -> None:
    x = torch.zeros(3, 300)
    x[1, 5] = -4.0
    c = parse_compressor(spec)
    out = c.compress(x)
    assert torch.equal(out[[0, 2]], torch.zeros(2, 300))
    assert out[1, 5] == -4.0 or spec == "sign"
    if spec == "sign":
        payload = c.encode(torch.zeros(1, 16))
        assert payload[0].tolist() == [255, 255, 0, 0, 0, 0]


@pytest.mark.parametrize("spec", SPECS)
def test_float64_input(spec: str) -> None:
    x = torch.randn(4, 700, dtype=torch.float64)
    c = parse_compressor(spec)
    assert torch.equal(c.encode(x), c.encode(x.float()))
    out = c.compress(x)
    assert out.dtype == torch.float64
    assert torch.equal(out, c.compress(x.float()).double())
    assert c.decode(c.encode(x), 700, torch.float16).dtype == torch.float16


@pytest.mark.parametrize("spec", SPECS)
def test_no_rows(spec: str) -> None:
    c = parse_compressor(spec)
    payload = c.encode(torch.zeros(0, 50))
    assert payload.shape == (0, c.payload_bytes(50))
    assert c.decode(payload, 50, torch.float32).shape == (0, 50)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.kernels
def test_rows_are_independent_of_the_batch_and_threads(spec: str) -> None:
    x = torch.from_numpy(random_rows(5, 40_000, seed=3, kind="heavy"))
    c = parse_compressor(spec)
    batch = c.encode(x)
    for i in range(5):
        assert torch.equal(c.encode(x[i : i + 1]), batch[i : i + 1])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(c.encode(x), batch)
    finally:
        torch.set_num_threads(threads)
    # Slicing a payload by columns (R = 1 starts at odd byte offsets) decodes the same.
    wide = torch.cat([torch.zeros(1, 3, dtype=torch.uint8), batch[:1]], dim=1)[:, 3:]
    assert torch.equal(c.decode(wide, 40_000, torch.float32), c.decode(batch[:1], 40_000, x.dtype))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", SPECS)
def test_cuda_payload_equals_cpu(spec: str) -> None:
    x = torch.from_numpy(random_rows(6, 20_000, seed=5, kind="heavy")).float()
    x[:, :100] = torch.randint(-2, 3, (6, 100)).float()  # ties for top-k
    c = parse_compressor(spec)
    payload = c.encode(x.cuda())
    assert payload.is_cuda
    assert torch.equal(payload.cpu(), c.encode(x))
    assert torch.equal(c.decode(payload, 20_000, torch.float32).cpu(), c.compress(x))


def test_shape_checks() -> None:
    c = parse_compressor("int8")
    with pytest.raises(ValueError, match="floating tensor"):
        c.encode(torch.zeros(10))
    with pytest.raises(ValueError, match="floating tensor"):
        c.encode(torch.zeros(2, 10, dtype=torch.int64))
    with pytest.raises(ValueError, match="d = 0"):
        c.encode(torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"\(R, 14\) torch.uint8 payload"):
        c.decode(torch.zeros(2, 13, dtype=torch.uint8), 10, torch.float32)
    with pytest.raises(ValueError, match="floating dtype"):
        c.decode(torch.zeros(2, 14, dtype=torch.uint8), 10, torch.int32)


# ---------------------------------------------------------------------------------------------
# Properties.

finite_rows = arrays(
    np.float32,
    st.tuples(st.integers(1, 4), st.integers(1, 600)),
    elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=False),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=finite_rows, spec=st.sampled_from(SPECS))
def test_property_matches_reference_and_contracts(x: np.ndarray, spec: str) -> None:
    c = parse_compressor(spec)
    payload = c.encode(torch.from_numpy(x))
    assert payload.shape[1] == c.payload_bytes(x.shape[1])
    expected_payload, expected_values = reference(spec, x)
    np.testing.assert_array_equal(payload.numpy(), expected_payload)
    out = c.decode(payload, x.shape[1], torch.float64).numpy()
    np.testing.assert_array_equal(out, expected_values.astype(np.float64))
    x64 = x.astype(np.float64)
    norm = np.sum(x64**2, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = np.nan_to_num(contraction_delta(spec, x64), nan=1.0)
    bound = (1 - delta) * norm
    assert np.all(np.sum((out - x64) ** 2, axis=1) <= bound + 1e-6 * norm + 1e-30)


@settings(max_examples=50, deadline=None)
@given(fraction=st.floats(1e-4, 1.0, exclude_min=False), d=st.integers(1, 5000))
def test_property_topk_k_and_name(fraction: float, d: int) -> None:
    c = TopKCompressor(fraction)
    assert 1 <= c.k(d) <= d
    assert c.k(d) >= fraction * d * (1 - 1e-12)
    assert parse_compressor(c.name) == c
    assert 0 < c.default_consensus_step <= 0.4


# ---------------------------------------------------------------------------------------------
# Parsing, names, errors.


def test_names_parse_back() -> None:
    assert compressor_forms() == ("none", "int8", "topk:FRACTION", "sign")
    for spec, cls in [
        ("none", NoCompressor),
        ("int8", Int8Compressor),
        ("sign", SignCompressor),
        ("topk:0.01", TopKCompressor),
        (" TopK:1e-2 ", TopKCompressor),
    ]:
        c = parse_compressor(spec)
        assert isinstance(c, cls)
        assert isinstance(c, Compressor)
        assert parse_compressor(c.name) == c
    assert parse_compressor("topk:1e-2").name == "topk:0.01"
    assert parse_compressor("topk:0.01") != parse_compressor("topk:0.02")


def test_default_consensus_steps() -> None:
    assert parse_compressor("none").default_consensus_step == 1.0
    assert parse_compressor("int8").default_consensus_step == 1.0
    assert parse_compressor("sign").default_consensus_step == 0.4
    assert parse_compressor("topk:0.01").default_consensus_step == 0.04
    assert parse_compressor("topk:0.1").default_consensus_step == pytest.approx(0.4 * 0.1**0.5)


def _ring(n: int) -> torch.Tensor:
    w = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in (i - 1, i, i + 1):
            w[i, j % n] = 1 / 3
    return w


def _choco_gossip(c: Compressor, w: torch.Tensor, gamma: float, rounds: int) -> float:
    """CHOCO-Gossip (Koloskova et al. 2019, Algorithm 1): the consensus error left, relative."""
    torch.manual_seed(0)
    x = torch.randn(w.shape[0], 200, dtype=torch.float64)
    mean = x.mean(dim=0)
    start = ((x - mean) ** 2).sum()
    public = torch.zeros_like(x)
    for _ in range(rounds):
        public = public + c.compress(x - public)
        x = x + gamma * (w @ public - public)
    return float(((x - mean) ** 2).sum() / start)


@pytest.mark.parametrize(
    ("spec", "rounds", "target"),
    [("none", 100, 1e-6), ("int8", 100, 1e-6), ("sign", 200, 1e-2), ("topk:0.01", 300, 0.3)],
)
def test_default_consensus_steps_reach_consensus(spec: str, rounds: int, target: float) -> None:
    c = parse_compressor(spec)
    w = _ring(8)
    error = _choco_gossip(c, w, c.default_consensus_step, rounds)
    assert error < target
    if spec == "int8":  # int8 tracks uncompressed gossip at gamma = 1
        dense = _choco_gossip(NoCompressor(), w, 1.0, rounds)
        assert error < 10 * dense


def test_linear_topk_rule_would_diverge() -> None:
    """Why topk's default grows like sqrt(F): gamma = 4F diverges at F = 0.2."""
    full = torch.full((16, 16), 1 / 16, dtype=torch.float64)
    c = TopKCompressor(0.2)
    assert _choco_gossip(c, full, 0.8, 100) > 1
    assert _choco_gossip(c, full, c.default_consensus_step, 100) < 1e-12


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "The compressor name is empty"),
        ("int4", "Unknown compressor 'int4'"),
        ("gzip", "Unknown compressor 'gzip'"),
        ("topk", "needs the fraction of entries to keep"),
        ("topk:", "needs the fraction of entries to keep"),
        ("topk:0", "got '0'"),
        ("topk:1.5", "got '1.5'"),
        ("topk:-1", "got '-1'"),
        ("topk:abc", "got 'abc'"),
        ("topk:nan", "got 'nan'"),
        ("topk:inf", "got 'inf'"),
    ],
)
def test_errors(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_compressor(spec)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
    assert "none, int8, topk:FRACTION" in message
    assert "0 < FRACTION <= 1" in message
    assert "sign" in message


def test_topk_constructor_rejects_bad_fractions() -> None:
    for bad in (0.0, -0.5, 1.01, math.nan):
        with pytest.raises(ConfigError, match="0 < FRACTION <= 1"):
            TopKCompressor(bad)
