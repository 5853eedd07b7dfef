"""Sealed messages between two sites: per-generation X25519 keys, one AES-256-GCM key per
direction, nonces from the round counter.

Without sealing, every parameter vector, count and flag crosses the network in clear: a loopback
capture of one unsealed run recovered 4 387 parameter vectors
(``tests/security/test_raw_capture.py`` captures a run with and without sealing: sealed, nothing of
the parameters is found). This module is the cryptographic core that closes that gap; it uses pyca
``cryptography`` for every primitive (X25519, HKDF-SHA256, AES-256-GCM, Ed25519) and implements none
itself.

**Keys, fresh for each generation.** A generation is one membership epoch of a run (the party
set changes only between generations). At the start of each generation every site makes a new
X25519 key pair (:meth:`SealingKey.generate`) and publishes its public half in a record that its
Ed25519 site key signs (:func:`sealing_key_record`). The signature binds the run id, the session
id (fresh at every start of a run, :mod:`slate.engines.distributed.control.session`), the
generation, the rank and the X25519 key together, so a record cannot be replayed into another run,
another session of the same run (an earlier run with the same roster) or another generation, nor
passed off as another rank's (:func:`verify_sealing_key_record` refuses each case and names the
rank). A fresh key per generation means that a key pair leaked or recorded in one generation opens
nothing of the next, and that a site which left and came back never shares a key with its former
self.

**One key per direction.** Two sites ``a`` and ``b`` compute the same X25519 shared secret.
HKDF-SHA256 over it, with ``info`` binding the run id, the session id, the generation, the
sender's and the receiver's rank (in that order: the *direction*) and both published X25519 keys,
gives one
AES-256-GCM key for ``a -> b`` and another for ``b -> a`` (:func:`direction_key`). Because the
keys differ, both directions may use the same round counters as nonces without ever using one
nonce twice under one key, and a message cannot be reflected back to its sender.

**Nonces from the round counter.** The 12-byte nonce of a message is its round number, big
endian (:func:`round_nonce`). A :class:`SealedChannel` seals each round at most once and only in
increasing order, so under one key a nonce is never reused: the counter only grows. The receiver
knows the round of the message it waits for (gossip runs in lockstep), so the round is not sent
and a sealed message is exactly the plaintext plus the 16-byte tag (:func:`sealed_size`).

**Associated data** binds the run id, the generation, the sender, the receiver and the round
(:func:`associated_data`). A message sealed for another run, generation, receiver or round, or
by another sender, fails its tag exactly like a flipped bit. The channel also refuses, before
decrypting, a round it has already opened (*replayed*) and a round below the last one it opened
(*out of order*). In lockstep the receiver never asks for an old round, so a replay shows as
a failed tag for the round it waits for; such a message is then tried (after the tag failed,
never on the normal path) against the last :data:`REPLAY_CHECK` rounds opened, and refused as
*replayed* when it is one of them. Every refusal is a :class:`SealedMessageRefused` naming the
sender and why; the refused message is never returned, so it can never be mixed.

Sealing hides the content of messages, not their size, timing or who talks to whom, and it does
nothing against a site of the run that sends bad values with valid seals (``--robust clip``
bounds what such a site can move the others, :mod:`slate.security.robust`).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from slate.errors import SlateError
from slate.security.masking import mask_info, pair_seed

__all__ = [
    "KEY_RECORD_FORMAT",
    "MAX_ROUND",
    "NONCE_BYTES",
    "REPLAY_CHECK",
    "TAG_BYTES",
    "SealedChannel",
    "SealedMessageRefused",
    "SealingKey",
    "SealingKeyRefused",
    "associated_data",
    "direction_info",
    "direction_key",
    "plain_size",
    "round_nonce",
    "sealed_size",
    "sealing_key_record",
    "verify_sealing_key_record",
]

#: What a signed sealing-key record is, and what its signature covers (never the format of
#: another signed thing of slate, so no signature can be moved between kinds).
KEY_RECORD_FORMAT = "slate-sealing-key-2"
DIRECTION_FORMAT = "slate-sealing-direction-2"  # first item of HKDF's info
MESSAGE_FORMAT = "slate-sealed-message-1"  # first item of every message's associated data
X25519_BYTES = 32
AES_KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # AES-GCM's standard nonce
TAG_BYTES = 16  # AES-GCM's full tag
ROUND_BYTES = 8  # the round in the associated data
MAX_ROUND = (1 << 64) - 1  # rounds are 0..2**64-1: the nonce's first 4 bytes are always 0
REPLAY_MEMORY = 4096  # opened rounds remembered (at least), to tell a replay from a late one
REPLAY_CHECK = 4  # recent rounds a message that failed its tag is tried as, to name a replay
MAX_RUN_ID = 128
MAX_SESSION = 128
_RECORD_FIELDS = {"format": str, "run": str, "session": str, "gen": int, "rank": int,
                  "x25519": str, "sig": str}  # fmt: skip

REASONS = ("tag", "replayed", "out of order")
#: Whether this ``cryptography`` seals into a given buffer (``AESGCM.encrypt_into``, newer
#: releases); older ones seal into new bytes, then copy.
_INTO = hasattr(AESGCM, "encrypt_into") and hasattr(AESGCM, "decrypt_into")

Buffer = bytes | bytearray | memoryview  # anything with the buffer protocol, in practice


class SealedMessageRefused(SlateError):
    """A sealed message that did not open: its sender, its round and why.

    ``reason`` is ``"tag"`` (the authentication tag failed: the message was altered, or sealed
    with another key, by another sender, for another receiver, run, generation or round),
    ``"replayed"`` (a round this channel already opened, or a message that opens as one of
    the last rounds opened: ``round`` is then that earlier round) or ``"out of order"`` (a
    round below the last one opened). The message's content is never returned.
    """

    def __init__(self, sender: int, receiver: int, round: int, reason: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown reason {reason!r}")
        self.sender, self.receiver, self.round, self.reason = sender, receiver, round, reason
        why = {
            "tag": "its authentication tag does not verify (it was altered on the way, or "
            "sealed with another key, by another sender, or for another receiver, run, "
            "generation or round)",
            "replayed": "that round was already received (a replayed message)",
            "out of order": "it is for a round earlier than one already received (out of order)",
        }[reason]
        super().__init__(
            f"Party {receiver} refused a sealed message from party {sender} for round {round}: "
            f"{why}. Nothing in it was used. Either someone on the network tampers with the "
            f"sites' traffic, or party {sender} runs modified or incompatible code."
        )


class SealingKeyRefused(SlateError):
    """A signed sealing-key record of ``rank`` was refused: ``problem`` says why."""

    def __init__(self, rank: int, problem: str) -> None:
        self.rank, self.problem = rank, problem
        super().__init__(
            f"The sealing key of party {rank} was refused: {problem}. No message is exchanged "
            f"with party {rank} under it; a record like this comes from someone other than the "
            "site on the roster, or from a site with another roster or run."
        )


class Signer(Protocol):
    """What signs a sealing-key record: an ``Ed25519PrivateKey``, or slate's ``SiteIdentity``."""

    def sign(self, data: bytes) -> bytes: ...


# --------------------------------------------------------------------------------------------
# one site's key of one generation, and its signed record


@dataclass(frozen=True, repr=False, eq=False)
class SealingKey:
    """Site ``rank``'s X25519 key pair for ``generation`` of run ``run_id`` in ``session`` (the
    session id of this start of the run; "" outside a session).

    Make a new one for every generation (:meth:`generate`); never store it. Its repr shows the
    run, session, generation and rank, never the private key.
    """

    run_id: str
    generation: int
    rank: int
    private_key: X25519PrivateKey
    session: str = ""

    def __post_init__(self) -> None:
        _check_binding(self.run_id, self.generation, self.rank)
        _check_session(self.session)

    @classmethod
    def generate(cls, run_id: str, generation: int, rank: int, session: str = "") -> SealingKey:
        """A fresh key pair from the operating system's random source."""
        return cls(run_id, generation, rank, X25519PrivateKey.generate(), session)

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte X25519 public key, as published in the signed record."""
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def __repr__(self) -> str:
        session = f", session={self.session[:16]!r}" if self.session else ""
        return (
            f"SealingKey(run_id={self.run_id!r}, generation={self.generation}, "
            f"rank={self.rank}{session})"
        )


def _check_session(session: str) -> None:
    if not isinstance(session, str) or len(session) > MAX_SESSION:
        raise ValueError(f"a session id is a string of at most {MAX_SESSION} characters")


def _check_binding(run_id: str, generation: int, rank: int) -> None:
    if not isinstance(run_id, str) or not 0 < len(run_id) <= MAX_RUN_ID:
        raise ValueError(f"a run id is a string of 1 to {MAX_RUN_ID} characters")
    for name, value in (("generation", generation), ("rank", rank)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"the {name} must be a non-negative integer, not {value!r}")


def _record_signed_bytes(
    run_id: str, session: str, generation: int, rank: int, x25519: str
) -> bytes:
    """What the Ed25519 signature of a sealing-key record covers: the format, run id, session
    id, generation, rank and X25519 key, as compact JSON (self-delimiting: no two different
    bindings give the same bytes)."""
    return _json([KEY_RECORD_FORMAT, run_id, session, generation, rank, x25519])


def sealing_key_record(key: SealingKey, signer: Signer) -> dict[str, Any]:
    """The record that publishes ``key``'s public half, signed by ``signer`` (the site's
    Ed25519 key of rank ``key.rank``).

    A JSON-serialisable dict ``{"format", "run", "session", "gen", "rank", "x25519", "sig"}``
    (the key and the signature in standard base64). The signature covers the format, run id,
    session id, generation, rank and X25519 key (:func:`verify_sealing_key_record` checks each).
    """
    x25519 = base64.b64encode(key.public_key).decode("ascii")
    signed = _record_signed_bytes(key.run_id, key.session, key.generation, key.rank, x25519)
    signature = base64.b64encode(signer.sign(signed)).decode("ascii")
    return {"format": KEY_RECORD_FORMAT, "run": key.run_id, "session": key.session,
            "gen": key.generation, "rank": key.rank, "x25519": x25519,
            "sig": signature}  # fmt: skip


def verify_sealing_key_record(
    record: object,
    signer_key: Ed25519PublicKey | bytes,
    run_id: str,
    generation: int,
    rank: int,
    session: str = "",
) -> bytes:
    """The raw X25519 public key that ``record`` publishes for site ``rank`` in ``generation``
    of run ``run_id`` and session ``session``, after checking its shape, its binding and its
    signature by ``signer_key`` (rank ``rank``'s Ed25519 public key from the roster, raw or as an
    object).

    Raises :class:`SealingKeyRefused` naming ``rank`` when the record is malformed, is for
    another run, session, generation or rank, or its signature does not verify.
    """
    if not isinstance(record, Mapping) or set(record) != set(_RECORD_FIELDS):
        raise SealingKeyRefused(rank, "it is not a sealing-key record")
    for name, kind in _RECORD_FIELDS.items():
        if not (_is_int(record[name]) if kind is int else isinstance(record[name], kind)):
            raise SealingKeyRefused(rank, f"its field {name!r} is not a {kind.__name__}")
    if record["format"] != KEY_RECORD_FORMAT:
        raise SealingKeyRefused(rank, f"its format is not {KEY_RECORD_FORMAT}")
    if record["run"] != run_id:
        raise SealingKeyRefused(rank, f"it is for another run ({_short(record['run'])})")
    if record["session"] != session:
        raise SealingKeyRefused(
            rank,
            f"it is for another session of this run ({_short(record['session'])}, not "
            f"{_short(session)}): an earlier run with the same roster made it",
        )
    if record["gen"] != generation:
        raise SealingKeyRefused(rank, f"it is for generation {record['gen']}, not {generation}")
    if record["rank"] != rank:
        raise SealingKeyRefused(rank, f"it is rank {record['rank']}'s record, not rank {rank}'s")
    public = _b64(record["x25519"])
    signature = _b64(record["sig"])
    if public is None or len(public) != X25519_BYTES:
        raise SealingKeyRefused(rank, f"its X25519 key is not {X25519_BYTES} bytes in base64")
    if signature is None:
        raise SealingKeyRefused(rank, "its signature is not base64")
    verifier = _ed25519(signer_key)
    signed = _record_signed_bytes(run_id, session, generation, rank, record["x25519"])
    try:
        verifier.verify(signature, signed)
    except InvalidSignature:
        raise SealingKeyRefused(
            rank, f"its signature does not verify with rank {rank}'s site key"
        ) from None
    return public


def _ed25519(key: Ed25519PublicKey | bytes) -> Ed25519PublicKey:
    if isinstance(key, Ed25519PublicKey):
        return key
    return Ed25519PublicKey.from_public_bytes(bytes(key))


# --------------------------------------------------------------------------------------------
# keys per direction, nonces and associated data


def direction_info(
    run_id: str,
    generation: int,
    sender: int,
    receiver: int,
    sender_public: bytes,
    receiver_public: bytes,
    session: str = "",
) -> bytes:
    """HKDF's ``info`` for the key of ``sender -> receiver``: compact JSON of
    ``[DIRECTION_FORMAT, run_id, session, generation, sender, receiver, sender's X25519 key,
    receiver's X25519 key]`` (keys in base64). The order of the two ranks is the direction, so
    the two directions of one pair get different keys; the session id ties it to this start of
    the run; the public keys tie the key to exactly the pair of published keys it came from."""
    return _json([DIRECTION_FORMAT, run_id, session, generation, sender, receiver,
                  base64.b64encode(sender_public).decode("ascii"),
                  base64.b64encode(receiver_public).decode("ascii")])  # fmt: skip


def direction_key(shared_secret: bytes, info: bytes) -> bytes:
    """The 32-byte AES-256-GCM key of one direction: HKDF-SHA256 of the X25519 shared secret
    with ``info`` (:func:`direction_info`) and no salt (the secret is fresh for every
    generation, and ``info`` carries every binding)."""
    return HKDF(algorithm=hashes.SHA256(), length=AES_KEY_BYTES, salt=None, info=info).derive(
        shared_secret
    )


def round_nonce(round: int) -> bytes:
    """The 12-byte nonce of ``round``: the round number, big endian."""
    _check_round(round)
    return round.to_bytes(NONCE_BYTES, "big")


def _associated_prefix(run_id: str, generation: int, sender: int, receiver: int) -> bytes:
    return _json([MESSAGE_FORMAT, run_id, generation, sender, receiver])


def associated_data(run_id: str, generation: int, sender: int, receiver: int, round: int) -> bytes:
    """A message's associated data: compact JSON of ``[MESSAGE_FORMAT, run_id, generation,
    sender, receiver]`` followed by the round as 8 bytes big endian. The JSON part ends at its
    closing bracket and the round has a fixed width, so no two bindings give the same bytes."""
    _check_round(round)
    prefix = _associated_prefix(run_id, generation, sender, receiver)
    return prefix + round.to_bytes(ROUND_BYTES, "big")


def sealed_size(plain_bytes: int) -> int:
    """Bytes on the wire for a ``plain_bytes``-byte message: the ciphertext (as long as the
    plaintext) and the 16-byte tag. The round is not sent: both sides know it."""
    if plain_bytes < 0:
        raise ValueError("a size is not negative")
    return plain_bytes + TAG_BYTES


def plain_size(sealed_bytes: int) -> int:
    """The plaintext's size of a ``sealed_bytes``-byte sealed message (:func:`sealed_size`'s
    inverse)."""
    if sealed_bytes < TAG_BYTES:
        raise ValueError(f"a sealed message has at least {TAG_BYTES} bytes (its tag)")
    return sealed_bytes - TAG_BYTES


def _check_round(round: int) -> None:
    if not _is_int(round) or not 0 <= round <= MAX_ROUND:
        raise ValueError(f"a round is an integer in 0..2**64-1, not {round!r}")


# --------------------------------------------------------------------------------------------
# one channel per (self, peer)


class SealedChannel:
    """Seals what this site sends to ``peer`` and opens what ``peer`` sends to it, for one
    generation; also holds the pair's seed of masked sums (:attr:`mask_seed`).

    Built from this site's :class:`SealingKey` and the peer's X25519 public key (from its
    verified record, :func:`verify_sealing_key_record`, or :meth:`from_record`). The X25519
    exchange and the two HKDF derivations happen once, here; each message then costs one
    AES-256-GCM operation.

    * :meth:`seal` takes the round counter of the message: rounds must grow strictly from one
      sealed message to the next (a repeated or smaller round raises ``ValueError`` and seals
      nothing), so no nonce is ever used twice under the sending key.
    * :meth:`open` takes the round the receiver expects. A round already opened (replayed) or
      below the last one opened (out of order) is refused before decrypting; a failed tag is
      refused after (as *replayed* when it opens as a recent round). A refusal leaves the
      channel as it was, so the message that belongs in the round can still be opened.
    """

    __slots__ = ("_ad_in", "_ad_out", "_in", "_last_in", "_last_out", "_out", "_recent",
                 "generation", "mask_seed", "peer", "rank", "run_id")  # fmt: skip

    def __init__(self, own: SealingKey, peer: int, peer_public: bytes) -> None:
        _check_binding(own.run_id, own.generation, peer)
        if peer == own.rank:
            raise ValueError(f"party {peer} needs no channel to itself")
        self.run_id, self.generation = own.run_id, own.generation
        self.rank, self.peer = own.rank, peer
        if len(peer_public) != X25519_BYTES:
            raise SealingKeyRefused(peer, f"its X25519 key is not {X25519_BYTES} bytes")
        try:
            shared = own.private_key.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError:  # a low-order point: the shared secret would be all zeros
            raise SealingKeyRefused(peer, "its X25519 key is a low-order point") from None
        mine = own.public_key
        session = own.session
        out_info = direction_info(
            self.run_id, self.generation, own.rank, peer, mine, peer_public, session
        )
        in_info = direction_info(
            self.run_id, self.generation, peer, own.rank, peer_public, mine, session
        )
        self._out = AESGCM(direction_key(shared, out_info))
        self._in = AESGCM(direction_key(shared, in_info))
        #: the pair's seed of masked sums (:mod:`slate.security.masking`): HKDF of the same
        #: X25519 secret with the mask's own ``info``, the same on both sides
        self.mask_seed = pair_seed(
            shared, mask_info(self.run_id, session, self.generation, own.rank, peer)
        )
        self._ad_out = _associated_prefix(self.run_id, self.generation, own.rank, peer)
        self._ad_in = _associated_prefix(self.run_id, self.generation, peer, own.rank)
        self._last_out: int | None = None  # the last round sealed
        self._last_in: int | None = None  # the last round opened
        self._recent: list[int] = []  # rounds opened lately, increasing (a bounded memory)

    @classmethod
    def from_record(
        cls, own: SealingKey, peer: int, record: object, peer_site_key: Ed25519PublicKey | bytes
    ) -> SealedChannel:
        """The channel to ``peer`` from its signed sealing-key record, verified first against
        ``peer_site_key`` (its Ed25519 key on the roster) for this run, session and
        generation."""
        public = verify_sealing_key_record(
            record, peer_site_key, own.run_id, own.generation, peer, own.session
        )
        return cls(own, peer, public)

    def seal(self, plaintext: Buffer, round: int) -> bytes:
        """``plaintext`` sealed for the peer in ``round``: ciphertext then tag,
        :func:`sealed_size` bytes. ``round`` must exceed every round sealed before."""
        nonce, ad = self._next_out(round)
        sealed = self._out.encrypt(nonce, plaintext, ad)
        self._last_out = round
        return sealed

    def seal_into(self, plaintext: Buffer, round: int, out: Buffer) -> None:
        """:meth:`seal`, written into ``out`` (a writable buffer of exactly
        ``sealed_size(len(plaintext))`` bytes, e.g. a ``uint8`` tensor's memory) without an
        intermediate copy where ``cryptography`` offers ``encrypt_into``."""
        size = sealed_size(memoryview(plaintext).nbytes)
        if memoryview(out).nbytes != size:
            raise ValueError(f"the sealed message takes {size} bytes, not {memoryview(out).nbytes}")
        nonce, ad = self._next_out(round)
        if _INTO:
            self._out.encrypt_into(nonce, plaintext, ad, out)
        else:  # cryptography before encrypt_into
            memoryview(out).cast("B")[:] = self._out.encrypt(nonce, plaintext, ad)
        self._last_out = round

    def open(self, sealed: Buffer, round: int) -> bytes:
        """The plaintext of ``sealed``, the peer's message for ``round``; raises
        :class:`SealedMessageRefused` naming the peer when the round was already opened, is
        earlier than the last one opened, or the tag does not verify."""
        nonce, ad = self._next_in(round)
        try:
            plaintext = self._in.decrypt(nonce, sealed, ad)
        except InvalidTag:
            raise self._failed_tag(sealed, round) from None
        self._opened(round)
        return plaintext

    def open_into(self, sealed: Buffer, round: int, out: Buffer) -> None:
        """:meth:`open`, written into ``out`` (a writable buffer of exactly
        ``plain_size(len(sealed))`` bytes) without an intermediate copy where ``cryptography``
        offers ``decrypt_into``. On a refusal ``out`` is overwritten with zeros: what a failed
        decryption may have left there is never readable."""
        size = memoryview(sealed).nbytes - TAG_BYTES
        view = memoryview(out).cast("B")
        nonce, ad = self._next_in(round)
        if size < 0 or view.nbytes != size:
            if size >= 0:
                raise ValueError(f"the plaintext takes {size} bytes, not {view.nbytes}")
            raise SealedMessageRefused(self.peer, self.rank, round, "tag")  # shorter than a tag
        try:
            if _INTO and size > 0:
                self._in.decrypt_into(nonce, sealed, ad, view)
            else:
                view[:] = self._in.decrypt(nonce, sealed, ad)
        except InvalidTag:
            view[:] = bytes(size)
            raise self._failed_tag(sealed, round) from None
        self._opened(round)

    def _failed_tag(self, sealed: Buffer, round: int) -> SealedMessageRefused:
        """The refusal of ``sealed``, whose tag failed for ``round``: *replayed*, for the round
        it was sealed in, when it opens as one of the last :data:`REPLAY_CHECK` rounds opened
        (the sender, or someone on the way, sent that message again); else *tag*. Costs a few
        decryptions, on a refusal only; the channel is left as it was."""
        for earlier in reversed(self._recent[-REPLAY_CHECK:]):
            ad = self._ad_in + _round_bytes(earlier)
            try:
                self._in.decrypt(earlier.to_bytes(NONCE_BYTES, "big"), bytes(sealed), ad)
            except InvalidTag:
                continue
            return SealedMessageRefused(self.peer, self.rank, earlier, "replayed")
        return SealedMessageRefused(self.peer, self.rank, round, "tag")

    def _next_out(self, round: int) -> tuple[bytes, bytes]:
        """The nonce and associated data of sealing ``round``, once it is checked to be after
        every round sealed before (so a nonce never repeats under the sending key)."""
        _check_round(round)
        if self._last_out is not None and round <= self._last_out:
            raise ValueError(
                f"round {round} is not after the last sealed round {self._last_out}: a nonce "
                "would be used twice under one key"
            )
        return round.to_bytes(NONCE_BYTES, "big"), self._ad_out + _round_bytes(round)

    def _next_in(self, round: int) -> tuple[bytes, bytes]:
        """The nonce and associated data of opening ``round``; refuses a round already opened
        (replayed) or earlier than the last one opened (out of order)."""
        _check_round(round)
        if self._last_in is not None and round <= self._last_in:
            at = bisect.bisect_left(self._recent, round)
            replayed = at < len(self._recent) and self._recent[at] == round
            reason = "replayed" if replayed else "out of order"
            raise SealedMessageRefused(self.peer, self.rank, round, reason)
        return round.to_bytes(NONCE_BYTES, "big"), self._ad_in + _round_bytes(round)

    def _opened(self, round: int) -> None:
        self._last_in = round
        self._recent.append(round)  # opened rounds only grow, so the list stays sorted
        if len(self._recent) >= 2 * REPLAY_MEMORY:
            del self._recent[:REPLAY_MEMORY]

    @property
    def last_sealed(self) -> int | None:
        """The last round sealed for the peer (None before the first)."""
        return self._last_out

    @property
    def last_opened(self) -> int | None:
        """The last round opened from the peer (None before the first)."""
        return self._last_in

    def __repr__(self) -> str:
        return (
            f"SealedChannel(run_id={self.run_id!r}, generation={self.generation}, "
            f"rank={self.rank}, peer={self.peer})"
        )


def _round_bytes(round: int) -> bytes:
    return round.to_bytes(ROUND_BYTES, "big")


def _json(value: list[Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")
