"""``slate keygen`` and ``slate roster``: the site key pairs and the roster of a multi-site run."""

from __future__ import annotations

import argparse
import hashlib

from slate.errors import ConfigError
from slate.security import Roster, make_roster, write_keypair, write_roster

__all__ = ["add_identity_parsers", "run_keygen", "run_roster"]


def add_identity_parsers(sub) -> None:
    """Add ``keygen`` and ``roster`` to the subparsers ``sub`` of the ``slate`` command."""
    keygen = sub.add_parser(
        "keygen",
        help="make this site's Ed25519 key pair (NAME.key, NAME.pub) for a multi-site run",
        description="Write a new Ed25519 key pair: NAME.key, the private key (mode 0600; it "
        "never leaves this site), and NAME.pub, the public key to send to whoever makes the "
        "roster. Existing files are never overwritten.",
    )
    keygen.add_argument(
        "--out",
        required=True,
        metavar="NAME",
        help="path of both files without suffix, e.g. sites/hospital-a; the site's name on the "
        "roster is the last part (hospital-a)",
    )
    roster = sub.add_parser(
        "roster",
        help="list the sites' public keys, ranked in the order given, in one roster file",
        description="Write the roster of a multi-site run: every site's public key (.pub from "
        "'slate keygen') with its rank, in the order given, and the run's id. Every site needs "
        "this same file. An existing file is never overwritten.",
    )
    roster.add_argument("--out", help="the roster file to write, e.g. roster.json")
    roster.add_argument(
        "--show",
        metavar="FILE",
        help="print a roster's run id, sha256 and sites (to compare with the organiser's) "
        "instead of writing one",
    )
    roster.add_argument(
        "--run-id",
        default=None,
        help="the run's id, printable ASCII, at most 128 characters (default: random)",
    )
    roster.add_argument(
        "public_keys", nargs="*", metavar="PUB", help="the sites' .pub files, rank 0 first"
    )


def run_keygen(args: argparse.Namespace) -> int:
    """``slate keygen --out NAME``: write the key pair and say what to do with it."""
    key_path, pub_path = write_keypair(args.out)
    print(f"wrote the private key {key_path} (mode 0600; keep it at this site, never share it)")
    print(f"wrote the public key  {pub_path}")
    print(f"send {pub_path} (never {key_path}) to whoever makes the roster ('slate roster')")
    return 0


def run_roster(args: argparse.Namespace) -> int:
    """``slate roster --out FILE [--run-id ID] PUB...``: write the roster and print its sites;
    ``slate roster --show FILE``: print a roster's sites."""
    if args.show is not None:
        if args.out is not None or args.public_keys or args.run_id is not None:
            raise ConfigError("--show FILE only prints a roster: give no --out, --run-id or PUB.")
        roster = Roster.read(args.show)
        print(f"the roster {args.show} of {roster.n} site(s)")
        _print_sites(roster)
        return 0
    if args.out is None or not args.public_keys:
        raise ConfigError(
            "slate roster needs --out FILE and the sites' .pub files (rank 0 first), or --show "
            "FILE to print an existing roster."
        )
    roster = make_roster(args.public_keys, run_id=args.run_id)
    path = write_roster(roster, args.out)
    print(f"wrote the roster {path} of {roster.n} site(s)")
    _print_sites(roster)
    print(
        f"every site needs this same file {path}: send it to each of them and check that they "
        "see the same sha256 ('slate roster --show FILE')"
    )
    return 0


def _print_sites(roster: Roster) -> None:
    print(f"run id: {roster.run_id}")
    print(f"sha256: {roster.digest}")
    width = max(len(site.name) for site in roster.sites)
    for site in roster.sites:
        fingerprint = hashlib.sha256(site.public_key).hexdigest()[:16]
        print(f"  rank {site.rank:>4}  {site.name:<{width}}  {fingerprint}")
