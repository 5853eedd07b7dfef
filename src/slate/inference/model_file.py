r"""The trained model as a self-describing pair of files in the run folder.

* ``model.pt``: the averaged model's ``state_dict``, tensors only (read with
  ``weights_only=True``, as before);
* ``model.json``: what it takes to rebuild and feed the model: the model name, input shape and
  ``hidden``, the preprocessing fitted in training, how input files are read, the label
  mapping, the slate and torch versions, and a format version (:data:`FORMAT_VERSION`); a run
  with validation rows adds ``validation_curve``, which names the kept model's validation PR
  curve in the run folder (``validation_pr_curve.csv``, its rows and positives, written by
  :mod:`slate.training.outputs`), where ``slate predict`` chooses its operating points.

:func:`load_model` returns the module, in eval mode, with its :class:`Preprocessing`: the map
from *raw features* (what a file holds) to the model's input, applied in this order:

* ``clip`` (LIBSVM files with a public value range: ``--feature-range``, and every
  ``--dp-epsilon`` run): each value clipped into ``[low, high]``, as every site clipped its own
  rows in training (:func:`slate.data.declared.clip_to_range`);
* ``divide`` (the digits set): :math:`x / 16`, computed in float64 and rounded to float32;
* ``images`` (MNIST, Fashion-MNIST, CIFAR-10, Tiny-ImageNet): uint8 pixels :math:`p` become
  :math:`(p / 255 - \mu_c) / \sigma_c` per channel :math:`c`, in float32;
* ``standardize`` (``--standardize``): :math:`(x_j - \text{mean}_j) / \text{scale}_j` per
  feature, in float64, rounded to float32;
* ``table`` (CSV files, :class:`slate.data.encoding.TableEncoder`): a missing numeric cell
  takes its column's training mean, columns with missing cells in training get a 0/1
  indicator, text columns are one-hot, then the scaling fitted in training. As an array (the
  exported program's input) the raw features of a table are its numeric columns as read (NaN
  for a missing cell) followed by the one-hot columns; :attr:`Preprocessing.raw_columns` names
  them.

Each step exists twice, on numpy arrays (``slate predict``) and as a torch module
(:meth:`Preprocessing.module`, inside the exported program), computing the same float32
numbers with the same operations.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from slate.errors import DataError
from slate.version import __version__

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MODEL_JSON",
    "STATE_DICT",
    "LoadedModel",
    "Preprocessing",
    "describe_run",
    "load_model",
    "read_model_info",
    "save_model",
]

FORMAT = "slate-model"
FORMAT_VERSION = 1
MODEL_JSON = "model.json"
STATE_DICT = "model.pt"
LIBSVM_DATASETS = ("w7a", "w8a", "libsvm", "digits")
CSV_OPTIONS = (
    "label_column",
    "positive_label",
    "delimiter",
    "encoding",
    "na_values",
    "categorical_columns",
    "missing",
)


# --------------------------------------------------------------------------- writing


def describe_run(config: Any, input_shape: Sequence[int], transform: Any = None) -> dict:
    """``model.json``'s content for a run: ``config`` is its resolved ``TrainConfig``,
    ``transform`` the fitted preprocessing of its data (``LocalData.preprocessing``)."""
    from slate.data.datasets import IMAGE_SETS

    steps: list[dict[str, Any]] = []
    span = getattr(config, "feature_range", None)
    if span is not None and config.dataset == "libsvm":
        steps.append({"kind": "clip", "low": float(span[0]), "high": float(span[1])})
    if config.dataset == "digits":
        steps.append({"kind": "divide", "by": 16.0})
    if config.dataset in IMAGE_SETS:
        spec = IMAGE_SETS[config.dataset]
        steps.append(
            {"kind": "images", "scale": 255.0, "mean": list(spec.mean), "std": list(spec.std)}
        )
    if transform is not None:
        steps.append(transform.to_dict())
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "slate_version": __version__,
        "torch_version": torch.__version__.split("+")[0],
        "dataset": config.dataset,
        "model": {
            "name": config.model,
            "input_shape": [int(n) for n in input_shape],
            "hidden": config.hidden,
        },
        "input": _input_description(config, input_shape),
        "preprocessing": steps,
        "labels": _label_mapping(config),
        "state_dict": STATE_DICT,
    }


def _input_description(config: Any, input_shape: Sequence[int]) -> dict[str, Any]:
    from slate.data.datasets import IMAGE_SETS

    if config.dataset == "csv":
        options = {k: getattr(config, k, None) for k in CSV_OPTIONS}
        for key in ("na_values", "categorical_columns"):
            options[key] = list(options[key] or ())
        return {"format": "csv", **options}
    if config.dataset in IMAGE_SETS:
        return {"format": "images", "dataset": config.dataset}
    described = {
        "format": "libsvm",
        "n_features": int(math.prod(input_shape)),
        "zero_based": bool(getattr(config, "zero_based", False)),
    }
    positive = getattr(config, "positive_label", None)
    return described if positive is None else {**described, "positive_label": positive}


def _label_mapping(config: Any) -> dict[str, Any]:
    from slate.data.datasets import IMAGE_SETS

    if config.dataset == "csv":
        return {
            "kind": "column",
            "column": config.label_column,
            "positive_label": config.positive_label,
            "meaning": f"1 where column {config.label_column!r} equals "
            f"{config.positive_label!r}, 0 otherwise",
        }
    classes = IMAGE_SETS[config.dataset].n_classes if config.dataset in IMAGE_SETS else None
    if config.dataset == "digits":
        classes = 10
    if classes is not None:
        half = classes // 2
        return {
            "kind": "classes",
            "n_classes": classes,
            "positive_classes": [half, classes - 1],
            "meaning": f"classes {half}-{classes - 1} positive (1), 0-{half - 1} negative (0)",
        }
    positive = getattr(config, "positive_label", None)
    if config.dataset == "libsvm" and positive is not None and positive.strip() in ("-1", "0"):
        return {"kind": "binary", "positive_label": positive.strip(),
                "meaning": f"LIBSVM label {positive.strip()} positive (--positive-label), the "
                "other label negative"}  # fmt: skip
    return {"kind": "binary", "meaning": "LIBSVM labels +1 or 1 positive, -1 or 0 negative"}


def save_model(out: str | Path, model: nn.Module, description: dict[str, Any]) -> None:
    """Write ``model.pt`` (the state_dict, on the CPU) and ``model.json`` into ``out``."""
    out = Path(out)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save(state, out / STATE_DICT)
    with open(out / MODEL_JSON, "w") as handle:
        json.dump(description, handle, indent=2)


# --------------------------------------------------------------------------- reading


class LoadedModel(NamedTuple):
    """What :func:`load_model` returns: ``model, preprocessing = slate.load_model(run)``."""

    model: nn.Module
    preprocessing: Preprocessing


def read_model_info(run_dir: str | Path) -> dict[str, Any]:
    """``model.json`` of a run folder, checked: its format and format version are known."""
    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"--run {run}: no such run folder.")
    path = run / MODEL_JSON
    if not path.is_file():
        old = (
            " It holds model.pt but no model.json: it was written by an older slate."
            if (run / STATE_DICT).is_file()
            else ""
        )
        raise DataError(
            f"--run {run} holds no {MODEL_JSON}, the description of its model.{old} Train the "
            "model again with this slate (or rebuild it by hand from summary.json's config, "
            "docs/outputs.md)."
        )
    try:
        info = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path} cannot be read as JSON ({err}).") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise DataError(f"{path} is not a slate model description (no 'format': '{FORMAT}').")
    version = info.get("format_version")
    if version != FORMAT_VERSION:
        raise DataError(
            f"{path} has model format version {version!r}, but slate {__version__} reads only "
            f"version {FORMAT_VERSION}. Use the slate version that wrote it "
            f"({info.get('slate_version', 'unknown')}), or train the model again."
        )
    return info


def load_model(run_dir: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """The run's model, rebuilt from ``model.json`` and loaded from ``model.pt`` with
    ``weights_only=True``, in eval mode, with its :class:`Preprocessing`.

    Raises:
        DataError: no ``model.json`` or ``model.pt``, an unknown format version, or weights
            that do not fit the described model.
    """
    from slate.errors import SlateError
    from slate.models import build_model

    run = Path(run_dir)
    info = read_model_info(run)
    spec = info["model"]
    try:
        model = build_model(
            spec["name"], tuple(spec["input_shape"]), hidden=spec.get("hidden") or 28
        )
    except SlateError as err:
        raise DataError(f"{run / MODEL_JSON} describes a model slate cannot build: {err}") from None
    weights = run / info.get("state_dict", STATE_DICT)
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"--run {run} holds {MODEL_JSON} but not its weights, {weights}.") from None
    except Exception as err:  # a corrupt file, or one holding more than tensors
        raise DataError(
            f"{weights} cannot be read with torch.load(weights_only=True): {err}"
        ) from None
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(
            f"{weights} does not fit the {spec['name']} model of input shape "
            f"{tuple(spec['input_shape'])} that {MODEL_JSON} describes: {first}"
        ) from None
    model.to(device).eval()
    return LoadedModel(model, Preprocessing.from_info(info))


# --------------------------------------------------------------------------- preprocessing


@dataclass
class Preprocessing:
    """The run's map from raw features to the model's input (module docstring).

    Attributes:
        steps: the saved steps, in order (``model.json``'s ``preprocessing``).
        input_shape: the model's input shape per row.
        input: how input files are read (``model.json``'s ``input``).
        labels: the label mapping (``model.json``'s ``labels``).
    """

    steps: list[dict[str, Any]]
    input_shape: tuple[int, ...]
    input: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> Preprocessing:
        steps = list(info.get("preprocessing") or [])
        known = set(_STEP_ARRAYS)
        unknown = [s.get("kind") for s in steps if s.get("kind") not in known]
        if unknown:
            raise DataError(f"Unknown preprocessing steps {unknown} in {MODEL_JSON}.")
        return cls(
            steps, tuple(info["model"]["input_shape"]), info.get("input", {}),
            info.get("labels", {}),
        )  # fmt: skip

    # ------------------------------------------------------------------ tables

    @property
    def encoder(self):
        """The fitted :class:`~slate.data.encoding.TableEncoder` of a CSV run, else ``None``."""
        from slate.data.encoding import TableEncoder

        for step in self.steps:
            if step["kind"] == "table":
                return TableEncoder.from_dict(step)
        return None

    @property
    def raw_columns(self) -> list[str] | None:
        """A table's raw feature columns as an array: numeric columns, then one-hot ones."""
        step = self._table_step()
        if step is None:
            return None
        one_hot = [f"{c}={v}" for c in step["text"] for v in step["categories"][c]]
        return list(step["numeric"]) + one_hot

    @property
    def raw_shape(self) -> tuple[int, ...]:
        """The shape of one row of raw features (the exported program's input)."""
        columns = self.raw_columns
        return (len(columns),) if columns is not None else self.input_shape

    def _table_step(self) -> dict[str, Any] | None:
        return next((s for s in self.steps if s["kind"] == "table"), None)

    def raw_table(self, table: Any) -> np.ndarray:
        """A table's raw features as a float32 array (numeric with NaN, then one-hot)."""
        encoder = self.encoder
        encoded = encoder.encode(table)  # checks the columns by name
        numeric = [np.asarray(table.numeric[c], dtype=np.float64) for c in encoder.numeric]
        start = len(encoder.numeric) + len(encoder.indicators)
        numbers = np.stack(numeric, axis=1) if numeric else np.zeros((table.rows, 0))
        return np.concatenate([numbers.astype(np.float32), encoded[:, start:]], axis=1)

    def table_features(self, table: Any, encoder: Any = None) -> np.ndarray:
        """The model input of a table read with the run's options: the encoder's
        ``transform`` (columns matched by header name), then any later steps. Pass
        ``encoder`` (from :attr:`encoder`) to read its count of unseen categories after."""
        encoder = encoder if encoder is not None else self.encoder
        x = encoder.transform(table)
        later = self.steps[self.steps.index(self._table_step()) + 1 :]
        return _apply_steps(later, x)

    # ------------------------------------------------------------------ arrays

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        """The model input (float32) of raw features ``(n, *raw_shape)``."""
        raw = np.asarray(raw)
        if tuple(raw.shape[1:]) != self.raw_shape:
            raise DataError(
                f"The raw features have shape {tuple(raw.shape[1:])} per row, but the model "
                f"takes {self.raw_shape}."
            )
        return _apply_steps(self.steps, raw.astype(np.float32, copy=False))

    def module(self) -> nn.Module:
        """The same map as a torch module (float32 raw features in, float32 out)."""
        layers = [_STEP_MODULES[s["kind"]](s) for s in self.steps]
        return nn.Sequential(*layers)


def _apply_steps(steps: list[dict[str, Any]], x: np.ndarray) -> np.ndarray:
    for step in steps:
        x = _STEP_ARRAYS[step["kind"]](step, x)
    return np.ascontiguousarray(x, dtype=np.float32)


def _clip(step: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return np.clip(x, np.float32(step["low"]), np.float32(step["high"])).astype(np.float32)


def _divide(step: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64) / float(step["by"])).astype(np.float32)


def _images(step: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """As :func:`slate.data.datasets.normalise_images`, from any real dtype."""
    out = x.astype(np.float32) / np.float32(step["scale"])
    out -= np.asarray(step["mean"], dtype=np.float32)[None, :, None, None]
    out /= np.asarray(step["std"], dtype=np.float32)[None, :, None, None]
    return out


def _standardize(step: dict[str, Any], x: np.ndarray) -> np.ndarray:
    from slate.data.preprocess import Standardizer

    return Standardizer.from_dict(step).apply(x.reshape(len(x), -1)).reshape(x.shape)


def _table(step: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """Raw table features (numeric with NaN, then one-hot) to the encoder's output."""
    from slate.data.preprocess import Standardizer

    numeric = step["numeric"]
    k = len(numeric)
    means = np.asarray([step["means"][c] for c in numeric], dtype=np.float64).astype(np.float32)
    numbers = x[:, :k].astype(np.float32)
    missing = np.isnan(numbers)
    filled = np.where(missing, means[None, :], numbers)
    flags = missing[:, [numeric.index(c) for c in step["indicators"]]].astype(np.float32)
    out = np.concatenate([filled, flags, x[:, k:].astype(np.float32)], axis=1)
    scaler = step.get("scaler")
    return Standardizer.from_dict(scaler).apply(out) if scaler else out


_STEP_ARRAYS = {
    "clip": _clip,
    "divide": _divide,
    "images": _images,
    "standardize": _standardize,
    "table": _table,
}


class _ClipModule(nn.Module):
    def __init__(self, step: dict[str, Any]) -> None:
        super().__init__()
        self.low = float(step["low"])
        self.high = float(step["high"])

    def forward(self, x: Tensor) -> Tensor:
        return x.to(torch.float32).clamp(self.low, self.high)


class _DivideModule(nn.Module):
    def __init__(self, step: dict[str, Any]) -> None:
        super().__init__()
        self.by = float(step["by"])

    def forward(self, x: Tensor) -> Tensor:
        return (x.to(torch.float64) / self.by).to(torch.float32)


class _ImagesModule(nn.Module):
    def __init__(self, step: dict[str, Any]) -> None:
        super().__init__()
        self.scale = float(step["scale"])
        shape = (1, len(step["mean"]), 1, 1)
        self.register_buffer("mean", torch.tensor(step["mean"], dtype=torch.float32).view(shape))
        self.register_buffer("std", torch.tensor(step["std"], dtype=torch.float32).view(shape))

    def forward(self, x: Tensor) -> Tensor:
        return (x.to(torch.float32) / self.scale - self.mean) / self.std


class _StandardizeModule(nn.Module):
    def __init__(self, step: dict[str, Any]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(step["mean"], dtype=torch.float64))
        self.register_buffer("scale", torch.tensor(step["scale"], dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(x.shape[0], -1).to(torch.float64)
        return ((flat - self.mean) / self.scale).to(torch.float32).reshape(x.shape)


class _TableModule(nn.Module):
    def __init__(self, step: dict[str, Any]) -> None:
        super().__init__()
        numeric = step["numeric"]
        self.k = len(numeric)
        means = torch.tensor([step["means"][c] for c in numeric], dtype=torch.float64)
        self.register_buffer("means", means.to(torch.float32))
        index = [numeric.index(c) for c in step["indicators"]]
        self.register_buffer("indicators", torch.tensor(index, dtype=torch.int64))
        scaler = step.get("scaler")
        self.scaled = scaler is not None
        if scaler:
            self.register_buffer("mean", torch.tensor(scaler["mean"], dtype=torch.float64))
            self.register_buffer("scale", torch.tensor(scaler["scale"], dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        numbers = x[:, : self.k].to(torch.float32)
        missing = torch.isnan(numbers)
        filled = torch.where(missing, self.means, numbers)
        flags = missing.index_select(1, self.indicators).to(torch.float32)
        out = torch.cat([filled, flags, x[:, self.k :].to(torch.float32)], dim=1)
        if self.scaled:
            out = ((out.to(torch.float64) - self.mean) / self.scale).to(torch.float32)
        return out


_STEP_MODULES = {
    "clip": _ClipModule,
    "divide": _DivideModule,
    "images": _ImagesModule,
    "standardize": _StandardizeModule,
    "table": _TableModule,
}
