r"""Calibrated probabilities: ``slate calibrate``, and the calibrator that ``predict``,
``evaluate`` and ``export`` apply.

A model trained for AP ranks rows; its score :math:`s = \sigma(z)` is monotone in the logit
:math:`z` but is not a probability (on an abalone run at a 0.77% positive rate the mean score
was 0.265). A *calibrator* :math:`g` maps the logit to a probability :math:`p = g(z)`, fitted on
a labelled file's pairs :math:`(z_i, y_i)`, :math:`i = 1..n`, with :math:`n_+` positives and
:math:`n_- = n - n_+` negatives:

* ``sigmoid`` (Platt scaling): :math:`g(z) = \sigma(a z + b)` with

  .. math::

      (a, b) = \arg\min_{a, b} -\sum_i \big[t_i \log g(z_i) + (1 - t_i) \log(1 - g(z_i))\big],
      \qquad t_i = \begin{cases} (n_+ + 1) / (n_+ + 2) & y_i = 1 \\
                                 1 / (n_- + 2) & y_i = 0, \end{cases}

  Platt's targets (Platt 1999, section 2.2: a prior that keeps :math:`a, b` finite when the
  file is separable). It is fitted with scikit-learn's ``LogisticRegression`` without penalty
  on every row twice, labelled 1 with weight :math:`t_i` and 0 with weight :math:`1 - t_i`
  (the logits divided by :math:`\max(1, \max_i |z_i|)` for the solver, :math:`a` scaled
  back): the same minimiser as ``CalibratedClassifierCV(method="sigmoid")``.
* ``isotonic``: :math:`g = \arg\min \sum_i (y_i - g(z_i))^2` over non-decreasing :math:`g`
  (pool adjacent violators, ``sklearn.isotonic.IsotonicRegression(out_of_bounds="clip")``),
  kept as its thresholds :math:`x_1 < \dots < x_K` and values :math:`y_1 \le \dots \le y_K`:
  :math:`g` is linear between consecutive thresholds, :math:`y_1` below :math:`x_1` and
  :math:`y_K` above :math:`x_K`.

Both are monotone in :math:`z` (Platt: when :math:`a > 0`), so ranking metrics (AP, AUROC,
which slate computes on the logits) do not change; isotonic steps may tie rows the logit kept
apart. How close to probabilities they come is measured on the file by the Brier score
:math:`B = \frac1n \sum_i (p_i - y_i)^2` and the log-loss :math:`L = -\frac1n \sum_i [y_i \log
p_i + (1 - y_i) \log(1 - p_i)]` (scikit-learn's, :math:`p` clipped to machine epsilon), for the
raw score :math:`\sigma(z)`, the calibrated :math:`p`, and the constant :math:`\pi = n_+ / n`
(:math:`B = \pi (1 - \pi)`). Measured on the file the calibrator was fitted on, they are
optimistic: a separate labelled file gives honest numbers.

The calibrator is stored as JSON (``calibration.json`` in the run folder, no pickle): the method,
its parameters (:math:`a, b`, or the thresholds :math:`x_k, y_k`), the file it was fitted on
(rows, positives, SHA-256) and the scores; ``reliability.png`` beside it shows the reliability
diagram (``sklearn.calibration.calibration_curve``, equal-count bins).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from slate.errors import ConfigError, DataError
from slate.version import __version__

__all__ = [
    "CALIBRATION_FILE",
    "METHODS",
    "RELIABILITY_FILE",
    "Calibration",
    "Calibrator",
    "IsotonicModule",
    "PlattModule",
    "calibrate_run",
    "fit_calibrator",
    "fit_isotonic",
    "fit_sigmoid",
    "format_calibration",
    "load_calibrator",
    "probability_scores",
    "raw_scores",
    "reliability",
]

CALIBRATION_FILE = "calibration.json"
RELIABILITY_FILE = "reliability.png"
FORMAT = "slate-calibration"
FORMAT_VERSION = 1
METHODS = ("sigmoid", "isotonic")
RELIABILITY_BINS = 10  # equal-count bins of the reliability diagram
_PLATT_TOL = 1e-12  # LogisticRegression's tolerance: (a, b) to about 1e-8


# --------------------------------------------------------------------------- the calibrator


@dataclass(frozen=True)
class Calibrator:
    """A fitted map from the model's logit to a probability (module docstring).

    ``sigmoid``: :math:`p = \\sigma(a z + b)`; ``isotonic``: :math:`p` = linear interpolation
    of ``(x, y)`` at :math:`z`, clipped to :math:`[y_1, y_K]` outside :math:`[x_1, x_K]`.
    """

    method: str
    a: float | None = None
    b: float | None = None
    x: tuple[float, ...] = ()
    y: tuple[float, ...] = ()

    def __call__(self, logits: np.ndarray | Tensor) -> np.ndarray:
        """The probabilities (float64) of the logits ``logits`` (any shape, flattened)."""
        z = np.asarray(logits, dtype=np.float64).reshape(-1)
        if self.method == "sigmoid":
            return _expit(self.a * z + self.b)
        return np.interp(z, np.asarray(self.x), np.asarray(self.y))

    def module(self) -> nn.Module:
        """The same map as torch operations (float64 inside, float32 out), for the export."""
        if self.method == "sigmoid":
            return PlattModule(self.a, self.b)
        return IsotonicModule(self.x, self.y)

    def describe(self) -> str:
        """``p = sigmoid(0.5123 * logit - 3.2100)`` or ``isotonic, 12 thresholds ...``."""
        if self.method == "sigmoid":
            sign = "-" if self.b < 0 else "+"
            return f"p = sigmoid({self.a:.6g} * logit {sign} {abs(self.b):.6g})"
        return (
            f"isotonic: {len(self.x)} thresholds on the logit from {self.x[0]:.6g} to "
            f"{self.x[-1]:.6g}, p from {self.y[0]:.6g} to {self.y[-1]:.6g}"
        )

    def parameters(self) -> dict[str, Any]:
        """``{"a", "b"}`` or ``{"x", "y"}`` (the isotonic thresholds and values)."""
        if self.method == "sigmoid":
            return {"a": self.a, "b": self.b}
        return {"x": list(self.x), "y": list(self.y)}

    @classmethod
    def from_parameters(cls, method: str, parameters: dict[str, Any]) -> Calibrator:
        """The calibrator of :meth:`parameters`' dict; ``ValueError`` when it does not fit."""
        if method == "sigmoid":
            a, b = float(parameters["a"]), float(parameters["b"])
            if not (math.isfinite(a) and math.isfinite(b)):
                raise ValueError(f"a = {a}, b = {b} are not finite")
            return cls("sigmoid", a=a, b=b)
        if method == "isotonic":
            x = tuple(float(v) for v in parameters["x"])
            y = tuple(float(v) for v in parameters["y"])
            if not x or len(x) != len(y):
                raise ValueError(f"{len(x)} thresholds x but {len(y)} values y")
            if any(b <= a for a, b in pairwise(x)):
                raise ValueError("the thresholds x are not increasing")
            if not all(math.isfinite(v) for v in (*x, *y)):
                raise ValueError("a threshold or value is not finite")
            return cls("isotonic", x=x, y=y)
        raise ValueError(f"unknown method {method!r}")


def _expit(t: np.ndarray) -> np.ndarray:
    """:math:`\\sigma(t) = 1 / (1 + e^{-t})` in float64 without overflow warnings."""
    from scipy.special import expit

    return expit(t)


class PlattModule(nn.Module):
    """:math:`p = \\sigma(a z + b)`, computed in float64, returned as float32."""

    def __init__(self, a: float, b: float) -> None:
        super().__init__()
        self.register_buffer("ab", torch.tensor([a, b], dtype=torch.float64))

    def forward(self, z: Tensor) -> Tensor:
        return torch.sigmoid(self.ab[0] * z.double() + self.ab[1]).float()


class IsotonicModule(nn.Module):
    r"""Linear interpolation of :math:`(x_k, y_k)` at :math:`z`, clipped to :math:`[x_1, x_K]`:
    with :math:`k` such that :math:`x_{k-1} \le z < x_k` (``torch.searchsorted``),
    :math:`p = y_{k-1} + (z - x_{k-1}) (y_k - y_{k-1}) / (x_k - x_{k-1})`; float64 inside,
    float32 out."""

    def __init__(self, x: Sequence[float], y: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("x", torch.tensor(list(x), dtype=torch.float64))
        self.register_buffer("y", torch.tensor(list(y), dtype=torch.float64))
        self.single = len(x) == 1  # a constant: no interval to interpolate in

    def forward(self, z: Tensor) -> Tensor:
        z = z.double()
        if self.single:
            return (torch.zeros_like(z) + self.y[0]).float()
        z = torch.clamp(z, min=self.x[0], max=self.x[-1])
        k = torch.clamp(torch.searchsorted(self.x, z, right=True), 1, self.x.numel() - 1)
        x0, x1 = self.x[k - 1], self.x[k]
        y0, y1 = self.y[k - 1], self.y[k]
        return (y0 + (z - x0) * (y1 - y0) / (x1 - x0)).float()


# --------------------------------------------------------------------------- fitting


def _checked(logits, labels) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    if z.shape != y.shape:
        raise ValueError(f"{z.size} logits for {y.size} labels")
    return z, y


def fit_sigmoid(logits, labels) -> Calibrator:
    """Platt scaling with Platt's targets (module docstring), by ``LogisticRegression``."""
    from sklearn.linear_model import LogisticRegression

    z, y = _checked(logits, labels)
    positives = int(y.sum())
    negatives = len(y) - positives
    target = np.where(y == 1, (positives + 1) / (positives + 2), 1 / (negatives + 2))
    scale = max(1.0, float(np.abs(z).max()))
    features = np.concatenate([z, z])[:, None] / scale
    classes = np.concatenate([np.ones(len(z)), np.zeros(len(z))])
    weights = np.concatenate([target, 1.0 - target])
    fitted = LogisticRegression(C=np.inf, tol=_PLATT_TOL, max_iter=10_000)
    fitted.fit(features, classes, sample_weight=weights)
    return Calibrator("sigmoid", a=float(fitted.coef_[0, 0]) / scale, b=float(fitted.intercept_[0]))


def fit_isotonic(logits, labels) -> Calibrator:
    """Isotonic regression of the labels on the logit, as scikit-learn fits it."""
    from sklearn.isotonic import IsotonicRegression

    z, y = _checked(logits, labels)
    fitted = IsotonicRegression(out_of_bounds="clip").fit(z, y.astype(np.float64))
    x = tuple(float(v) for v in fitted.X_thresholds_)
    values = tuple(float(v) for v in fitted.y_thresholds_)
    return Calibrator("isotonic", x=x, y=values)


def fit_calibrator(method: str, logits, labels) -> Calibrator:
    """``fit_sigmoid`` or ``fit_isotonic`` by name.

    Raises:
        ConfigError: an unknown method.
    """
    check_method(method)
    return fit_sigmoid(logits, labels) if method == "sigmoid" else fit_isotonic(logits, labels)


def check_method(method: str) -> None:
    """Raise :class:`ConfigError` unless ``method`` is one of :data:`METHODS`."""
    if method not in METHODS:
        raise ConfigError(
            f"--method must be sigmoid (Platt scaling: p = sigmoid(a * logit + b), two "
            f"parameters, the safer choice with few positives) or isotonic (a non-decreasing "
            f"step function of the logit, needs many positives), got {method!r}."
        )


# --------------------------------------------------------------------------- measuring


def raw_scores(logits) -> np.ndarray:
    """The uncalibrated score :math:`\\sigma(z)` as ``slate predict`` writes it (float32),
    as float64."""
    z = torch.as_tensor(np.asarray(logits, dtype=np.float32).reshape(-1))
    return torch.sigmoid(z).double().numpy()


def probability_scores(labels, probabilities: np.ndarray) -> dict[str, float]:
    """``{"brier", "log_loss"}`` of ``probabilities`` against the 0/1 ``labels``."""
    from sklearn.metrics import brier_score_loss, log_loss

    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    return {
        "brier": float(brier_score_loss(y, p, labels=[0, 1])),
        "log_loss": float(log_loss(y, p, labels=[0, 1])),
    }


def scores_against(logits, labels, calibrator: Calibrator) -> dict[str, dict[str, float]]:
    """Brier score and log-loss of the raw score, the calibrated probability and the constant
    positive rate: ``{"score": {...}, "probability": {...}, "constant": {...}}``."""
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    rate = float(y.mean())
    return {
        "score": probability_scores(y, raw_scores(logits)),
        "probability": probability_scores(y, calibrator(logits)),
        "constant": {**probability_scores(y, np.full(len(y), rate)), "positive_rate": rate},
    }


def reliability(labels, probabilities, bins: int = RELIABILITY_BINS) -> dict[str, list[float]]:
    """The reliability diagram's points: per equal-count bin of ``probabilities``, the mean
    predicted probability and the observed positive fraction
    (``sklearn.calibration.calibration_curve(strategy="quantile")``; empty bins left out)."""
    from sklearn.calibration import calibration_curve

    observed, predicted = calibration_curve(
        np.asarray(labels, dtype=np.int64).reshape(-1),
        np.asarray(probabilities, dtype=np.float64).reshape(-1),
        n_bins=bins,
        strategy="quantile",
    )
    return {"mean_predicted": predicted.tolist(), "observed": observed.tolist()}


# --------------------------------------------------------------------------- the run folder


def load_calibrator(run_dir: str | Path) -> Calibrator | None:
    """The run folder's ``calibration.json`` as a :class:`Calibrator`; None without one.

    Raises:
        DataError: the file exists but is not a calibration slate can read.
    """
    path = Path(run_dir) / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path} cannot be read as JSON ({err}).") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise DataError(f"{path} is not a slate calibration (no 'format': '{FORMAT}').")
    if saved.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{path} has calibration format version {saved.get('format_version')!r}; this slate "
            f"reads version {FORMAT_VERSION}. Run slate calibrate again."
        )
    try:
        return Calibrator.from_parameters(saved.get("method"), saved.get("parameters") or {})
    except (KeyError, TypeError, ValueError) as err:
        raise DataError(
            f"{path} holds no usable calibrator ({err}). Run slate calibrate again."
        ) from None


@dataclass
class Calibration:
    """What ``slate calibrate`` fitted, measured and wrote."""

    run: str
    data: str
    rows: int
    positives: int
    calibrator: Calibrator
    scores: dict[str, dict[str, float]]
    curves: dict[str, dict[str, list[float]]]
    out: Path
    sha256: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """``calibration.json``'s content."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "method": self.calibrator.method,
            "input": "the model's logit z (score = sigmoid(z))",
            "parameters": self.calibrator.parameters(),
            "fitted_on": {
                "data": self.data,
                "path": str(Path(self.data).resolve()),
                "sha256": self.sha256,
                "rows": self.rows,
                "positives": self.positives,
                "positive_rate": self.positives / self.rows,
            },
            "scores": self.scores,
            "reliability": self.curves,
            "notes": self.notes,
            "slate_version": __version__,
        }


def _sha256(path: Path) -> str | None:
    if not path.is_file():
        return None  # an image folder
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _own_file_note(run: Path, data: Path) -> str | None:
    """A note when ``data`` is the run's own test file or the file its test rows came from."""
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    config = summary.get("config") or {}
    split = str(summary.get("test_split") or "")
    resolved = data.resolve()

    def same(other: Any) -> bool:
        return bool(other) and Path(str(other)).resolve() == resolved

    if same(config.get("test")) or f"official test file {data.name}" in split:
        return (
            f"note: {data} is the run's own test file: from now on its Brier score and "
            "log-loss of the calibrated probability (slate evaluate) are optimistic, measured "
            "on the rows the calibrator was fitted on. Calibrate on a separate labelled file "
            "for honest numbers."
        )
    if same(config.get("train")):
        return (
            f"note: {data} is the run's training file (its test rows, if split from it, "
            "included): the model has seen these rows, so its scores there are more confident "
            "than on new data and the calibration is biased. Calibrate on a separate labelled "
            "file."
        )
    return None


def calibrate_run(
    run_dir: str | Path, data: str | Path, method: str, out: str | Path | None = None
) -> Calibration:
    """Fit a calibrator on a labelled file scored by the run's model, measure it, and write
    ``calibration.json`` and ``reliability.png`` into ``out`` (default: the run folder, where
    ``predict``, ``evaluate`` and ``export`` find it).

    The file is read as ``slate evaluate`` reads it (:func:`slate.inference.scoring.read_input`, the
    run's preprocessing) and scored by :func:`slate.inference.scoring.logits_of`.

    Raises:
        ConfigError: an unknown ``method``, or ``out`` is a file.
        DataError: no run folder, a file without labels, without positives or negatives, or
            whose logits are not finite.
    """
    from slate.inference.model_file import load_model
    from slate.inference.scoring import logits_of, read_input
    from slate.metrics.operating_points import FEW_POSITIVES

    check_method(method)
    run = Path(run_dir)
    folder = run if out is None else Path(out)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--out {folder} exists and is a file; give a folder.")
    model, pre = load_model(run)
    read = read_input(pre, data, "required", str(run))
    y = np.asarray(read.labels, dtype=np.int64)
    positives = int(y.sum())
    if positives == 0 or positives == len(y):
        one = "negative" if positives else "positive"
        raise DataError(
            f"{data} holds no {one} row among its {len(y)} rows: a calibrator maps scores to "
            "the chance of a positive, which a file of one class cannot tell. Give a labelled "
            "file with both classes."
        )
    z = logits_of(model, read.features).double().numpy()
    if not np.isfinite(z).all():
        raise DataError(
            f"the model of {run} gives {int((~np.isfinite(z)).sum())} non-finite logits on "
            f"{data}; they cannot be calibrated."
        )
    calibrator = fit_calibrator(method, z, y)
    probabilities = calibrator(z)
    result = Calibration(
        str(run), str(data), len(y), positives, calibrator, scores_against(z, y, calibrator),
        {"score": reliability(y, raw_scores(z)), "probability": reliability(y, probabilities)},
        folder, _sha256(Path(data)), list(read.notes),
    )  # fmt: skip
    if positives < FEW_POSITIVES:
        result.notes.append(
            f"warning: {data} holds only {positives} positive{'s' if positives != 1 else ''}; "
            "a calibrator fitted on so few is uncertain (isotonic most: its steps follow single "
            "rows), and its Brier score varies widely from one such file to another."
        )
    own = _own_file_note(run, Path(data))
    if own:
        result.notes.append(own)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CALIBRATION_FILE).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    _plot(result, y, z, probabilities)
    return result


def _plot(result: Calibration, y: np.ndarray, z: np.ndarray, probabilities: np.ndarray) -> None:
    from slate.metrics import plots

    brier = {k: v["brier"] for k, v in result.scores.items()}
    curves = {
        f"score sigmoid(logit) (Brier {brier['score']:.4f})": result.curves["score"],
        f"{result.calibrator.method} probability (Brier {brier['probability']:.4f})": (
            result.curves["probability"]
        ),
    }
    plots.plot_reliability(
        {name: (c["mean_predicted"], c["observed"]) for name, c in curves.items()},
        result.out / RELIABILITY_FILE,
        title=f"Reliability on {Path(result.data).name} ({result.rows} rows, "
        f"{result.positives} positive)",
        predictions={"score": raw_scores(z), "probability": probabilities},
        positive_rate=result.positives / result.rows,
    )


def format_calibration(result: Calibration) -> str:
    """The console report: the file, the calibrator, the scores before and after."""
    s = result.scores
    lines = [
        f"{result.calibrator.method} calibration fitted on {result.data}: {result.rows} rows, "
        f"{result.positives} positive ({result.positives / result.rows:.2%})",
        result.calibrator.describe(),
        f"{'on this file':<34} {'Brier':>8} {'log-loss':>9}",
        f"{'score sigmoid(logit), before':<34} {s['score']['brier']:>8.5f} "
        f"{s['score']['log_loss']:>9.5f}",
        f"{'calibrated probability, after':<34} {s['probability']['brier']:>8.5f} "
        f"{s['probability']['log_loss']:>9.5f}",
        f"{'constant ' + format(s['constant']['positive_rate'], '.2%'):<34} "
        f"{s['constant']['brier']:>8.5f} {s['constant']['log_loss']:>9.5f}",
        "(measured on the file it was fitted on: optimistic; a separate labelled file gives "
        "honest numbers)",
    ]
    return "\n".join([*lines, *result.notes])
