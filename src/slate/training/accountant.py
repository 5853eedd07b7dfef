r"""``--dp-epsilon``: the accountant, the per-site plan and the ledger (docs/privacy.md).

**The guarantee.** Record-level, per site, against any coalition of the other sites, which see
everything the site sends. Each site's releases are its noisy gradient estimates
(:mod:`slate.algorithms.privacy`); everything it sends is computed from them.

**The neighbouring relation** (:data:`RELATION`): *replace-one within its class*. Two training
sets of a site are neighbours when one row is replaced by another row of the same class. Each
site's class sizes ``n+`` and ``n-`` are public (declared at set-up, and the rates are computed
from them), so the data sets a site can have are those with its declared counts: adding or
removing a row changes a count, replacing a row within its class keeps both. A row's features
are covered; its label is covered only against a swap with a row of the other class (two
replacements, one per class: ε+ + ε- by group privacy); the counts themselves are not.

**The sensitivity.** The sampler draws rows by position and deals them into groups by class
and position only, so a replaced row (of the same class) is drawn with the same probability
and lands in the same group and slot. Only that group's clipped gradient changes. Every clipped
group gradient has norm at most C, so with the row's group ``c0`` (row not drawn), ``c1`` (the
row drawn) and ``c1'`` (its replacement drawn) all lie in the ball of radius C:
``||c1 - c0|| <= 2C`` and ``||c1' - c0|| <= 2C``. ``dp-accounting``'s replace-one model of a
Poisson-sampled Gaussian shifts the drawn outcome by ``+s`` on one side and ``-s`` on the other
from the undrawn one (``mu_upper = q N(-s) + (1 - q) N(0)``, ``mu_lower = q N(s) + (1 - q)
N(0)``), ``s`` the noise's unit: with ``s = 2C`` (the :attr:`Segment.sensitivity`) it covers
every such triple. The noise multiplier is therefore ``z = sigma / (2C)``, the noise's standard
deviation over the shift one draw can make, as under add/remove-one; for the same ``z``
replace-one reports about twice the ε of add/remove-one. Groups of one row (D-PSGD's, CODA's)
have ``c0 = 0`` (an empty slot), so ``s = C`` and ``z = sigma / C``
(:func:`slate.training.ledger_file.sensitivity_of`).

**The event.** One release samples each positive with probability ``q+`` and each negative with
``q-`` (Poisson, :class:`slate.data.sampler.PoissonGroupSampler`) and adds Gaussian noise of
standard deviation ``s z``: for a positive row ``PoissonSampled(q+, Gaussian(z))``, likewise
``q-`` for a negative. A row's ε is that of the composition, by ``dp-accounting``'s PLD
accountant with ``NeighboringRelation.REPLACE_ONE``, of every release recorded in its site's
ledger: ``ComposedDpEvent([SelfComposedDpEvent(PoissonSampledDpEvent(q_s, GaussianDpEvent(z_s)),
n_s) for each segment s])``. (``dp-accounting``'s RDP accountant has no Poisson-sampled
replace-one event, so there is no RDP cross-check.) No amplification by gossip is claimed.

**The rates.** Public, from the site's class sizes: each of the ``G`` groups expects ``b``
positives and ``m - b`` negatives, so ``q+ = min(1, G b / n+)`` and ``q- = min(1, G (m - b) /
n-)``.

**The ledger** (:mod:`slate.training.ledger_file`). Mechanisms, not counts: a segment per chunk
of steps, fsynced before its first release, read back by every run in the folder, never
restored from a checkpoint, refused where a field is missing (never guessed).

**The plan** (:func:`plan_privacy`). A run is planned against what its ledger leaves: each
party's ``z`` is the smallest that keeps the composition of the recorded history and the run's
steps within ``epsilon`` for both classes. A remainder under :data:`MIN_SHARE` of the budget
is refused before the first step (:class:`PrivacyBudgetSpent`); a remainder that cannot pay for
the planned steps even at :data:`Z_CEILING` is cut to the steps it affords, and the plan says
so (the run ends after them: ``Run.private_end``). During the run a site stops before the
first step whose release would take it past ``epsilon`` (:class:`PrivacyBudgetExhausted`).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slate.errors import SlateError
from slate.training.ledger_file import (
    LEDGER,
    LEDGER_FORMAT,
    RELATION,
    Event,
    PartyMechanism,
    PrivacyLedgerInvalid,
    Segment,
    check_parties,
    folder_history,
    history_events,
    ledger_path,
    read_ledger,
    sensitivity_of,
)

__all__ = [
    "LEDGER",
    "LEDGER_FORMAT",
    "MIN_SHARE",
    "RELATION",
    "Z_CEILING",
    "PartyMechanism",
    "PartyPrivacy",
    "PrivacyBudgetExhausted",
    "PrivacyBudgetSpent",
    "PrivacyLedger",
    "PrivacyLedgerInvalid",
    "PrivacyPlan",
    "Segment",
    "calibrate",
    "epsilon_pld",
    "folder_history",
    "ledger_path",
    "plan_privacy",
    "read_ledger",
    "sampling_rates",
]

#: A run needs at least this share of the budget left by the ledger's history: a smaller
#: remainder is of the order of the calibration's and the discretisation's slack, and pays
#: for steps with next to no signal. Such a run is refused before its first step.
MIN_SHARE = 0.01

#: The largest noise multiplier a plan takes: where the remainder cannot pay for the planned
#: steps below it (noise of standard deviation 512 C on a sum of at most G C), the plan is cut.
#: Far above what a fresh ledger needs (z = 36 for epsilon 1 over 500 steps at q = 0.216).
Z_CEILING = 256.0

#: The smallest noise multiplier searched: below it a release is close to no privacy at all.
Z_FLOOR = 0.25

#: The PLD accountant's discretisation of the privacy loss: pessimistic (an upper bound on
#: epsilon), within 1e-3 of its finest setting on the schedules of docs/privacy.md, and 10x
#: faster (0.1 s against 2 s at z = 0.76).
DISCRETISATION = 1e-3


class PrivacyBudgetExhausted(SlateError):
    """The next release would take a site past ``--dp-epsilon``."""


class PrivacyBudgetSpent(PrivacyBudgetExhausted):
    """The ledger's history leaves too little of ``--dp-epsilon`` for one step: refused before
    the run's first step."""


def sampling_rates(
    groups: int, batch_size: int, positives: int, n_pos: int, n_neg: int, unit: str = "row"
) -> tuple[float, float]:
    """``(q+, q-)``: each of ``groups`` groups expects ``positives`` (b) positives and
    ``batch_size - positives`` (m - b) negatives of a party with ``n_pos`` and ``n_neg``. A
    party without positives under a loss over groups (``unit="group"``, the AP surrogate: no
    term without a positive) samples nothing, ``(0, 0)``: it releases nothing, ε 0."""
    if n_pos == 0 and unit == "group":
        return 0.0, 0.0
    q_pos = min(1.0, groups * positives / n_pos) if n_pos else 0.0
    q_neg = min(1.0, groups * (batch_size - positives) / n_neg) if n_neg else 0.0
    return q_pos, q_neg


# ----------------------------------------------------------------------------- dp-accounting


def _merged(events: Iterable[Event]) -> tuple[Event, ...]:
    """The events with releases, identical mechanisms merged (composition is commutative)."""
    counts: dict[tuple[float, float], int] = {}
    for q, z, n in events:
        if n > 0 and q > 0:
            counts[(float(q), float(z))] = counts.get((float(q), float(z)), 0) + int(n)
    return tuple(sorted((q, z, n) for (q, z), n in counts.items()))


def epsilon_pld(events: Iterable[Event], delta: float) -> float:
    """ε at ``delta`` of the composition of ``(q, z, releases)`` events under replace-one, by
    ``dp-accounting``'s PLD accountant (0 for no release)."""
    return _epsilon(_merged(events), float(delta))


@functools.cache
def _epsilon(events: tuple[Event, ...], delta: float, interval: float = DISCRETISATION) -> float:
    """ε at ``delta`` of ``events`` (merged, :func:`_merged`) by dp-accounting's PLD accountant
    at ``interval`` (:func:`slate.training.pld_composition.composed_epsilon`)."""
    from slate.training.pld_composition import composed_epsilon

    return composed_epsilon(events, delta, interval)


def calibrate(
    q: float, releases: int, epsilon: float, delta: float, history: Sequence[Event] = ()
) -> float | None:
    """The smallest noise multiplier ``z`` (to a relative 1e-3, on the safe side, at least
    :data:`Z_FLOOR`) such that ``history`` composed with ``releases`` Poisson-sampled Gaussian
    releases at rate ``q`` and multiplier ``z`` meets ``epsilon`` at ``delta`` (PLD,
    replace-one): ``epsilon_pld`` at the returned ``z`` is at most ``epsilon``, and above it at
    ``z / 1.001``. Bracketed with a 10x coarser (pessimistic) PLD, answered by
    :func:`epsilon_pld` alone (:func:`slate.training.noise_search.smallest_z`); None when even
    :data:`Z_CEILING` does not meet ``epsilon``."""
    return _calibrate(float(q), int(releases), float(epsilon), float(delta), _merged(history))


#: The discretisation of the calibration's bracket: 10x coarser than :data:`DISCRETISATION`,
#: and as pessimistic (its z errs towards more noise, by 0 to 1.5%).
COARSE_DISCRETISATION = 1e-2


@functools.cache
def _calibrate(
    q: float, releases: int, epsilon: float, delta: float, history: tuple[Event, ...]
) -> float | None:
    from slate.training.noise_search import smallest_z

    def fine(z: float) -> float:
        return epsilon_pld((*history, (q, z, releases)), delta)

    def coarse(z: float) -> float:
        events = _merged((*history, (q, z, releases)))
        return _epsilon(events, delta, COARSE_DISCRETISATION)

    return smallest_z(fine, coarse, epsilon, Z_FLOOR, Z_CEILING, 1e-3)


def _affordable(q: float, most: int, epsilon: float, delta: float, history: Sequence[Event]) -> int:
    """The most releases, up to ``most``, at rate ``q`` and multiplier :data:`Z_CEILING` that
    ``history`` leaves room for within ``epsilon`` (ε grows with the count;
    :func:`slate.training.noise_search.most_releases`, which evaluates ε at the answer and the
    count after it; ``epsilon_pld`` at ``most`` exceeds ``epsilon`` where it is called)."""
    from slate.training.noise_search import most_releases

    ceiling = Z_CEILING
    return most_releases(lambda n: epsilon_pld((*history, (q, ceiling, n)), delta), most, epsilon)


# ----------------------------------------------------------------------------- the plan


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
        """The larger of the two rates."""
        return max(self.q_pos, self.q_neg)


@dataclass(frozen=True)
class PrivacyPlan:
    """The run's privacy settings and each local party's parameters: ``epsilon`` at ``delta``
    for the whole recorded ``history`` plus ``releases`` steps (``requested`` before a cut:
    ``note`` says so), clip ``C``, ``groups`` G of ``group_size`` slots, the clipping ``unit``
    (``group``: SLATE's AP over a group; ``row``: groups of one)."""

    epsilon: float
    delta: float
    clip: float
    groups: int
    group_size: int
    unit: str
    releases: int
    parties: tuple[PartyPrivacy, ...]
    history: tuple[Segment, ...] = ()
    requested: int | None = None
    note: str | None = None

    @property
    def sensitivity(self) -> float:
        """The shift one draw can make to the sum of clipped gradients: ``C`` for groups of one
        row, ``2C`` for larger groups (:func:`slate.training.ledger_file.sensitivity_of`)."""
        return sensitivity_of(self.unit, self.clip)

    def noise_std(self) -> tuple[float, ...]:
        """Each local party's noise standard deviation, the sensitivity times ``z``."""
        return tuple(self.sensitivity * p.z for p in self.parties)

    def segment(self, start: int, steps: int) -> Segment:
        """The segment of ``steps`` of this plan's releases from iteration ``start``."""
        return Segment(
            int(start), int(steps), self.unit, self.clip, self.sensitivity, RELATION,
            tuple(
                PartyMechanism(p.party, p.positives, p.negatives, p.q_pos, p.q_neg, p.z,
                               self.sensitivity * p.z)
                for p in self.parties
            ),
        )  # fmt: skip


def _spent_before(
    history: Sequence[Segment], party: int, q: tuple[float, float], delta: float
) -> tuple[float, float]:
    """ε of the recorded history for a positive and a negative row of ``party``."""
    return tuple(  # type: ignore[return-value]
        epsilon_pld(history_events(history, party, positive), delta) if rate > 0 else 0.0
        for positive, rate in ((True, q[0]), (False, q[1]))
    )


def _party_z(
    q_pos: float,
    q_neg: float,
    releases: int,
    epsilon: float,
    delta: float,
    history: Sequence[Segment],
    party: int,
) -> float:
    """``max(z+, z-)`` for ``releases`` more releases of ``party`` after ``history``: the class
    of the larger rate first; the other's calibration only where that ``z`` does not already
    keep it within ``epsilon`` (without a history it always does: ε grows with the rate)."""
    classes = sorted(((q_pos, True), (q_neg, False)), reverse=True)
    z: float | None = None
    for q, positive in classes:
        if q <= 0:
            continue
        events = history_events(history, party, positive)
        if z is not None and epsilon_pld((*events, (q, z, releases)), delta) <= epsilon:
            continue
        found = calibrate(q, releases, epsilon, delta, events)
        z = max(z or 0.0, found if found is not None else Z_CEILING)
    return z if z is not None else Z_FLOOR


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
    history: Sequence[Segment] = (),
    ledger: Path | None = None,
    rate_groups: int | None = None,
) -> PrivacyPlan:
    """The plan for local parties ``counts`` (``(party, n+, n-)`` each) against the ledger's
    recorded ``history`` (read from ``ledger``): per party, ``z = max(z+, z-)`` with ``z+`` the
    smallest multiplier whose composition of the history's events for a positive row with the
    run's ``releases`` at ``q+`` meets ``epsilon`` (likewise ``z-``). Refused before the first
    step (:class:`PrivacyBudgetSpent`) where the history leaves less than :data:`MIN_SHARE` of
    the budget, or not one release at :data:`Z_CEILING`; cut to the releases it affords where
    ``releases`` would need more than :data:`Z_CEILING`. The rates are the sampler's, from
    ``rate_groups`` (``--dp-groups``; default ``groups``, which counts slots for rows)."""
    history = tuple(history)
    check_parties(history, counts, ledger)
    rate_groups = groups if rate_groups is None else rate_groups
    rates = {
        party: sampling_rates(rate_groups, batch_size, positives, n_pos, n_neg, unit)
        for party, n_pos, n_neg in counts
    }
    where = f"the ledger {ledger}" if ledger is not None else "this run's ledger"
    recorded = sum(s.steps for s in history)

    def refused(spent: float, party: int, why: str) -> PrivacyBudgetSpent:
        return PrivacyBudgetSpent(
            f"Refused under --dp-epsilon {epsilon:g} (delta {delta:g}): {where} records "
            f"{recorded} releases of these rows in {len(history)} segments, which compose "
            f"(dp-accounting PLD, {RELATION}) to epsilon {spent:.4f} for party {party}, "
            f"leaving {max(epsilon - spent, 0.0):.4f}; {why}. No step was taken and nothing "
            "was sent. The ledger counts every run in this folder (resumes, returns, other "
            "flags); train these rows again only with a budget that covers that history "
            "(--dp-epsilon is the total, history included)."
        )

    afford = int(releases)
    for party, *_ in counts:
        q_pos, q_neg = rates[party]
        before = _spent_before(history, party, (q_pos, q_neg), delta) if history else (0, 0)
        if history and epsilon - max(before) < MIN_SHARE * epsilon:
            need = f"{MIN_SHARE:.0%} of the budget ({MIN_SHARE * epsilon:g})"
            raise refused(max(before), party, f"a run needs at least {need} left")
        for positive, q in ((True, q_pos), (False, q_neg)):
            events = history_events(history, party, positive)
            if q > 0 and epsilon_pld((*events, (q, Z_CEILING, afford)), delta) > epsilon:
                afford = _affordable(q, afford, epsilon, delta, events)
                if afford == 0:
                    raise refused(
                        max(before), party,
                        f"not one release fits, even at the largest noise multiplier z = "
                        f"{Z_CEILING:g}",
                    )  # fmt: skip
    parties = []
    for party, n_pos, n_neg in counts:
        q_pos, q_neg = rates[party]
        z = _party_z(q_pos, q_neg, afford, epsilon, delta, history, party)
        parties.append(PartyPrivacy(party, n_pos, n_neg, q_pos, q_neg, z))
    note = None
    if afford < releases:
        note = (
            f"privacy: {where} already records {recorded} releases of these rows; what is left "
            f"of --dp-epsilon {epsilon:g} pays for {afford} of the {releases} planned releases "
            f"(at z <= {Z_CEILING:g}): the run ends after them, {releases - afford} steps "
            "early, and its summary says so (planned_releases, requested_releases)"
        )
    return PrivacyPlan(epsilon, delta, clip, groups, group_size, unit, afford, tuple(parties),
                       history, int(releases), note)  # fmt: skip


@dataclass
class PrivacyLedger:
    """The releases of this process's parties, kept in ``path`` (None: in memory, a run
    without a folder) and counted against ``plan.epsilon`` together with ``plan.history``, the
    segments recorded before this run. ``entries`` are this run's segments.

    Each line is ``{"format": 2, "segment": ...}`` (:meth:`Segment.to_json`) or ``{"format":
    2, "opened": ...}`` when a run starts or continues in the folder.
    """

    plan: PrivacyPlan
    path: Path | None = None
    entries: list[Segment] = field(default_factory=list)

    @classmethod
    def open(cls, plan: PrivacyPlan, folder: Path | None, rank: int | None) -> PrivacyLedger:
        """The ledger of ``folder`` (never restored from a checkpoint), or an in-memory one
        without a folder; ``plan`` must have been made against the segments it records now. A
        line records this opening."""
        if folder is None:
            return cls(plan)
        from slate.permissions import private_folder

        private_folder(Path(folder))
        path = ledger_path(Path(folder), rank)
        if read_ledger(path) != plan.history:
            raise ValueError(f"the plan was not made against the ledger {path} as it is now")
        ledger = cls(plan, path)
        ledger._append(
            {
                "format": LEDGER_FORMAT,
                "opened": {
                    "epsilon": plan.epsilon,
                    "delta": plan.delta,
                    "relation": RELATION,
                    "clip": plan.clip,
                    "groups": plan.groups,
                    "requested_releases": plan.requested,
                    "planned_releases": plan.releases,
                    "recorded_segments": len(plan.history),
                    "parties": [asdict(p) for p in plan.parties],
                },
            }
        )
        return ledger

    @property
    def released(self) -> int:
        """This run's releases so far."""
        return sum(e.steps for e in self.entries)

    @property
    def recorded(self) -> int:
        """Every release the ledger records: the history's and this run's."""
        return sum(s.steps for s in self.plan.history) + self.released

    def events(self, k: int, positive: bool, extra: int = 0) -> tuple[Event, ...]:
        """The events of a row of that class of party position ``k``: the history's, this
        run's, and ``extra`` more releases of the plan."""
        party = self.plan.parties[k]
        q = party.q_pos if positive else party.q_neg
        segments = (*self.plan.history, *self.entries)
        return (*history_events(segments, party.party, positive), (q, party.z, int(extra)))

    def _within(self, extra: int) -> bool:
        """Whether ``extra`` more releases keep every local party within the budget."""
        if self.released + extra <= self.plan.releases:
            return True  # z was calibrated for the history and the planned releases
        return all(
            self._spent(k, positive, extra) <= self.plan.epsilon
            for k in range(len(self.plan.parties))
            for positive in (True, False)
        )

    def _spent(self, k: int, positive: bool, extra: int) -> float:
        """ε of :meth:`events` (``extra`` more releases of the plan)."""
        return epsilon_pld(self.events(k, positive, extra), self.plan.delta)

    def reserve(self, iteration: int, steps: int) -> int:
        """Record (and fsync) up to ``steps`` releases from ``iteration`` before they are made;
        returns how many fit within the budget (fewer only at its end)."""
        allowed = steps
        if not self._within(steps):  # the largest count that fits: every class's, or the plan's
            from slate.training.noise_search import most_releases

            fits = steps
            for k, positive in itertools.product(range(len(self.plan.parties)), (True, False)):
                spent = functools.partial(self._spent, k, positive)
                if spent(fits) > self.plan.epsilon:
                    fits = most_releases(spent, fits, self.plan.epsilon)
            allowed = max(fits, min(self.plan.releases - self.released, steps))
        if allowed > 0:
            segment = self.plan.segment(iteration, allowed)
            self._append({"format": LEDGER_FORMAT, "segment": segment.to_json()})
            self.entries.append(segment)
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
            f"{where} records {self.recorded} releases ({self.released} of this run, which "
            f"planned {self.plan.releases}), epsilon {spent:.3f} for the most exposed party "
            f"({RELATION}). Rollbacks, resumes and returns re-run steps, and every re-run is a "
            "new release. The run stopped before that step; nothing more was sent. Train "
            "these rows again only with a budget that covers this history."
        )

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` and ``model.json`` record under ``privacy``: ε of the whole
        recorded history (every run of this ledger, this one included) per local party and
        class, with the history's ε before this run; this run's own mechanism (relation,
        sensitivity, rates, ``z``, clip, groups) and releases; the top-level ε are the largest
        over the parties."""
        plan = self.plan
        parties = []
        for k, party in enumerate(plan.parties):
            before = _spent_before(plan.history, party.party, (party.q_pos, party.q_neg),
                                   plan.delta)  # fmt: skip
            parties.append(
                {
                    "party": party.party,
                    "positives": party.positives,
                    "negatives": party.negatives,
                    "q_positives": party.q_pos,
                    "q_negatives": party.q_neg,
                    "z": party.z,
                    "noise_std": plan.sensitivity * party.z,
                    "epsilon_positives": epsilon_pld(self.events(k, True), plan.delta),
                    "epsilon_negatives": epsilon_pld(self.events(k, False), plan.delta),
                    "epsilon_before_run": max(before),
                }
            )
        worst = max(parties, key=lambda p: p["z"])
        return {
            "epsilon_budget": plan.epsilon,
            "delta": plan.delta,
            "epsilon": max(max(p["epsilon_positives"], p["epsilon_negatives"]) for p in parties),
            "epsilon_positives": max(p["epsilon_positives"] for p in parties),
            "epsilon_negatives": max(p["epsilon_negatives"] for p in parties),
            "epsilon_before_run": max(p["epsilon_before_run"] for p in parties),
            "accountant": "dp-accounting PLD, every segment of the ledger composed",
            "neighbouring_relation": RELATION,
            "sensitivity": plan.sensitivity,
            "z": worst["z"],  # the largest; each party's under parties
            "clip": plan.clip,
            "groups": plan.groups,
            "group_size": plan.group_size,
            "clipping_unit": plan.unit,
            "q_positives": worst["q_positives"],
            "q_negatives": worst["q_negatives"],
            "requested_releases": plan.requested,
            "planned_releases": plan.releases,
            "releases": self.released,
            "ledger_releases": self.recorded,
            "ledger_segments": len(plan.history) + len(self.entries),
            "ledger": str(self.path) if self.path is not None else None,
            "parties": parties,
        }
