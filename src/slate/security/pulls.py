r"""``--robust clip``'s watch for a persistent pull: a neighbour whose messages the receiver clips
far more often than its other neighbours', or whose clipped excess points one way, round after
round, is *suspected*: named with its evidence, never excluded (:mod:`slate.security.robust`).

Why: a neighbour that sends its own model plus a pull :math:`p` with :math:`\lVert p \rVert`
under ``FAR`` times the receiver's model is clipped, never excluded; its pull is bounded by the
clip, not removed, and without this watch nobody names it. Clipping alone is not evidence (most
honest messages are clipped too), so the rule compares a sender with the receiver's other
neighbours, and asks for a direction that does not average out.

**What each receiver keeps** per sender :math:`j` (:class:`PullWatch`): the messages counted
(:math:`n_{ij}`) and clipped (:math:`c_{ij}`), the running clipped share :math:`s_{ij}` and the
running mean :math:`m_{ij}` of the unit vectors :math:`(x_j - x_i)/\lVert x_j - x_i \rVert` of its
clipped messages. "Running": the plain mean of the first ``window`` values, then an exponential
mean of step :math:`1/` ``window`` (so that a pull that starts late is seen within a few windows).

**The rule** (:class:`PullRule`, defaults measured on honest runs: docs/security.md). Receiver
:math:`i` suspects :math:`j` at the first round where :math:`n_{ij} \ge` ``window`` and either

* *clipped more often:* :math:`s_{ij} - \tilde s_i \ge` ``share_margin`` and
  :math:`(s_{ij} - \tilde s_i) / \sqrt{2 \bar s (1 - \bar s) / n_e} \ge` ``share_z``, with
  :math:`\tilde s_i` the lower median of :math:`i`'s shares over its senders with at least
  ``window`` messages (:math:`j` included: with two neighbours, the other's share),
  :math:`\bar s = (s_{ij} + \tilde s_i)/2` and :math:`n_e = \min(n_{ij}, 2\,` ``window``
  :math:`- 1)` messages (a two-sample binomial test: an honest neighbour on a fast-moving run is
  clipped about as often as the others, and the test asks for many standard errors); or
* *one direction:* :math:`c_{ij} \ge` ``window``, :math:`\lVert m_{ij} \rVert \ge`
  ``direction_bound`` and :math:`\lVert m_{ij} \rVert - \tilde m_i \ge` ``direction_margin``,
  :math:`\tilde m_i` the lower median of :math:`i`'s consistencies over its senders with at least
  ``window`` messages (honest neighbours' differences wander with their gradient noise).

A suspicion is recorded once per pair, with the evidence at that round (shares, median,
consistency, counts); it is reported at the end of the run as its receiver's, like an exclusion
(:mod:`slate.security.accusations`). With one neighbour only (nothing to compare with) nothing is
suspected. The direction is kept for at most ``DIRECTION_LIMIT`` numbers
(:math:`P \times n \times d`); beyond, only the clipped-share test runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["DIRECTION_LIMIT", "NO_PULL", "PULL_COLUMNS", "PullRule", "PullWatch"]

NEVER = 1 << 62
DIRECTION_LIMIT = 1 << 25  # numbers of running directions kept (P x n x d) at most
#: The columns a pull adds to a ``--robust`` record: ``suspected_at`` (-1: not), ``reasons``
#: (1: clipped more often, 2: one direction), share, median share and consistency in
#: thousandths (-1: not measured), the first iteration heard, and the messages counted and
#: clipped (at the suspicion, else at the end).
PULL_COLUMNS = 8
SHARE, DIRECTION = 1, 2
NO_PULL = (-1, 0, *(-1,) * (PULL_COLUMNS - 2))  # the columns of a pair no watch measured


@dataclass(frozen=True)
class PullRule:
    """The thresholds of the module docstring's rule (the defaults: docs/security.md)."""

    window: int = 64
    share_margin: float = 0.2
    share_z: float = 5.0
    direction_bound: float = 0.9
    direction_margin: float = 0.3


class PullWatch:
    """Per receiving row and sender, what the rule needs (module docstring), on the device."""

    def __init__(self, p: int, n: int, d: int, device: torch.device, dtype: torch.dtype,
                 rule: PullRule | None = None) -> None:  # fmt: skip
        self.rule = rule or PullRule()
        self.seen = torch.zeros(p, n, dtype=torch.long, device=device)
        self.clipped = torch.zeros(p, n, dtype=torch.long, device=device)
        self.share = torch.zeros(p, n, dtype=dtype, device=device)
        keep = p * n * d <= DIRECTION_LIMIT
        self.direction = torch.zeros(p, n, d if keep else 0, dtype=dtype, device=device)
        self.first = torch.full((p, n), NEVER, dtype=torch.long, device=device)
        self.suspected_at = torch.full((p, n), NEVER, dtype=torch.long, device=device)
        self.reasons = torch.zeros(p, n, dtype=torch.long, device=device)
        self.evidence = torch.zeros(p, n, 5, dtype=dtype, device=device)  # share, median,
        # consistency, seen, clipped at the suspicion

    def _step(self, count: Tensor) -> Tensor:
        """The running mean's step after ``count`` values: ``1/count``, at least ``1/window``."""
        return 1.0 / count.clamp(min=1, max=self.rule.window).to(self.share.dtype)

    def observe(self, receivers: Tensor, senders: Tensor, diff: Tensor, dist: Tensor,
                clipped: Tensor, counted: Tensor, iteration: int) -> None:  # fmt: skip
        """One round's edges: ``diff (E, d)`` the differences :math:`x_j - x_i`, ``dist`` their
        norms, ``clipped`` whether each was clipped, ``counted`` whether it was usable (finite,
        sender not excluded); then the rule, on the device."""
        pair = receivers * self.seen.shape[1] + senders
        seen, clips = self.seen.view(-1), self.clipped.view(-1)
        seen[pair] += counted.long()
        hit = counted & clipped
        clips[pair] += hit.long()
        first = self.first.view(-1)
        first[pair] = torch.where(counted, first[pair].clamp(max=iteration), first[pair])
        share = self.share.view(-1)
        step = self._step(seen[pair]) * counted
        share[pair] += step * (hit.to(share.dtype) - share[pair])
        if self.direction.shape[-1]:
            unit = diff / dist.clamp(min=torch.finfo(diff.dtype).tiny)[:, None]
            rows = self.direction.view(-1, self.direction.shape[-1])
            weight = (self._step(clips[pair]) * hit)[:, None]
            rows[pair] += weight * (torch.nan_to_num(unit) - rows[pair])
        self._judge(iteration)

    def consistency(self) -> Tensor:
        """``(P, n)``: :math:`\\lVert m_{ij} \\rVert` (0 where no direction is kept)."""
        if not self.direction.shape[-1]:
            return torch.zeros_like(self.share)
        return torch.linalg.vector_norm(self.direction, dim=-1)

    def _medians(self, values: Tensor, count: Tensor) -> Tensor:
        """``(P, 1)``: each row's lower median of ``values`` over the pairs with ``count`` at
        least ``window`` (NaN where none)."""
        enough = torch.where(count >= self.rule.window, values, math.nan)
        return enough.nanmedian(dim=1, keepdim=True).values

    def _judge(self, iteration: int) -> None:
        """Suspect the pairs the rule names this round (the first time only)."""
        r = self.rule
        median = self._medians(self.share, self.seen).expand_as(self.share)
        pooled = (self.share + median) / 2
        n_e = self.seen.clamp(max=2 * r.window - 1).to(self.share.dtype)
        spread = torch.sqrt(2 * pooled * (1 - pooled) / n_e.clamp(min=1))
        gap = self.share - median
        more = (gap >= r.share_margin) & (gap >= r.share_z * spread)
        consistent = self.consistency()
        typical = self._medians(consistent, self.seen).expand_as(consistent)
        one_way = ((self.clipped >= r.window) & (consistent >= r.direction_bound)
                   & (consistent - typical >= r.direction_margin))  # fmt: skip
        reasons = more.long() * SHARE + one_way.long() * DIRECTION
        newly = (self.seen >= r.window) & (reasons > 0) & (self.suspected_at >= NEVER)
        self.suspected_at = torch.where(newly, iteration, self.suspected_at)
        self.reasons = torch.where(newly, reasons, self.reasons)
        now = torch.stack([self.share, median, consistent, self.seen.to(self.share.dtype),
                           self.clipped.to(self.share.dtype)], dim=-1)  # fmt: skip
        self.evidence = torch.where(newly[..., None], now, self.evidence)

    def columns(self, row: int, sender: int) -> list[int]:
        """The :data:`PULL_COLUMNS` numbers of one pair for its ``--robust`` record: the
        evidence at the suspicion, or the values now when it was not suspected."""
        at = int(self.suspected_at[row, sender])
        if at < NEVER:
            share, median, consistent, seen, clipped = self.evidence[row, sender].tolist()
        else:
            median = float(self._medians(self.share, self.seen)[row, 0])
            share, seen = float(self.share[row, sender]), int(self.seen[row, sender])
            consistent = float(self.consistency()[row, sender])
            clipped = int(self.clipped[row, sender])
        first = int(self.first[row, sender])
        return [at if at < NEVER else -1, int(self.reasons[row, sender]), _thousandths(share),
                _thousandths(median), _thousandths(consistent), first if first < NEVER else -1,
                int(seen), int(clipped)]  # fmt: skip

    def state_dict(self) -> dict[str, Tensor]:
        return {name: getattr(self, name).cpu().clone() for name in WATCH_FIELDS}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name in WATCH_FIELDS:
            mine = getattr(self, name)
            setattr(self, name, state[name].to(mine.device, mine.dtype).clone())


WATCH_FIELDS = ("seen", "clipped", "share", "direction", "first", "suspected_at", "reasons",
                "evidence")  # fmt: skip


def _thousandths(value: float) -> int:
    """``value`` in thousandths, -1 when not a number (not measured)."""
    return round(1000 * value) if math.isfinite(value) else -1
