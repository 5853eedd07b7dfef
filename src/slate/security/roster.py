"""The roster of a run: every site's rank, name and Ed25519 public key, in one JSON file that
every site of the run holds identically::

    {"format": "slate-roster", "version": 1, "run_id": "...",
     "sites": [{"rank": 0, "name": "hospital-a", "public_key": "<base64, 32 bytes>"}, ...]}

Its :attr:`Roster.digest` is the sha256 of its canonical JSON (sites sorted by rank, keys sorted,
no whitespace, ASCII only), so it does not depend on the order of the sites or on the layout of
the file. :meth:`Roster.read` reads a file strictly: every problem is a
:class:`~slate.errors.ConfigError` naming the file and the offending field or rank.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from slate.errors import ConfigError
from slate.security.keys import create_exclusive, read_public_key, read_small_file

__all__ = ["Roster", "Site", "make_roster", "write_roster"]

ROSTER_FORMAT = "slate-roster"
ROSTER_VERSION = 1
KEY_BYTES = 32
SIGNATURE_BYTES = 64
MAX_SITES = 4096
MAX_RUN_ID = 128
MAX_NAME = 128
MAX_ROSTER_BYTES = 1 << 20

_TOP_FIELDS = frozenset({"format", "version", "run_id", "sites"})
_SITE_FIELDS = frozenset({"rank", "name", "public_key"})
_ROSTER_EXAMPLE = (
    '{"format": "slate-roster", "version": 1, "run_id": "...", "sites": [{"rank": 0, '
    '"name": "...", "public_key": "<base64 of 32 bytes>"}, ...]}'
)


@dataclass(frozen=True)
class Site:
    """One site of a run: its rank, a name for messages, and its raw Ed25519 public key."""

    rank: int
    name: str
    public_key: bytes


@dataclass(frozen=True)
class Roster:
    """Every site of one run, ``sites[r].rank == r``, and the digest of the whole list.

    Build one with :func:`make_roster`, :meth:`Roster.read` or :meth:`Roster.from_json`; the
    digest is only meaningful when computed by them.
    """

    run_id: str
    sites: tuple[Site, ...]
    digest: str
    path: str = ""

    def __post_init__(self) -> None:
        """Check the invariant ``sites[r].rank == r`` (a programming error otherwise)."""
        for index, site in enumerate(self.sites):
            if site.rank != index:
                raise ValueError(f"roster sites must be sorted by rank 0..N-1, got {site.rank}")

    @property
    def n(self) -> int:
        """The number of sites."""
        return len(self.sites)

    def rank_of(self, public_key: bytes) -> int | None:
        """The rank of the site with this raw public key, or None if it is not on the roster."""
        for site in self.sites:
            if site.public_key == public_key:
                return site.rank
        return None

    def verifier(self, rank: int) -> Ed25519PublicKey:
        """The public key object of site ``rank``.

        Raises:
            ValueError: ``rank`` is not one of 0..n-1.
        """
        if not _is_rank(rank, self.n):
            raise ValueError(f"rank {rank!r} is not on the roster (ranks 0..{self.n - 1})")
        return _public_key_object(self.sites[rank].public_key)

    def verify(self, rank: int, data: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is site ``rank``'s signature of ``data``; never raises.

        False for a rank off the roster, a signature that is not 64 bytes, or a bad signature.
        """
        if not _is_rank(rank, self.n):
            return False
        try:
            if len(signature) != SIGNATURE_BYTES:
                return False
            self.verifier(rank).verify(signature, data)
        except (InvalidSignature, TypeError, ValueError):
            return False
        return True

    def to_json(self) -> dict:
        """The roster as the JSON object of its file, sites sorted by rank."""
        return _canonical_json(self.run_id, self.sites)

    @staticmethod
    def from_json(raw: object, source: str) -> Roster:
        """Validate a parsed roster file strictly and build the :class:`Roster`.

        Args:
            raw: the parsed JSON.
            source: the file it came from, named in every error.

        Raises:
            ConfigError: one paragraph naming ``source`` and the offending field or rank.
        """
        if not isinstance(raw, dict):
            _bad(source, f"it must be a JSON object, not {_kind(raw)}. Expected {_ROSTER_EXAMPLE}")
        unknown = sorted(str(key) for key in raw if key not in _TOP_FIELDS)
        if unknown:
            _bad(source, f"unknown field(s) {', '.join(unknown)}. Expected {_ROSTER_EXAMPLE}")
        missing = sorted(_TOP_FIELDS - set(raw))
        if missing:
            _bad(source, f"missing field(s) {', '.join(missing)}. Expected {_ROSTER_EXAMPLE}")
        if raw["format"] != ROSTER_FORMAT:
            _bad(source, f'"format" must be "{ROSTER_FORMAT}", got {_short(raw["format"])}')
        version = raw["version"]
        if type(version) is not int or version != ROSTER_VERSION:
            _bad(
                source,
                f'"version" {_short(version)} is not supported; this slate reads version '
                f"{ROSTER_VERSION}",
            )
        run_id = raw["run_id"]
        problem = _run_id_problem(run_id)
        if problem:
            _bad(source, f'"run_id" {_short(run_id)} {problem}')
        entries = raw["sites"]
        if not isinstance(entries, list) or not entries:
            _bad(source, f'"sites" must be a non-empty list of sites, got {_short(entries)}')
        if len(entries) > MAX_SITES:
            _bad(source, f'"sites" lists {len(entries)} sites, more than the {MAX_SITES} allowed')
        sites = [_parse_site(entry, index, source) for index, entry in enumerate(entries)]
        _check_ranks(sites, source)
        by_key: dict[bytes, Site] = {}
        by_name: dict[str, Site] = {}
        for site in sites:
            if site.public_key in by_key:
                other = by_key[site.public_key]
                _bad(
                    source,
                    f"ranks {other.rank} ({other.name!r}) and {site.rank} ({site.name!r}) have "
                    "the same public key; every site needs its own key pair",
                )
            if site.name in by_name:
                other = by_name[site.name]
                _bad(
                    source,
                    f"ranks {other.rank} and {site.rank} have the same name {site.name!r}; "
                    "rename one of them",
                )
            by_key[site.public_key] = site
            by_name[site.name] = site
        return _assemble(run_id, sites, source)

    @staticmethod
    def read(path: str | Path) -> Roster:
        """Read and validate a roster file (at most 1 MiB of UTF-8 JSON).

        Raises:
            ConfigError: naming the file, when it is missing, unreadable, too large, not UTF-8,
                not JSON (with the line), or not a valid roster.
        """
        path = Path(path)
        data, _ = read_small_file(path, "roster file", MAX_ROSTER_BYTES)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"The roster file {path} is not UTF-8 text (byte {err.start} cannot be "
                "decoded). Expected the JSON file written by 'slate roster'."
            ) from err
        try:
            raw = json.loads(text, object_pairs_hook=_unique_fields)
        except _DuplicateField as err:
            raise ConfigError(
                f"The roster file {path} is invalid: the field {err.args[0]!r} appears twice "
                "in one object."
            ) from err
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"The roster file {path} is not valid JSON: {err.msg} at line {err.lineno}, "
                f"column {err.colno}. Expected the JSON file written by 'slate roster'."
            ) from err
        except RecursionError as err:
            raise ConfigError(
                f"The roster file {path} is not a roster: its JSON is nested too deeply."
            ) from err
        return Roster.from_json(raw, str(path))


def make_roster(public_keys: Sequence[str | Path], run_id: str | None = None) -> Roster:
    """The roster of the sites whose ``.pub`` files are given, ranked in the order given.

    Each site is named after its file's stem (``hospital-a.pub`` is ``hospital-a``).

    Args:
        public_keys: the ``.pub`` files, rank 0 first.
        run_id: the run's id; a random 32-hex-digit one when None.

    Raises:
        ConfigError: no key given, a file that is not a public key, two files with the same key
            or the same name, or an invalid run id.
    """
    paths = [Path(p) for p in public_keys]
    if not paths:
        raise ConfigError(
            "A roster needs at least one public key: pass the .pub file of every site, as "
            "written by 'slate keygen'."
        )
    if len(paths) > MAX_SITES:
        raise ConfigError(f"A roster lists at most {MAX_SITES} sites; {len(paths)} were given.")
    if run_id is None:
        run_id = secrets.token_hex(16)
    problem = _run_id_problem(run_id)
    if problem:
        raise ConfigError(f"The run id {_short(run_id)} is invalid: it {problem}.")
    sites: list[Site] = []
    key_files: dict[bytes, Path] = {}
    name_files: dict[str, Path] = {}
    for rank, path in enumerate(paths):
        key = read_public_key(path)
        name = path.stem
        problem = _name_problem(name)
        if problem:
            raise ConfigError(
                f"The site name {name!r} taken from the file name {path} {problem}; rename "
                "the file."
            )
        if key in key_files:
            raise ConfigError(
                f"The public key files {key_files[key]} and {path} hold the same key; every "
                "site needs its own key pair ('slate keygen')."
            )
        if name in name_files:
            raise ConfigError(
                f"The public key files {name_files[name]} and {path} give two sites the same "
                f"name {name!r}; rename one of the files (the name is the file name without "
                ".pub)."
            )
        key_files[key] = path
        name_files[name] = path
        sites.append(Site(rank=rank, name=name, public_key=key))
    return _assemble(run_id, sites, "")


def write_roster(roster: Roster, out: str | Path) -> Path:
    """Write ``roster`` as indented JSON to a new file ``out``; never overwrites.

    Raises:
        ConfigError: ``out`` exists, its folder is missing, or it cannot be created.
    """
    path = Path(out)
    text = json.dumps(roster.to_json(), indent=2, ensure_ascii=False) + "\n"
    create_exclusive(path, text.encode("utf-8"), 0o644, "roster file")
    return path


# --------------------------------------------------------------------------------------------
# helpers


class _DuplicateField(ValueError):
    """A JSON object of the roster file repeats a field name."""


def _unique_fields(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``object_pairs_hook`` of :func:`json.loads` that refuses repeated field names."""
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateField(key)
        obj[key] = value
    return obj


def _parse_site(entry: object, index: int, source: str) -> Site:
    """One entry of ``"sites"``, validated; errors name its rank (or its position)."""
    where = f'site #{index + 1} of "sites"'
    if not isinstance(entry, dict):
        _bad(source, f'{where} must be an object with "rank", "name" and "public_key"')
    rank = entry.get("rank")
    if type(rank) is not int:
        _bad(source, f'{where} has "rank" {_short(rank)}; it must be an integer')
    where = f"the site with rank {rank}"
    unknown = sorted(str(key) for key in entry if key not in _SITE_FIELDS)
    if unknown:
        _bad(source, f"{where} has unknown field(s) {', '.join(unknown)}")
    missing = sorted(_SITE_FIELDS - set(entry))
    if missing:
        _bad(source, f"{where} lacks the field(s) {', '.join(missing)}")
    name = entry["name"]
    problem = _name_problem(name)
    if problem:
        _bad(source, f'{where} has "name" {_short(name)}, which {problem}')
    encoded = entry["public_key"]
    if not isinstance(encoded, str):
        _bad(source, f'{where} has "public_key" {_short(encoded)}; it must be a base64 string')
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        _bad(source, f'{where} has a "public_key" that is not valid base64')
    if len(key) != KEY_BYTES:
        _bad(
            source,
            f'{where} has a "public_key" of {len(key)} bytes; an Ed25519 public key is '
            f"{KEY_BYTES} bytes",
        )
    try:
        _public_key_object(key)
    except ValueError:
        _bad(source, f'{where} has a "public_key" that is not an Ed25519 public key')
    return Site(rank=rank, name=name, public_key=key)


def _check_ranks(sites: list[Site], source: str) -> None:
    """The ranks must be exactly 0..N-1, each once."""
    seen: dict[int, Site] = {}
    for site in sites:
        if site.rank in seen:
            _bad(
                source,
                f"rank {site.rank} appears twice ({seen[site.rank].name!r} and "
                f"{site.name!r}); the ranks must be exactly 0..{len(sites) - 1}",
            )
        seen[site.rank] = site
    missing = sorted(set(range(len(sites))) - set(seen))
    if missing:
        extra = sorted(set(seen) - set(range(len(sites))))
        _bad(
            source,
            f"rank {_listed(missing)} is missing; with {len(sites)} sites the ranks must be "
            f"exactly 0..{len(sites) - 1}, but rank {_listed(extra)} was found instead",
        )


def _assemble(run_id: str, sites: list[Site], path: str) -> Roster:
    """The :class:`Roster` of validated sites, with its digest."""
    ordered = tuple(sorted(sites, key=lambda site: site.rank))
    canonical = json.dumps(
        _canonical_json(run_id, ordered),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    digest = hashlib.sha256(canonical.encode("ascii")).hexdigest()
    return Roster(run_id=run_id, sites=ordered, digest=digest, path=path)


def _canonical_json(run_id: str, sites: Sequence[Site]) -> dict:
    """The roster file's JSON object, sites sorted by rank."""
    return {
        "format": ROSTER_FORMAT,
        "version": ROSTER_VERSION,
        "run_id": run_id,
        "sites": [
            {
                "rank": site.rank,
                "name": site.name,
                "public_key": base64.b64encode(site.public_key).decode("ascii"),
            }
            for site in sorted(sites, key=lambda site: site.rank)
        ],
    }


def _run_id_problem(run_id: object) -> str | None:
    """Why ``run_id`` is not a valid run id, or None."""
    if not isinstance(run_id, str) or not run_id:
        return "must be a non-empty string"
    if len(run_id) > MAX_RUN_ID:
        return f"is {len(run_id)} characters long, more than the {MAX_RUN_ID} allowed"
    if not (run_id.isascii() and run_id.isprintable()):
        return "must consist of printable ASCII characters only"
    return None


def _name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid site name, or None."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > MAX_NAME:
        return f"is {len(name)} characters long, more than the {MAX_NAME} allowed"
    if not name.isprintable():
        return "must not contain control characters"
    return None


def _is_rank(rank: object, n: int) -> bool:
    """Whether ``rank`` is an int (not a bool) in 0..n-1."""
    return isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < n


@functools.lru_cache(maxsize=MAX_SITES)
def _public_key_object(raw: bytes) -> Ed25519PublicKey:
    """The (cached) key object of a raw public key; ValueError if it is not 32 bytes."""
    return Ed25519PublicKey.from_public_bytes(raw)


def _bad(source: str, detail: str) -> NoReturn:
    """Raise the ConfigError of an invalid roster ``source``."""
    raise ConfigError(f"The roster {source or '(in memory)'} is invalid: {detail}.")


def _kind(value: object) -> str:
    """A JSON-ish name for the type of ``value``."""
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _short(value: object) -> str:
    """``value`` as JSON, cut to 60 characters, for messages."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _listed(values: list[int]) -> str:
    """``[1, 3]`` as ``"1, 3"`` (at most 10 shown)."""
    shown = ", ".join(str(v) for v in values[:10])
    return shown + (", ..." if len(values) > 10 else "")
