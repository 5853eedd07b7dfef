r"""``slate reproduce communication``: what each way of talking less costs in AP
(``docs/communication.md``).

For each dataset (w7a and Fashion-MNIST by default, the paper's presets: N = 20, SLATE), the
study trains every :class:`Setting` for each seed: the paper's ring (one dense exchange per
iteration), federated averaging every ``q`` steps (an all-reduce), local steps
:math:`H \in \{5, 10, 25, 50\}` on the ring, the ``base-2`` graph (one peer per round, exact
average after a cycle), each CHOCO compressor on the ring, and ``base-2`` with local steps and
compression together. Every run is an ordinary ``slate train`` run in
``OUT/<dataset>/communication/<setting>/seed<k>/``, reused when it holds a ``summary.json``.

The report (``OUT/communication.md``, figures and CSVs in ``OUT/figures/``) gives, per dataset,
the final AP (mean ± std over seeds), rounds and bytes per party against the ring, AP against
bytes and against rounds, and a recommendation table: for each WAN link (RTT 20/80/150 ms at
10/100 Mbit/s), the serverless setting (neighbour exchanges only) whose final mean AP is within
``AP_TOLERANCE`` of the ring's and that reaches that AP soonest, with

.. math::

    T = T_{\mathrm{compute}} + R \cdot \mathrm{RTT} + 8 B / \mathrm{bandwidth}

at the first evaluation where the mean AP reaches the ring's final mean AP minus the tolerance
(:class:`slate.gossip.WanLink`; :math:`R` rounds and :math:`B` bytes per party so far,
:math:`T_{\mathrm{compute}}` the simulator's measured training time per iteration, all N
parties in one process, so an upper bound for one site).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slate import plots
from slate.gossip import WanLink
from slate.reproduce import _train_config, default_config_dir, load_preset, run_or_reuse
from slate.studies.tables import markdown_table, write_csv

__all__ = ["LINKS", "Setting", "communication", "settings_for"]

AP_TOLERANCE = 0.005  # the acceptance criterion: mean AP >= ring's mean - 0.005
LINKS = tuple(WanLink(rtt, bw) for rtt in (20.0, 80.0, 150.0) for bw in (10.0, 100.0))
LOCAL_STEPS = (5, 10, 25, 50)
#: Per dataset: the federated period q, the H of the combined settings, the evaluation interval.
PLANS = {"w7a": (50, 25, 250), "fashion-mnist": (10, 10, 30)}
DEFAULT_PLAN = (10, 10, None)
FIGURES = "figures"


@dataclass(frozen=True)
class Setting:
    """One way to talk: a folder key, a label, the flags it sets, and whether it is serverless
    (neighbour exchanges only: no all-reduce, no server)."""

    key: str
    label: str
    flags: dict[str, Any] = field(default_factory=dict)
    serverless: bool = True

    def command_flags(self) -> str:
        names = {"fed_period": "--fed-period", "gossip_every": "--gossip-every"}
        parts = [f"{names.get(k, '--' + k.replace('_', '-'))} {v}" for k, v in self.flags.items()]
        return " ".join(parts) if parts else "(defaults)"


def settings_for(dataset: str) -> list[Setting]:
    """The study's settings for ``dataset`` (``PLANS`` sets q and the combined H)."""
    q, h, _ = PLANS.get(dataset, DEFAULT_PLAN)
    out = [
        Setting("ring", "ring, H = 1 (the paper)"),
        Setting(f"federated-q{q}", f"federated, q = {q} (all-reduce)",
                {"topology": "federated", "fed_period": q}, serverless=False),
    ]  # fmt: skip
    out += [Setting(f"ring-H{k}", f"ring, H = {k}", {"gossip_every": k}) for k in LOCAL_STEPS]
    out += [
        Setting("base2", "base-2, H = 1", {"topology": "base-2"}),
        Setting(f"base2-H{h}", f"base-2, H = {h}", {"topology": "base-2", "gossip_every": h}),
    ]
    for spec in ("int8", "topk:0.01", "sign"):
        out.append(Setting(f"ring-{spec.replace(':', '')}", f"ring, {spec}", {"compress": spec}))
    for spec in ("int8", "sign"):
        flags = {"topology": "base-2", "gossip_every": h, "compress": spec}
        out.append(Setting(f"base2-H{h}-{spec}", f"base-2, H = {h}, {spec}", flags))
    return out


@dataclass
class Outcome:
    """A setting's runs over the seeds: summaries and history columns."""

    setting: Setting
    summaries: list[dict[str, Any]]
    histories: list[dict[str, np.ndarray]]

    def final(self, key: str) -> tuple[float, float]:
        values = [float(s[key]) for s in self.summaries]
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    def mean_column(self, column: str) -> np.ndarray:
        return np.mean([h[column] for h in self.histories], axis=0)

    def std_column(self, column: str) -> np.ndarray:
        return np.std([h[column] for h in self.histories], axis=0)

    def seconds_per_iteration(self) -> float:
        """Measured training time per iteration (wall minus evaluations and loading)."""
        per = [
            (s["wall_seconds"] - s["evaluation_seconds"]) / max(1, s["iterations"])
            for s in self.summaries
        ]
        return statistics.fmean(per)


def _read_history(folder: Path) -> dict[str, np.ndarray]:
    with open(folder / "history.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}


def time_to_target(outcome: Outcome, target: float, link: WanLink) -> float:
    """Estimated WAN seconds until the mean AP first reaches ``target`` (NaN: never)."""
    ap = outcome.mean_column("test_ap")
    hits = np.flatnonzero(ap >= target)
    if hits.size == 0:
        return math.nan
    i = int(hits[0])
    iteration = float(outcome.mean_column("iteration")[i])
    compute = outcome.seconds_per_iteration() * iteration
    rounds = float(outcome.mean_column("rounds")[i])
    sent = float(outcome.mean_column("comm_bytes_per_party")[i])
    return link.seconds(compute, rounds, sent)


def communication(
    data_dir: str | None,
    out: Path,
    *,
    datasets: Sequence[str] = ("w7a", "fashion-mnist"),
    seeds: Sequence[int] = (0, 1, 2),
    config_dir: Path | None = None,
    device: str = "cpu",
    iterations: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, list[dict[str, Any]]]:
    """Run (or reuse) every dataset x setting x seed and write the report; returns the rows."""
    config_dir = config_dir or default_config_dir()
    figures = out / FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    sections, results = [], {}
    for dataset in datasets:
        preset = load_preset(dataset, config_dir)
        outcomes = _run_dataset(preset, data_dir, out, seeds, device, iterations, log)
        rows, text = _dataset_report(dataset, preset, outcomes, figures)
        results[dataset] = rows
        sections.append(text)
    report = _report_header(seeds, datasets) + "\n\n".join(sections)
    (out / "communication.md").write_text(report)
    log(f"wrote {out / 'communication.md'}")
    return results


def _run_dataset(preset, data_dir, out, seeds, device, iterations, log) -> list[Outcome]:
    dataset = preset["dataset"]
    _, _, every = PLANS.get(dataset, DEFAULT_PLAN)
    outcomes = []
    for setting in settings_for(dataset):
        summaries, histories = [], []
        for seed in seeds:
            folder = out / dataset / "communication" / setting.key / f"seed{seed}"
            log(f"{dataset} {setting.key} seed {seed}")
            config = _train_config(
                preset, "slate", seed, data_dir=data_dir, device=device, iterations=iterations,
                eval_every=every if iterations is None else None, **setting.flags,
            )  # fmt: skip
            summaries.append(run_or_reuse(config, folder, log))
            histories.append(_read_history(folder))
        outcomes.append(Outcome(setting, summaries, histories))
    return outcomes


def _dataset_report(
    dataset: str, preset: dict[str, Any], outcomes: list[Outcome], figures: Path
) -> tuple[list[dict[str, Any]], str]:
    ring = outcomes[0]
    ring_ap, _ = ring.final("test_ap")
    ring_rounds, _ = ring.final("rounds")
    ring_bytes, _ = ring.final("comm_bytes_per_party")
    target = ring_ap - AP_TOLERANCE
    rows, cells = [], []
    for outcome in outcomes:
        ap, ap_std = outcome.final("test_ap")
        rounds, _ = outcome.final("rounds")
        sent, _ = outcome.final("comm_bytes_per_party")
        row = {
            "dataset": dataset, "setting": outcome.setting.key, "flags":
            outcome.setting.command_flags(), "serverless": outcome.setting.serverless,
            "ap_mean": ap, "ap_std": ap_std, "rounds": rounds, "bytes_per_party": sent,
            "fewer_rounds": ring_rounds / rounds if rounds else math.inf,
            "fewer_bytes": ring_bytes / sent if sent else math.inf,
            "meets_ap": ap >= target,
        }  # fmt: skip
        rows.append(row)
        cells.append([
            outcome.setting.label, f"`{row['flags']}`", f"{ap:.4f} ± {ap_std:.4f}",
            f"{ap - ring_ap:+.4f}", f"{rounds:.0f}", f"{row['fewer_rounds']:.1f}x",
            f"{sent / 1e6:.3g}", f"{row['fewer_bytes']:.1f}x",
            "yes" if outcome.setting.serverless else "no (all-reduce)",
        ])  # fmt: skip
    write_csv(rows, figures / f"communication_{dataset}.csv")
    curves = _plot_curves(dataset, outcomes, figures)
    recommend = _recommendations(outcomes, target, ring)
    table = markdown_table(
        ["setting", "flags", "final test AP", "Δ vs ring", "rounds", "fewer rounds",
         "MB per party", "fewer bytes", "serverless"],
        cells,
    )  # fmt: skip
    iterations = int(ring.summaries[0]["iterations"])
    text = (
        f"## {dataset}\n\nSLATE, N = {preset['nodes']}, {iterations} iterations, the preset's "
        f"step size and batch, {len(ring.summaries)} seeds. The ring's final AP is "
        f"{ring_ap:.4f}; a setting meets the AP criterion at a mean of at least "
        f"{target:.4f} (ring − {AP_TOLERANCE}).\n\n{table}\n\n{curves}\n"
        f"### Which flags for which link ({dataset})\n\nEstimated time until the mean AP "
        f"reaches {target:.4f}, among the serverless settings that meet the AP criterion "
        f"(compute: {ring.seconds_per_iteration() * 1e3:.2f} ms per iteration measured for "
        f"all N parties in the simulator).\n\n{recommend}\n"
    )
    return rows, text


def _recommendations(outcomes: list[Outcome], target: float, ring: Outcome) -> str:
    eligible = [
        o for o in outcomes if o.setting.serverless and o.final("test_ap")[0] >= target + 0.0
    ]
    cells = []
    for link in LINKS:
        times = {o.setting.key: time_to_target(o, target, link) for o in eligible}
        finite = {k: t for k, t in times.items() if math.isfinite(t)}
        ring_time = time_to_target(ring, target, link)
        if not finite:
            cells.append([str(link), "—", "—", _seconds(ring_time), "—"])
            continue
        best = min(finite, key=finite.get)
        setting = next(o.setting for o in eligible if o.setting.key == best)
        cells.append([
            str(link), f"`{setting.command_flags()}`", _seconds(finite[best]),
            _seconds(ring_time), f"{ring_time / finite[best]:.0f}x",
        ])  # fmt: skip
    return markdown_table(["link", "use", "time to target", "ring (the paper)", "faster"], cells)


def _plot_curves(dataset: str, outcomes: list[Outcome], figures: Path) -> str:
    text = ""
    for column, unit, name in (
        ("comm_bytes_per_party", "MB sent per party", "bytes"),
        ("rounds", "rounds (sequential exchanges)", "rounds"),
    ):
        scale = 1e6 if name == "bytes" else 1.0
        curves = {
            o.setting.label: (o.mean_column(column) / scale, o.mean_column("test_ap"))
            for o in outcomes
        }
        bands = {o.setting.label: o.std_column("test_ap") for o in outcomes}
        path = figures / f"communication_{dataset}_{name}.png"
        plots.plot_ap_curves(
            curves, path, title=f"{dataset}: test AP against {name} (mean ± std over seeds)",
            xlabel=unit, logx=True, bands=bands,
        )  # fmt: skip
        text += f"![AP against {name} on {dataset}]({FIGURES}/{path.name})\n"
    return text


def _report_header(seeds: Sequence[int], datasets: Sequence[str]) -> str:
    seed_list = ",".join(str(s) for s in seeds)
    return (
        "# Talking less: local steps, exact-averaging graphs and compressed gossip\n\n"
        "Made by `slate reproduce communication --data-dir ../shared/data --seeds "
        f"{seed_list} --datasets {','.join(datasets)}`. Rounds are sequential exchanges (a "
        "gossip round is one; an exact average by ring all-reduce counts its 2 (N − 1) "
        "steps); bytes are what one party sends, as encoded (`comm_bytes_per_party`). "
        "*Serverless* means neighbour exchanges only.\n\n"
    )


def _seconds(value: float) -> str:
    if not math.isfinite(value):
        return "not reached"
    return f"{value / 60:.1f} min" if value >= 120 else f"{value:.0f} s"
