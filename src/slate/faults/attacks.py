r"""A misbehaving neighbour, for the tests of ``--robust`` and of the checks that catch an insider
(tests only): ``SLATE_ATTACK=RANK@ITER:KIND[,...]`` makes party ``RANK`` misbehave from iteration
``ITER`` on.

**Gossip attacks** (:data:`GOSSIP_KINDS`) corrupt what the party sends its neighbours while its
own copy stays honest: ``nan`` (every value NaN), ``scale:F`` (times ``F``), ``signflip`` (times
-1), ``zeros``, or ``drift:K``: :math:`x + K D (T - x) / \lVert T - x \rVert`, where :math:`x` is
its own current model, :math:`T` is :math:`x` with the output layer (the model's last
``nn.Linear``, weight and bias) negated, and :math:`D` is the median distance between its own
model and the messages it received in its last round (before the first, its own movement since
the start): a message about as far from the receivers as an honest neighbour's, always pulling
the same bad way (:func:`drift_message`). On both engines: the simulator mixes the attacker's
corrupted row into the others' rows, a distributed process sends it; under CHOCO the corrupted
vector is what the attacker compresses and sends. :class:`Attacker` is what the run's
:class:`~slate.security.robust.MessageGuard` sends through in place of an honest sender.

**Lies** (:data:`LIE_KINDS`) are an insider's lies in the final average, the evaluation counts
and the set-up sums, told by a distributed process only (:mod:`slate.faults.lies`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from slate.errors import ConfigError

__all__ = [
    "ATTACK_ENV",
    "GOSSIP_KINDS",
    "KINDS",
    "LIE_KINDS",
    "Attack",
    "Attacker",
    "corrupt",
    "drift_message",
    "parse_attacks",
]

ATTACK_ENV = "SLATE_ATTACK"
GOSSIP_KINDS = ("nan", "scale", "signflip", "zeros", "drift")
#: The insider's lies outside gossip (:mod:`slate.faults.lies`).
LIE_KINDS = ("final-poison", "eval-inflate", "eval-deflate", "rows", "stats-scale",
             "fake-categories", "impute")  # fmt: skip
KINDS = GOSSIP_KINDS + LIE_KINDS
WITH_FACTOR = ("scale", "drift", "rows", "stats-scale", "impute")  # the kinds written KIND:F


@dataclass(frozen=True)
class Attack:
    """Party ``rank`` corrupts what it sends from iteration ``start`` on."""

    rank: int
    start: int
    kind: str
    factor: float = 1.0


def parse_attacks(spec: str | None) -> list[Attack]:
    """``RANK@ITER:KIND[,...]`` (module docstring); raises ConfigError naming the bad part."""
    attacks: list[Attack] = []
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        who, at_sign, rest = item.partition("@")
        when, colon, kind = rest.partition(":")
        kind, _, argument = kind.partition(":")
        problem = None
        if not (at_sign and colon and who.isdigit() and when.isdigit()):
            problem = "expected RANK@ITER:KIND with whole numbers RANK and ITER"
        elif kind not in KINDS:
            spelled = ", ".join(f"{k}:F" if k in WITH_FACTOR else k for k in KINDS)
            problem = f"KIND must be one of {spelled}, not {kind!r}"
        elif (kind in WITH_FACTOR) != bool(argument):
            problem = f"{kind} takes a factor ({kind}:F)" if kind in WITH_FACTOR else (
                f"{kind} takes no factor")  # fmt: skip
        factor = 1.0
        if problem is None and kind in WITH_FACTOR:
            try:
                factor = float(argument)
            except ValueError:
                problem = f"the factor {argument!r} is not a number"
            else:
                if kind == "drift" and not (math.isfinite(factor) and factor >= 0):
                    problem = f"drift's factor must be a finite number >= 0, not {argument!r}"
        if problem is not None:
            raise ConfigError(f"{ATTACK_ENV}: bad part {item!r}: {problem}")
        attacks.append(Attack(int(who), int(when), kind, factor))
    return attacks


def corrupt(x: Tensor, attack: Attack) -> Tensor:
    """What the attacker sends in place of ``x`` (a new tensor; ``x`` is not changed); ``drift``
    needs what the attacker received: :meth:`Attacker.sent` and :func:`drift_message`."""
    if attack.kind == "drift":
        raise ValueError("drift's message depends on what its party received: use Attacker.sent")
    if attack.kind == "nan":
        return torch.full_like(x, math.nan)
    if attack.kind == "zeros":
        return torch.zeros_like(x)
    if attack.kind == "signflip":
        return -x
    return x * attack.factor


def drift_message(x: Tensor, distance: Tensor, factor: float, span: tuple[int, int]) -> Tensor:
    r"""``drift:K``'s message: :math:`x + K D (T - x) / \lVert T - x \rVert`, where :math:`T` is
    :math:`x` with the output layer (``span`` of the flat vector) negated and :math:`D` is
    ``distance``. :math:`T - x` is :math:`-2x` on the span and zero elsewhere, so the message is
    :math:`x` with the output layer shrunk by :math:`K D` along itself (unchanged where that
    layer is zero). A new tensor; ``x`` is not changed."""
    start, stop = span
    head = x[start:stop]
    norm = torch.linalg.vector_norm(head)
    step = torch.where(norm > 0, factor * distance / norm.clamp_min(torch.finfo(x.dtype).tiny), 0)
    out = x.clone()
    out[start:stop] = head - step * head
    return out


class Attacker:
    """What this process's parties send when ``SLATE_ATTACK`` names one of them: the
    :class:`~slate.security.robust.Sender` of the run's guard in place of an honest one.

    Args:
        local_parties: the parties whose rows this process holds.
        attacks: the planned attacks; only the gossip ones of the local parties are kept.
        output_layer: ``drift``'s span of the flat vector (the model's last ``nn.Linear``).
    """

    def __init__(self, local_parties: list[int], attacks: Any = (),
                 output_layer: tuple[int, int] | None = None) -> None:  # fmt: skip
        self.local = list(local_parties)
        self.attacks = [a for a in attacks if a.rank in self.local and a.kind in GOSSIP_KINDS]
        self.output_layer = output_layer
        if output_layer is None and any(a.kind == "drift" for a in self.attacks):
            raise ConfigError(
                f"{ATTACK_ENV}: drift negates the model's output layer, its last torch.nn.Linear, "
                "but this model has none; use drift with a model that ends in a Linear layer."
            )
        self._heard: Tensor | None = None  # (P,): drift's D, the last round's median distance
        self._origin: Tensor | None = None  # (P, d): the rows at the start (drift's fallback)

    def attacking(self, iteration: int) -> bool:
        return any(iteration >= a.start for a in self.attacks)

    @property
    def listens(self) -> bool:
        """Whether a local row plans a ``drift`` attack (it measures what it receives from
        the start, :meth:`heard`)."""
        return any(a.kind == "drift" for a in self.attacks)

    def edge_by_edge(self, iteration: int) -> bool:
        """Whether mixing must go edge by edge: an attacker among the rows (or one that listens)."""
        return self.attacking(iteration) or self.listens

    def sent(self, x: Tensor, iteration: int) -> Tensor:
        """``x (P, d)`` as the local parties send it at ``iteration``: attackers' rows corrupted
        (a copy)."""
        if not self.attacking(iteration):
            return x
        out = x.clone()
        for attack in self.attacks:
            if iteration >= attack.start:
                row = self.local.index(attack.rank)
                if attack.kind == "drift":
                    assert self.output_layer is not None
                    distance = self.drift_distance(x)[row]
                    out[row] = drift_message(x[row], distance, attack.factor, self.output_layer)
                else:
                    out[row] = corrupt(x[row], attack)
        return out

    def drift_distance(self, x: Tensor) -> Tensor:
        """Per local row, ``drift``'s :math:`D`: the median (the mean of the two middle values
        for an even count) of the distances between the row and the messages it received in
        its last round with any; before its first, its own movement since the start (its last
        mix is the start)."""
        if self._origin is None or self._origin.shape != x.shape:
            self._origin = x.detach().clone()
        moved = torch.linalg.vector_norm(x - self._origin, dim=1)
        if self._heard is None:
            return moved
        return torch.where(torch.isfinite(self._heard), self._heard, moved)

    def heard(self, own: Tensor, theirs: Tensor, receivers: Tensor) -> None:
        """Note, for ``drift``, the median distance of this round's messages ``theirs (E, d)``
        from the receiving rows' own values ``own (E, d)`` (``receivers``: each edge's local
        row); a row that received nothing keeps its last value. Nothing without ``drift``."""
        if not self.listens:
            return
        p = len(self.local)
        if self._heard is None or self._heard.device != own.device:
            self._heard = own.new_full((p,), math.nan)
        dist = torch.linalg.vector_norm(theirs - own, dim=1)
        mine = receivers[None, :] == torch.arange(p, device=own.device)[:, None]
        median = torch.where(mine, dist[None, :], math.nan).nanquantile(0.5, dim=1)
        self._heard = torch.where(torch.isfinite(median), median, self._heard)

    def begin(self, x: Tensor) -> None:
        """The local rows' starting parameters ``x (P, d)``: ``drift`` measures from them."""
        if self.listens:
            self._origin, self._heard = x.detach().clone(), None

    def restart(self, local_parties: list[int]) -> None:
        """After a change of the party set: the local parties are now ``local_parties``."""
        self.local = list(local_parties)

    def state_dict(self) -> dict[str, Tensor]:
        """``drift``'s memory, for a checkpoint."""
        return {name: value.cpu().clone() for name in ("_heard", "_origin")
                if (value := getattr(self, name)) is not None}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any], like: Tensor) -> None:
        for name in ("_heard", "_origin"):
            if name in state:
                setattr(self, name, state[name].to(like.device, like.dtype).clone())
