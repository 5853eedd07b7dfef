r"""``slate reproduce communication``: what each way of talking less costs in AP
(``docs/communication.md``).

For each preset (by default ``w7a``, the paper's run, and ``w7a-dirichlet``, w7a split non-IID;
N = 20, SLATE), the study trains every :class:`Setting` for each seed: the paper's ring (one
dense exchange per iteration), federated averaging every ``q`` steps (an all-reduce), local
steps :math:`H \in \{5, 10, 25, 50\}` on the ring, the ``base-2`` graph (one peer per round,
exact average after a cycle), each CHOCO compressor on the ring, ``base-2`` with local steps and
compression together, and a control that never gossips (:func:`control_setting`: each party
trains alone, and only the final evaluation averages the parties' models). Every run is an
ordinary ``slate train`` run in ``OUT/<preset>/communication/<setting>/seed<k>/``, reused when
it holds a ``summary.json``.

The report (``OUT/communication.md``, figures and CSVs in ``OUT/figures/``) gives, per dataset,
the final AP (mean ± std over seeds), rounds and bytes per party against the ring, AP against
bytes and against rounds, and a recommendation table: for each WAN link (RTT 20/80/150 ms at
10/100 Mbit/s), the serverless setting (neighbour exchanges only) whose final mean AP is within
``AP_TOLERANCE`` of the ring's and whose whole run takes the least estimated time,

.. math::

    T = T_{\mathrm{compute}} + R \cdot \mathrm{RTT} + 8 B / (g \cdot \mathrm{bandwidth})

(:class:`slate.communication.gossip.WanLink`; :math:`R` rounds and :math:`B` bytes per party,
delivered at
:data:`slate.communication.gossip.EXCHANGE_GOODPUT` :math:`g` of the line rate;
:math:`T_{\mathrm{compute}}` one site's share, :math:`1/N`, of the simulator's measured time per
iteration of the ring, the same for every setting). Each setting's final AP is also set against
the control's, seed by seed (:class:`Comparison`), and a setting whose difference is within the
noise is reported as not distinguishable from training alone.
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
from scipy import stats

from slate.communication.gossip import EXCHANGE_GOODPUT, WanLink
from slate.errors import ConfigError
from slate.metrics import plots
from slate.studies.reproduce import default_config_dir, load_preset, run_or_reuse, train_config
from slate.studies.tables import markdown_table, write_csv
from slate.training.configuration import resolve_and_check

__all__ = [
    "CONTROL",
    "LINKS",
    "Comparison",
    "Setting",
    "SettingOutcome",
    "communication",
    "compare_with_control",
    "control_setting",
    "read_history",
    "settings_for",
    "wan_seconds",
]

AP_TOLERANCE = 0.005  # the acceptance criterion: mean AP >= ring's mean - 0.005
LINKS = tuple(WanLink(rtt, bw) for rtt in (20.0, 80.0, 150.0) for bw in (10.0, 100.0))
LOCAL_STEPS = (5, 10, 25, 50)
#: Per dataset: the federated period q, the H of the combined settings, the evaluation interval.
PLANS = {"w7a": (50, 25, 250), "w7a-dirichlet": (50, 25, 250), "fashion-mnist": (10, 10, 30)}
DEFAULT_PLAN = (10, 10, None)
FIGURES = "figures"
#: The presets the study runs by default: w7a as the paper partitions it, and w7a split
#: non-IID (Dirichlet, alpha = 1), where training alone is far behind gossip.
DATASETS = ("w7a", "w7a-dirichlet")
CONTROL = "no-gossip"  # the key of the no-communication control (control_setting)
CONFIDENCE = 0.95  # of the paired t interval that decides "distinguishable from the control"


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


def control_setting(iterations: int) -> Setting:
    """The no-communication control of a run of ``iterations`` iterations: ``--gossip-every
    iterations + 1``, so no gossip round falls within the run and no byte is sent; each party
    trains alone on its own data, and only the final evaluation averages the parties' models
    (the same mean every setting is evaluated on)."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(
            f"The no-gossip control needs the run's iteration count, a whole number >= 1, to "
            f"set --gossip-every past it; got {iterations!r}."
        )
    return Setting(CONTROL, "no gossip (control)", {"gossip_every": iterations + 1})


def settings_for(dataset: str, iterations: int) -> list[Setting]:
    """The study's settings for ``dataset`` (``PLANS`` sets q and the combined H), the ring
    first and the no-gossip control (:func:`control_setting`) of an ``iterations``-long run
    last."""
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
    out.append(control_setting(iterations))
    return out


@dataclass
class SettingOutcome:
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


@dataclass(frozen=True)
class Comparison:
    r"""A setting's final test AP against the no-gossip control's, paired by seed.

    ``deltas[k]`` is the setting's AP minus the control's on the k-th seed (the same seed gives
    both runs the same partition, initial model and batches). The setting differs from the
    control when :math:`|\bar\Delta| \ge` ``AP_TOLERANCE`` and, with two seeds or more, the
    ``CONFIDENCE`` paired t interval :math:`\bar\Delta \pm t_{n-1} s_\Delta / \sqrt{n}`
    excludes zero; otherwise it is not distinguishable from the control."""

    ap: float
    control_ap: float
    deltas: tuple[float, ...]

    @property
    def mean(self) -> float:
        """The mean over seeds of the paired differences (= mean AP - control's mean AP)."""
        return statistics.fmean(self.deltas)

    @property
    def std(self) -> float:
        """The sample standard deviation over seeds of the paired differences (0: one seed)."""
        return statistics.stdev(self.deltas) if len(self.deltas) > 1 else 0.0

    @property
    def half_width(self) -> float:
        """Half the width of the paired t interval of the mean difference (0: one seed)."""
        n = len(self.deltas)
        if n < 2:
            return 0.0
        return float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * self.std / math.sqrt(n)

    @property
    def verdict(self) -> str:
        """``better`` or ``worse`` than the control, or ``not distinguishable``."""
        if abs(self.mean) < AP_TOLERANCE or abs(self.mean) <= self.half_width:
            return "not distinguishable"
        return "better" if self.mean > 0 else "worse"


def compare_with_control(outcome: SettingOutcome, control: SettingOutcome) -> Comparison:
    """Pair ``outcome``'s runs with the control's by seed (``summary.json``'s ``seed``) and
    take the differences of their final test AP; a seed missing from either is a ConfigError."""
    mine = {int(s["seed"]): float(s["test_ap"]) for s in outcome.summaries}
    base = {int(s["seed"]): float(s["test_ap"]) for s in control.summaries}
    if sorted(mine) != sorted(base) or not mine:
        raise ConfigError(
            f"Setting {outcome.setting.key!r} ran seeds {sorted(mine)} and the no-gossip control "
            f"ran {sorted(base)}; a comparison pairs the two runs of each seed, so both need the "
            "same, non-empty, set of seeds (rerun the study with one --seeds list)."
        )
    seeds = sorted(mine)
    return Comparison(
        ap=statistics.fmean(mine.values()),
        control_ap=statistics.fmean(base.values()),
        deltas=tuple(mine[k] - base[k] for k in seeds),
    )


def read_history(folder: Path) -> dict[str, np.ndarray]:
    """Every column of a run's ``history.csv`` as a float array."""
    with open(folder / "history.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}


def wan_seconds(
    outcome: SettingOutcome,
    link: WanLink,
    compute_per_iteration: float,
    target: float | None = None,
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
    datasets: Sequence[str] = DATASETS,
    seeds: Sequence[int] = (0, 1, 2),
    config_dir: Path | None = None,
    device: str = "cpu",
    iterations: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, list[dict[str, Any]]]:
    """Run (or reuse) every preset x setting x seed and write the report; returns the rows.

    ``datasets`` names presets (``<config_dir>/<name>.toml``): a preset may set a partition
    (``w7a-dirichlet``), so the report and the run folders use the preset's name."""
    config_dir = config_dir or default_config_dir()
    figures = out / FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    sections, results = [], {}
    for name in datasets:
        preset = load_preset(name, config_dir)
        outcomes = _run_dataset(name, preset, data_dir, out, seeds, device, iterations, log)
        rows, text = _dataset_report(name, preset, outcomes, figures)
        results[name] = rows
        sections.append(text)
    report = _report_header(seeds, datasets) + "\n\n".join(sections)
    (out / "communication.md").write_text(report)
    log(f"wrote {out / 'communication.md'}")
    return results


def _run_dataset(
    name, preset, data_dir, out, seeds, device, iterations, log
) -> list[SettingOutcome]:
    _, _, every = PLANS.get(name, DEFAULT_PLAN)
    common = {"data_dir": data_dir, "device": device, "iterations": iterations}
    common["eval_every"] = every if iterations is None else None
    total = resolve_and_check(train_config(preset, "slate", seeds[0], **common)).flags.iterations
    outcomes = []
    for setting in settings_for(name, total):
        summaries, histories = [], []
        for seed in seeds:
            folder = out / name / "communication" / setting.key / f"seed{seed}"
            log(f"{name} {setting.key} seed {seed}")
            config = train_config(preset, "slate", seed, **common, **setting.flags)
            summaries.append(run_or_reuse(config, folder, log))
            histories.append(read_history(folder))
        outcomes.append(SettingOutcome(setting, summaries, histories))
    return outcomes


def _dataset_report(
    dataset: str, preset: dict[str, Any], outcomes: list[SettingOutcome], figures: Path
) -> tuple[list[dict[str, Any]], str]:
    ring = outcomes[0]
    control = next(o for o in outcomes if o.setting.key == CONTROL)
    ring_ap, _ = ring.final("test_ap")
    ring_rounds, _ = ring.final("rounds")
    ring_bytes, _ = ring.final("comm_bytes_per_party")
    target = ring_ap - AP_TOLERANCE
    rows, cells = [], []
    comparisons = {o.setting.key: compare_with_control(o, control) for o in outcomes}
    for outcome in outcomes:
        ap, ap_std = outcome.final("test_ap")
        rounds, _ = outcome.final("rounds")
        sent, _ = outcome.final("comm_bytes_per_party")
        versus = comparisons[outcome.setting.key]
        row = {
            "dataset": dataset, "setting": outcome.setting.key, "flags":
            outcome.setting.command_flags(), "serverless": outcome.setting.serverless,
            "ap_mean": ap, "ap_std": ap_std, "rounds": rounds, "bytes_per_party": sent,
            "fewer_rounds": ring_rounds / rounds if rounds else math.inf,
            "fewer_bytes": ring_bytes / sent if sent else math.inf,
            "meets_ap": ap >= target,
            "ap_control": versus.control_ap, "delta_control": versus.mean,
            "delta_control_std": versus.std,
            "delta_control_per_seed": ";".join(f"{d:.6f}" for d in versus.deltas),
            "vs_control": "control" if outcome is control else versus.verdict,
        }  # fmt: skip
        rows.append(row)
        cells.append([
            outcome.setting.label, f"`{row['flags']}`", f"{ap:.4f} ± {ap_std:.4f}",
            f"{ap - ring_ap:+.4f}", f"{rounds:.0f}",
            f"{row['fewer_rounds']:.1f}x" if rounds else "none",
            f"{sent / 1e6:.3g}", f"{row['fewer_bytes']:.1f}x" if sent else "none",
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
        f"## {dataset}\n\nSLATE, N = {preset['nodes']}, {_partition_words(preset)}, "
        f"{iterations} iterations, the preset's step size and batch, {len(ring.summaries)} "
        f"seeds. The ring's final AP is {ring_ap:.4f}; a setting meets the AP criterion at a "
        f"mean of at least {target:.4f} (ring − {AP_TOLERANCE}).\n\n{table}\n\n{curves}\n"
        f"{_control_section(dataset, outcomes, control, comparisons)}\n"
        f"### Which flags for which link ({dataset})\n\nAmong the serverless settings that "
        f"meet the AP criterion, the one whose whole run ({iterations} iterations) is estimated "
        f"to take the least time over each link: one site's compute plus, per round, the RTT "
        f"and the round's bytes at {EXCHANGE_GOODPUT:g} of the link's bandwidth "
        f"(`slate.communication.gossip.WanLink`; the evaluations, the same for every setting, "
        f"are left out). One site's compute is the simulator's "
        f"measured time per iteration of the ring for all N parties divided by N "
        f"({1e3 * ring.seconds_per_iteration() / int(preset['nodes']):.2f} ms), the same for "
        f"every setting (their compute differs by less than the noise of a shared machine; "
        f"`benchmarks/RESULTS.md` measures it). 'Reaches the target' is the first evaluation "
        f"where the mean AP is at least {target:.4f}. The final exact average that turns the "
        f"parties' models into one is not counted (one base-2 cycle, the same for every "
        f"setting).\n\n{recommend}\n"
    )
    return rows, text


def _partition_words(preset: dict[str, Any]) -> str:
    """How the preset splits the training set, in words."""
    if preset.get("partition", "stratified") == "dirichlet":
        alpha = float(preset.get("dirichlet_alpha", 0.5))
        return f"a non-IID partition (`--partition dirichlet --dirichlet-alpha {alpha:g}`)"
    return "the paper's stratified partition"


def _control_section(
    dataset: str,
    outcomes: list[SettingOutcome],
    control: SettingOutcome,
    comparisons: dict[str, Comparison],
) -> str:
    """The table of every setting's final AP against the no-gossip control's, and what it says
    in words: which settings are not distinguishable from training alone."""
    n = len(control.summaries)
    cells = []
    for outcome in outcomes:
        versus = comparisons[outcome.setting.key]
        is_control = outcome is control
        cells.append([
            outcome.setting.label, f"{versus.ap:.4f}", f"{versus.control_ap:.4f}",
            f"{versus.mean:+.4f} ± {versus.std:.4f}",
            ", ".join(f"{d:+.4f}" for d in versus.deltas),
            "(the control)" if is_control else versus.verdict,
        ])  # fmt: skip
    table = markdown_table(
        ["setting", "final test AP", "no gossip", "Δ vs no gossip", "Δ per seed",
         "vs no gossip"],
        cells,
    )  # fmt: skip
    total = int(control.summaries[0]["iterations"])
    lows = [s.get("party_ap_min") for s in control.summaries]
    highs = [s.get("party_ap_max") for s in control.summaries]
    alone = ""
    if all(v is not None for v in lows + highs):
        alone = (
            f" Each party's own model scores AP {statistics.fmean(lows):.4f} (the lowest party) "
            f"to {statistics.fmean(highs):.4f} (the highest), means over seeds."
        )
    others = [o for o in outcomes if o is not control]
    same = [o.setting.label for o in others if comparisons[o.setting.key].verdict
            == "not distinguishable"]  # fmt: skip
    worse = [o.setting.label for o in others if comparisons[o.setting.key].verdict == "worse"]
    if comparisons[others[0].setting.key].verdict == "not distinguishable":
        verdict = (
            f"**On {dataset}, talking during training does not change the final AP**: the ring "
            f"itself is not distinguishable from the parties training alone, so this run "
            f"cannot tell the settings apart."
        )
    elif not same and not worse:
        gains = [comparisons[o.setting.key].mean for o in others]
        verdict = (
            f"Every setting is better than no gossip, by {min(gains):+.4f} to {max(gains):+.4f} "
            f"AP: on {dataset} communication matters, and the table above ranks real costs."
        )
    else:
        verdict = "".join([
            f"Not distinguishable from no gossip: {', '.join(same)}. " if same else "",
            f"Worse than no gossip: {', '.join(worse)}. " if worse else "",
            "The other settings are better than no gossip.",
        ])  # fmt: skip
    return (
        f"### Against no communication ({dataset})\n\nThe control trains every party alone: "
        f"`--gossip-every {total + 1}`, so no gossip round falls within the {total} iterations "
        f"and no byte is sent. As for every setting, the model evaluated is the mean of the "
        f"parties' final models (one exact average after training, counted in no setting); "
        f"the control's AP is that of the average of {control.summaries[0]['nodes']} "
        f"independently trained models.{alone} Δ is a setting's final AP minus the control's "
        f"on the same seed (the same partition, initial model and batches): mean ± std over "
        f"the {n} seeds, then each seed's. A setting is *not distinguishable* from the control "
        f"when |mean Δ| < {AP_TOLERANCE} or, with two seeds or more, the "
        f"{CONFIDENCE:.0%} paired t interval of the mean Δ contains 0.\n\n{table}\n\n"
        f"{verdict}\n"
    )


def _recommendations(outcomes: list[SettingOutcome], target: float, ring: SettingOutcome) -> str:
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


def _plot_curves(dataset: str, outcomes: list[SettingOutcome], figures: Path) -> str:
    """AP against bytes and rounds (log axes: the no-gossip control, which sends nothing, is
    left out), and the ring's and the control's AP against iterations."""
    text = ""
    talking = [o for o in outcomes if o.setting.key != CONTROL]
    for column, unit, name in (
        ("comm_bytes_per_party", "MB sent per party", "bytes"),
        ("rounds", "rounds (sequential exchanges)", "rounds"),
    ):
        scale = 1e6 if name == "bytes" else 1.0
        curves = {
            o.setting.label: (o.mean_column(column) / scale, o.mean_column("test_ap"))
            for o in talking
        }
        bands = {o.setting.label: o.std_column("test_ap") for o in talking}
        path = figures / f"communication_{dataset}_{name}.png"
        plots.plot_ap_curves(
            curves, path, title=f"{dataset}: test AP against {name} (mean ± std over seeds)",
            xlabel=unit, logx=True, bands=bands,
        )  # fmt: skip
        text += f"![AP against {name} on {dataset}]({FIGURES}/{path.name})\n"
    pair = [outcomes[0], *(o for o in outcomes if o.setting.key == CONTROL)]
    path = figures / f"communication_{dataset}_control.png"
    plots.plot_ap_curves(
        {o.setting.label: (o.mean_column("iteration"), o.mean_column("test_ap")) for o in pair},
        path, title=f"{dataset}: the ring against no gossip (mean ± std over seeds)",
        bands={o.setting.label: o.std_column("test_ap") for o in pair},
    )  # fmt: skip
    return text + f"![The ring against no gossip on {dataset}]({FIGURES}/{path.name})\n"


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
        "`summary.json`: one party's compute, plus an RTT per gossip round and per round trip "
        "of the other collectives, plus the busiest party's gossip bytes at half the link's "
        "rate (TCP delivers a gossip exchange's burst at about that) and the collectives' bytes "
        "with their headers ([engines.md](engines.md#communication-accounting)). "
        "[wan.md](wan.md) measures real runs over an emulated link: the estimate came within "
        "0.81x-0.97x of the measured training times.\n\n"
        "Every setting is set against a control that does not communicate during training "
        "(`no-gossip`: each party trains alone and only the final evaluation averages the "
        "parties' models); a setting that is not distinguishable from it is said so, since on "
        "such a run communication costs nothing in AP whatever the flags.\n\n"
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
