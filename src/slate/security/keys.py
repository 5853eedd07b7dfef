"""Site key files: a site's Ed25519 key pair, written once and read back strictly.

- ``NAME.key``: a site's Ed25519 private key, PEM PKCS8, unencrypted, mode 0600 from the moment
  it is created. It never leaves the site.
- ``NAME.pub``: the matching public key, PEM SubjectPublicKeyInfo, sent to whoever makes the
  roster (:mod:`slate.security.roster`).

Every problem caused by a file the user gave is a :class:`~slate.errors.ConfigError` naming that
file. No file is ever overwritten: each is created with ``O_EXCL`` (:func:`create_exclusive`,
which the roster's writer uses too).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from slate.errors import ConfigError

__all__ = [
    "MAX_KEY_FILE_BYTES",
    "create_exclusive",
    "fingerprint",
    "read_private_key",
    "read_public_key",
    "read_small_file",
    "write_keypair",
]

MAX_KEY_FILE_BYTES = 64 << 10

_ENCRYPTED = (
    "is encrypted; slate needs an unencrypted PEM PKCS8 Ed25519 key such as 'slate keygen' "
    "writes (it is protected by its mode 0600 instead)."
)


def write_keypair(out: str | Path) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair to ``OUT.key`` (mode 0600) and ``OUT.pub``.

    The suffixes are appended, not substituted: ``sites/hospital-a`` gives
    ``sites/hospital-a.key`` and ``sites/hospital-a.pub``. The parent folder must exist.

    Args:
        out: the common path of both files, without suffix.

    Returns:
        The paths of the private and the public key file.

    Raises:
        ConfigError: either file already exists (nothing is written then), the parent folder
            is missing, or a file cannot be created.
    """
    base = os.fspath(out)
    if not base or not Path(base).name or base.endswith(("/", os.sep)):
        raise ConfigError(
            f"The key name {base!r} must name a file, not a folder: e.g. 'sites/hospital-a' "
            "writes sites/hospital-a.key and sites/hospital-a.pub."
        )
    key_path, pub_path = Path(base + ".key"), Path(base + ".pub")
    parent = key_path.parent
    if not parent.is_dir():
        raise ConfigError(
            f"The folder {parent} for the key files {key_path} and {pub_path} does not exist; "
            "create it first (no folder is created for you)."
        )
    for path in (key_path, pub_path):
        if path.exists() or path.is_symlink():
            raise ConfigError(
                f"The key file {path} already exists and is never overwritten; nothing was "
                "written. Choose another name, or move the old key pair away first if you "
                "really mean to replace it."
            )
    key = Ed25519PrivateKey.generate()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    pub_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    create_exclusive(key_path, key_pem, 0o600, "private key file")
    try:
        create_exclusive(pub_path, pub_pem, 0o644, "public key file")
    except ConfigError:
        key_path.unlink(missing_ok=True)  # never leave half a key pair behind
        raise
    return key_path, pub_path


def read_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Read an unencrypted PEM Ed25519 private key that only its owner can access.

    Raises:
        ConfigError: the file is missing or unreadable, grants any access to group or others
            (on POSIX), or does not hold an unencrypted PEM Ed25519 private key.
    """
    path = Path(path)
    data, mode = read_small_file(path, "private key file", MAX_KEY_FILE_BYTES)
    if b"-----BEGIN PUBLIC KEY-----" in data:
        raise ConfigError(
            f"The private key file {path} holds a public key. Pass the private .key file "
            "written by 'slate keygen', not the .pub."
        )
    if os.name == "posix" and mode & 0o077:
        raise ConfigError(
            f"The private key file {path} can be accessed by other users (mode "
            f"{stat.S_IMODE(mode):04o}); a private key must be readable by its owner only. "
            f"Run 'chmod 600 {path}' and try again."
        )
    if b"ENCRYPTED" in data:
        raise ConfigError(f"The private key file {path} {_ENCRYPTED}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as err:  # a password would be needed
        raise ConfigError(f"The private key file {path} {_ENCRYPTED}") from err
    except (ValueError, UnsupportedAlgorithm) as err:
        raise ConfigError(
            f"The private key file {path} is not a PEM private key. Expected the .key file "
            "written by 'slate keygen --out NAME'."
        ) from err
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            f"The private key file {path} holds a key of another type; slate needs an Ed25519 "
            "key such as 'slate keygen --out NAME' writes."
        )
    return key


def read_public_key(path: str | Path) -> bytes:
    """The raw 32-byte Ed25519 public key of a PEM ``.pub`` file.

    Raises:
        ConfigError: the file is missing or unreadable, or does not hold a PEM Ed25519 public
            key (a private key given here is refused: pass the ``.pub``).
    """
    path = Path(path)
    data, _ = read_small_file(path, "public key file", MAX_KEY_FILE_BYTES)
    if b"PRIVATE KEY" in data:
        raise ConfigError(
            f"The public key file {path} holds a private key. Pass the .pub file written by "
            "'slate keygen' instead, and never share the .key file."
        )
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as err:
        raise ConfigError(
            f"The public key file {path} is not a PEM public key. Expected the .pub file "
            "written by 'slate keygen --out NAME'."
        ) from err
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(
            f"The public key file {path} holds a key of another type; slate needs an Ed25519 "
            "key such as 'slate keygen --out NAME' writes."
        )
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# --------------------------------------------------------------------------------------------
# file helpers (shared with the roster)


def fingerprint(public_key: bytes) -> str:
    """The first 16 hex digits of the sha256 of a raw public key."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def read_small_file(path: Path, what: str, limit: int) -> tuple[bytes, int]:
    """The bytes and ``st_mode`` of a regular file of at most ``limit`` bytes; ConfigError
    naming it otherwise."""
    try:
        info = path.stat()
    except FileNotFoundError as err:
        raise ConfigError(f"The {what} {path} does not exist.") from err
    except OSError as err:
        raise ConfigError(f"The {what} {path} cannot be read: {err.strerror}.") from err
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"The {what} {path} is a folder, not a file.")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"The {what} {path} is not a regular file.")
    try:
        with path.open("rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            data = handle.read(limit + 1)
    except OSError as err:
        raise ConfigError(f"The {what} {path} cannot be read: {err.strerror}.") from err
    if len(data) > limit:
        raise ConfigError(
            f"The {what} {path} is larger than {_size(limit)}; it cannot be a {what} written "
            "by slate."
        )
    return data, mode


def create_exclusive(path: Path, data: bytes, mode: int, what: str) -> None:
    """Create ``path`` with ``mode`` (never a chmod afterwards) and write ``data``; never
    overwrites. ConfigError naming the file otherwise."""
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError as err:
        raise ConfigError(
            f"The {what} {path} already exists and is never overwritten. Choose another name, "
            "or move the old file away first."
        ) from err
    except FileNotFoundError as err:
        raise ConfigError(
            f"The {what} {path} cannot be created: its folder {path.parent} does not exist."
        ) from err
    except OSError as err:
        raise ConfigError(f"The {what} {path} cannot be created: {err.strerror}.") from err
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError as err:
        path.unlink(missing_ok=True)
        raise ConfigError(f"The {what} {path} could not be written: {err.strerror}.") from err


def _size(limit: int) -> str:
    """A byte count as MiB or KiB."""
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
