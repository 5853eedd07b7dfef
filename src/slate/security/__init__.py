"""Who takes part in a multi-site run: Ed25519 site keys and the roster that lists them.

Each site makes a key pair once (:func:`write_keypair`, ``slate keygen``) and sends its public
key to whoever organises the run, who lists every public key with its rank in one roster file
(:func:`make_roster`, :func:`write_roster`, ``slate roster``). Every site then loads the same
roster and its own private key (:func:`site_identity`) to sign what it sends and verify what
it receives. The roster's :attr:`Roster.digest` lets the sites check that they hold the same
file.

Three modules: :mod:`~slate.security.keys` (the key files), :mod:`~slate.security.roster` (the
roster file) and :mod:`~slate.security.identity` (this site's key bound to its rank);
:mod:`~slate.security.messages` checks the shape of what the parties exchange. This package is a
low layer: it imports only the standard library, ``cryptography`` and :mod:`slate.errors`.
"""

from __future__ import annotations

from slate.security.identity import SiteIdentity, site_identity
from slate.security.keys import read_private_key, read_public_key, write_keypair
from slate.security.roster import Roster, Site, make_roster, write_roster

__all__ = [
    "Roster",
    "Site",
    "SiteIdentity",
    "make_roster",
    "read_private_key",
    "read_public_key",
    "site_identity",
    "write_keypair",
    "write_roster",
]
