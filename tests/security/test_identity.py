"""Site identities: ``slate keygen``, ``slate roster``, the strict roster reader, signatures."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from slate.cli import main
from slate.errors import ConfigError
from slate.security import (
    Roster,
    make_roster,
    read_private_key,
    read_public_key,
    site_identity,
    write_keypair,
    write_roster,
)
from tests.sites import slate_here

POSIX = os.name == "posix"
NAMES = ("hospital-a", "hospital-b", "clinic-c")


# --------------------------------------------------------------------------------------------
# helpers


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """Run ``slate argv`` in-process: exit code, stdout, stderr."""
    capsys.readouterr()
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _user_error(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """``slate argv`` must fail with exit code 2 and one paragraph containing ``needles``."""
    rc, _, err = _run(capsys, argv)
    assert rc == 2, err
    assert err.startswith("slate: error:"), err
    assert "Traceback" not in err
    assert "\n\n" not in err.strip()
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def _raw_public(path: Path) -> bytes:
    """The raw public key of a .pub file, parsed independently with ``cryptography``."""
    key = serialization.load_pem_public_key(path.read_bytes())
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _reference_digest(raw: dict) -> str:
    """The digest as specified: sha256 of the canonical JSON, sites sorted by rank."""
    canonical = dict(raw, sites=sorted(raw["sites"], key=lambda site: site["rank"]))
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


@pytest.fixture
def sites(tmp_path: Path) -> list[tuple[Path, Path]]:
    """Three key pairs (``.key``, ``.pub``) under ``tmp_path/keys``."""
    folder = tmp_path / "keys"
    folder.mkdir()
    return [write_keypair(folder / name) for name in NAMES]


@pytest.fixture
def roster_raw(sites: list[tuple[Path, Path]]) -> dict:
    """The JSON object of a valid roster of the three sites."""
    return {
        "format": "slate-roster",
        "version": 1,
        "run_id": "run-1",
        "sites": [
            {
                "rank": rank,
                "name": NAMES[rank],
                "public_key": base64.b64encode(_raw_public(pub)).decode("ascii"),
            }
            for rank, (_, pub) in enumerate(sites)
        ],
    }


@pytest.fixture
def roster_file(tmp_path: Path, roster_raw: dict) -> Path:
    """``roster_raw`` written to ``tmp_path/roster.json``."""
    path = tmp_path / "roster.json"
    path.write_text(json.dumps(roster_raw, indent=2))
    return path


# --------------------------------------------------------------------------------------------
# keygen


def test_keygen_writes_a_matching_key_pair(capsys, tmp_path: Path) -> None:
    rc, out, err = _run(capsys, ["keygen", "--out", str(tmp_path / "hospital-a")])
    assert rc == 0, err
    key_path, pub_path = tmp_path / "hospital-a.key", tmp_path / "hospital-a.pub"
    assert str(key_path) in out and str(pub_path) in out
    assert "never" in out and f"send {pub_path}" in out
    if POSIX:
        assert key_path.stat().st_mode & 0o777 == 0o600
    private = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    assert isinstance(private, Ed25519PrivateKey)
    public = serialization.load_pem_public_key(pub_path.read_bytes())
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    assert public.public_bytes(*raw) == private.public_key().public_bytes(*raw)
    signature = read_private_key(key_path).sign(b"round 7")
    public.verify(signature, b"round 7")
    with pytest.raises(InvalidSignature):
        public.verify(signature, b"round 8")
    assert read_public_key(pub_path) == public.public_bytes(*raw)


@pytest.mark.skipif(not POSIX, reason="file modes are POSIX")
def test_keygen_creates_the_key_0600_without_chmod(tmp_path: Path, monkeypatch) -> None:
    """The mode is set at creation: no chmod, and a permissive umask does not loosen it."""

    def no_chmod(*args, **kwargs):
        raise AssertionError("the key file must be created 0600, not chmod-ed afterwards")

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(Path, "chmod", no_chmod)
    old_umask = os.umask(0)
    try:
        key_path, pub_path = write_keypair(tmp_path / "site")
    finally:
        os.umask(old_umask)
    assert key_path.stat().st_mode & 0o777 == 0o600
    assert pub_path.stat().st_mode & 0o077 != 0o077  # readable, not world-writable


def test_keygen_appends_suffixes(tmp_path: Path) -> None:
    key_path, pub_path = write_keypair(str(tmp_path / "hospital.v2"))
    assert (key_path.name, pub_path.name) == ("hospital.v2.key", "hospital.v2.pub")
    assert key_path.is_file() and pub_path.is_file()


def test_keygen_never_overwrites(capsys, tmp_path: Path) -> None:
    out = str(tmp_path / "site")
    assert _run(capsys, ["keygen", "--out", out])[0] == 0
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    _user_error(capsys, ["keygen", "--out", out], "site.key", "already exists")
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_keygen_with_only_the_pub_present_writes_nothing(capsys, tmp_path: Path) -> None:
    (tmp_path / "site.pub").write_text("old")
    _user_error(capsys, ["keygen", "--out", str(tmp_path / "site")], "site.pub", "already")
    assert not (tmp_path / "site.key").exists()
    assert (tmp_path / "site.pub").read_text() == "old"


def test_keygen_missing_folder(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    _user_error(capsys, ["keygen", "--out", str(missing / "site")], str(missing), "exist")
    assert not missing.exists()


# --------------------------------------------------------------------------------------------
# reading key files


def _missing(tmp_path: Path, key: Path, pub: Path) -> Path:
    return tmp_path / "absent.key"


def _folder(tmp_path: Path, key: Path, pub: Path) -> Path:
    path = tmp_path / "folder.key"
    path.mkdir()
    return path


def _loose(tmp_path: Path, key: Path, pub: Path) -> Path:
    key.chmod(0o644)
    return key


def _the_pub(tmp_path: Path, key: Path, pub: Path) -> Path:
    return pub


def _garbage(tmp_path: Path, key: Path, pub: Path) -> Path:
    path = tmp_path / "garbage.key"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"-----BEGIN PRIVATE KEY-----\nnot base64 at all\n-----END PRIVATE KEY-----\n")
    os.close(fd)
    return path


def _encrypted(tmp_path: Path, key: Path, pub: Path) -> Path:
    path = tmp_path / "encrypted.key"
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, pem)
    os.close(fd)
    return path


def _x25519(tmp_path: Path, key: Path, pub: Path) -> Path:
    path = tmp_path / "x25519.key"
    pem = X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, pem)
    os.close(fd)
    return path


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (_missing, "does not exist"),
        (_folder, "folder"),
        pytest.param(
            _loose,
            "chmod 600",
            marks=pytest.mark.skipif(not POSIX, reason="file modes are POSIX"),
        ),
        (_the_pub, "public key"),
        (_garbage, "not a PEM private key"),
        (_encrypted, "encrypted"),
        (_x25519, "Ed25519"),
    ],
)
def test_read_private_key_errors(tmp_path: Path, make: Callable, needle: str) -> None:
    key, pub = write_keypair(tmp_path / "site")
    path = make(tmp_path, key, pub)
    with pytest.raises(ConfigError) as info:
        read_private_key(path)
    message = str(info.value)
    assert str(path) in message and needle in message, message
    assert "\n" not in message


def test_read_private_key_accepts_its_own_key(tmp_path: Path) -> None:
    key, pub = write_keypair(tmp_path / "site")
    private = read_private_key(key)
    assert isinstance(private, Ed25519PrivateKey)
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    assert private.public_key().public_bytes(*raw) == read_public_key(pub)


def test_read_public_key_errors(tmp_path: Path) -> None:
    key, _ = write_keypair(tmp_path / "site")
    with pytest.raises(ConfigError, match=r"site\.key.*private key.*\.pub"):
        read_public_key(key)
    with pytest.raises(ConfigError, match=r"absent\.pub.*does not exist"):
        read_public_key(tmp_path / "absent.pub")
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("hello")
    with pytest.raises(ConfigError, match=r"garbage\.pub.*not a PEM public key"):
        read_public_key(garbage)
    other = tmp_path / "x25519.pub"
    other.write_bytes(
        X25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ConfigError, match=r"x25519\.pub.*Ed25519"):
        read_public_key(other)


# --------------------------------------------------------------------------------------------
# making and reading rosters


def test_roster_cli_round_trip(capsys, tmp_path: Path, sites) -> None:
    out = tmp_path / "roster.json"
    pubs = [str(pub) for _, pub in sites]
    rc, text, err = _run(capsys, ["roster", "--out", str(out), "--run-id", "trial-7", *pubs])
    assert rc == 0, err
    raw = json.loads(out.read_text())
    assert raw["format"] == "slate-roster" and raw["version"] == 1
    assert raw["run_id"] == "trial-7"
    assert [s["rank"] for s in raw["sites"]] == [0, 1, 2]
    assert [s["name"] for s in raw["sites"]] == list(NAMES)
    for site, (_, pub) in zip(raw["sites"], sites, strict=True):
        assert base64.b64decode(site["public_key"]) == _raw_public(pub)
    digest = _reference_digest(raw)
    roster = Roster.read(out)
    assert roster.digest == digest
    assert roster.run_id == "trial-7" and roster.n == 3 and roster.path == str(out)
    assert [site.name for site in roster.sites] == list(NAMES)
    assert "trial-7" in text and digest in text and "same file" in text
    for rank, (name, (_, pub)) in enumerate(zip(NAMES, sites, strict=True)):
        fingerprint = hashlib.sha256(_raw_public(pub)).hexdigest()[:16]
        line = next(line for line in text.splitlines() if fingerprint in line)
        assert f"rank {rank:>4}" in line and name in line


def test_roster_cli_keeps_the_order_given_and_never_overwrites(tmp_path: Path, sites) -> None:
    out = tmp_path / "roster.json"
    argv = ["roster", "--out", str(out), *(str(pub) for _, pub in reversed(sites))]
    done = slate_here(*argv)
    assert done.returncode == 0, done.stderr
    roster = Roster.read(out)
    assert [site.name for site in roster.sites] == list(reversed(NAMES))  # the order given
    assert len(roster.run_id) == 32 and int(roster.run_id, 16) >= 0
    assert roster.digest in done.stdout
    before = out.read_bytes()
    again = slate_here(*argv)
    assert again.returncode == 2
    assert again.stderr.startswith("slate: error:") and str(out) in again.stderr
    assert out.read_bytes() == before


def test_digest_ignores_order_and_layout(tmp_path: Path, roster_raw: dict) -> None:
    first = tmp_path / "a.json"
    first.write_text(json.dumps(roster_raw, indent=4))
    shuffled = dict(reversed(list(roster_raw.items())))
    shuffled["sites"] = [roster_raw["sites"][i] for i in (2, 0, 1)]
    second = tmp_path / "b.json"
    second.write_text(json.dumps(shuffled, separators=(",", ":")))
    a, b = Roster.read(first), Roster.read(second)
    assert a.digest == b.digest == _reference_digest(roster_raw)
    assert [site.rank for site in b.sites] == [0, 1, 2]
    assert a.sites == b.sites


def _flip_key_byte(raw: dict) -> None:
    key = bytearray(base64.b64decode(raw["sites"][1]["public_key"]))
    key[5] ^= 0x01
    raw["sites"][1]["public_key"] = base64.b64encode(bytes(key)).decode("ascii")


def _swap_ranks(raw: dict) -> None:
    raw["sites"][0]["rank"], raw["sites"][1]["rank"] = 1, 0


@pytest.mark.parametrize(
    "change",
    [
        lambda raw: raw.update(run_id="run-2"),
        lambda raw: raw["sites"][2].update(name="clinic-d"),
        _flip_key_byte,
        _swap_ranks,
    ],
    ids=["run_id", "name", "key", "rank"],
)
def test_digest_changes_with_content(tmp_path: Path, roster_raw: dict, change: Callable) -> None:
    changed = copy.deepcopy(roster_raw)
    change(changed)
    before = Roster.from_json(roster_raw, "a.json").digest
    after = Roster.from_json(changed, "b.json").digest
    assert before != after
    assert after == _reference_digest(changed)


def test_write_roster_round_trip_and_no_overwrite(tmp_path: Path, sites) -> None:
    roster = make_roster([pub for _, pub in sites], run_id="r")
    path = write_roster(roster, tmp_path / "roster.json")
    again = Roster.read(path)
    assert (again.run_id, again.sites, again.digest) == (roster.run_id, roster.sites, roster.digest)
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"roster\.json.*already exists"):
        write_roster(roster, path)
    assert path.read_bytes() == before
    with pytest.raises(ConfigError, match=r"missing"):
        write_roster(roster, tmp_path / "missing" / "roster.json")


def test_make_roster_errors(tmp_path: Path, sites) -> None:
    with pytest.raises(ConfigError, match="at least one"):
        make_roster([])
    (_, pub_a), (_, pub_b), _ = sites
    twin = tmp_path / "twin.pub"
    twin.write_bytes(pub_a.read_bytes())
    with pytest.raises(ConfigError) as info:
        make_roster([pub_a, pub_b, twin])
    assert str(pub_a) in str(info.value) and str(twin) in str(info.value)
    other = tmp_path / "other"
    other.mkdir()
    _, same_name = write_keypair(other / NAMES[0])
    with pytest.raises(ConfigError) as info:
        make_roster([pub_a, same_name])
    message = str(info.value)
    assert str(pub_a) in message and str(same_name) in message and "rename" in message
    with pytest.raises(ConfigError, match="run id"):
        make_roster([pub_a], run_id="tab\there")
    assert make_roster([pub_a]).run_id != make_roster([pub_a]).run_id


def _set_site(which: int, /, **fields) -> Callable[[dict], None]:
    """A change that sets ``fields`` of the site with this rank."""

    def change(raw: dict) -> None:
        next(site for site in raw["sites"] if site["rank"] == which).update(fields)

    return change


def _duplicate_key(raw: dict) -> None:
    raw["sites"][2]["public_key"] = raw["sites"][0]["public_key"]


def _short_key(raw: dict) -> None:
    raw["sites"][1]["public_key"] = base64.b64encode(bytes(31)).decode("ascii")


def _drop_field(raw: dict) -> None:
    del raw["sites"][0]["name"]


BAD_ROSTERS = [
    (lambda raw: raw.update(extra=1), ["unknown field", "extra"]),
    (lambda raw: raw.pop("run_id"), ["missing field", "run_id"]),
    (lambda raw: raw.update(format="slate-topology"), ['"format"']),
    (lambda raw: raw.update(version=2), ['"version"', "2"]),
    (lambda raw: raw.update(version=True), ['"version"', "true"]),
    (lambda raw: raw.update(run_id=""), ['"run_id"', "non-empty"]),
    (lambda raw: raw.update(run_id=7), ['"run_id"', "string"]),
    (lambda raw: raw.update(run_id="r" * 129), ['"run_id"', "129"]),
    (lambda raw: raw.update(run_id="caf\u00e9"), ['"run_id"', "ASCII"]),
    (lambda raw: raw.update(sites=[]), ['"sites"', "non-empty"]),
    (lambda raw: raw.update(sites={"0": 1}), ['"sites"', "list"]),
    (lambda raw: raw.update(sites=raw["sites"] * 1366), ['"sites"', "4098", "4096"]),
    (lambda raw: raw["sites"].__setitem__(0, "site"), ["site #1"]),
    (_set_site(1, rank=True), ["site #2", '"rank" true']),
    (_set_site(1, rank=1.0), ["site #2", '"rank" 1.0']),
    (_set_site(2, rank=1), ["rank 1 appears twice", "hospital-b", "clinic-c"]),
    (_set_site(2, rank=3), ["rank 2 is missing", "rank 3"]),
    (_set_site(0, rank=-1), ["rank 0 is missing", "rank -1"]),
    (_set_site(1, comment="x"), ["rank 1", "unknown field", "comment"]),
    (_drop_field, ["rank 0", "name"]),
    (_set_site(1, name=""), ["rank 1", '"name"', "non-empty"]),
    (_set_site(1, name="n" * 129), ["rank 1", '"name"', "129"]),
    (_set_site(1, name="a\nb"), ["rank 1", '"name"', "control"]),
    (_set_site(2, name="hospital-a"), ["ranks 0 and 2", "hospital-a", "rename"]),
    (_set_site(1, public_key="not base64!"), ["rank 1", "base64"]),
    (_set_site(1, public_key=32), ["rank 1", "base64"]),
    (_short_key, ["rank 1", "31 bytes", "32"]),
    (_duplicate_key, ["ranks 0", "and 2", "same public key"]),
]


@pytest.mark.parametrize(("change", "needles"), BAD_ROSTERS)
def test_bad_roster_files(
    tmp_path: Path, roster_raw: dict, change: Callable, needles: list[str]
) -> None:
    raw = copy.deepcopy(roster_raw)
    change(raw)
    path = tmp_path / "bad-roster.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as info:
        Roster.read(path)
    message = str(info.value)
    assert str(path) in message, message
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_roster_not_a_json_object(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rosters/r1\.json.*JSON object"):
        Roster.from_json([1, 2], "rosters/r1.json")


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        (b'{\n  "format": "slate-roster",\n  oops\n}', ["not valid JSON", "line 3"]),
        (b"\xff\xfe{}", ["UTF-8"]),
        (b" " * (1 << 20) + b"{}", ["larger than 1 MiB"]),
        (b'{"format": "slate-roster", "format": "x"}', ["'format'", "twice"]),
        (b"[" * 100_000 + b"]" * 100_000, []),
    ],
    ids=["syntax", "utf8", "too-large", "duplicate-field", "deep"],
)
def test_unreadable_roster_files(tmp_path: Path, content: bytes, needles: list[str]) -> None:
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        Roster.read(path)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_roster_missing_or_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nowhere\.json.*does not exist"):
        Roster.read(tmp_path / "nowhere.json")
    with pytest.raises(ConfigError, match=r"folder"):
        Roster.read(tmp_path)


def test_roster_lookups(roster_file: Path, sites) -> None:
    roster = Roster.read(roster_file)
    for rank, (_, pub) in enumerate(sites):
        assert roster.rank_of(_raw_public(pub)) == rank
        assert roster.verifier(rank).public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        ) == _raw_public(pub)
    assert roster.rank_of(bytes(32)) is None
    for rank in (3, -1, True):
        with pytest.raises(ValueError):
            roster.verifier(rank)


# --------------------------------------------------------------------------------------------
# site identity and signatures


def test_site_identity_finds_the_rank(roster_file: Path, sites) -> None:
    for rank, (key, pub) in enumerate(sites):
        identity = site_identity(roster_file, key, rank=rank, nodes=3)
        assert identity.rank == rank
        assert identity.public_key == _raw_public(pub)
        assert identity.roster.digest == Roster.read(roster_file).digest
    assert site_identity(roster_file, sites[1][0]).rank == 1
    assert repr(identity) == "SiteIdentity(rank=2, name='clinic-c', run_id='run-1')"


def test_site_identity_key_not_on_roster(tmp_path: Path, roster_file: Path) -> None:
    stranger, _ = write_keypair(tmp_path / "stranger")
    with pytest.raises(ConfigError) as info:
        site_identity(roster_file, stranger)
    message = str(info.value)
    assert str(stranger) in message and str(roster_file) in message
    assert "not on the roster" in message


def test_site_identity_rank_mismatch(roster_file: Path, sites) -> None:
    with pytest.raises(ConfigError) as info:
        site_identity(roster_file, sites[1][0], rank=2)
    message = str(info.value)
    assert "Rank 2" in message and "rank 1" in message and "hospital-b" in message
    assert str(sites[1][0]) in message


def test_site_identity_nodes_mismatch(roster_file: Path, sites) -> None:
    with pytest.raises(ConfigError, match=r"4 nodes.*roster\.json.*3 sites"):
        site_identity(roster_file, sites[0][0], nodes=4)


def test_verify(roster_file: Path, sites) -> None:
    zero = site_identity(roster_file, sites[0][0])
    one = site_identity(roster_file, sites[1][0])
    data = b"heartbeat 12 from rank 0"
    signature = zero.sign(data)
    assert len(signature) == 64
    assert zero.verify(0, data, signature)
    assert one.verify(0, data, signature)  # any site checks any other site's signature
    assert one.verify(1, b"x", one.sign(b"x")) and zero.verify(1, b"x", one.sign(b"x"))
    flipped_data = bytes([data[0] ^ 1]) + data[1:]
    assert not zero.verify(0, flipped_data, signature)
    flipped_signature = signature[:10] + bytes([signature[10] ^ 1]) + signature[11:]
    assert not zero.verify(0, data, flipped_signature)
    assert not zero.verify(1, data, signature)  # another rank's key
    assert not zero.verify(2, data, signature)
    for rank in (99, 3, -1, True, "0", None):
        assert not zero.verify(rank, data, signature)
    assert not zero.verify(0, data, signature[:63])
    assert not zero.verify(0, data, signature + b"\x00")
    assert not zero.verify(0, data, b"")
    assert not zero.verify(0, data, None)
    assert not zero.verify(0, "text", signature)
