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
``AP_TOLERANCE`` of the ring's and whose whole run takes the least estimated time,

.. math::

    T = T_{\mathrm{compute}} + R \cdot \mathrm{RTT} + 8 B / \mathrm{bandwidth}

(:class:`slate.gossip.WanLink`; :math:`R` rounds and :math:`B` bytes per party;
:math:`T_{\mathrm{compute}}` one site's share, :math:`1/N`, of the simulator's measured time per
iteration of the ring, the same for every setting).
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
from slate.studies.reproduce import default_config_dir, load_preset, run_or_reuse, train_config
from slate.studies.tables import markdown_table, write_csv

__all__ = [
    "LINKS",
    "Outcome",
    "Setting",
    "communication",
    "read_history",
    "settings_for",
    "wan_seconds",
]

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


def read_history(folder: Path) -> dict[str, np.ndarray]:
    """Every column of a run's ``history.csv`` as a float array."""
    with open(folder / "history.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}


def wan_seconds(
    outcome: Outcome, link: WanLink, compute_per_iteration: float, target: float | None = None
) -> float:
    """Estimated WAN seconds of ``outcome``'s run (mean over seeds): the whole run, or, with
    ``target``, until the mean AP first reaches it (NaN: never). ``compute_per_iteration`` is
    one site's compute per iteration, the same for every setting."""
    iterations = outcome.mean_column("iteration")
    i = len(iterations) - 1
    if target is not None:
        hits = np.flatnonzero(outcome.mean_column("test_ap") >= target)
        if hits.size == 0:
            return math.nan
        i = int(hits[0])
    rounds = float(outcome.mean_column("rounds")[i])
    sent = float(outcome.mean_column("comm_bytes_per_party")[i])
    return link.seconds(compute_per_iteration * float(iterations[i]), rounds, sent)


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
            config = train_config(
                preset, "slate", seed, data_dir=data_dir, device=device, iterations=iterations,
                eval_every=every if iterations is None else None, **setting.flags,
            )  # fmt: skip
            summaries.append(run_or_reuse(config, folder, log))
            histories.append(read_history(folder))
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
        f"### Which flags for which link ({dataset})\n\nAmong the serverless settings that "
        f"meet the AP criterion, the one whose whole run ({iterations} iterations) is estimated "
        f"to take the least time over each link: one site's compute plus, per round, the RTT "
        f"and the round's bytes at the link's bandwidth. One site's compute is the simulator's "
        f"measured time per iteration of the ring for all N parties divided by N "
        f"({1e3 * ring.seconds_per_iteration() / int(preset['nodes']):.2f} ms), the same for "
        f"every setting (their compute differs by less than the noise of a shared machine; "
        f"`benchmarks/RESULTS.md` measures it). 'Reaches the target' is the first evaluation "
        f"where the mean AP is at least {target:.4f}. The final exact average that turns the "
        f"parties' models into one is not counted (one base-2 cycle, the same for every "
        f"setting).\n\n{recommend}\n"
    )
    return rows, text


def _recommendations(outcomes: list[Outcome], target: float, ring: Outcome) -> str:
    """Per link, the serverless setting meeting the AP criterion whose whole run is fastest."""
    compute = ring.seconds_per_iteration() / int(ring.summaries[0]["nodes"])
    eligible = [o for o in outcomes if o.setting.serverless and o.final("test_ap")[0] >= target]
    cells = []
    for link in LINKS:
        best = min(eligible, key=lambda o: wan_seconds(o, link, compute))
        whole, ring_whole = wan_seconds(best, link, compute), wan_seconds(ring, link, compute)
        cells.append([
            str(link), f"`{best.setting.command_flags()}`", _seconds(whole),
            _seconds(wan_seconds(best, link, compute, target)), _seconds(ring_whole),
            f"{ring_whole / whole:.0f}x",
        ])  # fmt: skip
    return markdown_table(
        ["link", "use", "whole run", "reaches the target after", "ring (the paper), whole run",
         "faster"],
        cells,
    )  # fmt: skip


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
        "The paper's protocol sends the whole model to every neighbour after every step. Between "
        "sites a round trip costs 20-150 ms, so rounds cost time before bytes do. Three flags "
        "make the parties talk less, on both engines, with the algorithms unchanged "
        "([engines.md](engines.md#talking-less-local-steps-and-compressed-gossip)):\n\n"
        "* `--gossip-every H`: H local steps per gossip round; rounds without gossip send "
        "nothing.\n"
        "* `--topology base-2` (any N) or `one-peer-exponential` (N a power of 2): one peer per "
        "round, and a short cycle of rounds that averages exactly.\n"
        "* `--compress int8|topk:F|sign`: CHOCO-SGD compressed gossip with error feedback; the "
        "wire carries the encoding itself (int8 values with a scale per 256; top-k indices and "
        "values; sign bits with a scale).\n\n"
        "`--wan RTT_MS,MBIT_S` adds the estimated time over a link to `history.csv` and "
        "`summary.json`; [wan.md](wan.md) measures real runs over an emulated link and "
        "compares them with the estimate.\n\n"
        "Compression can leave the parties far apart behind a good average, above all with "
        "non-IID parties. A compressed run therefore scores each party's own final model by "
        "default (`party_ap_min`, `party_ap_max`), and a run whose parties end apart prints "
        "one warning with what to try and records it as `divergence` in `summary.json` "
        "([outputs.md](outputs.md#divergence-between-parties)).\n\n"
        "This page is made by `slate reproduce communication --data-dir ../shared/data --seeds "
        f"{seed_list} --datasets {','.join(datasets)}` (`--out reproduction` by default). "
        "Rounds are sequential exchanges (a gossip round is one; an exact average by ring "
        "all-reduce counts its 2 (N − 1) steps); bytes are what one party sends, as encoded "
        "(`comm_bytes_per_party`). *Serverless* means neighbour exchanges only: no all-reduce, "
        "no server.\n\n"
    )


def _seconds(value: float) -> str:
    if not math.isfinite(value):
        return "not reached"
    return f"{value / 60:.1f} min" if value >= 120 else f"{value:.0f} s"
