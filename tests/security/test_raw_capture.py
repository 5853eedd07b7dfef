"""Confidentiality by capture: a raw socket on ``lo`` records every TCP payload byte
between the processes of a 4-site run, as an eavesdropper on the network would. Without a
roster the parameters, the schema's column names and each site's counts are all found in it;
with ``--roster`` no float32 window has cosine above 0.5 with any party's parameters, and none of
the names or counts appears. Skipped where raw sockets are not permitted (no root or
``CAP_NET_RAW``)."""

from __future__ import annotations

import gzip
import struct

import pytest
import torch

from tests.security.raw_capture import LoopbackCapture, best_cosines, raw_socket_refusal
from tests.sites import (
    HAVE_W7A,
    SHARED,
    finish,
    free_port,
    identity_flags,
    make_roster,
    start_party,
)

REFUSAL = raw_socket_refusal()

SITES, ROWS, FEATURES = 4, 200, 300
COLUMNS = [f"w7a_attribute_{j:03d}" for j in range(1, FEATURES + 1)]
LABEL = "is_positive_case"
FLAGS = ["--nodes", str(SITES), "--dataset", "csv", "--train", "train.csv", "--test",
         "test.csv", "--label-column", LABEL, "--positive-label", "1", "--out", "run", "--seed",
         "1", "--no-progress", "--no-plots", "--timeout", "30", "--iterations", "40", "--topology",
         "ring"]  # fmt: skip


def write_csv_sites(root) -> list[bytes]:
    """Each site's own CSV files, every ``SITES``-th row of w7a with named columns; returns the
    markers an eavesdropper must not read: every column name, and each site's counts as the
    schema states them."""
    markers = [name.encode() for name in [*COLUMNS, LABEL]]
    for source, name in (("w7a.gz", "train"), ("w7a.t.gz", "test")):
        with gzip.open(SHARED / "w7a" / source, "rt") as handle:
            lines = [line for line, _ in zip(handle, range(SITES * ROWS), strict=False)]
        for r in range(SITES):
            rows, positives = [], 0
            for line in lines[r::SITES]:
                label, *pairs = line.split()
                dense = ["0"] * FEATURES
                for pair in pairs:
                    index, value = pair.split(":")
                    if int(index) <= FEATURES:
                        dense[int(index) - 1] = value
                positive = int(float(label) > 0)
                positives += positive
                rows.append(",".join([*dense, str(positive)]))
            (root / f"site{r}").mkdir(parents=True, exist_ok=True)
            text = ",".join([*COLUMNS, LABEL]) + "\n" + "\n".join(rows) + "\n"
            (root / f"site{r}" / f"{name}.csv").write_text(text)
            markers.append(f'"{name}_positives":{positives}'.encode())
    return markers


def present(markers: list[bytes], wire: bytes) -> list[bytes]:
    """The ``markers`` found in ``wire``, in order: ``[m for m in markers if m in wire]``, with
    one scan of ``wire`` for the column names' common prefix instead of one scan per name (a
    name is in ``wire`` exactly where the prefix is, followed by the rest of the name)."""
    prefix = COLUMNS[0][:-3].encode()  # "w7a_attribute_"
    named = {m for m in markers if m.startswith(prefix)}
    sizes = {len(m) for m in named}
    seen, at = set(), wire.find(prefix)
    while at >= 0:
        seen.update(wire[at : at + size] for size in sizes)
        at = wire.find(prefix, at + 1)
    return [m for m in markers if (m in seen if m in named else m in wire)]


def captured_run(root, roster):
    """The run's TCP streams on ``lo`` and each site's final parameters (flattened)."""
    port = free_port()
    with LoopbackCapture() as capture:
        keys = [identity_flags(roster, r) if roster else [] for r in range(SITES)]
        parties = [start_party(root, r, port, *FLAGS, *keys[r]) for r in range(SITES)]
        capture.watch(p.pid for p in parties)
        for code, text in finish(parties, timeout=300):
            assert code == 0, text[-3000:]
    models = []
    for r in range(SITES):
        state = torch.load(root / f"site{r}" / "run" / "model.pt", weights_only=False)
        tensors = state if isinstance(state, dict) else {"x": state}
        floats = [v for v in tensors.values() if torch.is_tensor(v) and v.is_floating_point()]
        models.append(torch.cat([v.reshape(-1) for v in floats]))
    return capture, capture.streams(), models


def test_best_cosines_is_the_largest_cosine_of_any_window():
    generator = torch.Generator().manual_seed(3)
    reference = torch.randn(50, generator=generator)
    noise = torch.randn(400, generator=generator)
    noise[100:150] += 0.8 * reference  # a window close to the reference, among noise
    raw = b"xyz" + noise.numpy().tobytes() + struct.pack("<f", float("nan")) + b"\x7f\x7f\xff\xff"
    expected = -1.0
    for shift in range(4):
        floats = torch.frombuffer(bytearray(raw[shift : shift + (len(raw) - shift) // 4 * 4]),
                                  dtype=torch.float32)  # fmt: skip
        windows = torch.nan_to_num(floats.double(), nan=0.0, posinf=0.0, neginf=0.0)
        windows = torch.where(windows.abs() <= 1e4, windows, 0.0).unfold(0, 50, 1)
        cos = torch.nn.functional.cosine_similarity(windows, reference.double()[None], dim=1)
        expected = max(expected, float(cos.max()))
    (found,) = best_cosines([raw], [reference])
    assert expected > 0.5 and abs(found - expected) < 1e-9
    # blocks of 79 windows (FFTs of 128 points): five FFTs per alignment, the same largest cosine
    (blocked,) = best_cosines([raw], [reference], fft_size=128)
    assert abs(blocked - expected) < 1e-9
    assert best_cosines([raw], [-reference])[0] < expected


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")
@pytest.mark.skipif(REFUSAL is not None, reason=f"raw sockets are not permitted: {REFUSAL}")
def test_a_raw_capture_on_loopback_reads_nothing_under_a_roster(tmp_path):
    plain, sealed = tmp_path / "plain", tmp_path / "sealed"
    markers = write_csv_sites(plain)
    assert write_csv_sites(sealed) == markers
    roster = make_roster(sealed, SITES)
    report = {}
    for label, root, key in (("plain", plain, None), ("sealed", sealed, roster)):
        capture, streams, models = captured_run(root, key)
        wire = b"\0".join(streams.values())
        report[label] = {
            "bytes": len(wire) - max(0, len(streams) - 1),
            "streams": len(streams),
            "dropped": capture.dropped,
            "cosine": max(best_cosines(streams.values(), models)),
            "found": [m.decode() for m in present(markers, wire)],
        }
    for label, figures in report.items():
        print(f"\n{label}: {figures['bytes']:,} TCP payload bytes in {figures['streams']} "
              f"streams ({figures['dropped']} frames dropped), best cosine "
              f"{figures['cosine']:.4f}, {len(figures['found'])} of {len(markers)} names and "
              "counts in clear")  # fmt: skip
    clear, hidden = report["plain"], report["sealed"]
    assert clear["dropped"] == 0 and hidden["dropped"] == 0, report
    # the check sees what an eavesdropper sees without sealing: parameters, names and counts
    assert clear["cosine"] > 0.9, report
    assert len(clear["found"]) == len(markers), report
    # with a roster, as much traffic, and none of it readable
    assert hidden["bytes"] >= clear["bytes"] // 2, report
    assert hidden["cosine"] < 0.5, report
    assert hidden["found"] == [], report
