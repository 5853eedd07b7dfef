"""The WAN benchmark's pure parts: the emulator's link schedule, the counters, the table.
Nothing here builds a namespace or needs root."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from benchmarks import wan, wan_exchange
from benchmarks.wan_testbed import (
    COUNTERS,
    counter_deltas,
    departure,
    parse_counters,
    site_address,
)


def brute_force_due(packets: list[tuple[float, int]], rate_bps: float, delay: float) -> list[float]:
    """Each packet's delivery time on a FIFO link, in closed form: it leaves once the link has
    sent every packet from the start of its busy period, i.e. the latest, over the earlier
    packets j, of j's arrival plus the serialisation of packets j..k; then the delay."""
    due = []
    for k in range(len(packets)):
        finish = max(
            packets[j][0] + sum(size * 8 / rate_bps for _, size in packets[j : k + 1])
            for j in range(k + 1)
        )
        due.append(finish + delay)
    return due


@pytest.mark.parametrize("seed", range(20))
def test_departure_matches_the_closed_form_of_a_fifo_link(seed):
    rng = random.Random(seed)
    rate, delay = rng.choice([1e6, 10e6, 100e6]), rng.choice([0.0, 0.04, 0.1])
    arrival, packets = 0.0, []
    for _ in range(rng.randint(1, 40)):
        arrival += rng.expovariate(1 / 0.001)  # bursts and gaps around a packet's 1.2 ms
        packets.append((arrival, rng.randint(40, 1500)))
    link_free, due = 0.0, []
    for at, size in packets:
        link_free = departure(at, link_free, size, rate)
        due.append(link_free + delay)
    assert due == pytest.approx(brute_force_due(packets, rate, delay), abs=1e-12)


def test_departure_of_an_idle_and_of_a_busy_link():
    assert departure(1.0, 0.5, 1250, 10e6) == pytest.approx(1.001)  # 10 000 bits at 10 Mbit/s
    assert departure(1.0, 2.0, 1250, 10e6) == pytest.approx(2.001)  # waits for the link


def test_counters_are_parsed_in_order_and_differenced():
    before = {"site0": parse_counters("100\n200\n3\n4\n")}
    after = {"site0": parse_counters("1100 1200 13 14")}
    assert list(before["site0"]) == list(COUNTERS)
    assert counter_deltas(before, after) == {
        "site0": {"tx_bytes": 1000, "rx_bytes": 1000, "tx_packets": 10, "rx_packets": 10}
    }
    with pytest.raises(ValueError):
        parse_counters("1 2 3")


def test_site_addresses_stay_off_the_other_testbeds_subnet():
    assert site_address(0) == "10.78.0.1"
    assert site_address(3) == "10.78.0.4"
    with pytest.raises(ValueError):
        site_address(253)  # would be the rendezvous's 10.78.0.254


def _row(label: str, seconds: float, wire: float, eval_bytes: float | None) -> dict:
    run = {
        "whole_seconds": seconds + 5,
        "summaries": [
            {
                "wall_seconds": seconds - r,
                "evaluation_seconds": 5.0 - r,
                "comm_bytes_per_party": wire / 2,
                "test_ap": 0.7,
                "estimated_wan_seconds": 2 * seconds,
                "rounds": 10,
                **({"eval_bytes_per_party": eval_bytes} if eval_bytes is not None else {}),
            }
            for r in range(2)
        ],
        "wire": {
            "site0": {"tx_bytes": wire, "rx_bytes": wire},
            "site1": {"tx_bytes": 3 * wire, "rx_bytes": 3 * wire},
            "rdv": {"tx_bytes": 7, "rx_bytes": 7},
        },
    }
    simulated = {"estimated_wan_seconds": seconds / 2, "comm_bytes_per_party": wire / 2,
                 "wall_seconds": 1.0, "test_ap": 0.7, "evaluation_seconds": 0.1}  # fmt: skip
    return wan.result_row(label, run, simulated)


def test_result_rows_take_the_slowest_site_and_the_mean_wire_bytes():
    row = _row("ring", 100.0, 1e6, None)
    assert row["training_seconds"] == 100.0
    assert row["wire_tx_per_site"] == 2e6  # (1 + 3) / 2 MB: the rendezvous is not a site
    assert row["eval_bytes_per_party"] is None  # summaries without it
    assert _row("ring", 100.0, 1e6, 5e5)["eval_bytes_per_party"] == 5e5


def test_the_table_shows_ratios_against_the_first_setting():
    rows = [_row("ring", 100.0, 4e6, None), _row("base-2", 25.0, 1e6, 2e5)]
    lines = wan.table(rows)
    assert lines[2].startswith("| ring | 100.0 | 5.0 | 105.0 | 8.00 | 8.00 | 2.00 | n/a | 4.00x |")
    assert "| 2.00x | 0.50x | 0.7000 (every site) |" in lines[2]  # 200 / 100, 50 / 100
    assert lines[3].startswith("| base-2 | 25.0 | 5.0 | 30.0 | 2.00 | 2.00 | 0.50 | 0.20 |")
    assert lines[-1] == "| base-2 | 4.00x | 3.50x | 4.00x |"


def test_formatting_helpers():
    assert wan.ratio(3.0, 2.0) == "1.50x"
    assert wan.ratio(None, 2.0) == wan.ratio(1.0, 0) == "n/a"
    assert wan.megabytes(1_234_567) == "1.23"
    assert wan.ap_cell([0.5, 0.6]) == "0.5000 / 0.6000"
    assert wan.wan_flag(40, 10) == "80,10"


def test_the_section_names_its_command_and_link():
    meta = {"iterations": 200, "sites": 4, "delay_ms": 40.0, "rate_mbit": 10.0, "rows": 6175,
            "settings": ["ring"], "emulator": None}  # fmt: skip
    lines = wan.section([_row("ring", 10.0, 1e6, None)], meta)
    assert lines[0].startswith("\n## Over an emulated WAN (")
    text = "\n".join(lines)
    assert "`python -m benchmarks --only wan --iterations 200 --settings ring`" in text
    assert "RTT 80 ms" in text and "--wan 80,10" in text


def test_without_root_it_prints_one_line_and_skips(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(wan.os, "geteuid", lambda: 1000)
    assert wan.wan_benchmark(tmp_path, iterations=10) is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "skipped" in out and "root" in out


def test_without_ip_it_skips(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(wan.os, "geteuid", lambda: 0)
    monkeypatch.setattr(wan.shutil, "which", lambda _: None)
    assert wan.wan_benchmark(tmp_path, iterations=10) is None
    assert "`ip`" in capsys.readouterr().out


def test_each_site_gets_every_nth_line(tmp_path: Path):
    source = tmp_path / "w7a"
    source.mkdir()
    for name, prefix in (("w7a.gz", "train"), ("w7a.t.gz", "test")):
        with gzip.open(source / name, "wt") as handle:
            handle.writelines(f"{prefix}{i}\n" for i in range(10))
    assert wan.write_shards(tmp_path / "sites", source, 4) == 3
    assert (tmp_path / "sites/site1/train.svm").read_text() == "train1\ntrain5\ntrain9\n"
    assert (tmp_path / "sites/site3/test.svm").read_text() == "test3\ntest7\n"


def test_the_exchange_model_is_round_trips_plus_bytes_at_the_line_rate():
    rtt, bits_per_ms = 80.0, 10e6 / 1e3  # 80 ms, 10 Mbit/s
    flags = wan_exchange.Probe("flags", "all-reduce", 8)
    # 2 float32s: 3 round trips (measured 236 ms), 2 * 3 / 4 of 8 bytes with IP/TCP headers.
    assert wan_exchange.modelled_ms(flags, 4, rtt, 10.0) == pytest.approx(
        3 * rtt + 1.5 * 8 * 8 * (1500 / 1448) / bits_per_ms
    )
    mean = wan_exchange.Probe("mean", "all-reduce", 33_828)
    assert wan_exchange.modelled_ms(mean, 4, rtt, 10.0) == pytest.approx(
        6 * rtt + 1.5 * 33_828 * 8 * (1500 / 1448) / bits_per_ms
    )
    gather = wan_exchange.Probe("gather", "all-gather", 1000)
    assert wan_exchange.modelled_ms(gather, 4, rtt, 10.0) == pytest.approx(
        3 * rtt + 3 * 1000 * 8 * (1500 / 1448) / bits_per_ms
    )
    ring = wan_exchange.Probe("ring", "exchange", 33_828, 2)
    assert wan_exchange.modelled_ms(ring, 4, rtt, 10.0) == pytest.approx(
        rtt + 2 * 33_828 * 8 / (0.5 * bits_per_ms)
    )


def test_the_exchange_table_shows_model_over_measured():
    rows = [{"probe": "p", "measured_ms": 200.0, "modelled_ms": 150.0}]
    assert wan_exchange.exchange_table(rows, 4)[-1] == "| p | 200.0 | 150.0 | 0.75x |"


def test_sites_skip_the_figures_unless_the_setting_keeps_them():
    plain = wan.site_flags(wan.SETTINGS["base-2"][1])
    assert "--no-plots" in plain and plain[-6:] == wan.SETTINGS["base-2"][1]
    kept = wan.site_flags(wan.SETTINGS["base-2-figures"][1])
    assert "--no-plots" not in kept and "--plots" not in kept
    assert kept == [f for f in plain if f != "--no-plots"]


def test_the_whole_command_from_a_run_without_the_wan_adds_what_the_estimate_charges_it():
    """The same command with no delay (local), plus the training's network share of its
    estimate (estimate less compute) and an RTT per store and set-up round trip and one for the
    token exchange before leaving."""
    summary = {"estimated_wan_seconds": 12.0, "compute_seconds": 3.0, "store_round_trips": 16,
               "set_up_round_trips": 3}  # fmt: skip
    assert wan.whole_from_local(summary, 7.5, 80.0) == pytest.approx(7.5 + 9.0 + 0.08 * 20)
    rows = [_row("base-2", 25.0, 1e6, 2e5)]
    rows[0].update(estimated_whole_seconds=20.0, local_whole_seconds=7.5,
                   whole_from_local_seconds=27.0)  # fmt: skip
    assert "| base-2 | 30.0 | 20.0 | 0.67x | 7.5 | 27.0 | 0.90x |" in wan.table(rows)
