"""The job file of a multi-site run: every setting the sites must agree on, in one TOML file.

``slate job init`` writes it (:func:`job_text`, :func:`write_job`): each agreed setting of
``slate train`` (:mod:`slate.cli.train_settings`) under its field name, with its help as a
comment above it; an unset one (the dataset's default at every site) stays commented out.
``slate train --job FILE`` reads it back (:func:`read_job`), checking every key and type
against the same declarations, and its digest (:func:`job_digest`: the sha256 of the agreed
values it resolves to, whatever its comments and order) joins the run agreement as the
``job_sha256`` setting (:mod:`slate.training.agreement`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import textwrap
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from slate.cli.train_settings import TrainSetting, comma_items, lr_value, train_settings
from slate.config import TrainConfig
from slate.errors import ConfigError

__all__ = [
    "agreed_settings",
    "job_digest",
    "job_text",
    "read_job",
    "write_job",
]

HEADER = """\
# The job file of one multi-site slate run: every setting the sites must agree on.
# Written by 'slate job init'; every site runs 'slate train --job THIS_FILE' with only its
# own flags (--rank, --key, --roster, --rendezvous, --train, --test, --out, ...).
# A setting left commented out is unset, as a flag left out is: its help says what follows.
"""


def agreed_settings() -> list[TrainSetting]:
    """The settings of ``slate train`` every site must share and a user gives (a flag)."""
    return [s for s in train_settings() if s.agreed and s.option_strings and s.group]


def _toml(value: Any) -> str:
    """One TOML value: a bool, number, string or list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _comment(setting: TrainSetting) -> list[str]:
    """The comment lines above a setting: its flag, help and choices."""
    text = (setting.help or "").replace("%%", "%")
    if setting.choices is not None:
        text += f" (one of: {', '.join(str(c) for c in setting.choices)})"
    flag = setting.option_strings[0]
    text = f"{flag}: {text.strip()}" if setting.help else f"{flag}{text}"
    return textwrap.wrap(text, 94, initial_indent="# ", subsequent_indent="# ")


def job_text(values: Mapping[str, Any]) -> str:
    """The job file of ``values`` (field name -> value; a missing or None value is unset),
    every agreed setting once, grouped as ``slate train --help`` groups them."""
    lines, group = [HEADER.rstrip("\n")], None
    settings = agreed_settings()
    order = {g: i for i, g in reversed(list(enumerate(s.group for s in settings)))}
    for setting in sorted(settings, key=lambda s: order[s.group]):
        if setting.group != group:
            group = setting.group
            lines += ["", f"# ---- {group} ----"]
        lines += ["", *_comment(setting)]
        value = values.get(setting.dest)
        if value is None:
            lines.append(f"# {setting.dest} = (unset)")
        else:
            lines.append(f"{setting.dest} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def write_job(path: str | Path, values: Mapping[str, Any]) -> None:
    """Write the job file; an existing file is never replaced."""
    try:
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(job_text(values))
    except FileExistsError:
        raise ConfigError(
            f"{path} exists already: 'slate job init' never replaces a job file (the sites "
            "may be running with it). Give another --out, or remove the file first."
        ) from None
    except OSError as err:
        raise ConfigError(f"--out {path}: the job file cannot be written: {err}.") from None


def _line_of(text: str, key: str) -> str:
    """`` (line N)`` of ``key``'s assignment in the file's text, or nothing."""
    pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.match(line):
            return f" (line {number})"
    return ""


def _expected(setting: TrainSetting) -> str:
    """What a setting's value must be, in words."""
    if setting.action in ("store_true",) or "BooleanOptional" in str(setting.action):
        return "true or false"
    if setting.nargs:
        return f"a list of {setting.nargs} numbers"
    if setting.action == "append":
        return "a list of strings"
    if setting.type is lr_value:
        return 'a number or "auto"'
    kind = {int: "an integer", float: "a number"}.get(setting.type, "a string")
    if setting.choices is not None:
        return f"one of {', '.join(json.dumps(c) for c in setting.choices)}"
    return kind


def _text_lr(text: str) -> float | str:
    """``lr = "auto"`` (or a number written as a string); ValueError otherwise."""
    try:
        return lr_value(text)
    except argparse.ArgumentTypeError:
        raise ValueError('a number or "auto"') from None


def _convert(setting: TrainSetting, value: Any) -> Any:
    """The :class:`TrainConfig` value of a job file's ``value``; ValueError when it is not of
    the setting's type."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if setting.action == "store_true" or "BooleanOptional" in str(setting.action):
        ok = isinstance(value, bool)
    elif setting.nargs:
        ok = isinstance(value, list) and len(value) == setting.nargs
        ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        value = tuple(float(v) for v in value) if ok else value
    elif setting.action == "append":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        value = comma_items(value) if ok else value
    elif setting.type is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif setting.type in (float, lr_value):
        ok = number or (setting.type is lr_value and isinstance(value, str))
        value = _text_lr(value) if isinstance(value, str) and ok else value
        value = float(value) if number else value
    else:
        ok = isinstance(value, str)
    if not ok or (setting.choices is not None and value not in setting.choices):
        raise ValueError(_expected(setting))
    return value


def read_job(path: str | Path) -> dict[str, Any]:
    """Every agreed setting's value from the job file at ``path`` (a key it leaves out: the
    field's default); a :class:`ConfigError` names the file, the key (and its line) and what
    was expected."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"--job {path}: no such file ('slate job init' writes one).") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--job {path}: the job file cannot be read: {err}.") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(
            f"--job {path}: the job file is not valid TOML: {err}. It holds one 'key = value' "
            "line per setting ('slate job init' writes one)."
        ) from None
    return _values(path, text, data)


def _values(path: str | Path, text: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The agreed values of a parsed job file, each key and type checked."""
    settings = {s.dest: s for s in agreed_settings()}
    unknown = [key for key in data if key not in settings]
    if unknown:
        raise ConfigError(_unknown_message(path, text, unknown))
    values = {dest: TrainConfig.__dataclass_fields__[dest].default for dest in settings}
    for key, raw in data.items():
        try:
            values[key] = _convert(settings[key], raw)
        except (ValueError, TypeError) as err:
            got = json.dumps(raw) if isinstance(raw, str | int | float | list) else repr(raw)
            raise ConfigError(
                f"--job {path}: the key {key}{_line_of(text, key)} is {got}, where "
                f"{settings[key].option_strings[0]} takes {err}. Correct it in the job file "
                "(every site must hold the same file)."
            ) from None
    return values


def _unknown_message(path: str | Path, text: str, unknown: Iterable[str]) -> str:
    """One paragraph for keys that are no agreed setting: a site's own, or none at all."""
    own = {s.dest: s.option_strings[0] for s in train_settings() if s.option_strings}
    parts = []
    for key in unknown:
        where = f"{key}{_line_of(text, key)}"
        parts.append(
            f"{where} is this site's own setting: give {own[key]} on the command line"
            if key in own
            else f"{where} is no setting of slate train"
        )
    return (
        f"--job {path}: the job file holds keys it may not: {'; '.join(parts)}. A job file "
        "holds only the settings every site must agree on ('slate job init' writes them all)."
    )


def job_digest(values: Mapping[str, Any]) -> str:
    """The sha256 of a job's agreed values in canonical form (sorted keys, JSON): the same for
    two files that differ only in comments, order or a default written out."""
    canonical = {s.dest: values.get(s.dest) for s in agreed_settings()}
    encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(encoded.encode()).hexdigest()
