"""Sealed messages (``slate.security.sealing``, ``slate.communication.sealed_tensors``), checked
against references built here directly from pyca ``cryptography``: the X25519 exchange, HKDF
with the ``info`` bytes written out by hand, and ``AESGCM`` with the nonce and associated data
written out by hand."""

from __future__ import annotations

import base64
import json
import random
import struct

import pytest
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slate.communication.sealed_tensors import open_tensor, seal_tensor, sealed_numel
from slate.errors import SlateError
from slate.security.sealing import (
    REPLAY_CHECK,
    TAG_BYTES,
    SealedChannel,
    SealedMessageRefused,
    SealingKey,
    SealingKeyRefused,
    associated_data,
    plain_size,
    round_nonce,
    sealed_size,
    sealing_key_record,
    verify_sealing_key_record,
)

RUN = "run-7"
GEN = 3
SESSION = "c3" * 32  # this start of the run (slate.engines.distributed.control.session)
EARLIER = "d4" * 32  # an earlier run with the same roster


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Site:
    """A site of the test: its Ed25519 site key and its X25519 key of one generation."""

    def __init__(
        self, rank: int, generation: int = GEN, run: str = RUN, session: str = SESSION
    ) -> None:
        self.rank = rank
        self.site_key = Ed25519PrivateKey.generate()
        self.key = SealingKey.generate(run, generation, rank, session)
        self.record = sealing_key_record(self.key, self.site_key)

    def channel(self, peer: Site) -> SealedChannel:
        return SealedChannel.from_record(
            self.key, peer.rank, peer.record, peer.site_key.public_key()
        )


def reference_key(sender: SealingKey, receiver: SealingKey, run: str = RUN, gen: int = GEN):
    """The AES-GCM object of ``sender -> receiver``, derived here without slate: X25519, then
    HKDF-SHA256 with the info bytes spelt out."""
    shared = sender.private_key.exchange(X25519PublicKey.from_public_bytes(receiver.public_key))
    info = (
        f'["slate-sealing-direction-2","{run}","{sender.session}",{gen},{sender.rank},'
        f'{receiver.rank},"{b64(sender.public_key)}","{b64(receiver.public_key)}"]'
    ).encode()
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)
    return raw, AESGCM(raw)


def reference_nonce(round: int) -> bytes:
    return b"\0\0\0\0" + struct.pack(">Q", round)


def reference_ad(sender: int, receiver: int, round: int, run: str = RUN, gen: int = GEN) -> bytes:
    return f'["slate-sealed-message-1","{run}",{gen},{sender},{receiver}]'.encode() + struct.pack(
        ">Q", round
    )


@pytest.fixture
def pair() -> tuple[Site, Site]:
    return Site(0), Site(1)


def refused(channel: SealedChannel, sealed: bytes, round: int) -> SealedMessageRefused:
    with pytest.raises(SealedMessageRefused) as caught:
        channel.open(sealed, round)
    error = caught.value
    assert error.sender == channel.peer and error.receiver == channel.rank
    assert f"from party {channel.peer} " in str(error) and isinstance(error, SlateError)
    return error


# -- signed sealing-key records ---------------------------------------------------------------


def test_a_record_is_json_and_verifies_to_the_published_key(pair):
    a, _ = pair
    record = json.loads(json.dumps(a.record))
    assert set(record) == {"format", "run", "session", "gen", "rank", "x25519", "sig"}
    assert (record["run"], record["session"], record["gen"], record["rank"]) == (
        RUN, SESSION, GEN, 0
    )  # fmt: skip
    assert base64.b64decode(record["x25519"]) == a.key.public_key
    raw_site_key = a.site_key.public_key().public_bytes_raw()
    for site_key in (a.site_key.public_key(), raw_site_key):
        found = verify_sealing_key_record(record, site_key, RUN, GEN, 0, SESSION)
        assert found == a.key.public_key


def test_the_signature_covers_exactly_the_binding(pair):
    a, _ = pair
    signed = f'["slate-sealing-key-2","{RUN}","{SESSION}",{GEN},0,"{a.record["x25519"]}"]'
    signed = signed.encode()
    a.site_key.public_key().verify(base64.b64decode(a.record["sig"]), signed)  # raises if not


def record_refused(record, site_key, run=RUN, gen=GEN, rank=0, session=SESSION) -> str:
    with pytest.raises(SealingKeyRefused) as caught:
        verify_sealing_key_record(record, site_key, run, gen, rank, session)
    assert caught.value.rank == rank and f"party {rank} " in str(caught.value)
    assert isinstance(caught.value, SlateError)
    return caught.value.problem


def test_a_record_with_a_wrong_signature_is_refused(pair):
    a, b = pair
    assert "does not verify" in record_refused(a.record, b.site_key.public_key())  # b's site key
    flipped = bytearray(base64.b64decode(a.record["sig"]))
    flipped[10] ^= 0x01
    assert "does not verify" in record_refused(
        {**a.record, "sig": b64(bytes(flipped))}, a.site_key.public_key()
    )
    # another X25519 key under a's signature: the substitution is caught
    swapped = {**a.record, "x25519": b.record["x25519"]}
    assert "does not verify" in record_refused(swapped, a.site_key.public_key())
    # a record signed by b's site key for rank 0 is not rank 0's
    forged = sealing_key_record(a.key, b.site_key)
    assert "does not verify" in record_refused(forged, a.site_key.public_key())


@pytest.mark.parametrize(
    ("run", "gen", "rank", "words"),
    [("run-8", GEN, 0, "another run"), (RUN, GEN + 1, 0, "generation 3, not 4"),
     (RUN, GEN - 1, 0, "generation 3, not 2"), (RUN, GEN, 1, "rank 0's record, not rank 1's")],
)  # fmt: skip
def test_a_record_for_another_run_generation_or_rank_is_refused(pair, run, gen, rank, words):
    a, _ = pair
    assert words in record_refused(a.record, a.site_key.public_key(), run, gen, rank)


def test_a_record_of_another_session_is_refused(pair):
    """An earlier run with the same roster: the same run id, rank and generation, another
    session; its record is refused naming the session, as the same key relabelled by hand."""
    earlier = Site(0, session=EARLIER)
    assert "another session" in record_refused(earlier.record, earlier.site_key.public_key())
    relabelled = {**earlier.record, "session": SESSION}
    assert "does not verify" in record_refused(relabelled, earlier.site_key.public_key())


def test_a_record_relabelled_by_hand_does_not_verify(pair):
    a, _ = pair
    for field, value in (("run", "run-8"), ("gen", GEN + 1), ("rank", 1), ("session", EARLIER)):
        changed = {**a.record, field: value}
        run, gen, rank = changed["run"], changed["gen"], changed["rank"]
        problem = record_refused(
            changed, a.site_key.public_key(), run, gen, rank, changed["session"]
        )
        assert "does not verify" in problem


@pytest.mark.parametrize(
    "change",
    [lambda r: {k: v for k, v in r.items() if k != "sig"}, lambda r: {**r, "extra": 1},
     lambda r: {**r, "gen": True}, lambda r: {**r, "gen": "3"}, lambda r: {**r, "x25519": "%%"},
     lambda r: {**r, "x25519": b64(b"short")}, lambda r: {**r, "sig": "not base64!"},
     lambda r: {**r, "format": "slate-record-1"}, lambda r: [r], lambda r: None],
)  # fmt: skip
def test_a_malformed_record_is_refused(pair, change):
    a, _ = pair
    record_refused(change(a.record), a.site_key.public_key())


def test_a_site_identity_signs_a_record_that_its_roster_key_verifies(tmp_path):
    from slate.security import make_roster, site_identity, write_keypair

    keys = [write_keypair(tmp_path / f"site{r}") for r in range(2)]
    roster = make_roster([pub for _, pub in keys], run_id=RUN)
    roster_path = tmp_path / "roster.json"
    roster_path.write_text(json.dumps(roster.to_json()))
    identity = site_identity(roster_path, keys[1][0], rank=1, nodes=2)
    key = SealingKey.generate(RUN, GEN, 1)
    record = sealing_key_record(key, identity)
    assert verify_sealing_key_record(record, roster.verifier(1), RUN, GEN, 1) == key.public_key
    record_refused(record, roster.verifier(0), rank=1, session="")


def test_a_low_order_x25519_key_is_refused(pair):
    a, _ = pair
    with pytest.raises(SealingKeyRefused) as caught:
        SealedChannel(a.key, 5, bytes(32))  # the all-zero point
    assert caught.value.rank == 5


def test_keys_are_fresh_and_repr_shows_no_secret(pair):
    a, _ = pair
    again = SealingKey.generate(RUN, GEN, 0)
    assert again.public_key != a.key.public_key
    assert repr(a.key) == (
        f"SealingKey(run_id={RUN!r}, generation={GEN}, rank=0, session={SESSION[:16]!r})"
    )
    assert "session" not in repr(SealingKey.generate(RUN, GEN, 0))


# -- keys per direction, against the reference ------------------------------------------------


def test_a_sealed_message_is_the_reference_aes_gcm_of_the_plaintext(pair):
    a, b = pair
    channel = a.channel(b)
    _, reference = reference_key(a.key, b.key)
    plaintext = bytes(range(256)) * 3
    sealed = channel.seal(plaintext, 41)
    assert len(sealed) == len(plaintext) + 16 == sealed_size(len(plaintext))
    assert reference.decrypt(reference_nonce(41), sealed, reference_ad(0, 1, 41)) == plaintext
    # and what the reference seals, the receiving channel opens
    theirs = reference.encrypt(reference_nonce(42), b"from the reference", reference_ad(0, 1, 42))
    assert b.channel(a).open(theirs, 42) == b"from the reference"


def test_nonce_and_associated_data_helpers_match_the_reference():
    assert round_nonce(0) == bytes(12) and round_nonce(258) == reference_nonce(258)
    assert round_nonce(2**64 - 1) == b"\0\0\0\0" + b"\xff" * 8
    assert associated_data(RUN, GEN, 2, 5, 9) == reference_ad(2, 5, 9)
    with pytest.raises(ValueError):
        round_nonce(2**64)
    with pytest.raises(ValueError):
        round_nonce(-1)


def test_the_two_directions_have_different_keys_and_each_side_opens_the_other(pair):
    a, b = pair
    a_to_b, _ = reference_key(a.key, b.key)
    b_to_a, _ = reference_key(b.key, a.key)
    assert a_to_b != b_to_a
    at_a, at_b = a.channel(b), b.channel(a)
    for round in range(5):
        assert at_b.open(at_a.seal(b"ping %d" % round, round), round) == b"ping %d" % round
        assert at_a.open(at_b.seal(b"pong %d" % round, round), round) == b"pong %d" % round
    # the same plaintext and round give different bytes in the two directions
    assert at_a.seal(b"same", 9) != at_b.seal(b"same", 9)


def test_a_message_reflected_to_its_sender_is_refused(pair):
    a, b = pair
    at_a = a.channel(b)
    sealed = at_a.seal(b"to b", 1)
    assert refused(at_a, sealed, 1).reason == "tag"  # a opening its own message as b's


# -- refusals ---------------------------------------------------------------------------------


def test_every_flipped_bit_is_refused_naming_the_sender(pair):
    a, b = pair
    at_a, at_b = a.channel(b), b.channel(a)
    plaintext = b"parameters of round 7, forty bytes long!"
    sealed = at_a.seal(plaintext, 7)
    for position in range(len(sealed)):  # the ciphertext, then the tag
        for bit in range(8):
            flipped = bytearray(sealed)
            flipped[position] ^= 1 << bit
            error = refused(at_b, bytes(flipped), 7)
            assert (error.reason, error.sender, error.round) == ("tag", 0, 7)
    assert refused(at_b, sealed[:-1], 7).reason == "tag"  # a cut tag
    assert refused(at_b, sealed + b"\0", 7).reason == "tag"  # a byte more
    assert refused(at_b, b"", 7).reason == "tag"
    assert at_b.open(sealed, 7) == plaintext  # the refusals changed nothing


def test_a_replayed_round_is_refused(pair):
    a, b = pair
    at_a, at_b = a.channel(b), b.channel(a)
    first, second = at_a.seal(b"one", 3), at_a.seal(b"two", 5)
    assert at_b.open(first, 3) == b"one" and at_b.open(second, 5) == b"two"
    for sealed, round in ((second, 5), (first, 3)):
        error = refused(at_b, sealed, round)
        assert (error.reason, error.round) == ("replayed", round)
        assert "already received" in str(error)
    # in lockstep, an old message offered for the next round fails its tag, and is then
    # recognised as the round it was sealed in
    for sealed, round in ((second, 5), (first, 3)):
        error = refused(at_b, sealed, 6)
        assert (error.reason, error.round, error.sender) == ("replayed", round, 0)
    assert at_b.last_opened == 5  # the refusals changed nothing
    sixth = at_a.seal(b"six", 6)
    assert at_b.open(sixth, 6) == b"six"
    # only the last few rounds are tried: an older replay is refused for its tag
    for round in range(7, 7 + REPLAY_CHECK):
        assert at_b.open(at_a.seal(b"x", round), round) == b"x"
    assert refused(at_b, sixth, 7 + REPLAY_CHECK).reason == "tag"


def test_an_out_of_order_round_is_refused(pair):
    a, b = pair
    at_a, at_b = a.channel(b), b.channel(a)
    early, late = at_a.seal(b"early", 3), at_a.seal(b"late", 4)
    assert at_b.open(late, 4) == b"late"
    error = refused(at_b, early, 3)
    assert error.reason == "out of order" and "earlier than" in str(error)
    assert at_b.last_opened == 4


def test_rounds_may_skip_forward():
    a, b = Site(0), Site(1)
    at_a, at_b = a.channel(b), b.channel(a)
    for round in (0, 2, 7, 1000, 2**64 - 1):
        assert at_b.open(at_a.seal(b"x", round), round) == b"x"


def test_a_round_is_never_sealed_twice(pair):
    a, b = pair
    at_a = a.channel(b)
    at_a.seal(b"x", 4)
    for round in (4, 3):
        with pytest.raises(ValueError, match="nonce would be used twice"):
            at_a.seal(b"y", round)
    assert at_a.last_sealed == 4
    for bad in (-1, 2**64, 1.0, True):
        with pytest.raises(ValueError):
            at_a.seal(b"y", bad)


def test_a_message_for_another_receiver_is_refused():
    a, b, c = Site(0), Site(1), Site(2)
    sealed = a.channel(b).seal(b"for b only", 1)
    assert refused(c.channel(a), sealed, 1).reason == "tag"
    # sealed with a -> b's own key, but with c named as receiver: the associated data differs
    _, reference = reference_key(a.key, b.key)
    sealed = reference.encrypt(reference_nonce(1), b"for c?", reference_ad(0, 2, 1))
    assert refused(b.channel(a), sealed, 1).reason == "tag"


def test_a_message_from_another_sender_is_refused_naming_the_expected_one():
    a, b, c = Site(0), Site(1), Site(2)
    # c's message to b, arriving where b waits for a's (relayed, or on a rewired connection)
    sealed = c.channel(b).seal(b"c's", 1)
    error = refused(b.channel(a), sealed, 1)
    assert (error.reason, error.sender, error.receiver) == ("tag", 0, 1)
    assert "from party 0" in str(error)
    # a's own key to b, with c named as the sender in the associated data
    _, reference = reference_key(a.key, b.key)
    sealed = reference.encrypt(reference_nonce(1), b"as c", reference_ad(2, 1, 1))
    assert refused(b.channel(a), sealed, 1).reason == "tag"
    assert refused(b.channel(c), sealed, 1).reason == "tag"  # c's key to b is another key


@pytest.mark.parametrize(
    ("run", "gen", "session"),
    [(RUN, GEN + 1, SESSION), ("run-8", GEN, SESSION), (RUN, GEN, EARLIER)],
)
def test_a_message_of_another_generation_run_or_session_is_refused(pair, run, gen, session):
    a, b = pair
    # the same X25519 key pairs, bound to another run, generation or session: other keys per
    # direction (HKDF's info binds all three)
    a_there = SealingKey(run, gen, 0, a.key.private_key, session)
    b_there = SealingKey(run, gen, 1, b.key.private_key, session)
    sealed = SealedChannel(a_there, 1, b.key.public_key).seal(b"elsewhere", 2)
    assert refused(b.channel(a), sealed, 2).reason == "tag"
    assert SealedChannel(b_there, 0, a.key.public_key).open(sealed, 2) == b"elsewhere"  # there
    if session != SESSION:
        return  # the session is bound by the key only (the associated data has no session)
    # the right key, with the other run's or generation's associated data
    _, reference = reference_key(a.key, b.key)
    sealed = reference.encrypt(reference_nonce(2), b"x", reference_ad(0, 1, 2, run, gen))
    assert refused(b.channel(a), sealed, 2).reason == "tag"


def test_a_message_for_another_round_is_refused(pair):
    a, b = pair
    _, reference = reference_key(a.key, b.key)
    # the nonce of round 2 with the associated data of round 3, and the reverse
    mixed = reference.encrypt(reference_nonce(2), b"x", reference_ad(0, 1, 3))
    assert refused(b.channel(a), mixed, 2).reason == "tag"
    assert refused(b.channel(a), mixed, 3).reason == "tag"


def test_no_channel_to_oneself(pair):
    a, _ = pair
    with pytest.raises(ValueError):
        SealedChannel(a.key, 0, a.key.public_key)


# -- sizes and tensors ------------------------------------------------------------------------


def test_sealed_size_adds_the_tag():
    assert TAG_BYTES == 16
    for n in (0, 1, 1200, 8600, 600_000):
        assert sealed_size(n) == n + 16 and plain_size(sealed_size(n)) == n
    assert sealed_numel(2150, torch.float32) == 8616 and sealed_numel(8600, torch.uint8) == 8616
    with pytest.raises(ValueError):
        plain_size(15)


def float32_specials() -> torch.Tensor:
    # quiet NaN, NaNs with payloads, signalling NaNs; infinities, -0, subnormals, 1
    bits = [0x7FC00000, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0xFF800123,
            0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x80000001, 0x3F800000]  # fmt: skip
    raw = struct.pack(f"<{len(bits)}I", *bits)
    return torch.frombuffer(bytearray(raw), dtype=torch.float32)


@pytest.mark.parametrize(
    "tensor",
    [float32_specials(), torch.randn(7, 5), torch.arange(256, dtype=torch.uint8).reshape(16, 16),
     torch.randint(-128, 128, (8600,), dtype=torch.int8), torch.tensor(3.5), torch.empty(0, 4),
     torch.randn(6, 3).t(), torch.randn(5, dtype=torch.float64)],
)  # fmt: skip
def test_a_tensor_round_trips_bit_exactly(pair, tensor):
    a, b = pair
    at_a, at_b = a.channel(b), b.channel(a)
    sealed = seal_tensor(at_a, tensor, 11)
    assert sealed.dtype == torch.uint8 and sealed.dim() == 1
    assert sealed.numel() == sealed_numel(tensor.numel(), tensor.dtype)
    back = open_tensor(at_b, sealed, 11, tensor.dtype, tensor.shape)
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    plain = tensor.contiguous().reshape(-1).view(torch.uint8)
    assert torch.equal(back.reshape(-1).view(torch.uint8), plain)  # every bit, NaN payloads too
    if tensor.numel():  # the sealed bytes are the reference AES-GCM of the tensor's bytes
        _, reference = reference_key(a.key, b.key)
        data = bytes(sealed.numpy())
        assert reference.decrypt(reference_nonce(11), data, reference_ad(0, 1, 11)) == bytes(
            plain.numpy()
        )


def test_a_tampered_or_misfit_sealed_tensor_is_refused(pair):
    a, b = pair
    at_a, at_b = a.channel(b), b.channel(a)
    sealed = seal_tensor(at_a, torch.ones(10), 1)
    with pytest.raises(ValueError, match="cannot hold"):
        open_tensor(at_b, sealed, 1, torch.float32, (11,))
    sealed[3] ^= 0x80
    with pytest.raises(SealedMessageRefused) as caught:
        open_tensor(at_b, sealed, 1, torch.float32, (10,))
    assert caught.value.sender == 0 and caught.value.reason == "tag"


# -- property: any payload size, 0 bytes to 1 MB ----------------------------------------------

CHANNELS: dict[str, tuple[Site, Site, object]] = {}


def shared_pair():
    """One pair of sites and their reference key for the whole property test (the round grows
    from one example to the next, as on a real channel)."""
    if not CHANNELS:
        a, b = Site(0), Site(1)
        CHANNELS["pair"] = (a.channel(b), b.channel(a), reference_key(a.key, b.key)[1])
        CHANNELS["round"] = 0
    return CHANNELS["pair"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(size=st.integers(0, 1 << 20), seed=st.integers(0, 2**32 - 1))
@example(size=0, seed=1)
@example(size=1, seed=2)
@example(size=15, seed=3)
@example(size=16, seed=4)
@example(size=17, seed=5)
@example(size=1 << 20, seed=6)
def test_any_payload_size_round_trips_against_the_reference(size, seed):
    at_a, at_b, reference = shared_pair()
    CHANNELS["round"] += 1
    round = CHANNELS["round"]
    plaintext = random.Random(seed).randbytes(size)
    sealed = at_a.seal(plaintext, round)
    assert len(sealed) == sealed_size(size)
    assert reference.decrypt(reference_nonce(round), sealed, reference_ad(0, 1, round)) == plaintext
    assert at_b.open(sealed, round) == plaintext


# -- sealing into given buffers ---------------------------------------------------------------


@pytest.mark.parametrize("into", [True, False])  # cryptography's *_into, or the fallback
def test_sealing_into_a_buffer_equals_sealing(monkeypatch, into):
    import slate.security.sealing as sealing

    monkeypatch.setattr(sealing, "_INTO", into and sealing._INTO)
    a, b = Site(0), Site(1)
    at_a, at_b, twin = a.channel(b), b.channel(a), a.channel(b)
    plaintext = random.Random(1).randbytes(1000)
    out = bytearray(sealed_size(1000))
    at_a.seal_into(plaintext, 5, out)
    assert bytes(out) == twin.seal(plaintext, 5)
    opened = bytearray(1000)
    at_b.open_into(out, 5, opened)
    assert opened == plaintext
    with pytest.raises(ValueError, match="nonce would be used twice"):
        at_a.seal_into(plaintext, 5, out)
    with pytest.raises(ValueError, match="takes"):
        at_a.seal_into(plaintext, 6, bytearray(10))
    # a refused message leaves zeros behind, never unauthenticated plaintext
    sealed = bytearray(at_a.seal(plaintext, 7))
    sealed[0] ^= 1
    opened = bytearray(b"\xaa" * 1000)
    with pytest.raises(SealedMessageRefused) as caught:
        at_b.open_into(sealed, 7, opened)
    assert caught.value.reason == "tag" and opened == bytes(1000)
    with pytest.raises(SealedMessageRefused):
        at_b.open_into(b"short", 8, bytearray())
    assert at_b.open(at_a.seal(b"", 9), 9) == b""
    with pytest.raises(SealedMessageRefused) as caught:
        at_b.open_into(sealed, 5, bytearray(1000))
    assert caught.value.reason == "replayed"


def test_tensors_round_trip_without_the_into_methods(monkeypatch):
    import slate.security.sealing as sealing

    monkeypatch.setattr(sealing, "_INTO", False)
    a, b = Site(0), Site(1)
    tensor = float32_specials().reshape(1, -1)
    sealed = seal_tensor(a.channel(b), tensor, 1)
    back = open_tensor(b.channel(a), sealed, 1, torch.float32, tensor.shape)
    assert torch.equal(back.view(torch.int32), tensor.view(torch.int32))
