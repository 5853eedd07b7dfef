r"""Using a trained model: score a file (``slate predict``), measure it (``slate evaluate``).

Both read a file the way the run read its data (``model.json``'s ``input``), apply the run's
preprocessing (:class:`slate.inference.model_file.Preprocessing`) and score every row with the
averaged model in eval mode, in the same chunks of rows as the run's own evaluation, so that the
run's test file gives the same logits, and the same AP, as training reported.

* LIBSVM runs (w7a, w8a, ``--dataset libsvm``, digits): a LIBSVM file read with the model's
  feature count :math:`d` (an index above :math:`d` is an error, a file with fewer features is
  padded with zeros), or a ``.npy`` array ``(n, d)``.
* CSV runs: a table read with the run's options; features are found by header name (so columns
  may come in any order, extra columns are ignored, a missing one is an error), the label column
  may be absent (``predict``), and the run's ID columns (``--id-column``) are carried into the
  predictions.
* Image runs: the dataset's folder (its test split: ``t10k-*`` for MNIST / Fashion-MNIST,
  ``test_batch.bin`` for CIFAR-10, ``val/`` for Tiny-ImageNet), one IDX images file (labels
  from the ``*-labels-idx1-ubyte`` beside it, if any) or CIFAR-10 ``.bin`` batch, or a ``.npy``
  array of raw pixels ``(n, C, H, W)`` (``(n, H, W)`` for one channel).

A decision threshold (``--at-recall R`` / ``--at-precision P``) is chosen by the rules of
:mod:`slate.metrics.operating_points` on a labelled ``--calibrate`` file; else on the run's
validation rows (``validation_pr_curve.csv``, named in ``model.json``) when it had
``--validation-fraction``, and then the test precision and recall of that same threshold (read
off the test set's ``pr_curve.csv``) are reported beside it, the honest estimate; else on the
run's test set (``pr_curve.csv``). Rows with logit :math:`\ge t` get decision 1.

With per-site files the run folder holds two curves of each kind (``model.json``'s
``threshold_curve`` and ``validation_curve``; :mod:`slate.training.threshold_curve`): the
saved model's on this site's **own** rows, the default (``pr_curve.csv``,
``validation_pr_curve.csv``), which no other site can shape, and the **pooled** curve of every
site's summed histograms (``pr_curve_pooled.csv``, ``validation_pr_curve_pooled.csv``), which
a lying site can shape; ``--curve own|pooled`` chooses explicitly. With one test set for every
site the two are one curve. With
``--threshold T`` the decision is ``score >= T`` on the score :math:`\sigma(z)` (monotone in the
logit :math:`z`, not a calibrated probability: ``slate calibrate`` fits one,
:mod:`slate.inference.calibration`, and the predictions then carry a ``probability`` column).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from slate import metrics
from slate.errors import ConfigError, DataError
from slate.inference.calibration import load_calibrator, scores_against
from slate.inference.model_file import Preprocessing, load_model, read_model_info
from slate.inference.scoring import PieceScorer, iter_input, logits_of, read_input
from slate.metrics import plots
from slate.metrics.operating_points import (
    OperatingPoint,
    at_precision,
    at_recall,
    at_threshold,
    few_positives_warning,
    marks,
    operating_points,
    unreached_marks,
)

__all__ = [
    "ModelEvaluation",
    "Predictions",
    "Reading",
    "evaluate",
    "format_evaluation",
    "predict",
    "run_curve",
    "write_evaluation",
    "write_predictions",
]

SCORE_FORMAT = "{:.9g}"  # float32 values written so that they read back exactly


@dataclass(frozen=True)
class Reading:
    """How ``predict`` and ``evaluate`` read a CSV file beyond the run's options: what to do
    with a bad row (``"error"`` or ``"skip"``, :mod:`slate.inference.scoring`), and a
    delimiter instead of the run's (``"whitespace"``: runs of spaces and tabs)."""

    on_bad_row: str = "error"
    delimiter: str | None = None


def _scored(
    model: nn.Module,
    pre: Preprocessing,
    data: str | Path,
    labels: str,
    run: str,
    reading: Reading = Reading(),
) -> tuple[Tensor, np.ndarray | None, dict[str, list[str]], list[str]]:
    """Every row's logit, its labels, ID columns and the file's notes, read and scored one
    piece at a time (:func:`slate.inference.scoring.iter_input`): beyond these, the memory does not
    grow with the file's rows."""
    scorer, pieces, ids, notes = PieceScorer(model), [], {}, []
    for piece in iter_input(pre, data, labels, run, reading.on_bad_row, reading.delimiter):
        scorer.add(piece.features)
        pieces.append(piece.labels)
        for column, values in piece.ids.items():
            ids.setdefault(column, []).extend(values)
        notes = piece.notes
    joined = None if any(y is None for y in pieces) else np.concatenate(pieces)
    if joined is None and labels == "required":
        raise DataError(
            f"{data} holds no labels, but they are needed here (to measure the model, or to "
            "choose a threshold). Give a labelled file."
        )
    return scorer.finish(), joined, ids, notes


def run_curve(
    run_dir: str | Path, name: str = "pr_curve.csv", what: str = "test-set"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The run's test-set PR curve with its logit thresholds, from ``pr_curve.csv`` (or
    another curve file of the run folder, ``name``, of the ``what`` rows)."""
    path = Path(run_dir) / name
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except FileNotFoundError:
        raise DataError(
            f"{path} is missing: the run's {what} curve is needed to choose a threshold. "
            "Give a labelled file with --calibrate FILE."
        ) from None
    if not rows or "logit" not in rows[0]:
        raise DataError(
            f"{path} has no logit column (it was written by an older slate), so the run's "
            f"{what} thresholds are unknown. Give a labelled file with --calibrate FILE."
        )
    columns = [np.array([float(r[k]) for r in rows]) for k in ("precision", "recall", "logit")]
    return columns[0], columns[1], columns[2]


def _curve_of(logits: Tensor, labels: np.ndarray, path: str):
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    positives = int(y.sum())
    if positives == 0:
        raise DataError(
            f"{path} holds no positive row among its {len(y)} rows: precision, recall and AP "
            "are undefined without positives."
        )
    precision, recall, thresholds = metrics.precision_recall_curve(logits, y)
    return precision, recall, np.append(thresholds.astype(np.float64), np.inf), y


# --------------------------------------------------------------------------- predict


@dataclass
class Predictions:
    """``slate predict``'s output: one score (and decision) per input row, in input order.

    ``scores`` are :math:`\\sigma(z)` of the logits :math:`z`: monotone in the logit, not
    calibrated probabilities; ``probabilities`` are the run's calibrator applied to :math:`z`
    (:mod:`slate.inference.calibration`), when the run folder holds one.
    """

    path: str
    scores: np.ndarray  # float32 sigmoid(logit)
    logits: np.ndarray  # float32
    ids: dict[str, list[str]]
    decisions: np.ndarray | None = None  # 0/1
    point: OperatingPoint | None = None
    threshold_source: str | None = None
    # With a threshold chosen on validation rows: its precision and recall on the test set.
    test_point: OperatingPoint | None = None
    test_source: str | None = None
    test_binned: bool = False  # the test curve is a histogram's (federated test scores)
    notes: list[str] = field(default_factory=list)
    probabilities: np.ndarray | None = None  # float64, from calibration.json

    @property
    def rows(self) -> int:
        return len(self.scores)

    def describe_threshold(self) -> str | None:
        """One line: which threshold made the decisions, and where it came from."""
        if self.decisions is None:
            return None
        flagged = int(self.decisions.sum())
        share = f"{flagged} of {self.rows} rows flagged"
        if self.point is None:
            return f"decision = score >= {self.threshold_source}: {share}"
        p = self.point
        return (
            f"decision = logit >= {p.logit:.9g} (score >= {p.threshold:.9g}), chosen for "
            f"{p.describe()} on {self.threshold_source}, where it gives precision "
            f"{p.precision:.4f}{_interval(p.precision_interval)} and recall "
            f"{p.recall:.4f}{_interval(p.recall_interval)}{self._on_test()}: {share}"
        )

    def _on_test(self) -> str:
        """``; on the run's test set ... it gives precision ... and recall ...``, or nothing."""
        t = self.test_point
        if t is None:
            return ""
        if t.precision is None:
            return f"; on {self.test_source} it flags no row (recall 0)"
        edge = ""
        if self.test_binned and self.point is not None and t.logit != self.point.logit:
            # A histogram's curve (federated test scores): the rows from that bin edge up.
            edge = f" (read at the test curve's first bin edge above it, logit {t.logit:.6g})"
        return (
            f"; on {self.test_source} it gives precision {t.precision:.4f}"
            f"{_interval(t.precision_interval)} and recall {t.recall:.4f}"
            f"{_interval(t.recall_interval)}{edge}"
        )


def _interval(bounds: tuple[float, float] | None) -> str:
    """`` (95% 0.61-0.87)``, or nothing without counts."""
    return "" if bounds is None else f" (95% {bounds[0]:.2f}-{bounds[1]:.2f})"


def _run_summary(run_dir: str | Path) -> dict[str, Any]:
    """``summary.json`` of the run, or nothing when it cannot be read."""
    try:
        saved = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _run_test_positives(run_dir: str | Path) -> int | None:
    """``summary.json``'s ``test_positives`` (None for runs written before it was stored)."""
    value = _run_summary(run_dir).get("test_positives")
    return int(value) if value is not None else None


def _check_threshold_options(threshold, recall, precision, calibrate) -> None:
    given = [
        flag
        for flag, value in (
            ("--threshold", threshold), ("--at-recall", recall), ("--at-precision", precision)
        )
        if value is not None
    ]  # fmt: skip
    if len(given) > 1:
        raise ConfigError(f"Give one of --threshold, --at-recall, --at-precision, not {given}.")
    if calibrate is not None and recall is None and precision is None:
        raise ConfigError(
            "--calibrate FILE chooses the threshold for --at-recall R or --at-precision P; give "
            "one of them (--threshold T needs no calibration)."
        )
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"--threshold is a score sigmoid(logit) in [0, 1], got {threshold}.")
    for flag, value in (("--at-recall", recall), ("--at-precision", precision)):
        if value is not None and not 0.0 < value <= 1.0:
            raise ConfigError(f"{flag} must lie in (0, 1], got {value}.")


def predict(
    run_dir: str | Path,
    data: str | Path,
    *,
    threshold: float | None = None,
    at_recall_of: float | None = None,
    at_precision_of: float | None = None,
    calibrate: str | Path | None = None,
    reading: Reading = Reading(),
    curve: str | None = None,
) -> Predictions:
    """Score every row of ``data`` with the run's model; with a threshold option, decide.

    Args:
        run_dir: the run folder (``model.json``, ``model.pt``, ``pr_curve.csv``).
        data: the file to score (module docstring for the formats).
        threshold: decision = score >= ``threshold`` (the score :math:`\\sigma(z)`, in [0, 1]).
        at_recall_of: decision at the threshold of the highest precision with recall >= R on
            the calibration set (the run's test set, or ``calibrate``).
        at_precision_of: decision at the threshold of the highest recall with precision >= P.
        calibrate: a labelled file in the same format to choose the threshold on.
        reading: bad rows and the delimiter of a CSV file (and of ``calibrate``).
        curve: ``"own"`` or ``"pooled"``: the run's curve to choose on (module docstring);
            None: the run's default (``model.json``'s ``threshold_curve``).
    """
    _check_threshold_options(threshold, at_recall_of, at_precision_of, calibrate)
    model, pre = load_model(run_dir)
    logits, _, ids, notes = _scored(model, pre, data, "optional", str(run_dir), reading)
    scores = torch.sigmoid(logits)
    out = Predictions(str(data), scores.numpy(), logits.numpy(), ids, notes=notes)
    out.probabilities = _calibrated(run_dir, logits)
    if threshold is not None:
        out.decisions = (scores.numpy().astype(np.float64) >= threshold).astype(np.int8)
        out.threshold_source = f"{threshold:g}"
        return out
    if at_recall_of is None and at_precision_of is None:
        return out
    validation = None
    if calibrate is not None:
        held = read_input(
            pre, calibrate, "required", str(run_dir), reading.on_bad_row, reading.delimiter
        )
        precision, recall, edges, _ = _curve_of(
            logits_of(model, held.features), held.labels, str(calibrate)
        )
        out.threshold_source = f"the calibration file {calibrate} ({held.rows} rows)"
        out.notes += held.notes
        positives = int(held.labels.sum())
    else:
        validation = _validation_curve(run_dir, curve)
        if validation is not None:
            (precision, recall, edges), positives, out.threshold_source = validation
        else:
            name, positives, whose = _test_curve(run_dir, curve)
            precision, recall, edges = run_curve(run_dir, name)
            out.threshold_source = _test_source(run_dir, name, whose)
    if at_recall_of is not None:
        point = at_recall(precision, recall, edges, at_recall_of)
    else:
        point = at_precision(precision, recall, edges, at_precision_of)
    if not point.reachable:
        best = int(np.argmax(np.where(edges < np.inf, precision, -1.0)))
        raise DataError(
            f"No threshold reaches precision >= {at_precision_of} on "
            f"{out.threshold_source}: the highest precision there is {precision[best]:.4f} "
            f"(at recall {recall[best]:.4f}). Ask for a lower precision."
        )
    if positives is not None:
        point = point.with_counts(positives)
        where = "the run's validation set" if validation is not None else out.threshold_source
        warning = few_positives_warning(positives, where)
        out.notes += [warning] if warning else []
    out.point = point
    if calibrate is None and validation is not None:  # the honest number: the test set's
        out.test_point, out.test_source = _on_test_set(run_dir, point, curve)
        own = out.test_source.startswith(_WHOSE["own"].format(kind="test"))
        out.test_binned = _run_summary(run_dir).get("evaluation") == "federated" and not own
    out.decisions = (logits.numpy().astype(np.float64) >= point.logit).astype(np.int8)
    return out


_WHOSE = {
    "own": "this site's own {kind} rows",
    "pooled": "every site's pooled {kind} rows",
    "run": "the run's {kind} set",
}


def _test_source(run_dir: str | Path, name: str = "pr_curve.csv", whose: str = "run") -> str:
    return f"{_WHOSE[whose].format(kind='test')} ({Path(run_dir) / name})"


def _chosen(saved: dict[str, Any], curve: str | None, what: str) -> tuple[str, str]:
    """``(file, whose rows: own, pooled or run)`` of the curve ``curve`` (None: the run's
    default) among the curves ``saved`` describes (``model.json``'s ``threshold_curve`` or
    ``validation_curve``; empty for a run written before either was recorded: one curve)."""
    default = saved.get("file", "pr_curve.csv")
    source, pooled = saved.get("source"), saved.get("pooled_file")
    if curve == "pooled" and pooled:
        return pooled, "pooled"
    if curve == "pooled" and source == "own":
        raise DataError(
            f"this run has no pooled {what} curve: the site refused the final average and saved "
            "its own model, scored on its own rows only. Leave out --curve pooled."
        )
    if curve == "own" and source == "pooled" and pooled:
        raise DataError(
            f"this run has no own {what} curve: {saved.get('note')}. Use --curve pooled, or "
            "--calibrate FILE with labelled rows of this site."
        )
    if source == "own":
        return default, "own"
    return default, "pooled" if pooled else "run"


def _test_curve(run_dir: str | Path, curve: str | None) -> tuple[str, int | None, str]:
    """The test curve's file, its positives and whose rows it scores (:func:`_chosen`)."""
    saved = read_model_info(run_dir).get("threshold_curve") or {}
    name, whose = _chosen(saved, curve, "test")
    positives = {"own": saved.get("positives"), "pooled": saved.get("pooled_positives")}.get(whose)
    if positives is None:
        positives = _run_test_positives(run_dir)
    return name, (None if positives is None else int(positives)), whose


def _validation_curve(
    run_dir: str | Path, curve: str | None = None
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], int | None, str] | None:
    """The run's validation curve (``model.json``'s ``validation_curve``; ``curve``:
    :func:`_chosen`), its positives and a description; None for a run without validation
    rows."""
    saved = read_model_info(run_dir).get("validation_curve")
    if not saved:
        return None
    name, whose = _chosen(saved, curve, "validation")
    positives = saved.get("pooled_positives" if whose == "pooled" else "positives")
    where = _WHOSE[whose].format(kind="validation").replace(" set", " rows")
    source = (
        f"{where} ({Path(run_dir) / name}: {saved.get('rows')} rows, "
        f"{positives} positive{'' if positives == 1 else 's'})"
    )
    curves = run_curve(run_dir, name, "validation")
    return curves, (None if positives is None else int(positives)), source


def _on_test_set(
    run_dir: str | Path, point: OperatingPoint, curve: str | None = None
) -> tuple[OperatingPoint, str]:
    """The precision and recall on the run's test set of a threshold chosen elsewhere."""
    name, positives, whose = _test_curve(run_dir, curve)
    precision, recall, edges = run_curve(run_dir, name)
    test = at_threshold(precision, recall, edges, point.logit, point.kind, point.target)
    if positives is not None and test.reachable:
        test = test.with_counts(positives)
    return test, _test_source(run_dir, name, whose)


def _calibrated(run_dir: str | Path, logits: Tensor) -> np.ndarray | None:
    """The run's calibrated probabilities of ``logits``; None without ``calibration.json``."""
    calibrator = load_calibrator(run_dir)
    return None if calibrator is None else calibrator(logits.numpy())


def write_predictions(predictions: Predictions, out: str | Path | None) -> None:
    """The predictions CSV: the ID columns, ``score``, ``probability`` when the run is
    calibrated, and ``decision`` when decided; to ``out`` or, without it, to stdout."""
    header = [*predictions.ids, "score"]
    if predictions.probabilities is not None:
        header.append("probability")
    if predictions.decisions is not None:
        header.append("decision")
    columns: list[Any] = list(predictions.ids.values())
    columns.append([SCORE_FORMAT.format(float(s)) for s in predictions.scores])
    if predictions.probabilities is not None:
        columns.append([SCORE_FORMAT.format(float(p)) for p in predictions.probabilities])
    if predictions.decisions is not None:
        columns.append([str(int(d)) for d in predictions.decisions])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(zip(*columns, strict=True))
    if out is None:
        sys.stdout.write(buffer.getvalue())
        return
    target = Path(out)
    if target.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name, e.g. {target}/scores.csv.")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(buffer.getvalue())


# --------------------------------------------------------------------------- evaluate


@dataclass
class ModelEvaluation:
    """``slate evaluate``'s numbers on one labelled file, and its PR curve."""

    run: str
    data: str
    rows: int
    positives: int
    ap: float
    auroc: float | None
    table: list[OperatingPoint]
    curve: tuple[np.ndarray, np.ndarray] = field(repr=False)
    notes: list[str] = field(default_factory=list)
    calibration: dict[str, Any] | None = None  # Brier and log-loss, with a calibrator

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "data": self.data,
            "rows": self.rows,
            "positives": self.positives,
            "positive_rate": self.positives / self.rows,
            "ap": self.ap,
            "auroc": self.auroc,
            "operating_points": [p.to_dict() for p in self.table],
            "calibration": self.calibration,
        }


def evaluate(
    run_dir: str | Path, data: str | Path, reading: Reading = Reading()
) -> ModelEvaluation:
    """AP, AUROC, positive rate and the operating-point table of the run's model on ``data``
    (``reading``: bad rows and the delimiter of a CSV file; skipped rows are not measured).

    The metrics are :mod:`slate.metrics`' (equal to scikit-learn's) on the logits, as in
    training, so the run's own test file gives ``summary.json``'s ``test_ap``.
    """
    model, pre = load_model(run_dir)
    logits, labels, _, notes = _scored(model, pre, data, "required", str(run_dir), reading)
    precision, recall, edges, y = _curve_of(logits, labels, str(data))
    positives = int(y.sum())
    auroc = metrics.auroc(logits, y) if positives < len(y) else None
    return ModelEvaluation(
        str(run_dir), str(data), len(y), positives, metrics.average_precision(logits, y), auroc,
        operating_points(precision, recall, edges, positives=positives), (precision, recall),
        notes, _calibration_scores(run_dir, logits, y),
    )  # fmt: skip


def _calibration_scores(run_dir: str | Path, logits: Tensor, y: Tensor) -> dict[str, Any] | None:
    """With a calibrator: the method, and the Brier score and log-loss of the calibrated
    ``probability``, of the raw ``score`` and of the constant positive rate on this file."""
    calibrator = load_calibrator(run_dir)
    if calibrator is None:
        return None
    scores = scores_against(logits.numpy(), y.numpy(), calibrator)
    return {"method": calibrator.method, **scores}


def format_evaluation(result: ModelEvaluation) -> str:
    """The console report: the metrics, then the operating-point table."""
    auroc = "n/a (no negative row)" if result.auroc is None else f"{result.auroc:.6f}"
    lines = [
        f"{result.data}: {result.rows} rows, {result.positives} positive "
        f"({result.positives / result.rows:.2%})",
        f"AP {result.ap:.6f}  AUROC {auroc}",
        f"{'operating point':<18} {'precision':>9} {'recall':>8} {'threshold':>11} {'logit':>9}",
    ]
    for point in result.table:
        name = point.describe()
        if not point.reachable:
            lines.append(f"{name:<18} {'not reached':>9}")
            continue
        lines.append(
            f"{name:<18} {point.precision:>9.4f} {point.recall:>8.4f} {point.threshold:>11.6g} "
            f"{point.logit:>9.4f}  TP {point.true_positives} of {point.flagged} flagged; 95% "
            f"P {_bounds(point.precision_interval)} R {_bounds(point.recall_interval)}"
        )
    c = result.calibration
    if c is not None:
        lines.append(
            f"calibrated probability ({c['method']}, calibration.json): Brier "
            f"{c['probability']['brier']:.5f} (raw score {c['score']['brier']:.5f}, constant "
            f"{c['constant']['brier']:.5f}), log-loss {c['probability']['log_loss']:.5f} "
            f"({c['score']['log_loss']:.5f}, {c['constant']['log_loss']:.5f})"
        )
    warning = few_positives_warning(result.positives, result.data)
    return "\n".join([*lines, warning] if warning else lines)


def _bounds(bounds: tuple[float, float] | None) -> str:
    return "n/a" if bounds is None else f"{bounds[0]:.2f}-{bounds[1]:.2f}"


def write_evaluation(result: ModelEvaluation, out_dir: str | Path) -> None:
    """``evaluation.json`` and ``pr_curve.png`` (the operating points marked) in ``out_dir``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is a file; give a folder.")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "evaluation.json", "w") as handle:
        json.dump(result.to_dict(), handle, indent=2)
    precision, recall = result.curve
    plots.plot_pr_curves(
        {Path(result.run).name: (precision, recall, result.ap)},
        out / "pr_curve.png",
        title=f"Precision-recall on {Path(result.data).name}",
        points=marks(result.table),
        unreached=unreached_marks(result.table),
        prevalence=result.positives / result.rows,
    )
