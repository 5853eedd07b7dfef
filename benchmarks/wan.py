"""What slate's distributed engine costs over a wide-area network: 4 sites on w7a, each a
``slate train --rank R`` in its own network namespace, joined by an emulated WAN
(:class:`benchmarks.wan_testbed.WanTestbed`: one-way delay 40 ms, so RTT 80 ms, and 10 Mbit/s
on every site's uplink, by default).

For each setting it records the training time (``wall_seconds``), the whole command's time, the
bytes that really crossed each site's ``wan0`` (IP headers, acknowledgements, rendezvous,
heartbeats and evaluations included) against slate's own count (``comm_bytes_per_party``), and
the ``--wan`` estimates of the distributed run and of a simulator run with the same flags.

``python -m benchmarks.wan [--iterations T] [--sites N] [--delay-ms D] [--rate-mbit R]
[--settings ring,base-2,...] [--json FILE]`` prints the section's markdown lines;
``python -m benchmarks --only wan`` puts them into RESULTS.md. Root and iproute2 are needed;
without them it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.site_runs import Launch, run_sites
from benchmarks.wan_exchange import exchange_rows, exchange_table
from benchmarks.wan_testbed import RDV, RDV_ADDRESS, WanTestbed, counter_deltas, site_address
from slate.communication.gossip import WanLink
from slate.engines.base import DIRECT_ROUND_TRIPS

HERE = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE.parent.parent / "shared" / "data"
ITERATIONS, SITES, DELAY_MS, RATE_MBIT = 2000, 4, 40.0, 10.0
#: Setting key -> (label, the flags it adds to every site's and the simulator's command).
SETTINGS: dict[str, tuple[str, list[str]]] = {
    "ring": ("ring (the paper)", []),
    "base-2": ("base-2, H = 25, int8",
               ["--topology", "base-2", "--gossip-every", "25", "--compress", "int8"]),
    "base-2-stop": ("base-2, H = 25, int8, `--on-party-loss stop`",
                    ["--topology", "base-2", "--gossip-every", "25", "--compress", "int8",
                     "--on-party-loss", "stop"]),
    "base-2-sealed": ("base-2, H = 25, int8, sealed (`--roster`)",
                      ["--topology", "base-2", "--gossip-every", "25", "--compress", "int8"]),
    "base-2-figures": ("base-2, H = 25, int8, figures drawn after leaving",
                       ["--topology", "base-2", "--gossip-every", "25", "--compress", "int8",
                        "--plots"]),
}  # fmt: skip
SEALED = {"base-2-sealed"}  # settings run under a roster: every site its key, signed and sealed
DEFAULT_SETTINGS = ("ring", "base-2", "base-2-stop")
#: Every site's flags (and the simulator's, with ``{rank}`` in the paths), setting apart: no
#: figures (``slate plot`` draws them on demand), but where a setting asks for them.
FLAGS = ["--dataset", "libsvm", "--features", "300", "--seed", "1", "--no-progress",
         "--no-plots"]  # fmt: skip
PORT = 29600
LOCAL_MBIT = 10_000.0  # the testbed "without the WAN": no delay, and this rate
#: What :func:`whole_from_local` reads from the first site's summary.
SUMMARY_KEYS = ("estimated_wan_seconds", "compute_seconds", "store_round_trips",
                "set_up_round_trips")  # fmt: skip


def site_flags(setting_flags: list[str]) -> list[str]:
    """:data:`FLAGS` and then the setting's own; a setting's ``--plots`` (a marker, not a slate
    flag) keeps the figures: it drops ``--no-plots`` and itself."""
    if "--plots" not in setting_flags:
        return [*FLAGS, *setting_flags]
    return [f for f in FLAGS if f != "--no-plots"] + [f for f in setting_flags if f != "--plots"]


def skip_reason() -> str | None:
    """Why this machine cannot run the benchmark (not root, no ``ip``, no TUN), or None."""
    if os.geteuid() != 0:
        return "wan benchmark skipped: it builds network namespaces, which needs root"
    if shutil.which("ip") is None:
        return "wan benchmark skipped: iproute2's `ip` is not installed"
    if not Path("/dev/net/tun").exists():
        return "wan benchmark skipped: no /dev/net/tun"
    return None


def write_shards(root: Path, w7a: Path, sites: int) -> int:
    """Site r gets lines r, r + sites, ... of w7a (``train.svm``) and of w7a.t (``test.svm``)
    in ``root/site{r}``; returns the training rows of site 0."""
    for source, name in (("w7a.gz", "train.svm"), ("w7a.t.gz", "test.svm")):
        with gzip.open(w7a / source, "rt") as handle:
            lines = handle.readlines()
        for r in range(sites):
            (root / f"site{r}").mkdir(parents=True, exist_ok=True)
            (root / f"site{r}" / name).write_text("".join(lines[r::sites]))
    return len((root / "site0" / "train.svm").read_text().splitlines())


def slate(*args: str) -> list[str]:
    """``python -m slate ARGS`` with this interpreter (under ``nice -n N`` when the
    ``SLATE_BENCH_NICE`` variable says N: a machine shared with other work)."""
    nice = os.environ.get("SLATE_BENCH_NICE", "").strip()
    prefix = ["nice", "-n", nice] if nice.lstrip("-").isdigit() else []
    return [*prefix, sys.executable, "-m", "slate", *args]


def wan_flag(delay_ms: float, rate_mbit: float) -> str:
    """``--wan``'s value for this link: ``RTT_MS,MBIT_S``."""
    return f"{2 * delay_ms:g},{rate_mbit:g}"


def distributed_run(
    bed: WanTestbed, root: Path, key: str, flags: list[str], iterations: int, port: int,
    wan: str, limit: float, name: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One run over the testbed: ``slate rendezvous`` in the rendezvous namespace, then every
    site's ``slate train --rank R --external-store``, all started at once. Returns the whole
    command's time (start of the rendezvous to the exit of the last site), every site's
    summary, and each namespace's ``wan0`` counter deltas; raises ``RuntimeError`` with every
    process's stderr if one fails or the run takes over ``limit`` seconds. ``name`` (default
    ``key``) names its keys, run folders and logs."""
    sites = len(bed.addresses) - 1
    env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}  # slate picks wan0
    sealed, key = key in SEALED, name or key
    roster = make_roster(root, sites, key) if sealed else None
    serve = slate("rendezvous", "--host", RDV_ADDRESS, "--port", str(port),
                  *(["--roster", str(roster)] if roster else []))  # fmt: skip
    rendezvous = Launch("slate rendezvous", serve, root / f"{key}-rendezvous.err",
                        {"role": RDV, "env": env})  # fmt: skip
    launches = []
    for r in range(sites):
        command = slate("train", "--rank", str(r), "--nodes", str(sites), "--rendezvous",
                        f"{RDV_ADDRESS}:{port}", "--external-store", "--train", "train.svm",
                        "--test", "test.svm", *site_flags(flags), "--iterations", str(iterations),
                        "--wan", wan, "--out", key)  # fmt: skip
        if roster is not None:
            command += ["--roster", str(roster), "--key", f"{key}-site{r}.key"]
        options = {"role": f"site{r}", "cwd": root / f"site{r}", "env": env}
        launches.append(Launch(f"site {r}", command, root / f"site{r}" / f"{key}.err", options))
    before = bed.counters()
    wall = run_sites(f"WAN {key!r}", rendezvous, launches, limit,
                     lambda command, role, **popen: bed.exec(role, command, **popen))  # fmt: skip
    summaries = [json.loads((root / f"site{r}" / key / "summary.json").read_text())
                 for r in range(sites)]  # fmt: skip
    return {"whole_seconds": wall, "summaries": summaries, "rtt_ms": float(wan.split(",")[0]),
            "wire": counter_deltas(before, bed.counters())}  # fmt: skip


def make_roster(root: Path, sites: int, key: str) -> Path:
    """A key per site (``site{r}/{key}-site{r}.key``) and the run's roster of them all."""
    from slate.security import make_roster as roster_of
    from slate.security import write_keypair, write_roster

    publics = [write_keypair(root / f"site{r}" / f"{key}-site{r}")[1] for r in range(sites)]
    return write_roster(roster_of(publics, run_id=f"wan-{key}"), root / f"roster-{key}.json")


def simulator_run(root: Path, key: str, flags: list[str], iterations: int, sites: int,
                  wan: str) -> dict[str, Any]:  # fmt: skip
    """The same setting in one process (``--engine simulator``), each party reading its site's
    files (``{rank}`` in the paths); returns its summary."""
    out = root / f"sim-{key}"
    command = slate("train", "--engine", "simulator", "--nodes", str(sites),
                    "--train", str(root / "site{rank}" / "train.svm"),
                    "--test", str(root / "site{rank}" / "test.svm"), *site_flags(flags),
                    "--iterations", str(iterations), "--wan", wan,
                    "--out", str(out))  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    whole = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    return {**json.loads((out / "summary.json").read_text()), "whole_seconds": whole}


def whole_estimate(summary: dict[str, Any], simulated: dict[str, Any], rtt_ms: float) -> float:
    """The ``--wan`` estimate of the whole command (:meth:`WanLink.whole_seconds`): the site's
    training estimate, the simulator's own work outside training (its whole command less its
    training: interpreter, imports, reading, outputs, with no wire at all), the store's round
    trips (``store_round_trips``), the collectives' before training
    (``set_up_round_trips``) and the token exchange before leaving (one direct exchange)."""
    link = WanLink(rtt_ms, 1.0)
    local = max(0.0, simulated["whole_seconds"] - simulated["wall_seconds"])
    teardown = DIRECT_ROUND_TRIPS
    return link.whole_seconds(summary["estimated_wan_seconds"], local,
                              summary.get("store_round_trips", 0),
                              summary.get("set_up_round_trips", 0), teardown)  # fmt: skip


def whole_from_local(summary: dict[str, Any], local_whole: float, rtt_ms: float) -> float:
    """The whole command predicted from the same command run on the testbed without its WAN
    (``local_whole``: no delay, no rate limit, the same processes sharing the same cores), plus
    what the ``--wan`` estimate charges the network: the training's round trips and bytes
    (``estimated_wan_seconds`` less ``compute_seconds``), and the set-up's and teardown's round
    trips (:meth:`WanLink.whole_seconds` with no training and no local work)."""
    network = summary["estimated_wan_seconds"] - summary["compute_seconds"]
    link = WanLink(rtt_ms, 1.0)
    outside = link.whole_seconds(
        0.0,
        0.0,
        summary.get("store_round_trips", 0),
        summary.get("set_up_round_trips", 0),
        DIRECT_ROUND_TRIPS,
    )
    return local_whole + network + outside


def result_row(label: str, run: dict[str, Any], simulated: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one setting, from its distributed run and its simulator run."""
    summaries, wire = run["summaries"], run["wire"]
    sites = [wire[ns] for ns in wire if ns != RDV]
    first = summaries[0]
    slowest = max(summaries, key=lambda s: s["wall_seconds"])
    evaluation = [s.get("eval_bytes_per_party") for s in summaries]
    return {
        "setting": label,
        "training_seconds": slowest["wall_seconds"],
        "evaluation_seconds": slowest["evaluation_seconds"],
        "whole_seconds": run["whole_seconds"],
        "wire_tx_per_site": sum(s["tx_bytes"] for s in sites) / len(sites),
        "wire_rx_per_site": sum(s["rx_bytes"] for s in sites) / len(sites),
        "wire_tx_rendezvous": wire[RDV]["tx_bytes"] if RDV in wire else None,
        "wire": wire,
        "comm_bytes_per_party": first["comm_bytes_per_party"],
        "eval_bytes_per_party": None if None in evaluation else max(evaluation),
        "rounds": first.get("rounds"),
        "estimated_wan_seconds": first["estimated_wan_seconds"],
        "estimated_whole_seconds": whole_estimate(first, simulated, run["rtt_ms"])
        if "rtt_ms" in run and "whole_seconds" in simulated
        else None,
        "simulator_estimated_wan_seconds": simulated["estimated_wan_seconds"],
        "simulator_comm_bytes_per_party": simulated["comm_bytes_per_party"],
        "simulator_wall_seconds": simulated["wall_seconds"],
        "simulator_evaluation_seconds": simulated["evaluation_seconds"],
        "simulator_test_ap": simulated["test_ap"],
        "test_ap": [s["test_ap"] for s in summaries],
        "first_summary": {key: first.get(key) for key in SUMMARY_KEYS},
    }


def ratio(a: float | None, b: float | None) -> str:
    """``a / b`` as ``1.23x``, or ``n/a`` when either is missing or ``b`` is 0."""
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def megabytes(value: float | None) -> str:
    """Bytes as MB (10^6 bytes), two decimals, or ``n/a``."""
    return f"{value / 1e6:.2f}" if value is not None else "n/a"


def ap_cell(aps: Sequence[float]) -> str:
    """Every site's test AP: one value when they all agree (federated), else each."""
    if max(aps) - min(aps) < 5e-5:
        return f"{aps[0]:.4f} (every site)"
    return " / ".join(f"{ap:.4f}" for ap in aps)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of the settings, then the first setting against each other one."""
    lines = ["| setting | training (s) | of which evaluations (s) | whole command (s) | "
             "wire tx per site (MB) | wire rx per site (MB) | slate's bytes per party (MB) | "
             "evaluation bytes per party (MB) | wire tx / slate's | `--wan` estimate, "
             "distributed (s) | `--wan` estimate, simulator (s) | distributed estimate / "
             "training | simulator estimate / training | test AP |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        lines.append(
            f"| {row['setting']} | {row['training_seconds']:.1f} | "
            f"{row['evaluation_seconds']:.1f} | {row['whole_seconds']:.1f} | "
            f"{megabytes(row['wire_tx_per_site'])} | {megabytes(row['wire_rx_per_site'])} | "
            f"{megabytes(row['comm_bytes_per_party'])} | "
            f"{megabytes(row['eval_bytes_per_party'])} | "
            f"{ratio(row['wire_tx_per_site'], row['comm_bytes_per_party'])} | "
            f"{row['estimated_wan_seconds']:.1f} | "
            f"{row['simulator_estimated_wan_seconds']:.1f} | "
            f"{ratio(row['estimated_wan_seconds'], row['training_seconds'])} | "
            f"{ratio(row['simulator_estimated_wan_seconds'], row['training_seconds'])} | "
            f"{ap_cell(row['test_ap'])} |"
        )
    if any(row.get("estimated_whole_seconds") for row in rows):
        lines += ["", "| setting | whole command (s) | `--wan` estimate of the whole command (s) "
                  "| estimate / measured | the same command without the WAN (s) | it plus what "
                  "the estimate charges the network (s) | that / measured |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in rows:
            guess, local = row.get("estimated_whole_seconds"), row.get("local_whole_seconds")
            from_local = row.get("whole_from_local_seconds")
            lines.append(
                f"| {row['setting']} | {row['whole_seconds']:.1f} | "
                f"{'n/a' if guess is None else f'{guess:.1f}'} | "
                f"{ratio(guess, row['whole_seconds'])} | "
                f"{'n/a' if local is None else f'{local:.1f}'} | "
                f"{'n/a' if from_local is None else f'{from_local:.1f}'} | "
                f"{ratio(from_local, row['whole_seconds'])} |"
            )
    if len(rows) > 1:
        base = rows[0]
        lines += ["", f"| {base['setting']} against | training time | whole command | "
                  "wire tx per site |", "|---|---|---|---|"]  # fmt: skip
        for row in rows[1:]:
            lines.append(
                f"| {row['setting']} | "
                f"{ratio(base['training_seconds'], row['training_seconds'])} | "
                f"{ratio(base['whole_seconds'], row['whole_seconds'])} | "
                f"{ratio(base['wire_tx_per_site'], row['wire_tx_per_site'])} |"
            )
    return lines


def section(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The RESULTS.md section: heading, table, and what was run."""
    command = "python -m benchmarks --only wan" + "".join(
        f" --{flag} {meta[key]}" for flag, key, default in (
            ("iterations", "iterations", ITERATIONS), ("sites", "sites", SITES),
            ("delay-ms", "delay_ms", DELAY_MS), ("rate-mbit", "rate_mbit", RATE_MBIT))
        if meta[key] != default
    )  # fmt: skip
    if meta["settings"] != list(DEFAULT_SETTINGS):
        command += f" --settings {','.join(meta['settings'])}"
    late = meta.get("emulator") or {}
    lateness = (f" The emulator delivered packets {late['late_mean_ms']:.1f} ms late on average "
                f"(at most {late['late_max_ms']:.0f} ms) and dropped {late['dropped']}."
                if late else "")  # fmt: skip
    rtt = 2 * meta["delay_ms"]
    exchange = meta.get("exchange") or []
    probes = [
        "", *exchange_table(exchange, meta["sites"]),
        "\nEach exchange alone, as slate's distributed engine calls gloo, on the same testbed "
        "(`benchmarks/wan_exchange.py`: the median of 15 calls, 5 ms apart), next to what the "
        "estimate charges for it: RTTs per collective from "
        "`slate.engines.base.all_reduce_round_trips` and `all_gather_round_trips`, bytes at the "
        "line rate (a gossip exchange at `slate.communication.gossip.EXCHANGE_GOODPUT` of it).",
    ] if exchange else []  # fmt: skip
    return [
        "\n## Over an emulated WAN (one network namespace per site, w7a)\n",
        *table(rows),
        f"\n`{command}`: {meta['sites']} sites ({meta['rows']:,} w7a training rows each, "
        f"every {meta['sites']}th line of w7a and of w7a.t), each a `slate train --rank R "
        "--external-store` in its own network namespace, the `slate rendezvous` in another, "
        f"joined by `benchmarks/wan_testbed.py`: one-way delay {meta['delay_ms']:g} ms (RTT "
        f"{rtt:g} ms) and {meta['rate_mbit']:g} Mbit/s on every namespace's uplink. Every site: "
        f"`{' '.join(FLAGS)} --iterations {meta['iterations']} --wan "
        f"{wan_flag(meta['delay_ms'], meta['rate_mbit'])}` and the setting's flags (*figures "
        "drawn after leaving*: without `--no-plots`). *Training* is "
        "the largest `wall_seconds` of the sites' `summary.json` (of which that site's "
        "`evaluation_seconds`, its federated test evaluations); *whole command* runs from "
        "starting the rendezvous to the exit of the last site. *Wire* bytes are the deltas of "
        "each namespace's `wan0` counters over the run (IP headers, TCP acknowledgements, the "
        "rendezvous, heartbeats and evaluations included), a mean over the sites; *slate's "
        "bytes* are `comm_bytes_per_party`. The `--wan` estimate "
        "(`estimated_wan_seconds`, [docs/wan.md](../docs/wan.md)) is one party's compute "
        "(without its network waits), an RTT per gossip round and per round trip of the other "
        "collectives, and the busiest party's bytes at the link's rate; the simulator's comes "
        "from the same flags in one process (`--engine simulator`, each party on its site's "
        f"files), before any wire exists.{lateness} "
        "All processes share the machine's cores.",
        *probes,
    ]


def wan_benchmark(
    data_dir: Path, iterations: int = ITERATIONS, sites: int = SITES,
    delay_ms: float = DELAY_MS, rate_mbit: float = RATE_MBIT,
    settings: Sequence[str] = DEFAULT_SETTINGS, raw_json: Path | None = None,
    local: bool = True,
) -> list[str] | None:  # fmt: skip
    """Run every setting over a fresh testbed and return the section's lines; None (after
    printing one line) where this machine cannot build the testbed. With ``local``, each
    setting runs again on a testbed without delay or rate limit (:func:`whole_from_local`)."""
    reason = skip_reason()
    if reason is not None:
        print(reason, flush=True)
        return None
    unknown = [key for key in settings if key not in SETTINGS]
    if unknown:
        raise SystemExit(f"unknown settings {unknown}; choose from {', '.join(SETTINGS)}")
    site_address(sites - 1)  # at most 253 sites
    wan = wan_flag(delay_ms, rate_mbit)
    limit = 600 + 2.0 * iterations  # seconds before a run counts as stuck
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"iterations": iterations, "sites": sites, "delay_ms": delay_ms,
                            "rate_mbit": rate_mbit, "settings": list(settings)}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="slate-wan-") as tmp:
        root = Path(tmp)
        meta["rows"] = write_shards(root, Path(data_dir) / "w7a", sites)
        with WanTestbed(sites, delay_ms, rate_mbit) as bed:
            meta["exchange"] = exchange_rows(bed, root, PORT + 99)
            print("\n".join(exchange_table(meta["exchange"], sites)), file=sys.stderr, flush=True)
            for k, key in enumerate(settings):
                label, flags = SETTINGS[key]
                run = distributed_run(bed, root, key, flags, iterations, PORT + k, wan, limit)
                simulated = simulator_run(root, key, flags, iterations, sites, wan)
                rows.append(result_row(label, run, simulated))
                print(table(rows[-1:])[-1], file=sys.stderr, flush=True)
            meta["emulator"] = bed.stats()
        if local:  # the same commands with no delay and no rate limit, on the same cores
            with WanTestbed(sites, 0.0, LOCAL_MBIT) as bed:
                for k, (key, row) in enumerate(zip(settings, rows, strict=True)):
                    label, flags = SETTINGS[key]
                    run = distributed_run(bed, root, key, flags, iterations, PORT + 50 + k,
                                          wan, limit, f"{key}-local")  # fmt: skip
                    row["local_whole_seconds"] = run["whole_seconds"]
                    row["whole_from_local_seconds"] = whole_from_local(
                        row["first_summary"], run["whole_seconds"], 2 * delay_ms
                    )
    lines = section(rows, meta)
    if raw_json is not None:
        raw_json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return lines


def _terminate_gracefully() -> None:
    """SIGTERM raises SystemExit, so the testbed is taken down as after Ctrl-C."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def add_options(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options (also those of ``python -m benchmarks --only wan``)."""
    group = parser.add_argument_group("wan (root only)")
    group.add_argument("--iterations", type=int, default=None, help=f"default {ITERATIONS}")
    group.add_argument("--sites", type=int, default=SITES)
    group.add_argument("--delay-ms", type=float, default=DELAY_MS, help="one way")
    group.add_argument("--rate-mbit", type=float, default=RATE_MBIT, help="per site's uplink")
    group.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                       help=f"comma-separated, of: {', '.join(SETTINGS)}")  # fmt: skip
    group.add_argument("--json", type=Path, default=None, help="write the raw numbers here")
    group.add_argument("--no-local", action="store_true",
                       help="skip the runs without the WAN (the estimate from them)")  # fmt: skip


def run_from_options(args: argparse.Namespace, data_dir: Path, quick: bool) -> list[str] | None:
    """:func:`wan_benchmark` with parsed options (``--quick``: 400 iterations by default)."""
    _terminate_gracefully()
    iterations = args.iterations or (400 if quick else ITERATIONS)
    settings = [key.strip() for key in args.settings.split(",") if key.strip()]
    return wan_benchmark(data_dir, iterations, args.sites, args.delay_ms, args.rate_mbit,
                         settings, args.json, not args.no_local)  # fmt: skip


def main() -> None:
    """``python -m benchmarks.wan [options]``: print the section's lines."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wan")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--quick", action="store_true", help="400 iterations")
    add_options(parser)
    args = parser.parse_args()
    lines = run_from_options(args, args.data_dir, args.quick)
    if lines is not None:
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
