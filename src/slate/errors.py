"""User-facing error types.

Every error that a user can cause with bad input (a file, a flag, a value) is raised as a
subclass of :class:`SlateError`. The CLI catches exactly these and prints their message as one
paragraph with a non-zero exit code, never a traceback. A message that names several parties
names them through :func:`parties_text`, :func:`per_party_text` or :func:`by_party_text`, so that
it stays one short paragraph at any number of parties.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any


class SlateError(Exception):
    """Base class of every error caused by the user's input; its message is shown as is."""


class DataError(SlateError):
    """A data file or dataset is missing, malformed, or unusable for the requested run."""


class TopologyError(SlateError):
    """A mixing matrix is invalid (not square, not doubly stochastic, disconnected, ...)."""


class ConfigError(SlateError):
    """A flag or configuration value is out of range or inconsistent with the others."""


class TrainingDiverged(SlateError):
    """A loss or parameter became non-finite during training."""


class SumRefused(SlateError):
    """A sum over the sites that cannot be true (a lie in a sum, or a value no sum can carry):
    every site drops it and stops, keeping its own model (exit code 2)."""


class RunInterrupted(SlateError):
    """The run was stopped by SIGINT or SIGTERM after writing a checkpoint (exit code 130)."""


# ------------------------------------------------------------------ parties named in a message
#
# A message names parties by rank. Listed one by one, the parties of a large run bury the
# message (1000 parties short of positives made a 14 000-character error), so every message
# that names several parties writes them through these functions: runs of consecutive ranks
# as ``first-last``, and past a few, a count and the first runs.

#: Up to this many parties are named without a count in front ("parties 0, 3, 7").
FEW = 5
#: A long list shows this many pieces ("0-3", "7"), then how many numbers are left.
RUNS_SHOWN = 6
#: A per-party listing shows this many groups (parties that share a value or a message).
GROUPS_SHOWN = 4


def ranges_text(numbers: Iterable[int], most: int | None = RUNS_SHOWN) -> str:
    """The integers, sorted and without repeats, as runs: ``[0, 1, 2, 3, 7, 9, 10, 11]`` gives
    ``"0-3, 7, 9-11"``. A run of three or more is written ``first-last``, a run of two as two
    numbers ("4, 5"). With ``most``, at most ``most`` pieces (a run or a number) are written,
    then "and K more" (K the numbers not written); ``most=None`` writes them all. No numbers
    give ``"none"``."""
    values = sorted(set(numbers))
    if not values:
        return "none"
    runs: list[tuple[int, int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    pieces: list[str] = []
    written = 0
    for first, last in runs:
        if most is not None and len(pieces) >= most:
            break
        if last - first >= 2:
            pieces.append(f"{first}-{last}")
        elif last == first + 1:
            if most is not None and len(pieces) + 2 > most:
                pieces.append(str(first))
                written += 1
                break
            pieces += [str(first), str(last)]
        else:
            pieces.append(str(first))
        written += last - first + 1
    text = ", ".join(pieces)
    left = len(values) - written
    return f"{text} and {left} more" if left else text


def parties_text(ranks: Iterable[int], counted: bool = True) -> str:
    """Parties by rank, for a message: ``"party 3"``, ``"parties 0-3, 7"`` (up to :data:`FEW`
    parties), and beyond, their count first: ``"1000 parties (0-999)"``, ``"500 parties (0, 2,
    4, 6, 8, 10 and 494 more)"``. ``counted=False`` leaves the count out (for a sentence that
    already gives it): ``"parties 109-999"``."""
    values = sorted(set(ranks))
    if not values:
        return "no party"
    if len(values) == 1:
        return f"party {values[0]}"
    listed = ranges_text(values)
    if len(values) <= FEW or not counted:
        return f"parties {listed}"
    return f"{len(values)} parties ({listed})"


def per_party_text(values: Sequence[Any] | Mapping[int, Any]) -> str:
    """One value per party (``values[n]`` is party n's; a mapping gives the parties it holds),
    grouped by value: ``[2, 1, 2]`` gives ``"party 1: 1; parties 0, 2: 2"``. Groups come in
    increasing value (numbers) or by their first party (anything else); past :data:`GROUPS_SHOWN`
    groups, the other parties are summed up in one (their count and, for numbers, the range of their
    values)."""
    groups: dict[Any, list[int]] = {}
    pairs = values.items() if isinstance(values, Mapping) else enumerate(values)
    for rank, value in pairs:
        groups.setdefault(value, []).append(rank)
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in groups)
    order = sorted(groups) if numbers else list(groups)
    pieces = [f"{parties_text(groups[v])}: {v}" for v in order[:GROUPS_SHOWN]]
    rest = order[GROUPS_SHOWN:]
    if rest:
        count = sum(len(groups[v]) for v in rest)
        spread = f"{min(rest)}-{max(rest)}" if numbers else f"{len(rest)} other values"
        pieces.append(f"the other {count} parties: {spread}")
    return "; ".join(pieces)


def by_party_text(items: Iterable[tuple[int, str]], lead: tuple[str, str] = ("", "")) -> str:
    """Each party's own message (``(rank, text)`` pairs), parties with the same text together:
    ``"Party 3: file missing. Parties 0-2: no positives."`` (a text keeps its own full stop).
    ``lead`` goes between the parties and the colon, its first form after one party and its
    second after several: ``(" could not read its data", " could not read their data")``.
    Groups come in order of their first party; past :data:`GROUPS_SHOWN` groups, the others
    are counted, not shown."""
    groups: dict[str, list[int]] = {}
    for rank, text in sorted(items, key=lambda item: item[0]):
        groups.setdefault(text, []).append(rank)
    texts = list(groups)
    pieces = []
    for text in texts[:GROUPS_SHOWN]:
        ranks = groups[text]
        who = parties_text(ranks) + lead[len(ranks) > 1]
        stop = "" if text.rstrip().endswith((".", "!", "?")) else "."
        pieces.append(f"{who[0].upper()}{who[1:]}: {text.rstrip()}{stop}")
    rest = texts[GROUPS_SHOWN:]
    if rest:
        others = parties_text([r for text in rest for r in groups[text]])
        pieces.append(f"{others[0].upper()}{others[1:]}: {len(rest)} other messages, not shown.")
    return " ".join(pieces)


def parse_bounds(
    cls: Any, text: str | None, flag: str, minimum: float, integers: tuple = ()
) -> Any:
    """``NAME=VALUE,...`` (``flag``: ``--final-check-bounds``, ``--declared-bounds``) as the
    frozen dataclass ``cls`` of numbers: each name one of its fields (``-`` read as ``_``), each
    value a number of at least ``minimum`` (the fields in ``integers`` as whole numbers); the
    names left out keep their defaults. A bad item is a :class:`ConfigError`
    naming the flag and the item."""
    names = [f.name for f in fields(cls)]
    values: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if name not in names:
            raise ConfigError(f"{flag}: no bound {name!r}; the bounds are {', '.join(names)}")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{flag}: {name}={value!r} is no number") from None
        if not number >= minimum:
            raise ConfigError(f"{flag}: {name} must be at least {minimum:g}, got {value}")
        values[name] = int(number) if name in integers else number
    return cls(**values)
