r"""The privacy ledger's file: what each segment of private steps records, read back and
checked (:mod:`slate.training.accountant` plans and composes with it; docs/privacy.md).

A ledger is a JSON-lines file in the run folder (``privacy-ledger.jsonl``, or
``privacy-ledger-rank{r}.jsonl`` for a site of a distributed run). Every line is
``{"format": 2, "segment": ...}`` (a :class:`Segment`: everything its guarantee depends on) or
``{"format": 2, "opened": ...}``; anything else, and any segment with a missing, odd or
inconsistent field, is refused (:class:`PrivacyLedgerInvalid`) naming the file and the line,
never guessed.

**The sensitivity.** The shift one draw can make to the sum of clipped gradients that the
noise covers (:func:`sensitivity_of`): ``C`` for groups of one row (D-PSGD's, CODA's: a slot
without the row holds nothing, and a row's clipped gradient lies in the ball of radius ``C``),
``2C`` for groups of several rows (SLATE's: the group's clipped gradient without the row also
lies in that ball, so the row moves it by up to ``2C``). The noise's standard deviation is the
sensitivity times ``z``, and ``dp-accounting``'s replace-one Gaussian shifts a drawn outcome by
one sensitivity either way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slate.errors import SlateError

__all__ = [
    "LEDGER",
    "LEDGER_FORMAT",
    "RELATION",
    "Event",
    "PartyMechanism",
    "PrivacyLedgerInvalid",
    "Segment",
    "check_parties",
    "console_line",
    "folder_history",
    "history_events",
    "ledger_path",
    "read_ledger",
    "sensitivity_of",
]

LEDGER = "privacy-ledger.jsonl"

#: The version of the ledger's lines; a line without it (an earlier slate's) is refused.
LEDGER_FORMAT = 2

#: The neighbouring relation, as ``summary.json`` names it: one row replaced by another row of
#: the same class (the class sizes are public). ``dp-accounting``: ``REPLACE_ONE``.
RELATION = "replace-one row within its class"

#: ``(q, z, releases)``: ``releases`` Poisson-sampled Gaussian releases at rate ``q`` and noise
#: multiplier ``z``.
Event = tuple[float, float, int]


class PrivacyLedgerInvalid(SlateError):
    """A ledger line is damaged, lacks a field, or records other parties than the run's: its
    releases cannot be composed, so none are made."""


def sensitivity_of(unit: str, clip: float) -> float:
    """The shift of one draw for a clipping ``unit`` at bound ``clip`` (module docstring):
    ``C`` for ``row``, ``2C`` for ``group``."""
    return float(clip) if unit == "row" else 2.0 * float(clip)


@dataclass(frozen=True)
class PartyMechanism:
    """One party's mechanism in a segment: its class sizes, its rates and its noise
    (``noise_std = sensitivity * z``)."""

    party: int
    positives: int
    negatives: int
    q_positives: float
    q_negatives: float
    z: float
    noise_std: float


@dataclass(frozen=True)
class Segment:
    """A run of ``steps`` private steps from iteration ``start`` with one mechanism: its
    clipping ``unit`` and bound ``clip``, its ``sensitivity`` (the shift of one draw:
    :func:`sensitivity_of`), the neighbouring ``relation``, and per party its
    :class:`PartyMechanism`. Everything its guarantee depends on: its events are
    ``(q+, z, steps)`` and ``(q-, z, steps)`` per party."""

    start: int
    steps: int
    clipping_unit: str
    clip: float
    sensitivity: float
    relation: str
    parties: tuple[PartyMechanism, ...]

    def mechanism(self, party: int) -> PartyMechanism:
        """Party ``party``'s mechanism (KeyError if the segment does not hold it)."""
        for mechanism in self.parties:
            if mechanism.party == party:
                return mechanism
        raise KeyError(party)

    def event(self, party: int, positive: bool) -> Event:
        """The event of a row of ``party`` of that class: ``(q, z, steps)``."""
        m = self.mechanism(party)
        return (m.q_positives if positive else m.q_negatives, m.z, self.steps)

    def to_json(self) -> dict[str, Any]:
        """Its ledger line's ``segment`` value."""
        entry = asdict(self)
        entry["parties"] = [asdict(p) for p in self.parties]
        return entry

    @classmethod
    def from_json(cls, entry: Any, where: str) -> Segment:
        """The segment of a ledger line (``where`` names its file and line); every field must
        be there, of its type and consistent, else :class:`PrivacyLedgerInvalid`."""

        def refuse(what: str) -> PrivacyLedgerInvalid:
            return PrivacyLedgerInvalid(
                f"The privacy ledger {where} {what}: the releases it records cannot be "
                "composed, so no more are made under --dp-epsilon (a missing or odd value is "
                "never guessed). Restore the file as the runs wrote it, or train these rows "
                "again only with a budget that covers every earlier release of them."
            )

        def number(source: dict[str, Any], name: str, kind: type, low: float) -> Any:
            if name not in source:
                raise refuse(f"lacks the field '{name}'")
            value = source[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise refuse(f"has a field '{name}' that is not a number ({value!r})")
            if kind is int and value != int(value):
                raise refuse(f"has a field '{name}' that is not a whole number ({value!r})")
            if not math.isfinite(value) or value < low:
                raise refuse(f"has a field '{name}' out of range ({value!r})")
            return kind(value)

        if not isinstance(entry, dict):
            raise refuse("holds a 'segment' that is not an object")
        for name in ("clipping_unit", "relation", "parties"):
            if name not in entry:
                raise refuse(f"lacks the field '{name}'")
        if entry["relation"] != RELATION:
            raise refuse(
                f"records the neighbouring relation {entry['relation']!r}, not {RELATION!r} "
                "that this slate composes"
            )
        if entry["clipping_unit"] not in ("group", "row"):
            raise refuse(f"records an unknown clipping unit {entry['clipping_unit']!r}")
        start, steps = number(entry, "start", int, 0), number(entry, "steps", int, 1)
        clip = number(entry, "clip", float, 0.0)
        sensitivity = number(entry, "sensitivity", float, 0.0)
        unit = entry["clipping_unit"]
        if clip <= 0 or not math.isclose(sensitivity, sensitivity_of(unit, clip), rel_tol=1e-12):
            raise refuse(
                f"records a sensitivity {sensitivity!r} other than "
                f"{'C' if unit == 'row' else '2C'} for C = {clip!r} and the unit {unit!r}"
            )
        if not isinstance(entry["parties"], list) or not entry["parties"]:
            raise refuse("records no party")
        parties = []
        for source in entry["parties"]:
            if not isinstance(source, dict):
                raise refuse("records a party that is not an object")
            q_pos = number(source, "q_positives", float, 0.0)
            q_neg = number(source, "q_negatives", float, 0.0)
            z = number(source, "z", float, 0.0)
            noise = number(source, "noise_std", float, 0.0)
            if q_pos > 1 or q_neg > 1:
                raise refuse("records a sampling rate above 1")
            if z <= 0 or not math.isclose(noise, sensitivity * z, rel_tol=1e-9):
                raise refuse(f"records a noise {noise!r} that is not its sensitivity times z")
            party = number(source, "party", int, 0)
            n_pos, n_neg = number(source, "positives", int, 0), number(source, "negatives", int, 0)
            parties.append(PartyMechanism(party, n_pos, n_neg, q_pos, q_neg, z, noise))
        return cls(start, steps, entry["clipping_unit"], clip, sensitivity, RELATION,
                   tuple(parties))  # fmt: skip


def ledger_path(folder: Path, rank: int | None) -> Path:
    """The ledger of ``folder``: ``privacy-ledger.jsonl``, or a distributed site's
    ``privacy-ledger-rank{r}.jsonl``."""
    return Path(folder) / (LEDGER if rank is None else f"privacy-ledger-rank{rank}.jsonl")


def folder_history(folder: Path, rank: int | None) -> tuple[Segment, ...]:
    """The segments of ``folder``'s ledger for this process (:func:`ledger_path`), refused
    (:class:`PrivacyLedgerInvalid`) where the folder also holds the other engine's kind of
    ledger (the simulator's, with every party, beside a site's ``-rank{r}`` one): releases of
    the same rows recorded there cannot be told apart, and are not left out by guess. (The
    sites of one distributed run may share a folder: each ledger is its own party's.)"""
    own = ledger_path(folder, rank)
    pattern = "privacy-ledger-rank*.jsonl" if rank is None else LEDGER
    others = sorted(p.name for p in Path(folder).glob(pattern))
    if others:
        raise PrivacyLedgerInvalid(
            f"The run folder {folder} holds the privacy ledger {others[0]} besides this "
            f"process's {own.name}: releases of these rows recorded by a run of the other "
            "engine cannot be told apart from this one's, so no release is made under "
            "--dp-epsilon. Train in another folder only with a budget that covers every "
            "release both ledgers count."
        )
    return read_ledger(own)


def read_ledger(path: Path) -> tuple[Segment, ...]:
    """The segments recorded in the ledger ``path`` (none if it does not exist). Every line is
    ``{"format": 2, "segment": ...}`` or ``{"format": 2, "opened": ...}``; anything else is
    refused (:class:`PrivacyLedgerInvalid`) naming the file and the line."""
    path = Path(path)
    if not path.exists():
        return ()
    segments = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{path}, line {number},"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise PrivacyLedgerInvalid(
                f"The privacy ledger {where} is damaged (not JSON): its releases cannot be "
                "counted, so no more are made under --dp-epsilon. Restore the file, or train "
                "these rows again only with a budget that covers every earlier release of them."
            ) from None
        if not isinstance(entry, dict) or entry.get("format") != LEDGER_FORMAT:
            raise PrivacyLedgerInvalid(
                f"The privacy ledger {where} lacks the field 'format' = {LEDGER_FORMAT}: it was "
                "written by an earlier slate, which recorded the noise multipliers of its "
                "releases but not their sampling rates, clipping and relation, so they cannot "
                "be composed and are never guessed. No release is made under --dp-epsilon in "
                "this folder; train these rows again elsewhere only with a budget that covers "
                "every release the old ledger counts."
            )
        if "segment" in entry:
            segments.append(Segment.from_json(entry["segment"], where))
        elif not isinstance(entry.get("opened"), dict):
            raise PrivacyLedgerInvalid(
                f"The privacy ledger {where} is neither a segment nor an opening: its releases "
                "cannot be counted, so no more are made under --dp-epsilon. Restore the file."
            )
    return tuple(segments)


def history_events(segments: Sequence[Segment], party: int, positive: bool) -> tuple[Event, ...]:
    return tuple(segment.event(party, positive) for segment in segments)


def check_parties(
    segments: Sequence[Segment], counts: Sequence[tuple[int, int, int]], path: Path | None
) -> None:
    """Every segment must hold exactly this run's parties with their class sizes: a row's ε
    composes its own party's releases, and another deal of the rows has other parties."""
    mine = sorted((int(p), int(n_pos), int(n_neg)) for p, n_pos, n_neg in counts)
    for segment in segments:
        theirs = sorted((m.party, m.positives, m.negatives) for m in segment.parties)
        if theirs != mine:
            raise PrivacyLedgerInvalid(
                f"The privacy ledger {path} records releases of parties (party, positives, "
                f"negatives) {theirs} from iteration {segment.start}, but this run's parties "
                f"are {mine}: the rows are dealt otherwise (other --nodes or other data), so a "
                "row's earlier releases cannot be told apart and are not composed by guess. "
                "Run with the ledger's parties, or train elsewhere only with a budget that "
                "covers every release the ledger counts."
            )


def console_line(summary: dict[str, Any]) -> str:
    """The one line that states the guarantee reached."""
    return (
        f"differential privacy per site ({summary['neighbouring_relation']}): epsilon "
        f"{summary['epsilon_positives']:.3f} for positives, {summary['epsilon_negatives']:.3f} "
        f"for negatives (PLD, the ledger's {summary['ledger_releases']} releases) at delta "
        f"{summary['delta']:g}, budget {summary['epsilon_budget']:g}; this run: z "
        f"{summary['z']:.3f}, clip {summary['clip']:g}, {summary['groups']} groups, "
        f"{summary['releases']} releases, rates q+ {summary['q_positives']:.4f} q- "
        f"{summary['q_negatives']:.4f}"
    )
