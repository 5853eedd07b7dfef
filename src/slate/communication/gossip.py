r"""The flags that make a run talk less, checked and turned into :class:`GossipSettings`; and
the WAN time a site can plan with (``--wan``).

* ``--gossip-every H``: local steps between gossip rounds (:mod:`slate.engines.base`).
* ``--compress none|int8|topk:FRACTION|sign`` and ``--consensus-step GAMMA|auto``: CHOCO
  compressed gossip (:mod:`slate.communication.choco`, :mod:`slate.communication.compression`).
* ``--wan RTT_MS,MBIT_S``: the WAN time one party can plan with, :meth:`WanLink.seconds`
  (docs/communication.md, "The estimate").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slate.communication.choco import auto_consensus_step
from slate.communication.compression import Compressor, parse_compressor
from slate.errors import ConfigError
from slate.topology import Topology

__all__ = [
    "EARLY_GOODPUT",
    "EXCHANGE_GOODPUT",
    "WIRE_OVERHEAD",
    "GossipSettings",
    "WanLink",
    "check_gossip_flags",
    "gossip_settings",
    "parse_wan",
]

AUTO = "auto"

#: Bytes on the wire per byte of payload in a collective: 1500-byte IP packets carry 1448
#: bytes of TCP payload (20 bytes of IP header, 32 of TCP header with timestamps).
WIRE_OVERHEAD = 1500 / 1448
#: The share of the line rate at which a gossip exchange delivers its bytes. Neighbours send to
#: each other at the same time, in short bursts with the link idle in between; over TCP such a
#: burst was measured to take about twice its bytes' time at the line rate (headers and
#: acknowledgements included), from 1.5x to 2.2x for 8.6-68 KB to one, two or three
#: neighbours (``python -m benchmarks --only wan``, "One exchange").
EXCHANGE_GOODPUT = 0.5
#: The same share for a gossip round whose receives were posted rounds before it: its sender
#: sends at once, on a connection kept busy by the rounds before, and the ring's two 34 KB
#: messages took 68 ms on top of half an RTT at 10 Mbit/s, 0.8 of the line rate
#: (``python -m benchmarks --only wan``, "posted two early").
EARLY_GOODPUT = 0.8


@dataclass(frozen=True)
class GossipSettings:
    r"""How often and how compactly parties gossip (``--gossip-every``, ``--compress``).

    Attributes:
        every: :math:`H \ge 1`, iterations per gossip round (1: every iteration, the paper's).
        compressor: the CHOCO compression operator, or ``None`` for dense gossip (the paper's).
        consensus_step: CHOCO's :math:`\gamma` (ignored without a compressor).
    """

    every: int = 1
    compressor: Compressor | None = None
    consensus_step: float = 1.0

    @property
    def is_paper_protocol(self) -> bool:
        return self.every == 1 and self.compressor is None


@dataclass(frozen=True)
class WanLink:
    """A wide-area link: round-trip time and bandwidth (``--wan RTT_MS,MBIT_S``)."""

    rtt_ms: float
    mbit_s: float

    def seconds(
        self,
        compute_seconds: float,
        rounds: float,
        exchanged_bytes: float,
        round_trips: float = 0.0,
        collective_bytes: float = 0.0,
        early_rounds: float = 0.0,
    ) -> float:
        r"""Estimated wall time of one party:

        .. math::

            T = T_{\text{compute}} + \text{RTT}\,\big(R - \tfrac{1}{2} R_e + Q\big)
                + \frac{8}{\text{bandwidth}} \Big(B_x \Big(\frac{1 - e}{g} + \frac{e}{g_e}\Big)
                + o\,B_c\Big),

        with :math:`R` gossip rounds (each one exchange waited for), of which :math:`R_e` had
        their receives posted rounds before (``early_rounds``:
        :attr:`slate.engines.base.Communicator.ahead_share` of :math:`R`) and wait half a round
        trip: gloo hands a message over once the receiver's notice that it posted the receive
        has arrived, and that notice left a round or two earlier (measured on the emulated 80 ms
        link, docs/wan.md); :math:`Q` the round trips of the
        other collectives, waited for one after the other
        (:func:`~slate.engines.base.all_reduce_round_trips`,
        :func:`~slate.engines.base.all_gather_round_trips`), :math:`B_x` the busiest party's
        gossip bytes (a share :math:`e = R_e / R` of them in the early rounds, at
        :data:`EARLY_GOODPUT` :math:`g_e`), :math:`B_c` its collective bytes,
        :data:`EXCHANGE_GOODPUT` :math:`g` and :data:`WIRE_OVERHEAD` :math:`o`
        (docs/communication.md, "The estimate")."""
        early = early_rounds / rounds if rounds else 0.0
        gossip = exchanged_bytes * ((1.0 - early) / EXCHANGE_GOODPUT + early / EARLY_GOODPUT)
        payload = gossip + collective_bytes * WIRE_OVERHEAD
        transfer = 8.0 * payload / (self.mbit_s * 1e6)
        waited = rounds - early_rounds / 2 + round_trips
        return compute_seconds + waited * self.rtt_ms / 1e3 + transfer

    def whole_seconds(
        self,
        training_seconds: float,
        local_seconds: float,
        store_round_trips: float,
        set_up_round_trips: float,
        teardown_round_trips: float,
    ) -> float:
        r"""Estimated wall time of one site's whole command:

        .. math::

            T_{\text{whole}} = T + T_{\text{local}} + \text{RTT}\,(S + Q_{\text{set-up}}
                + Q_{\text{teardown}}),

        with :math:`T` the training's estimate (:meth:`seconds`), :math:`T_{\text{local}}` the
        site's own work outside training (interpreter, imports, reading, outputs), :math:`S`
        the store's round trips of set-up and teardown (constant in N:
        :data:`slate.engines.base.SET_UP_STORE_ROUND_TRIPS`), and :math:`Q` the round trips of
        the collectives before training (the data agreement, the run settings) and after it
        (the final average, the token exchange before leaving)."""
        waits = store_round_trips + set_up_round_trips + teardown_round_trips
        return training_seconds + local_seconds + waits * self.rtt_ms / 1e3

    def __str__(self) -> str:
        return f"{self.rtt_ms:g} ms RTT, {self.mbit_s:g} Mbit/s"


def parse_wan(text: str | None) -> WanLink | None:
    """``"80,100"`` -> 80 ms round trip at 100 Mbit/s; ``None`` -> no estimate."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).split(",")]
    try:
        rtt, bandwidth = (float(p) for p in parts)
    except ValueError:
        rtt = bandwidth = math.nan
    if not (math.isfinite(rtt) and rtt >= 0 and math.isfinite(bandwidth) and bandwidth > 0):
        raise ConfigError(
            f"--wan {text!r} is not RTT_MS,MBIT_S: give the round-trip time in milliseconds "
            "(>= 0) and the bandwidth in Mbit/s (> 0), separated by a comma, e.g. --wan 80,100 "
            "for 80 ms at 100 Mbit/s."
        )
    return WanLink(rtt, bandwidth)


def _parse_consensus_step(value: object, compressor: Compressor) -> float | str:
    if value is None:
        return compressor.default_consensus_step
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        gamma = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        gamma = math.nan
    if not 0 < gamma <= 1:
        raise ConfigError(
            f"--consensus-step {value!r} is not valid: CHOCO's consensus step gamma must lie in "
            f"(0, 1], or be 'auto' (chosen by simulating noisy gossip on this run's graph). The "
            f"default for --compress {compressor.name} is {compressor.default_consensus_step:g}."
        )
    return gamma


def check_gossip_flags(config) -> None:
    """One-paragraph errors for ``--gossip-every``, ``--compress``, ``--consensus-step`` and
    ``--wan``, before any data is read."""
    every = config.gossip_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(
            f"--gossip-every must be a whole number of iterations >= 1 (1: gossip after every "
            f"local step, the paper's protocol; H: H local steps per gossip round), got "
            f"{every!r}."
        )
    if every > 1 and config.gradient_tracking:
        raise ConfigError(
            f"--gradient-tracking cannot be combined with --gossip-every {every}: the tracker "
            "(Alg. 1 line 8) assumes one exchange per step, and local steps make it drift; "
            "the K-GT correction (Liu et al., 2023) is not implemented. Use one of the two "
            "(docs/algorithms.md)."
        )
    compressor = parse_compressor(config.compress)
    if compressor.name != "none" and config.gradient_tracking:
        raise ConfigError(
            f"--gradient-tracking cannot be combined with --compress {config.compress}: CHOCO "
            "gossip keeps one set of public copies per party, and the tracker (Alg. 1 line 8) "
            "would be mixed through the parameters' copies, each overwriting the other's (on a "
            "quadratic the error grew 47x). Use one of the two (docs/algorithms.md)."
        )
    if config.consensus_step is not None and compressor.name == "none":
        raise ConfigError(
            "--consensus-step sets CHOCO's gamma for compressed gossip; it needs --compress "
            "int8, topk:FRACTION or sign."
        )
    _parse_consensus_step(config.consensus_step, compressor)
    parse_wan(config.wan)


def gossip_settings(config, topology: Topology, d: int) -> GossipSettings:
    """The run's :class:`GossipSettings`; ``--consensus-step auto`` is resolved here, by
    simulating gossip on ``topology`` with ``d``-dimensional parameters."""
    compressor = parse_compressor(config.compress)
    if compressor.name == "none":
        return GossipSettings(every=config.gossip_every)
    gamma = _parse_consensus_step(config.consensus_step, compressor)
    if gamma == AUTO:
        gamma = auto_consensus_step(topology, compressor, d)
    return GossipSettings(every=config.gossip_every, compressor=compressor, consensus_step=gamma)
