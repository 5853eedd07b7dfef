"""Masked sums through the sealed wire (slate.engines.distributed.wire.sealed_wire), in one
process: N members as threads, each with real sealing keys and channels, their sealed messages
carried by queues in place of torch.distributed. Every total is checked against the plain sum
computed here; every message a member opened is read back from the test-only recorder."""

from __future__ import annotations

import math
import queue
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from slate.engines.distributed.control.membership import PartyLost
from slate.engines.distributed.wire.sealed_wire import SealedWire
from slate.faults.opened import OpenedRecorder
from slate.security.masking import FLOAT_BITS, SPLIT, MaskOverflow, WideFixedPoint
from slate.security.sealing import SealedChannel, SealingKey


class Network:
    """Queues per (sender, receiver); ``drop`` loses every message of those senders."""

    def __init__(self, drop: tuple[int, ...] = ()) -> None:
        self.queues: dict[tuple[int, int], queue.Queue] = {}
        self.lock = threading.Lock()
        self.drop = drop

    def line(self, a: int, b: int) -> queue.Queue:
        with self.lock:
            return self.queues.setdefault((a, b), queue.Queue())


class ThreadWire(SealedWire):
    """A sealed wire whose swap goes through :class:`Network` (sealing and opening as ever)."""

    network: Network

    def swap(self, waiter, sends, receives, group=None, check=None):
        del waiter, group, check
        for peer, tensor in sends:
            sealed = self.seal(tensor, peer)
            if self.rank not in self.network.drop:
                self.network.line(self.rank, self.members[peer]).put(sealed)
        out = []
        for peer, like in receives:
            try:
                sealed = self.network.line(self.members[peer], self.rank).get(timeout=2)
            except queue.Empty:
                raise PartyLost(f"party {self.members[peer]} is gone") from None
            out.append(self.open(sealed, peer, like))
        return out


def wires(members, network, generation=0, recorders=None, masks=True):
    keys = {r: SealingKey.generate("run", generation, r, "session") for r in members}
    out = []
    for r in members:
        channels = {p: SealedChannel(keys[r], p, keys[p].public_key) for p in members if p != r}
        recorder = recorders[r] if recorders else None
        wire = ThreadWire(r, tuple(members), channels, recorder=recorder, masks=masks)
        wire.network = network
        out.append(wire)
    return out


def run_each(wires_, call):
    """Each member's ``call(wire, index)`` in a thread of its own (or the exception it raised),
    in order."""
    results: list[object] = [None] * len(wires_)

    def member(i):
        try:
            results[i] = call(wires_[i], i)
        except Exception as err:  # the test looks at each member's outcome
            results[i] = err

    threads = [threading.Thread(target=member, args=(i,)) for i in range(len(wires_))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def run_all(wires_, values, what="statistics"):
    """Each member's result of one sum (or the exception it raised), in order."""
    return run_each(wires_, lambda wire, i: wire.reduce(None, values[i], "sum", what))


def words_sent(monkeypatch) -> list[int]:
    """The words each gathered masked message holds, from now on (not the digests compared
    after each sum, bytes: :mod:`slate.security.sum_digests`)."""
    sent: list[int] = []
    gather = ThreadWire.gather

    def counting_gather(self, waiter, value):
        if value.dtype == torch.int64:
            sent.append(value.numel())
        return gather(self, waiter, value)

    monkeypatch.setattr(ThreadWire, "gather", counting_gather)
    return sent


@pytest.mark.parametrize("n", [3, 5])
def test_integer_sums_are_exact_and_every_member_gets_the_same_bits(n):
    rng = np.random.default_rng(n)
    values = [torch.from_numpy(rng.integers(-(2**40), 2**40, size=(4, 7))) for _ in range(n)]
    members = wires(list(range(n)), Network())
    for _ in range(2):  # two sums in a row, each with its own masks
        results = run_all(members, values)
        for got in results:
            assert got.dtype == torch.int64
            assert torch.equal(got, sum(values))


def test_float_sums_are_within_the_fixed_point_step_of_the_exact_sum():
    n = 4
    rng = np.random.default_rng(0)
    values = [torch.from_numpy(rng.normal(0, 1e3, 257)) for _ in range(n)]
    values[2][0] = 1e15  # a column sum of squares of a large-scale feature
    for k in range(n):
        values[k][1] = 123456.0 * k + 7  # counts held in floats: exact
    exact = np.sum([v.numpy().astype(np.longdouble) for v in values], axis=0)
    results = run_all(wires([0, 1, 2, 3], Network()), values)
    for got in results:
        assert got.dtype == torch.float64
        assert torch.equal(got, results[0])
    error = np.abs(results[0].numpy().astype(np.longdouble) - exact)
    step = math.ldexp(1.0, -FLOAT_BITS)
    bound = n * step / 2 + np.abs(exact) * np.finfo(np.float64).eps
    assert (error <= bound).all()
    assert float(results[0][1]) == 123456.0 * 6 + 28


def test_several_sums_in_one_exchange_each_in_its_own_type(monkeypatch):
    """The evaluation's counts (integers, one word each) and riders (floats) in one masked
    exchange: each sum equals the plain one, the integers exactly, and the message one member
    sends is one word per integer, two per float, and the float part's refusal count."""
    n = 3
    rng = np.random.default_rng(7)
    counts = [torch.from_numpy(rng.integers(0, 500, size=(2, 64))) for _ in range(n)]
    riders = [torch.from_numpy(rng.normal(0, 10, 5)) for _ in range(n)]
    sent = words_sent(monkeypatch)
    results = run_each(
        wires([0, 1, 2], Network()),
        lambda wire, i: wire.masked_sums(None, [counts[i], riders[i]], "evaluation"),
    )
    assert sent == [2 * 64 + 2 * 5 + 1] * n
    for got_counts, got_riders in results:
        assert got_counts.dtype == torch.int64 and torch.equal(got_counts, sum(counts))
        assert got_riders.dtype == torch.float64
        torch.testing.assert_close(got_riders, sum(riders), rtol=0, atol=1e-10)


def test_the_parameters_average_goes_in_one_word_a_value_and_refuses_what_it_cannot_carry(
    monkeypatch,
):
    """``narrow`` (the parameters' average, NarrowFixedPoint): one masked word per value and
    the refusal count, each sum within N 2^-33 of the exact one; a parameter beyond
    2^31 / N is refused by every member."""
    n = 3
    torch.manual_seed(1)
    models = [torch.randn(500) * 10 for _ in range(n)]
    models[1][0] = 3e-7  # below float32's rounding where the step is finer
    members = wires([0, 1, 2], Network())
    sent = words_sent(monkeypatch)

    def narrow(wire, i):
        return wire.reduce(None, models[i], "sum", "average", narrow=True)

    results = run_each(members, narrow)
    assert sent == [500 + 1] * n
    exact = np.sum([m.numpy().astype(np.float64) for m in models], axis=0)
    for got in results:
        assert got.dtype == torch.float32 and torch.equal(got, results[0])
        assert np.abs(got.numpy().astype(np.float64) - exact).max() <= n * 2.0**-33 + 1e-5
    models[2][3] = 2.0**31 / n  # beyond the range
    assert all(isinstance(r, MaskOverflow) for r in run_each(members, narrow))


def test_a_model_average_matches_the_plain_float32_average_to_1e_6():
    n = 3
    torch.manual_seed(0)
    models = [torch.randn(2000) * 3 for _ in range(n)]
    results = run_all(wires([0, 1, 2], Network()), models, "average")
    plain = (models[0] + models[1] + models[2]) / n
    for got in results:
        assert got.dtype == torch.float32
        assert torch.allclose(got / n, plain, rtol=0, atol=1e-6)


def entropy(data: bytes) -> float:
    frequency = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256) / len(data)
    frequency = frequency[frequency > 0]
    return float(-(frequency * np.log2(frequency)).sum())


def test_no_single_message_reveals_a_members_value(tmp_path: Path):
    """Member 1 holds a planted count table and sum. Every payload any member opened differs
    from its sender's value, holds none of its numbers' bytes, and looks uniform; the same sum
    unmasked (the comparison switch) shows them all, so this check can fail."""
    n = 3
    values = [torch.zeros(1024, dtype=torch.float64) for _ in range(n)]
    values[1][:512] = 91.0  # planted counts
    values[1][600] = 4242.5 * 271  # a planted column sum
    values[0][:10] = 1.0
    planted = [np.float64(91.0).tobytes(), np.float64(4242.5 * 271).tobytes()]
    for masks, folder in ((True, tmp_path / "masked"), (False, tmp_path / "plain")):
        recorders = [OpenedRecorder(folder, r) for r in range(n)]
        results = run_all(wires(list(range(n)), Network(), recorders=recorders, masks=masks),
                          values, "evaluation")  # fmt: skip
        assert all(torch.equal(r, values[0] + values[1] + values[2]) for r in results)
        from_one = sorted(folder.glob("rank*/from1-*-evaluation.bin"))
        assert len(from_one) == n - 1
        for path in from_one:
            payload = path.read_bytes()
            own = values[1].numpy().tobytes()
            if masks:
                assert len(payload) > 4096 and entropy(payload) >= 7.5, path
                assert payload != own and not any(p in payload for p in planted), path
            else:
                assert payload == own  # the control: unmasked, the value is there


def test_a_value_a_member_cannot_carry_is_refused_by_every_member():
    n = 3
    values = [torch.ones(5, dtype=torch.float64) for _ in range(n)]
    values[2][3] = math.inf
    results = run_all(wires([0, 1, 2], Network()), values, "standardisation squares")
    for i, got in enumerate(results):
        assert isinstance(got, MaskOverflow), got
        assert "standardisation squares" in str(got)
        assert ("this site's" in str(got)) == (i == 2) and "1 value(s)" in str(got)
    limit = math.ldexp(1.0, 63 + SPLIT - FLOAT_BITS) / n
    values[2][3] = 2 * limit
    assert all(isinstance(r, MaskOverflow) for r in run_all(wires([0, 1, 2], Network()), values))


def test_a_member_lost_during_a_sum_gives_no_total_and_the_next_generation_redoes_it():
    """Member 2's masked words never arrive: no member returns a total (none with a mask left
    in it); the survivors' next generation, under new keys, sums their own values exactly."""
    values = [torch.tensor([float(10**r), 0.5]) for r in range(3)]
    results = run_all(wires([0, 1, 2], Network(drop=(2,))), values)
    assert isinstance(results[0], PartyLost) and isinstance(results[1], PartyLost)
    again = run_all(wires([0, 1], Network(), generation=1), values[:2])
    assert all(torch.equal(r, values[0] + values[1]) for r in again)


def test_wide_fixed_point_splits_exactly():
    codec = WideFixedPoint("x")
    x = np.array([0.0, -1.0, 2.0**52 + 1, -(2.0**-40), 1e18 / 3, -7.25])
    words, bad = codec.encode(x, 4)
    assert not bad.any()
    _, low = np.split(words, 2)
    assert ((low >= 0) & (low < 2**SPLIT)).all()
    assert np.array_equal(codec.decode(words), x)
