"""This site's identity in a multi-site run: its private key bound to its rank on the roster,
loaded from ``--key`` and ``--roster`` (:func:`site_identity`) and checked against ``--rank``
and ``--nodes`` before anything connects; signing and verifying with it.

The key files are :mod:`slate.security.keys`'s, the roster :mod:`slate.security.roster`'s.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from slate.errors import ConfigError
from slate.security.keys import fingerprint, read_private_key
from slate.security.roster import Roster

__all__ = ["SiteIdentity", "site_identity"]


class SiteIdentity:
    """This site's private key and the roster it belongs to.

    Attributes:
        roster: the run's roster.
        rank: this site's rank on it.
    """

    __slots__ = ("_key", "_public_key", "rank", "roster")

    def __init__(self, key: Ed25519PrivateKey, roster: Roster, rank: int) -> None:
        """Bind ``key`` to ``rank`` of ``roster``; use :func:`site_identity` to build one."""
        self._key = key
        self._public_key = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        if roster.rank_of(self._public_key) != rank:
            raise ValueError(f"the key is not rank {rank} of the roster")
        self.roster = roster
        self.rank = rank

    @property
    def public_key(self) -> bytes:
        """This site's raw 32-byte public key."""
        return self._public_key

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data`` by this site."""
        return self._key.sign(data)

    def verify(self, rank: int, data: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is site ``rank``'s signature of ``data`` (never raises)."""
        return self.roster.verify(rank, data, signature)

    def __repr__(self) -> str:
        """Rank, name and run, never the key."""
        name = self.roster.sites[self.rank].name
        return f"SiteIdentity(rank={self.rank}, name={name!r}, run_id={self.roster.run_id!r})"


def site_identity(
    roster_path: str | Path,
    key_path: str | Path,
    rank: int | None = None,
    nodes: int | None = None,
) -> SiteIdentity:
    """Load this site's identity: its private key and the roster that must list it.

    Args:
        roster_path: the run's roster file.
        key_path: this site's private ``.key`` file.
        rank: the rank this site was told to take; checked against the roster when given.
        nodes: the number of sites of the run; checked against the roster when given.

    Raises:
        ConfigError: either file is invalid, the key is not on the roster, or ``rank`` or
            ``nodes`` disagree with the roster.
    """
    roster = Roster.read(roster_path)
    key = read_private_key(key_path)
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    found = roster.rank_of(public)
    if found is None:
        raise ConfigError(
            f"The public key of the private key file {key_path} (fingerprint "
            f"{fingerprint(public)}) is not on the roster {roster_path} (run "
            f"{roster.run_id}). Use this site's own .key file and the roster made from its .pub."
        )
    if rank is not None and rank != found:
        raise ConfigError(
            f"Rank {rank} was given, but the key file {key_path} is site "
            f"{roster.sites[found].name!r} with rank {found} on the roster {roster_path}. "
            f"Use rank {found}, or this rank's own key file."
        )
    if nodes is not None and nodes != roster.n:
        raise ConfigError(
            f"{nodes} nodes were given, but the roster {roster_path} lists {roster.n} sites; "
            "every site of the run must be on the roster."
        )
    return SiteIdentity(key, roster, found)
