r"""``--dp-epsilon``: the accountant, the per-site plan and the ledger (docs/privacy.md).

**The guarantee.** Record-level (one training row of one site, its label included, added or
removed), per site, against any coalition of the other sites, which see everything the site
sends. Each site's releases are its noisy gradient estimates
(:mod:`slate.algorithms.privacy`); everything it sends is computed from them.

**The event.** One release samples each positive with probability ``q+`` and each negative with
``q-`` (Poisson, :class:`slate.data.sampler.PoissonGroupSampler`) and adds Gaussian noise of
multiplier ``z`` to a sum of sensitivity ``2C``: for a positive row,
``PoissonSampled(q+, Gaussian(z))``, composed over the run's releases (likewise ``q-`` for a
negative). ``dp-accounting``'s PLD accountant gives the figure and solves for ``z``
(``calibrate_dp_mechanism``) so that the larger rate meets ``epsilon`` at ``delta`` over the
planned releases; its RDP accountant is the cross-check. No amplification by gossip is claimed.

**The rates.** Public, from the site's class sizes (declared, hence public): each of the ``G``
groups expects ``b`` positives and ``m - b`` negatives, so ``q+ = min(1, G b / n+)`` and
``q- = min(1, G (m - b) / n-)``.

**The ledger.** An append-only file in the run folder (``privacy-ledger.jsonl``, or
``privacy-ledger-rank{r}.jsonl`` for a site of a distributed run), one JSON line per chunk of
steps, written and fsynced *before* the chunk's first release: a run stopped within a chunk has
its whole chunk counted. Rollbacks, resumes and returns re-run steps: each is counted again. It
is read back when a run continues in its folder and never restored from a checkpoint. A run
stops before the first step whose release would take a site past ``epsilon``
(:class:`PrivacyBudgetExhausted`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from slate.errors import SlateError

__all__ = [
    "LEDGER",
    "PartyPrivacy",
    "PrivacyBudgetExhausted",
    "PrivacyLedger",
    "PrivacyPlan",
    "calibrate",
    "epsilon_pld",
    "epsilon_rdp",
    "plan_privacy",
    "sampling_rates",
]

LEDGER = "privacy-ledger.jsonl"


class PrivacyBudgetExhausted(SlateError):
    """The next release would take a site past ``--dp-epsilon``."""


def sampling_rates(
    groups: int, batch_size: int, positives: int, n_pos: int, n_neg: int
) -> tuple[float, float]:
    """``(q+, q-)``: each of ``groups`` groups expects ``positives`` (b) positives and
    ``batch_size - positives`` (m - b) negatives of a party with ``n_pos`` and ``n_neg``."""
    q_pos = min(1.0, groups * positives / n_pos) if n_pos else 0.0
    q_neg = min(1.0, groups * (batch_size - positives) / n_neg) if n_neg else 0.0
    return q_pos, q_neg


def _event(q: float, z: float, releases: int):
    import dp_accounting as dpa

    return dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), int(releases)
    )


def _composed(events: Sequence[tuple[float, float, int]]):
    import dp_accounting as dpa

    return dpa.ComposedDpEvent([_event(q, z, n) for q, z, n in events if n > 0 and q > 0])


#: The PLD accountant's discretisation of the privacy loss: pessimistic (an upper bound on
#: epsilon), within 1e-3 of its finest setting on the schedules of docs/privacy.md, and 10x
#: faster (0.1 s against 2 s at z = 0.76).
DISCRETISATION = 1e-3


def _pld_accountant():
    from dp_accounting.pld import pld_privacy_accountant

    return pld_privacy_accountant.PLDAccountant(value_discretization_interval=DISCRETISATION)


@cache
def epsilon_pld(events: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """ε at ``delta`` of the composition of ``(q, z, releases)`` events, by ``dp-accounting``'s
    PLD accountant (0 for no release)."""
    if not any(n > 0 and q > 0 for q, _, n in events):
        return 0.0
    accountant = _pld_accountant()
    accountant.compose(_composed(events))
    return float(accountant.get_epsilon(delta))


@cache
def epsilon_rdp(events: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """The same ε by ``dp-accounting``'s RDP accountant (an upper bound, the cross-check)."""
    if not any(n > 0 and q > 0 for q, _, n in events):
        return 0.0
    import logging

    from dp_accounting.rdp import rdp_privacy_accountant

    absl = logging.getLogger("absl")  # its warnings of orders left out at small z
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        accountant = rdp_privacy_accountant.RdpAccountant()
        accountant.compose(_composed(events))
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


#: The smallest noise multiplier searched: below it a release is close to no privacy at all.
Z_FLOOR = 0.25


@cache
def calibrate(q: float, releases: int, epsilon: float, delta: float) -> float:
    """The smallest noise multiplier ``z`` (to a relative 1e-3, on the safe side) whose
    ``releases`` Poisson-sampled Gaussian releases at rate ``q`` meet ``epsilon`` at ``delta``
    by the PLD accountant (``dp_accounting.calibrate_dp_mechanism``, in a bracket found by
    doubling from 1; at least :data:`Z_FLOOR`)."""
    import dp_accounting as dpa

    def spent(z: float) -> float:
        return epsilon_pld(((q, z, releases),), delta)

    high = 1.0
    while spent(high) > epsilon:
        high *= 2.0
    low = high / 2.0
    while spent(low) <= epsilon:
        if low <= Z_FLOOR:
            return Z_FLOOR if spent(Z_FLOOR) <= epsilon else low
        high, low = low, low / 2.0
    return float(
        dpa.calibrate_dp_mechanism(
            _pld_accountant,
            lambda z: _event(q, z, releases),
            epsilon,
            delta,
            bracket_interval=dpa.ExplicitBracketInterval(low, high),
            tol=1e-3 * low,
        )
    )


@dataclass(frozen=True)
class PartyPrivacy:
    """One party's public privacy parameters: its class sizes, rates and noise multiplier."""

    party: int
    positives: int
    negatives: int
    q_pos: float
    q_neg: float
    z: float

    @property
    def q(self) -> float:
        """The rate the noise is calibrated on: the larger of the two."""
        return max(self.q_pos, self.q_neg)

    def epsilons(self, releases: Sequence[tuple[float, int]], delta: float) -> dict[str, float]:
        """ε for a positive row and a negative row (PLD), and the RDP cross-check of the larger
        rate, after ``releases``: ``(z, count)`` pairs."""

        def events(q: float) -> tuple[tuple[float, float, int], ...]:
            return tuple((q, z, n) for z, n in releases)

        return {
            "epsilon_positives": epsilon_pld(events(self.q_pos), delta),
            "epsilon_negatives": epsilon_pld(events(self.q_neg), delta),
            "epsilon_rdp": epsilon_rdp(events(self.q), delta),
        }


@dataclass(frozen=True)
class PrivacyPlan:
    """The run's privacy settings and each local party's parameters: ``epsilon`` at ``delta``
    over ``releases`` planned releases (T steps), clip ``C``, ``groups`` G of ``group_size``
    slots, the clipping ``unit`` (``group``: SLATE's AP over a group; ``row``: groups of one)."""

    epsilon: float
    delta: float
    clip: float
    groups: int
    group_size: int
    unit: str
    releases: int
    parties: tuple[PartyPrivacy, ...]

    def noise_std(self) -> tuple[float, ...]:
        """Each local party's noise standard deviation, ``2 C z``."""
        return tuple(2.0 * self.clip * p.z for p in self.parties)


def plan_privacy(
    epsilon: float,
    delta: float,
    clip: float,
    groups: int,
    group_size: int,
    unit: str,
    releases: int,
    counts: Sequence[tuple[int, int, int]],
    batch_size: int,
    positives: int,
) -> PrivacyPlan:
    """The plan for local parties ``counts``: ``(party, n+, n-)`` each; ``z`` calibrated per
    party on its own larger rate (parties with the same rates share one calibration)."""
    parties = []
    for party, n_pos, n_neg in counts:
        q_pos, q_neg = sampling_rates(groups, batch_size, positives, n_pos, n_neg)
        z = calibrate(max(q_pos, q_neg), releases, epsilon, delta)
        parties.append(PartyPrivacy(party, n_pos, n_neg, q_pos, q_neg, z))
    return PrivacyPlan(epsilon, delta, clip, groups, group_size, unit, releases, tuple(parties))


@dataclass
class PrivacyLedger:
    """The releases of this process's parties, kept in ``path`` (None: in memory, a run
    without a folder) and counted against ``plan.epsilon``.

    Each line is ``{"from_iteration", "steps", "z", "released"}`` (``z`` per local party), or
    ``{"opened": ...}`` when a run starts or continues in the folder. ``released`` counts every
    release so far, across every run in this folder.
    """

    plan: PrivacyPlan
    path: Path | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def open(cls, plan: PrivacyPlan, folder: Path | None, rank: int | None) -> PrivacyLedger:
        """The ledger of ``folder`` (read back if it exists: never from a checkpoint), or an
        in-memory one without a folder; a line records this opening."""
        if folder is None:
            return cls(plan)
        from slate.permissions import private_folder

        private_folder(Path(folder))
        name = LEDGER if rank is None else f"privacy-ledger-rank{rank}.jsonl"
        path = Path(folder) / name
        entries: list[dict[str, Any]] = []
        if path.exists():
            for number, line in enumerate(path.read_text().splitlines(), 1):
                try:
                    entries.append(json.loads(line))
                except json.JSONDecodeError:
                    raise PrivacyBudgetExhausted(
                        f"The privacy ledger {path} is damaged at line {number}: its releases "
                        "cannot be counted, so no more can be made under --dp-epsilon. Restore "
                        "the file, or start the run in a new folder only if its rows were never "
                        "used by a run of this folder."
                    ) from None
        ledger = cls(plan, path, [e for e in entries if "steps" in e])
        ledger._append(
            {
                "opened": {
                    "epsilon": plan.epsilon,
                    "delta": plan.delta,
                    "clip": plan.clip,
                    "groups": plan.groups,
                    "planned_releases": plan.releases,
                    "parties": [p.__dict__ for p in plan.parties],
                }
            }
        )
        return ledger

    @property
    def released(self) -> int:
        """The releases counted so far."""
        return sum(int(e["steps"]) for e in self.entries)

    def _releases(self, party: int, extra: int = 0) -> list[tuple[float, int]]:
        """``(z, count)`` of party position ``party``'s releases, ``extra`` more at its z now."""
        counts: dict[float, int] = {}
        for entry in self.entries:
            z = float(entry["z"][party]) if party < len(entry["z"]) else float(entry["z"][-1])
            counts[z] = counts.get(z, 0) + int(entry["steps"])
        z_now = self.plan.parties[party].z
        counts[z_now] = counts.get(z_now, 0) + extra
        return sorted(counts.items())

    def _within(self, extra: int) -> bool:
        """Whether ``extra`` more releases keep every local party within the budget."""
        for k, party in enumerate(self.plan.parties):
            releases = self._releases(k, extra)
            if len(releases) == 1 and releases[0][1] <= self.plan.releases:
                continue  # z was calibrated for the planned count at this very rate
            events = tuple((party.q, z, n) for z, n in releases)
            if epsilon_pld(events, self.plan.delta) > self.plan.epsilon:
                return False
        return True

    def reserve(self, iteration: int, steps: int) -> int:
        """Record (and fsync) up to ``steps`` releases from ``iteration`` before they are made;
        returns how many fit within the budget (fewer only at its end)."""
        allowed = steps
        if not self._within(steps):
            low, high = 0, steps  # the largest count that fits, by bisection
            while low < high:
                middle = (low + high + 1) // 2
                if self._within(middle):
                    low = middle
                else:
                    high = middle - 1
            allowed = low
        if allowed > 0:
            entry = {
                "from_iteration": int(iteration),
                "steps": int(allowed),
                "z": [p.z for p in self.plan.parties],
                "released": self.released + allowed,
            }
            self.entries.append(entry)
            self._append(entry)
        return allowed

    def admit(self, iteration: int, steps: int) -> tuple[int, int | None]:
        """:meth:`reserve` ``steps`` from ``iteration``: the steps to run, and the iteration
        the run must stop before (None while the budget holds)."""
        allowed = self.reserve(iteration, steps)
        return allowed, (iteration + allowed if allowed < steps else None)

    def _append(self, entry: dict[str, Any]) -> None:
        if self.path is None:
            return
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(descriptor, "a") as handle:  # (0600: the run folder's files are private)
            handle.write(json.dumps(entry) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def exhausted_message(self, iteration: int) -> str:
        """The paragraph of a run stopped before the release at ``iteration``."""
        where = f"the ledger {self.path}" if self.path is not None else "this run's ledger"
        spent = self.summary()["epsilon"]
        return (
            f"The privacy budget --dp-epsilon {self.plan.epsilon:g} (delta "
            f"{self.plan.delta:g}) would be exceeded by the release of iteration {iteration}: "
            f"{where} counts {self.released} releases already (epsilon {spent:.3f} for the "
            f"most exposed party), and the run planned {self.plan.releases}. Rollbacks, "
            "resumes and returns re-run steps, and every re-run is a new release. The run "
            "stopped before that step; nothing more was sent. Start a new run only with a "
            "new budget for these rows."
        )

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` and ``model.json`` record under ``privacy``: the budget, the
        mechanism, the releases counted, and per local party its rates, ``z`` and ε for its
        positives and negatives (PLD) with the RDP cross-check; the top-level ε are the largest
        over the parties."""
        plan = self.plan
        parties = []
        for k, party in enumerate(plan.parties):
            parties.append(
                {
                    "party": party.party,
                    "positives": party.positives,
                    "negatives": party.negatives,
                    "q_positives": party.q_pos,
                    "q_negatives": party.q_neg,
                    "z": party.z,
                    "noise_std": 2.0 * plan.clip * party.z,
                    **party.epsilons(self._releases(k), plan.delta),
                }
            )
        worst = max(parties, key=lambda p: p["z"])
        return {
            "epsilon_budget": plan.epsilon,
            "delta": plan.delta,
            "epsilon": max(max(p["epsilon_positives"], p["epsilon_negatives"]) for p in parties),
            "epsilon_positives": max(p["epsilon_positives"] for p in parties),
            "epsilon_negatives": max(p["epsilon_negatives"] for p in parties),
            "epsilon_rdp": max(p["epsilon_rdp"] for p in parties),
            "accountant": "dp-accounting PLD (RDP cross-check)",
            "z": worst["z"],  # the largest; each party's under parties
            "clip": plan.clip,
            "groups": plan.groups,
            "group_size": plan.group_size,
            "clipping_unit": plan.unit,
            "q_positives": worst["q_positives"],
            "q_negatives": worst["q_negatives"],
            "planned_releases": plan.releases,
            "releases": self.released,
            "ledger": str(self.path) if self.path is not None else None,
            "parties": parties,
        }


def console_line(summary: dict[str, Any]) -> str:
    """The one line that states the guarantee reached."""
    return (
        f"differential privacy per site: epsilon {summary['epsilon_positives']:.3f} for "
        f"positives, {summary['epsilon_negatives']:.3f} for negatives (PLD; RDP "
        f"{summary['epsilon_rdp']:.3f}) at delta {summary['delta']:g}, budget "
        f"{summary['epsilon_budget']:g}; z {summary['z']:.3f}, clip {summary['clip']:g}, "
        f"{summary['groups']} groups, {summary['releases']} releases, rates "
        f"q+ {summary['q_positives']:.4f} q- {summary['q_negatives']:.4f}"
    )
