"""A run's folder and closing lines: ``summary.json``, ``history.csv``, the curves, the model.

:func:`write_run_folder` writes what :mod:`slate.training.loop` computed; :func:`build_summary` and
:func:`evaluation_summary` assemble ``summary.json`` (keys in ``docs/outputs.md``) and
:func:`report` prints the closing lines. With validation rows (``--validation-fraction``) the kept
model's validation PR curve is saved beside the test one (:class:`ValidationCurve`), and named in
``model.json``: ``slate predict --at-recall`` chooses its threshold there. With per-site files
each curve is the saved model's on this site's own rows, the pooled curve beside it
(:mod:`slate.training.threshold_curve`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from slate.errors import FEW, parties_text
from slate.inference.model_file import describe_run, save_model
from slate.metrics import plots
from slate.metrics.operating_points import (
    FEW_POSITIVES,
    OperatingPoint,
    few_positives_warning,
    marks,
    operating_points,
    unreached_marks,
)
from slate.permissions import private_files, private_folder
from slate.security.robust import accusation_lines
from slate.training.ap_coverage import coverage_text
from slate.training.evaluation import TestScores
from slate.training.threshold_curve import (
    CURVE,
    POOLED_CURVE,
    POOLED_VALIDATION_CURVE,
    Curves,
    curves_of,
)

if TYPE_CHECKING:
    from slate.training.run import Run

__all__ = [
    "HISTORY_COLUMNS",
    "VALIDATION_CURVE",
    "ValidationCurve",
    "build_summary",
    "default_out_dir",
    "draw_figures",
    "evaluation_summary",
    "final_curves",
    "parties",
    "report",
    "write_history",
    "write_run_folder",
]

HISTORY_COLUMNS = (
    "iteration",
    "test_ap",
    "test_auroc",
    "train_loss",
    "consensus_distance",
    "elapsed_seconds",
    "parties_alive",
    "rounds",
    "comm_bytes_per_party",
    "eval_bytes_per_party",
    "estimated_wan_seconds",
)


#: The kept model's precision-recall curve on the validation rows, in the run folder.
VALIDATION_CURVE = "validation_pr_curve.csv"


@dataclass
class ValidationCurve:
    """The kept model's scores on the validation rows, taken at the end of training before the
    test rows replace them: its PR curve with logit thresholds (exact points when the
    validation rows are pooled, histogram bin edges when each party holds its own, as for the
    test curve, :mod:`slate.training.evaluation`), and the rows and positives behind it."""

    scores: TestScores
    rows: int
    positives: int
    evaluation: str  # "pooled" or "federated"
    curves: Curves | None = None  # the site's own curve and the pooled one

    @classmethod
    def of(cls, run: Run) -> ValidationCurve:
        """Score the run's current (kept) model on its validation rows (collective: every
        process calls it; reuses the last evaluation when it scored this model)."""
        evaluator = run.evaluator
        scored = evaluator.test_scores(run.x, run.iteration)
        positives = int(test_positives(run))
        curves = curves_of(evaluator.federated, scored.logits, evaluator.test_labels,
                           scored.scores, positives)  # fmt: skip
        return cls(scored.scores, int(run.data.n_test), positives, evaluator.evaluation.name,
                   curves)  # fmt: skip

    def describe(self) -> dict[str, Any]:
        """``model.json``'s ``validation_curve``: the default curve's file, rows and positives
        (the site's own with per-site files), and the pooled one's."""
        described: dict[str, Any] = {
            "file": VALIDATION_CURVE,
            "rows": self.rows,
            "positives": self.positives,
            "evaluation": self.evaluation,
        }
        if self.curves is not None:
            described.update(self.curves.describe(VALIDATION_CURVE, POOLED_VALIDATION_CURVE))
        return described


def default_out_dir(dataset: str, algorithm: str) -> Path:
    """A fresh ``runs/<dataset>-<algorithm>-<YYYYmmdd-HHMMSS>[-k]`` folder name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{dataset}-{algorithm}-{stamp}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def write_run_folder(
    run: Run,
    summary: dict[str, Any],
    history: list[dict[str, float]],
    out: Path,
    final_model: tuple[Tensor, dict[str, Tensor], TestScores],
    validation: ValidationCurve | None = None,
    figures: bool = True,
    curves: Curves | None = None,
) -> None:
    """Write the run folder: history, PR curve, model, summary; with ``validation``, the kept
    model's validation PR curve (:data:`VALIDATION_CURVE`); with ``figures``, the figures drawn
    from those files (:func:`draw_figures`); ``curves``: the test curves
    (:func:`final_curves`; None: the scores' own). The folder is ``0700`` and every file ``0600``
    (:mod:`slate.permissions`)."""
    private_folder(out)
    with private_files():
        _write_run_files(run, summary, history, out, final_model, validation, curves)
        if figures:
            draw_figures(out)


def draw_figures(out: Path | str) -> list[Path]:
    """Draw a run folder's figures from its files alone (``summary.json``, ``history.csv``,
    ``pr_curve.csv``), as ``0600`` PNGs: ``pr_curve.png`` (with the operating points, the
    targets not reached and the positive rate), ``ap_curve.png``, ``ap_bytes.png`` (when a party
    sent anything) and, with ``--wan``, ``ap_wan_time.png``. The files hold every number
    exactly (``repr`` floats, JSON), so these are the figures the run would draw from memory.
    ``slate train`` calls it after the run (a distributed party after it has left the others),
    ``slate plot`` on demand. Returns the files written; raises ``ConfigError`` naming a file
    that is missing or unreadable."""
    from slate.errors import ConfigError

    out = Path(out)
    try:
        summary = json.loads((out / "summary.json").read_text())
        with open(out / "history.csv", newline="") as handle:
            history = list(csv.DictReader(handle))
        with open(out / "pr_curve.csv", newline="") as handle:
            curve = list(csv.DictReader(handle))
        flags = {k: summary[k] for k in ("algorithm", "nodes", "topology", "dataset")}
        test_ap, split = summary["test_ap"], summary["test_split"]
        validated = bool(history) and "validation_ap" in history[0]
        ap_key = "validation_ap" if validated else "test_ap"
        iterations = [int(r["iteration"]) for r in history]
        ap = [float(r[ap_key]) for r in history]
        sent = [float(r["comm_bytes_per_party"]) / 1e6 for r in history]
        wan_seconds = [float(r["estimated_wan_seconds"] or "nan") for r in history]
        precision = np.array([float(r["precision"]) for r in curve])
        recall = np.array([float(r["recall"]) for r in curve])
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(
            f"{out} is not a complete run folder, so its figures cannot be drawn: "
            f"{type(err).__name__}: {err}. Expected summary.json, history.csv and pr_curve.csv "
            "as 'slate train' writes them."
        ) from None
    with private_files():
        return _draw(out, summary, flags, test_ap, split, validated, iterations, ap, sent,
                     wan_seconds, precision, recall)  # fmt: skip


def _draw(
    out: Path, summary: dict[str, Any], flags: dict[str, Any], test_ap: float, split: str,
    validated: bool, iterations: list[int], ap: list[float], sent: list[float],
    wan_seconds: list[float], precision: np.ndarray, recall: np.ndarray,
) -> list[Path]:  # fmt: skip
    label = f"{flags['algorithm']} (N={flags['nodes']}, {flags['topology']})"
    table = [OperatingPoint.from_dict(p) for p in summary.get("operating_points", [])]
    positives, rows = summary.get("test_positives"), summary.get("n_test")
    own = summary.get("threshold_curve") or {}
    if own.get("source") == "own":  # pr_curve.csv is the site's own rows'
        positives, rows = own.get("positives"), own.get("rows")
        test_ap = own.get("ap", test_ap)
    written = [
        plots.plot_pr_curves(
            {label: (precision, recall, test_ap)},
            out / "pr_curve.png",
            title=f"Precision-recall on the {flags['dataset']} test set: {split}",
            points=marks(table),
            unreached=unreached_marks(table),
            prevalence=positives / rows if positives is not None and rows else None,
        ),
        plots.plot_ap_curves(
            {label: (iterations, ap)},
            out / "ap_curve.png",
            title=f"{'Validation' if validated else 'Test'} AP of the averaged model on "
            f"{flags['dataset']}",
        ),
    ]
    if sent and sent[-1] > 0:  # AP against the bytes one party sent
        written.append(plots.plot_ap_curves(
            {label: (sent, ap)}, out / "ap_bytes.png",
            title=f"Test AP against traffic on {flags['dataset']}",
            xlabel="MB sent per party",
        ))  # fmt: skip
    if summary.get("wan") is not None:  # and against the estimated WAN time
        written.append(plots.plot_ap_curves(
            {label: (wan_seconds, ap)}, out / "ap_wan_time.png",
            title=f"Test AP against estimated WAN time ({summary['wan']})",
            xlabel="estimated seconds over the WAN",
        ))  # fmt: skip
    return written


def _write_run_files(
    run: Run,
    summary: dict[str, Any],
    history: list[dict[str, float]],
    out: Path,
    final_model: tuple[Tensor, dict[str, Tensor], TestScores],
    validation: ValidationCurve | None,
    curves: Curves | None,
) -> None:
    xbar, buffers, scores = final_model
    write_history(out / "history.csv", history, run.validated)
    if curves is None:
        curves = Curves(scores, "pooled", 0, 0)
    _write_curves(out, curves, CURVE, POOLED_CURVE)
    run.compute.layout.load_into(run.model, xbar, buffers)
    description = describe_run(run.flags, run.data.input_shape, run.data.preprocessing)
    description["threshold_curve"] = summary.get("threshold_curve")
    if validation is not None and validation.scores.curve is not None:
        v_curves = validation.curves or Curves(validation.scores, "pooled", 0, 0)
        _write_curves(out, v_curves, VALIDATION_CURVE, POOLED_VALIDATION_CURVE)
        description["validation_curve"] = validation.describe()
    if "privacy" in summary:  # --dp-epsilon: the guarantee travels with the model
        description["privacy"] = {k: v for k, v in summary["privacy"].items() if k != "ledger"}
    save_model(out, run.model, description)  # model.pt (the state_dict) and model.json
    with open(out / "summary.json", "w") as handle:
        json.dump(summary, handle, indent=2)


def _write_curves(out: Path, curves: Curves, file: str, pooled_file: str) -> None:
    """The default curve as ``file`` and, with per-site files, the pooled one as
    ``pooled_file``."""
    for scores, name in ((curves.default, file), (curves.pooled, pooled_file)):
        if scores is not None and scores.curve is not None:
            precision, recall = scores.pr_curve()
            write_pr_curve(out / name, precision, recall, scores.thresholds)


def write_history(
    path: Path, rows: list[dict[str, float]], validated: bool, append: bool = False
) -> None:
    """``history.csv``: a header and ``rows`` (with ``append``, ``rows`` added after the file's
    own, no header); ``validated``: the evaluations scored validation rows, which the columns
    say (``validation_ap``, ``validation_auroc``)."""
    columns: list[str] = list(HISTORY_COLUMNS)
    if validated:
        rows = [_validation_columns(row) for row in rows]
        columns = list(_validation_columns(dict.fromkeys(HISTORY_COLUMNS)))
    with open(path, "a" if append else "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        if not append:
            writer.writeheader()
        writer.writerows(rows)


def _validation_columns(row: dict[str, float]) -> dict[str, float]:
    renamed = {"test_ap": "validation_ap", "test_auroc": "validation_auroc"}
    return {renamed.get(k, k): v for k, v in row.items()}


def write_pr_curve(path: Path, precision, recall, logits) -> None:
    """``precision,recall,threshold,logit``: each point's decision "logit >= logit" (equally,
    probability >= threshold); the last point, (1, 0), flags nothing (``inf``). Numbers are
    written in their shortest exact form, so that thresholds read back select the same rows."""
    logits = np.full(len(precision), np.nan) if logits is None else np.asarray(logits)
    probability = torch.sigmoid(torch.from_numpy(logits.astype(np.float32))).double().numpy()
    probability[np.isposinf(logits)] = np.inf
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["precision", "recall", "threshold", "logit"])
        for row in zip(precision, recall, probability, logits, strict=True):
            writer.writerow([repr(float(v)) for v in row])


def build_summary(
    run: Run, history, party_aps: list[float], wall: float, traffic: dict[str, float],
    robust: list[list[int]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``summary.json``'s keys up to ``config`` (see :func:`evaluation_summary` for the rest);
    ``robust``: every party's ``--robust clip`` records (:meth:`Run.robust_records`)."""
    config, final = run.flags, history[-1]
    return {
        "dataset": config.dataset,
        "algorithm": config.algorithm,
        "engine": run.engine.name,
        "topology": config.topology,
        "nodes": config.nodes,
        "lambda": getattr(run.base_topology, "applied_lambda", run.base_topology.lam),
        "spectral_gap": run.base_topology.spectral_gap,
        "iterations": run.iteration,
        "test_ap": final["test_ap"],
        "test_auroc": final["test_auroc"],
        **_coverage(run),
        "party_ap_min": min(party_aps, default=None),  # None: --no-party-ap
        "party_ap_max": max(party_aps, default=None),
        "consensus_distance": final["consensus_distance"],
        "wall_seconds": wall,
        "compute_seconds": run.network.compute_seconds(wall),  # one party's, without network waits
        "wait_seconds": run.network.state()[2],  # this process's waits for communication
        "collective_round_trips": run.network.state()[1],  # the estimate's Q, since the start
        # before training (the data agreement, the run settings), and the store's (constant)
        "set_up_round_trips": run.network.set_up_round_trips(),
        "store_round_trips": run.engine.store_round_trips,
        "evaluation_seconds": run.evaluator.seconds,
        "eval_bytes_per_party": run.evaluator.sent_bytes,
        "load_seconds": run.load_seconds,
        "learning_warning": run.evaluator.learning_warning,
        "test_split": run.data.test_split,
        "seed": config.seed,
        "n_train": run.data.n_train,
        "n_test": scored_test_rows(run),
        "n_parameters": run.compute.layout.size,
        "device": str(run.device),
        **traffic,
        **_communication_summary(run, final),
        "parties_alive": run.engine.n_parties,
        "members": list(run.party_set.members),
        "party_events": run.party_set.party_events + run.guard.events(robust),
        "graph_changes": run.party_set.graph_changes,
        "config": config.to_dict(),
    }


def _coverage(run: Run) -> dict[str, Any]:
    """Which sites' test rows the final metrics cover: ``test_ap_sites`` (None with one test
    set for all), and ``test_ap_coverage``, the words the ``test AP`` line adds after a loss
    (None without one)."""
    sites = covered_sites(run)
    events = run.party_set.party_events
    text = coverage_text(sites, len(run.data.counts), events) if sites is not None else None
    return {"test_ap_sites": sites, "test_ap_coverage": text}


def _communication_summary(run: Run, final: dict[str, float]) -> dict[str, Any]:
    """How the parties talked: local steps, compressor, CHOCO's gamma, and the WAN estimate
    (that of the last history row)."""
    settings = run.comm.settings
    compressed = settings.compressor is not None
    return {
        "gossip_every": settings.every,
        "compress": settings.compressor.name if compressed else "none",
        "consensus_step": settings.consensus_step if compressed else None,
        "wan": str(run.wan) if run.wan is not None else None,
        "estimated_wan_seconds": final["estimated_wan_seconds"] if run.wan is not None else None,
    }


def parties(n: int) -> str:
    """``1 party``, ``4 parties``."""
    return f"{n} part{'y' if n == 1 else 'ies'}"


def report(run: Run, summary: dict[str, Any], wall: float, out: Path | None, log) -> None:
    """The closing lines; with per-party files every party prints its own."""
    prefix = "" if run.engine.is_main else f"party {run.engine.local_parties[0]}: "
    own_models = ""
    if summary["party_ap_min"] is not None:
        own_models = f"(party AP {summary['party_ap_min']:.4f}-{summary['party_ap_max']:.4f}) "
    bound = summary.get("test_ap_error_bound")
    within = f" (+-{bound:.1e}, federated)" if bound is not None else ""
    if summary.get("test_ap_coverage"):  # (after a loss: the survivors' test rows only)
        within += f" {summary['test_ap_coverage']}"
    if summary.get("own_test_ap") is not None:  # (the headline: this site's own rows)
        log(f"{prefix}{headline_text(summary)}")
    log(
        f"{prefix}test AP {summary['test_ap']:.4f}{within}  AUROC {summary['test_auroc']:.4f}  "
        f"{own_models}in {wall:.1f} s"
    )
    if summary.get("evaluation_warning"):
        log(f"{prefix}{summary['evaluation_warning']}")
    for line in accusation_lines(summary["party_events"]):
        log(f"{prefix}{line}")
    for kind in ("warning", "noise_note"):  # (a note under --dp-epsilon: metrics.divergence)
        if (summary.get("divergence") or {}).get(kind):
            log(f"{prefix}{summary['divergence'][kind]}")
    few = few_positives_warning(summary.get("test_positives", FEW_POSITIVES), "the test set")
    if few:
        log(f"{prefix}{few}")
    own = summary.get("party_test_ap")
    if own:
        log(f"{prefix}AP of the consensus model on each party's own test rows: {_own_aps(own)}")
    if out is not None:
        log(f"{prefix}results written to {out}")


def headline(run: Run, own: list[float | None], scores: TestScores) -> dict[str, Any]:
    """A site's headline AP: that of its own test rows (``own_test_ap``, with one local party
    that holds some), the pooled AP beside it (``pooled_test_ap``, the same as ``test_ap``), and
    each site's declared share of the pooled test rows (``pooled_test_shares``): a site that
    declares rows it does not hold moves the pooled AP, never a site's own (docs/security.md)."""
    sites = covered_sites(run) or list(range(len(run.data.counts)))
    rows = sum(run.data.counts[m].test for m in sites)
    shares = {str(m): run.data.counts[m].test / rows if rows else None for m in sites}
    mine = own[0] if len(own) == 1 else None
    return {"own_test_ap": mine, "headline_ap": "own" if mine is not None else "pooled",
            "pooled_test_ap": scores.values.get("test_ap"),
            "pooled_test_shares": shares}  # fmt: skip


def headline_text(summary: dict[str, Any]) -> str:
    """The console's headline: the site's own-rows AP, the pooled AP labelled beside it."""
    shares = summary.get("pooled_test_shares") or {}
    named = ", ".join(f"site {m} {share:.0%}" for m, share in shares.items() if share is not None)
    pooled = summary.get("pooled_test_ap")
    pooled_text = f"{pooled:.4f}" if pooled is not None else "n/a"
    return (f"AP {summary['own_test_ap']:.4f} on this site's own test rows (the headline); "
            f"pooled AP {pooled_text} over every site's declared test rows "
            f"(shares: {named})")  # fmt: skip


def _own_aps(own: dict[Any, float | None]) -> str:
    """Each party's AP, or past :data:`~slate.errors.FEW` parties the lowest and the highest
    (every party's is in ``summary.json``'s ``party_test_ap``)."""
    if len(own) <= FEW:
        return ", ".join(
            f"party {n} {'n/a' if ap is None else f'{ap:.4f}'}" for n, ap in own.items()
        )
    scored = sorted((ap, int(n)) for n, ap in own.items() if ap is not None)
    text = f"{len(own)} parties"
    if scored:
        (low, worst), (high, best) = scored[0], scored[-1]
        text += f", lowest {low:.4f} (party {worst}), highest {high:.4f} (party {best})"
    unscored = [int(n) for n, ap in own.items() if ap is None]
    if unscored:
        text += f", n/a at {parties_text(unscored)}"
    return text + " (all in summary.json's party_test_ap)"


def covered_sites(run: Run) -> list[int] | None:
    """With per-party test files, the parties whose test rows the final metrics cover: those
    still in the run (a lost party's test rows leave with it); None with one test set for all."""
    if run.data.federated and run.data.counts and not run.validated:
        return list(run.party_set.members)
    return None


def scored_test_rows(run: Run) -> int:
    """The test rows the final metrics cover (see :func:`covered_sites`)."""
    sites = covered_sites(run)
    if sites is not None:
        return sum(run.data.counts[m].test for m in sites)
    return run.data.n_test


def test_positives(run: Run) -> int:
    """The positives of the whole test set (every party's, with per-party files)."""
    if run.data.test_positives is not None:
        return run.data.test_positives
    if run.data.counts:
        return sum(run.data.counts[m].test_positives for m in run.party_set.members)
    return int(run.data.y_test.sum())


def final_curves(run: Run, logits: Tensor, scores: TestScores, refused: bool = False) -> Curves:
    """The saved model's test curves (:mod:`slate.training.threshold_curve`): ``logits`` on this
    process's test rows, ``scores`` the run's metrics of them; ``refused``: the site refused
    the average and ``scores`` are its own model's on its own rows."""
    evaluator = run.evaluator
    return curves_of(evaluator.federated, logits, evaluator.test_labels, scores,
                     test_positives(run), refused)  # fmt: skip


def evaluation_summary(
    run: Run, logits: Tensor, scores: TestScores, curves: Curves | None = None
) -> dict[str, Any]:
    """How the test set was scored; with per-party files the error bounds and each party's own
    AP; the operating points of the default threshold's curve (``curves``, :func:`final_curves`:
    the site's own rows with per-site files) and of the pooled one; the preprocessing applied
    to every feature row."""
    out: dict[str, Any] = dict(run.evaluator.evaluation.describe())
    out["test_positives"] = test_positives(run)
    if run.data.federated:
        own = run.evaluator.evaluation.party_test_aps(logits, run.evaluator.test_labels)
        out.update(
            test_ap_error_bound=scores.values.get("test_ap_error_bound"),
            test_auroc_error_bound=scores.values.get("test_auroc_error_bound"),
            party_test_ap={str(n): ap for n, ap in zip(run.engine.local_parties, own, strict=True)},
            party_rows=[dataclasses.asdict(c) for c in run.data.counts],
            evaluation_warning=scores.warning,  # e.g. many scores in the end bins
            **headline(run, own, scores),
        )
    if curves is None:  # (the scores' own curve)
        curves = Curves(scores, "pooled", scored_test_rows(run), test_positives(run))
    out["threshold_curve"] = curves.describe()
    for key, curve, positives in (
        ("operating_points", curves.default, curves.positives),
        ("operating_points_pooled", curves.pooled, curves.pooled_positives),
    ):  # the operating points (slate.metrics.operating_points)
        if curve is not None and curve.thresholds is not None:
            precision, recall = curve.pr_curve()
            table = operating_points(precision, recall, curve.thresholds, positives=positives)
            out[key] = [point.to_dict() for point in table]
    transform = run.data.preprocessing
    out["preprocessing"] = transform.to_dict() if transform is not None else None
    unseen = getattr(transform, "unseen", None)
    if unseen is not None:  # test cells whose category training never saw (encoded as zeros)
        out["unseen_categories"] = dict(unseen)
    return out
