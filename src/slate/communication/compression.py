r"""Compression operators for CHOCO-SGD compressed gossip (``--compress``).

CHOCO-SGD (Koloskova, Stich, Jaggi, ICML 2019) lets a party send, each gossip round, a
compressed difference :math:`q_i = C(x_i - \hat x_i)` between its parameters and the public copy
:math:`\hat x_i` that its neighbours hold, instead of :math:`x_i` itself. This module holds the
operators :math:`C`; the CHOCO update and the engines live elsewhere.

Every operator is applied to the rows of an ``(R, d)`` tensor independently (one row per
directed edge in the simulator, one per neighbour in the distributed engine), vectorized over
the rows, and is **deterministic**: the payload is a function of the row's values alone, for
any ``R`` and any number of threads, and the same bytes on CPU and CUDA: every number that
reaches the payload comes from exact operations (max, comparison, top-k values, integer
counts) or from single IEEE float operations done elementwise (one division, a fixed tree of
additions), never from a library reduction whose association order may vary. That is what lets
both engines encode a row alike: the same row gives the same bytes in the simulator and in the
distributed engine (the engines' rows themselves agree to float32 rounding, docs/testing.md).

Contraction
-----------
The CHOCO analysis needs a :math:`\delta`-contraction, :math:`0 < \delta \le 1`:

.. math::

    \mathbb{E}\,\|C(x) - x\|_2^2 \le (1 - \delta)\,\|x\|_2^2 \qquad \forall x \in \mathbb{R}^d,

and its consensus step :math:`\gamma` scales with :math:`\delta` (Theorem 2 of the paper:
:math:`\gamma^\star = \rho^2\delta / (16\rho + \rho^2 + 4\beta^2 + 2\rho\beta^2 - 8\rho\delta)`
with :math:`\rho` the spectral gap and :math:`\beta = \|I - W\|_2`). All operators here are
deterministic, so the expectation is the value itself.

- ``none``: :math:`C(x) = x` (rounded to float32, the wire precision), :math:`\delta = 1`.
- ``int8``: per block :math:`b` of 256 consecutive entries, :math:`s_b = \max_{j \in b} |x_j| /
  127` and :math:`C(x)_j = s_b\,\mathrm{round}(x_j / s_b)` with round half to even, the result
  clamped to :math:`[-127, 127]`. Each entry is off by at most :math:`s_b / 2` and
  :math:`\|x_b\|_2^2 \ge (127 s_b)^2`, so on a block of :math:`n_b \le 256` entries
  :math:`\|C(x_b) - x_b\|^2 \le n_b s_b^2/4 \le (256/254^2)\|x_b\|^2`: :math:`\delta \ge 1 -
  256/254^2 \approx 0.996` (up to float32 rounding of the scale and the products).
- ``topk:F``: keep the :math:`k = \max(1, \lceil F d \rceil)` entries of largest magnitude, zero
  the others. The kept :math:`k` carry at least a fraction :math:`k/d` of :math:`\|x\|^2`, so
  :math:`\delta = k / d` (Stich, Cordonnier, Jaggi, "Sparsified SGD with memory", NeurIPS 2018).
- ``sign``: the scaled sign :math:`C(x) = \frac{\|x\|_1}{d}\,\mathrm{sign}(x)` with
  :math:`\mathrm{sign}(0) = +1` (Karimireddy, Rebjock, Stich, Jaggi, ICML 2019, "Error
  feedback fixes SignSGD and other gradient compression schemes"). Its scale is the
  least-squares one, and :math:`\|C(x) - x\|^2 = \|x\|^2 - \|x\|_1^2/d`, so
  :math:`\delta = \|x\|_1^2 / (d\,\|x\|_2^2) \in [1/d, 1]`.

Wire format
-----------
:meth:`Compressor.encode` turns ``(R, d)`` floats into ``(R, n)`` ``torch.uint8`` bytes,
``n = payload_bytes(d)``; multi-byte numbers are stored little-endian (the byte order of every
platform torch runs on; :meth:`Tensor.view` reinterprets them in place). All operators first
round the input to float32, so a float64 row and its float32 rounding give the same payload.

=========  ==============================================================  =====================
operator   row layout                                                      ``payload_bytes(d)``
=========  ==============================================================  =====================
none       ``d`` float32 values                                            ``4 d``
int8       ``d`` int8 codes, then ``ceil(d / 256)`` float32 block scales  ``d + 4 ceil(d/256)``
topk:F     ``k`` int32 indices (ascending), then their ``k`` float32      ``8 k``
           values
sign       ``ceil(d / 8)`` bytes of sign bits (bit ``j`` of byte ``i`` is  ``ceil(d/8) + 4``
           entry ``8 i + j``, 1 = non-negative, padding bits 0), then the
           float32 scale
=========  ==============================================================  =====================

Inputs must be finite; what a NaN or an infinity becomes is unspecified (callers check
finiteness; checking here would cost a device synchronisation per call).
:meth:`Compressor.decode` trusts its payload: it checks the shape, not the contents.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from slate.config import agreed, must_agree
from slate.errors import ConfigError

__all__ = [
    "COMPRESSORS",
    "Compressor",
    "Int8Compressor",
    "NoCompressor",
    "NoOperatorParams",
    "SignCompressor",
    "TopKCompressor",
    "TopKParams",
    "compress_help",
    "compressor_forms",
    "from_bytes",
    "parse_compressor",
    "register_compressor",
    "to_bytes",
    "unregister_compressor",
]

WIRE_DTYPE = torch.float32
"""The precision of every value on the wire."""

INT8_BLOCK = 256
"""Entries per ``int8`` block, each with its own float32 scale."""

INT8_LEVELS = 127
"""The largest ``int8`` code: codes lie in ``[-127, 127]`` (symmetric, -128 unused)."""

TOPK_STEP_SCALE = 0.4
"""``topk:F``'s default consensus step is ``0.4 sqrt(F)`` (0.04 at the authors' ``F = 0.01``)."""


@dataclass(frozen=True)
class NoOperatorParams:
    """The parameters of an operator that has none (``none``, ``int8``, ``sign``)."""


@dataclass(frozen=True)
class TopKParams:
    """``topk:FRACTION``'s parameter: the fraction of entries kept."""

    fraction: float = agreed(help="the fraction of entries kept, 0 < FRACTION <= 1", example="0.01")


class Compressor(ABC):
    r"""A deterministic compression operator :math:`C`, applied to each row independently.

    Subclasses implement :meth:`payload_bytes`, :meth:`_encode` and :meth:`_decode`; the
    public methods validate their arguments once and round the input to float32.

    Attributes:
        name: the spec that :func:`parse_compressor` turns back into this operator.
        default_consensus_step: CHOCO's :math:`\gamma` for this operator when the user gives
            none (each subclass documents where its value comes from).
    """

    name: str
    default_consensus_step: float
    #: The operator's parameter dataclass: its fields, in order, follow the name in
    #: ``--compress`` (``topk:FRACTION``), each with its ``help`` and an ``example``.
    Params: ClassVar[type] = NoOperatorParams

    @classmethod
    def from_params(cls, params: Any) -> Compressor:
        """The operator with ``params`` (an instance of :attr:`Params`)."""
        return cls(**dataclasses.asdict(params))

    @classmethod
    def parse_params(cls, text: str | None, spec: str) -> Any:
        """:attr:`Params` from the text after the name in ``spec`` (None: no colon): one value
        per field, in order, colon-separated, converted by the field's type; a missing, extra or
        unconvertible value is a :class:`ConfigError` (ranges are ``__init__``'s to check)."""
        fields = dataclasses.fields(cls.Params)
        values = [] if text is None else text.split(":")
        if not fields and text is not None:
            raise ConfigError(f"Unknown compressor {spec!r}. Valid compressors: {_valid_forms()}.")
        if len(values) != len(fields):
            form = _form(spec.strip().lower().partition(":")[0])
            raise ConfigError(f"Compressor {spec!r} takes {len(fields)} value(s): write {form}. "
                              f"Valid compressors: {_valid_forms()}.")  # fmt: skip
        hints = typing.get_type_hints(cls.Params)
        given: dict[str, Any] = {}
        for f, value in zip(fields, values, strict=True):
            try:
                given[f.name] = hints[f.name](value)
            except ValueError:
                raise ConfigError(
                    f"Compressor {spec!r}: {f.name.upper()} must be {hints[f.name].__name__} "
                    f"({f.metadata['help']}), got {value!r}. Valid compressors: {_valid_forms()}."
                ) from None
        return cls.Params(**given)

    @abstractmethod
    def payload_bytes(self, d: int) -> int:
        """Bytes of one encoded row of ``d`` entries: exactly ``encode(x).shape[1]``."""

    @abstractmethod
    def _encode(self, rows: Tensor) -> Tensor:
        """Encode contiguous float32 rows ``(R, d)``, ``d >= 1``, into ``(R, n)`` uint8."""

    @abstractmethod
    def _decode(self, payload: Tensor, d: int, dtype: torch.dtype) -> Tensor:
        """Decode a contiguous ``(R, payload_bytes(d))`` uint8 payload into ``(R, d)``."""

    def encode(self, delta: Tensor) -> Tensor:
        """Encode each row of ``delta``.

        Args:
            delta: ``(R, d)`` floating tensor, ``d >= 1``, on any device.

        Returns:
            ``(R, payload_bytes(d))`` contiguous ``torch.uint8`` tensor on ``delta``'s device.
        """
        return self._encode(_wire_rows(delta)).contiguous()

    def decode(self, payload: Tensor, d: int, dtype: torch.dtype) -> Tensor:
        """Decode rows that :meth:`encode` produced.

        Args:
            payload: ``(R, payload_bytes(d))`` ``torch.uint8`` tensor.
            d: entries per row.
            dtype: floating dtype of the result.

        Returns:
            ``(R, d)`` tensor of ``dtype`` on ``payload``'s device: :math:`C(\\delta)`.
        """
        expected = self.payload_bytes(d)
        if payload.dtype != torch.uint8 or payload.ndim != 2 or payload.shape[1] != expected:
            raise ValueError(
                f"{self.name}: expected a (R, {expected}) torch.uint8 payload for d = {d}, got "
                f"{tuple(payload.shape)} {payload.dtype}."
            )
        if not dtype.is_floating_point:
            raise ValueError(f"{self.name}: decode needs a floating dtype, got {dtype}.")
        return self._decode(payload.contiguous(), d, dtype)

    def compress(self, delta: Tensor) -> Tensor:
        """:math:`C(\\delta)` = ``decode(encode(delta))``, with ``delta``'s shape and dtype."""
        return self.decode(self.encode(delta), delta.shape[1], delta.dtype)

    def __repr__(self) -> str:
        return f"parse_compressor({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compressor) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


class NoCompressor(Compressor):
    r"""``none``: the identity, :math:`C(x) = x` in float32 (:math:`\delta = 1`).

    ``default_consensus_step`` is 1: with an exact :math:`C` the public copies equal the
    parameters after each round, and CHOCO with :math:`\gamma = 1` is plain gossip
    :math:`x \leftarrow W x`.
    """

    name = "none"
    default_consensus_step = 1.0

    def payload_bytes(self, d: int) -> int:
        return 4 * _check_d(d)

    def _encode(self, rows: Tensor) -> Tensor:
        return to_bytes(rows)

    def _decode(self, payload: Tensor, d: int, dtype: torch.dtype) -> Tensor:
        return from_bytes(payload, WIRE_DTYPE).to(dtype)


class Int8Compressor(Compressor):
    r"""``int8``: symmetric 8-bit quantisation with one float32 scale per 256 entries.

    For block :math:`b` (entries :math:`256 b, \dots, \min(256 (b + 1), d) - 1`):
    :math:`s_b = \mathrm{fl}_{32}(\max_{j \in b} |x_j| / 127)` (0 for a zero block),
    :math:`q_j = \mathrm{clamp}(\mathrm{round}(x_j / s_b), -127, 127)` with round half to even
    and the division in float32, and :math:`C(x)_j = \mathrm{fl}_{32}(q_j s_b)`.
    :math:`\delta \ge 1 - 256/254^2 \approx 0.996` (module docstring). A block whose largest
    magnitude is below :math:`127 \cdot 2^{-149}` gets scale 0 and decodes to zeros.

    ``default_consensus_step`` is 1, as for ``none``. The authors use :math:`\gamma = 0.34`
    for 4-bit QSGD, and the best :math:`\gamma` grows with :math:`\delta`; 8-bit absmax
    quantisation is far finer (:math:`\delta \approx 0.996`). Measured with CHOCO-gossip
    (average consensus, the authors' Section 4 experiment; 16 parties, ``d = 2000`` Gaussian
    values, 300 rounds) on the ``star``, ``ring``, ``torus`` and ``exponential`` topologies,
    and on the first three with Gaussian noise added each round (as SGD steps would), the
    consensus error of ``int8`` matches that of ``none`` to within a few percent at every
    :math:`\gamma` in ``0.1 .. 1``, and :math:`\gamma = 1` is the fastest on every graph; a
    smaller :math:`\gamma` only slows it down (``0.5`` leaves :math:`10^{-8}` of the error on the
    ring where ``1`` leaves :math:`10^{-15}`). ``test_default_consensus_steps_reach_consensus``
    repeats a small version of this check.
    """

    name = "int8"
    default_consensus_step = 1.0

    def payload_bytes(self, d: int) -> int:
        return _check_d(d) + 4 * _ceil_div(d, INT8_BLOCK)

    def _encode(self, rows: Tensor) -> Tensor:
        r, d = rows.shape
        n_blocks = _ceil_div(d, INT8_BLOCK)
        blocks = F.pad(rows, (0, n_blocks * INT8_BLOCK - d)).view(r, n_blocks, INT8_BLOCK)
        # Divide by a tensor on the same device, never by a Python scalar: CUDA turns a division
        # by a CPU scalar into a multiplication by its reciprocal, which rounds differently.
        levels = torch.full((), float(INT8_LEVELS), dtype=WIRE_DTYPE, device=rows.device)
        scale = blocks.abs().amax(dim=2) / levels
        divisor = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(2)
        codes = torch.round(blocks / divisor).clamp_(-INT8_LEVELS, INT8_LEVELS)
        codes = codes.to(torch.int8).view(r, n_blocks * INT8_BLOCK)[:, :d]
        return torch.cat([to_bytes(codes), to_bytes(scale)], dim=1)

    def _decode(self, payload: Tensor, d: int, dtype: torch.dtype) -> Tensor:
        r = payload.shape[0]
        n_blocks = _ceil_div(d, INT8_BLOCK)
        codes = from_bytes(payload[:, :d], torch.int8).to(WIRE_DTYPE)
        scale = from_bytes(payload[:, d:], WIRE_DTYPE)
        codes = F.pad(codes, (0, n_blocks * INT8_BLOCK - d)).view(r, n_blocks, INT8_BLOCK)
        values = (codes * scale.unsqueeze(2)).view(r, n_blocks * INT8_BLOCK)[:, :d]
        return values.to(dtype)


class TopKCompressor(Compressor):
    r"""``topk:F``: keep the :math:`k = \max(1, \lceil F d \rceil)` largest magnitudes per row.

    ``F`` (:math:`0 < F \le 1`) is the fraction of entries **kept**; in the authors' code
    (epfml/ChocoSGD) ``compress_ratio`` is the fraction *dropped*, so their ``0.99`` is our
    ``topk:0.01``. :math:`k` is computed from ``F``'s shortest decimal form, exactly
    (``topk:0.07`` keeps 7 of 100, although ``0.07 * 100`` is ``7.000000000000001`` in floating
    point). :math:`\delta = k / d`.

    Ties: among entries of equal magnitude the lower index is kept, so the choice does not
    depend on the device or on how ``torch.topk`` orders equal values. The payload lists the
    kept indices in ascending order, then their values.

    ``default_consensus_step`` is :math:`0.4 \sqrt{F}`: the authors' :math:`\gamma = 0.04` at
    ``F = 0.01``, and between a fifth and a half of the smallest diverging :math:`\gamma` at
    every ``F`` we measured. CHOCO-gossip on 16 parties (``d = 2000``, 300 rounds; ``star``,
    ``ring``, ``torus``, ``exponential``, ``full``) diverges on some graph from
    :math:`\gamma \approx 0.16` at ``F = 0.01``, 0.24 at 0.03, 0.4 at 0.1, 0.8 at 0.2 and 1 at
    0.3: the stability limit grows like :math:`\sqrt F`, not like :math:`F` (Theorem 2's
    :math:`\gamma^\star \propto \delta` is a worst-case bound), so the linear rule :math:`4F`
    would diverge from ``F = 0.1`` on. ``topk:1`` is the identity but gets 0.4; use ``none``
    for uncompressed gossip.
    """

    Params = TopKParams

    @classmethod
    def parse_params(cls, text: str | None, spec: str) -> TopKParams:
        """``FRACTION`` of ``topk:FRACTION``, a number with ``0 < FRACTION <= 1``."""
        if not text:
            raise ConfigError(
                f"Compressor {spec!r} needs the fraction of entries to keep: write topk:FRACTION "
                f"with 0 < FRACTION <= 1, e.g. topk:0.01. Valid compressors: {_valid_forms()}."
            )
        try:
            fraction = float(text)
        except ValueError:
            fraction = math.nan
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(
                f"Compressor {spec!r}: the top-k fraction must be a number with "
                f"0 < FRACTION <= 1 (the fraction of entries kept), got {text!r}. Valid "
                f"compressors: {_valid_forms()}."
            )
        return TopKParams(fraction)

    def __init__(self, fraction: float) -> None:
        fraction = float(fraction)
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(
                f"The top-k fraction must satisfy 0 < FRACTION <= 1 (the fraction of entries "
                f"kept), got {fraction!r}. Valid compressors: {_valid_forms()}."
            )
        self.fraction = fraction
        self._exact_fraction = Fraction(repr(fraction))
        self.name = f"topk:{fraction!r}"
        self.default_consensus_step = float(f"{TOPK_STEP_SCALE * math.sqrt(fraction):.12g}")

    def k(self, d: int) -> int:
        """Entries kept of a row of ``d``: :math:`\\max(1, \\lceil F d \\rceil)`."""
        return max(1, math.ceil(self._exact_fraction * _check_d(d)))

    def payload_bytes(self, d: int) -> int:
        return 8 * self.k(d)

    def _encode(self, rows: Tensor) -> Tensor:
        r, d = rows.shape
        k = self.k(d)
        magnitude = rows.abs()
        # The k-th largest magnitude is the same on every device (only the order of equal values
        # within torch.topk's answer may differ); the mask then keeps everything above it and the
        # lowest-index entries equal to it.
        kth = magnitude.topk(k, dim=1).values[:, -1:]
        above = magnitude > kth
        ties = magnitude == kth
        room = k - above.sum(dim=1, keepdim=True)
        keep = above | (ties & (ties.cumsum(dim=1) <= room))
        # Each row keeps exactly k entries: send kept entry j to slot (kept before j), the others
        # to distinct slots past k, so the scatter has no duplicate targets.
        columns = torch.arange(d, device=rows.device).expand(r, d)
        slot = torch.where(keep, keep.cumsum(dim=1) - 1, k + columns)
        indices = torch.empty((r, k + d), dtype=torch.int64, device=rows.device)
        indices = indices.scatter_(1, slot, columns)[:, :k]
        values = rows.gather(1, indices)
        return torch.cat([to_bytes(indices.to(torch.int32)), to_bytes(values)], dim=1)

    def _decode(self, payload: Tensor, d: int, dtype: torch.dtype) -> Tensor:
        r = payload.shape[0]
        k = self.k(d)
        indices = from_bytes(payload[:, : 4 * k], torch.int32).to(torch.int64)
        values = from_bytes(payload[:, 4 * k :], WIRE_DTYPE).to(dtype)
        out = torch.zeros((r, d), dtype=dtype, device=payload.device)
        return out.scatter_(1, indices, values)


class SignCompressor(Compressor):
    r"""``sign``: :math:`C(x) = \frac{\|x\|_1}{d}\,\mathrm{sign}(x)`, :math:`\mathrm{sign}(0) = +1`.

    The scaled sign of Karimireddy et al. (ICML 2019), one bit per entry plus one float32
    scale; :math:`\delta = \|x\|_1^2 / (d \|x\|_2^2)`. ``-0.0`` counts as non-negative.

    The scale is :math:`\mathrm{fl}_{32}(S / d)` where :math:`S` is :math:`\|x\|_1` summed in
    float64 along a fixed pairwise tree: the row, zero-padded to a power of two :math:`2^m`, is
    halved :math:`m` times by adding entry :math:`i + 2^{l-1}` to entry :math:`i`. Every add is
    elementwise, so the sum does not depend on the device, the thread count or ``R`` (a
    library reduction may associate differently in each of these).

    ``default_consensus_step`` is 0.4, the low end of the authors' 0.4-0.5 for sign
    compression with a norm scale (their ``sign`` operator in epfml/ChocoSGD).
    """

    name = "sign"
    default_consensus_step = 0.4

    def payload_bytes(self, d: int) -> int:
        return _ceil_div(_check_d(d), 8) + 4

    def _encode(self, rows: Tensor) -> Tensor:
        r, d = rows.shape
        n_bytes = _ceil_div(d, 8)
        bits = F.pad((rows >= 0).to(torch.uint8), (0, 8 * n_bytes - d)).view(r, n_bytes, 8)
        weights = torch.tensor([1 << j for j in range(8)], dtype=torch.uint8, device=rows.device)
        packed = (bits * weights).sum(dim=2, dtype=torch.int32).to(torch.uint8)
        total = _tree_sum(rows.abs().to(torch.float64))
        count = torch.full((), float(d), dtype=torch.float64, device=rows.device)
        scale = (total / count).to(WIRE_DTYPE).unsqueeze(1)
        return torch.cat([packed, to_bytes(scale)], dim=1)

    def _decode(self, payload: Tensor, d: int, dtype: torch.dtype) -> Tensor:
        r = payload.shape[0]
        n_bytes = _ceil_div(d, 8)
        shifts = torch.arange(8, dtype=torch.uint8, device=payload.device)
        bits = (payload[:, :n_bytes].unsqueeze(2) >> shifts) & 1
        positive = bits.view(r, 8 * n_bytes)[:, :d].bool()
        scale = from_bytes(payload[:, n_bytes:], WIRE_DTYPE).to(dtype)
        return torch.where(positive, scale, -scale)


#: The operators by name, in the order ``--compress``'s help lists them.
COMPRESSORS: dict[str, type[Compressor]] = {
    "none": NoCompressor,
    "int8": Int8Compressor,
    "topk": TopKCompressor,
    "sign": SignCompressor,
}


def _form(name: str) -> str:
    """``topk`` -> ``topk:FRACTION``: the name and its parameters' names in capitals."""
    fields = dataclasses.fields(COMPRESSORS[name].Params)
    return ":".join([name, *(f.name.upper() for f in fields)])


def _described(name: str, with_help: bool) -> str:
    """The form of ``name``, with its parameters' help (``with_help``) and an example."""
    fields = dataclasses.fields(COMPRESSORS[name].Params)
    if not fields:
        return name
    example = ":".join([name, *(f.metadata["example"] for f in fields)])
    helps = [f.metadata["help"] for f in fields] if with_help else []
    return f"{_form(name)} ({', '.join([*helps, f'e.g. {example}'])})"


def _listed(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " or " + items[-1] if len(items) > 1 else items[0]


_BUILT_IN = frozenset(COMPRESSORS)


def compressor_forms() -> tuple[str, ...]:
    """The forms :func:`parse_compressor` accepts (``topk:FRACTION``), registered ones included."""
    return tuple(_form(name) for name in COMPRESSORS)


def _valid_forms() -> str:
    return _listed([_described(name, with_help=True) for name in COMPRESSORS])


def register_compressor(name: str, cls: type[Compressor]) -> type[Compressor]:
    """Add ``cls`` to :data:`COMPRESSORS` as ``--compress NAME[:VALUE...]``, for this process;
    returns ``cls``. Checked first: ``name`` is new, lower case, without a colon; ``cls`` is a
    :class:`Compressor` whose ``Params`` is a dataclass with every field classified
    (:func:`slate.config.agreed`) and carrying the ``help`` and ``example`` that
    ``--compress``'s help and errors show. A ``ValueError`` or ``TypeError`` otherwise."""
    if not (isinstance(cls, type) and issubclass(cls, Compressor)):
        raise TypeError(f"register_compressor takes a subclass of Compressor, got {cls!r}")
    if not name or name != name.strip().lower() or ":" in name or name in COMPRESSORS:
        raise ValueError(f"compressor name {name!r} is taken, empty, or not lower case without "
                         "a colon")  # fmt: skip
    if not dataclasses.is_dataclass(cls.Params):
        raise TypeError(f"{cls.__name__}.Params must be a dataclass, got {cls.Params!r}")
    for f in dataclasses.fields(cls.Params):
        must_agree(f)
        if "help" not in f.metadata or "example" not in f.metadata:
            raise TypeError(f"{cls.__name__}.Params.{f.name} needs help= and example= (the "
                            "help and errors of --compress show them)")  # fmt: skip
    COMPRESSORS[name] = cls
    return cls


def unregister_compressor(name: str) -> None:
    """Remove operator ``name`` that :func:`register_compressor` added (not a built-in one)."""
    if name in _BUILT_IN:
        raise ValueError(f"--compress {name} is built in and cannot be unregistered")
    if name not in COMPRESSORS:
        raise KeyError(f"no compressor named {name!r} is registered")
    del COMPRESSORS[name]


def compress_help() -> str:
    """``--compress``'s help: every operator's form, with an example where it takes one."""
    forms = _listed([_described(name, with_help=False) for name in COMPRESSORS])
    return f"CHOCO compressed gossip: {forms}"


def parse_compressor(spec: str) -> Compressor:
    """The compressor named by ``spec`` (``--compress``).

    Args:
        spec: ``none``, ``int8``, ``topk:FRACTION`` with ``0 < FRACTION <= 1`` the fraction of
            entries kept (``topk:0.01``), or ``sign``; surrounding spaces and case are ignored.

    Returns:
        The operator; ``parse_compressor(c.name) == c``.

    Raises:
        ConfigError: for an empty or unknown name, or a missing, non-numeric or out-of-range
            top-k fraction.
    """
    text = spec.strip().lower()
    if not text:
        raise ConfigError(f"The compressor name is empty. Valid compressors: {_valid_forms()}.")
    name, colon, rest = text.partition(":")
    operator = COMPRESSORS.get(name)
    if operator is None:
        raise ConfigError(f"Unknown compressor {spec!r}. Valid compressors: {_valid_forms()}.")
    return operator.from_params(operator.parse_params(rest if colon else None, spec))


def _check_d(d: int) -> int:
    if isinstance(d, bool) or not isinstance(d, int) or d < 1 or d >= 2**31:
        raise ValueError(f"Rows must have 1 <= d < 2**31 entries, got d = {d!r}.")
    return d


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _wire_rows(delta: Tensor) -> Tensor:
    """``delta`` as contiguous float32 rows, after checking it is an ``(R, d)`` float tensor."""
    if not isinstance(delta, Tensor) or delta.ndim != 2 or not delta.dtype.is_floating_point:
        shape = tuple(delta.shape) if isinstance(delta, Tensor) else type(delta).__name__
        dtype = delta.dtype if isinstance(delta, Tensor) else ""
        raise ValueError(f"Expected an (R, d) floating tensor to compress, got {shape} {dtype}.")
    _check_d(delta.shape[1])
    return delta.to(WIRE_DTYPE).contiguous()


def to_bytes(values: Tensor) -> Tensor:
    """The bytes of each row of a 2-D tensor, ``(R, m)`` -> ``(R, m * itemsize)`` uint8."""
    if values.numel() == 0:  # view refuses the zero strides of an empty tensor
        width = values.shape[1] * values.element_size()
        return torch.empty((values.shape[0], width), dtype=torch.uint8, device=values.device)
    return values.contiguous().view(torch.uint8)


def from_bytes(payload: Tensor, dtype: torch.dtype) -> Tensor:
    """Reinterpret ``(R, m * itemsize)`` uint8 rows as ``(R, m)`` of ``dtype``.

    Copies first: a column slice of a payload is not contiguous (or, with ``R = 1``, may start
    at an offset that is not a multiple of the item size), and ``view`` needs both.
    """
    if payload.numel() == 0:
        width = payload.shape[1] // torch.empty((), dtype=dtype).element_size()
        return torch.empty((payload.shape[0], width), dtype=dtype, device=payload.device)
    return payload.clone(memory_format=torch.contiguous_format).view(dtype)


def _tree_sum(values: Tensor) -> Tensor:
    """Row sums of ``(R, n)`` along a fixed pairwise tree (see :class:`SignCompressor`)."""
    n = values.shape[1]
    width = 1 << (n - 1).bit_length()
    values = F.pad(values, (0, width - n))
    while width > 1:
        width //= 2
        values = values[:, :width] + values[:, width:]
    return values[:, 0]
