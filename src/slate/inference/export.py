r"""``slate export``: the trained model as a program that runs without slate.

``--format torch-export`` writes a :func:`torch.export.export` program (``.pt2``) of

.. math::

    s = \sigma\big(f_\theta(\mathrm{prep}(x))\big),

the run's preprocessing (:meth:`slate.inference.model_file.Preprocessing.module`: image
normalisation, standardisation, a table's imputation and scaling), the averaged model in eval mode
(BatchNorm uses its running statistics) and the sigmoid, in one graph. Its input ``x`` is a
float32 tensor of raw features, ``(rows, features)`` or ``(rows, C, H, W)`` for images (uint8
pixel values as floats), with any number of rows; its output is the scores, ``(rows,)``: monotone
in the logit :math:`z = f_\theta(\mathrm{prep}(x))`, not calibrated probabilities.

When the run folder holds a calibrator (``calibration.json``, ``slate calibrate``), the program
ends with it instead of the sigmoid and outputs the calibrated probabilities
:math:`p = g(z)` (float64 inside, float32 out; :class:`slate.inference.calibration.PlattModule`
:math:`\sigma(a z + b)`, or :class:`slate.inference.calibration.IsotonicModule`, the isotonic
thresholds interpolated with ``torch.searchsorted``), equal to ``slate predict``'s
``probability`` column; ``calibrated=False`` (``--no-calibration``) keeps the scores.
Plain PyTorch runs it::

    program = torch.export.load("model.pt2").module()
    scores = program(x)

The file also carries ``slate.json`` (``torch.export.load(path, extra_files={"slate.json":
""})``): the input shape, a table's input columns, the run's label mapping, what the output is,
and the calibrator (``null`` without one).

A model that ``torch.export`` cannot trace gets an error naming the module and the operation
where tracing stopped.
"""

from __future__ import annotations

import json
import linecache
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from slate.errors import ConfigError
from slate.inference.calibration import Calibrator, load_calibrator
from slate.inference.model_file import Preprocessing, load_model, read_model_info

__all__ = ["EXPORT_FORMATS", "Exported", "ProbabilityProgram", "export_program", "export_run"]

EXPORT_FORMATS = ("torch-export",)
EXAMPLE_ROWS = 2  # the traced batch; the row count stays dynamic


class ProbabilityProgram(nn.Module):
    """Raw features in, one number per row out: preprocessing, the model, then the sigmoid
    (the score), or the calibrator (a calibrated probability) when one is given."""

    def __init__(
        self, preprocessing: nn.Module, model: nn.Module, calibration: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.preprocessing = preprocessing
        self.model = model
        self.calibration = calibration

    def forward(self, x: Tensor) -> Tensor:
        z = self.model(self.preprocessing(x)).reshape(-1)
        return torch.sigmoid(z) if self.calibration is None else self.calibration(z)


@dataclass
class Exported:
    """What :func:`export_run` wrote."""

    path: Path
    input_shape: tuple[int, ...]  # per row
    columns: list[str] | None
    calibration: str | None = None  # the calibrator's method, when the program applies one


def export_program(module: nn.Module, row_shape: tuple[int, ...], what: str = "the model"):
    """``torch.export`` of ``module`` on float32 inputs ``(rows, *row_shape)``, rows dynamic.

    Raises:
        ConfigError: tracing failed; the message names the innermost module whose ``forward``
            was running, its source line, and the operation torch reported.
    """
    module.eval()
    example = torch.zeros(EXAMPLE_ROWS, *row_shape, dtype=torch.float32)
    rows = torch.export.Dim("rows", min=1)
    try:
        return torch.export.export(module, (example,), dynamic_shapes=({0: rows},))
    except Exception as err:
        raise ConfigError(
            f"{what} cannot be exported with torch.export: tracing stopped in "
            f"{_where(err, module)}, at the operation {_first_lines(err)}. Replace that "
            "operation by one torch.export can trace (tensor operations, without Python "
            "control flow on tensor values), or load model.pt with slate.load_model instead."
        ) from None


def _where(err: Exception, root: nn.Module) -> str:
    """The innermost ``forward`` of a submodule of ``root`` in the traceback, with its line."""
    names = {id(m): name for name, m in root.named_modules()}
    found = None
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "forward" and id(owner) in names:
            found = (names[id(owner)], owner, frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    if found is None:
        return "the model"
    name, owner, filename, line = found
    code = linecache.getline(filename, line).strip()
    return (
        f"module {name or '(root)'} ({type(owner).__name__}.forward, {Path(filename).name} line "
        f"{line}: {code!r})"
    )


def _first_lines(err: Exception, limit: int = 300) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    text = " ".join(lines[:2]) or type(err).__name__
    return f"{type(err).__name__}: {text[:limit]}"


def export_run(
    run_dir: str | Path,
    out: str | Path | None = None,
    fmt: str = "torch-export",
    calibrated: bool = True,
) -> Exported:
    """Export the run's model with its preprocessing and sigmoid, or its calibrator (module
    docstring).

    Args:
        run_dir: the run folder.
        out: the ``.pt2`` file (default ``RUN/model.pt2``).
        fmt: ``torch-export`` (the only format).
        calibrated: end with the run's calibrator when it has one (else the sigmoid).
    """
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}.")
    run = Path(run_dir)
    model, pre = load_model(run)
    info = read_model_info(run)
    calibrator = load_calibrator(run) if calibrated else None
    program = ProbabilityProgram(
        pre.module(), model, calibrator.module() if calibrator is not None else None
    )
    spec = info["model"]
    exported = export_program(program, pre.raw_shape, what=f"The {spec['name']} model of {run}")
    path = Path(out) if out is not None else run / "model.pt2"
    if path.is_dir():
        raise ConfigError(f"--out {path} is a folder; give a file name such as model.pt2.")
    path.parent.mkdir(parents=True, exist_ok=True)
    sidecar = json.dumps(_sidecar(info, pre, calibrator))
    torch.export.save(exported, path, extra_files={"slate.json": sidecar})
    method = calibrator.method if calibrator is not None else None
    return Exported(path, pre.raw_shape, pre.raw_columns, method)


def _sidecar(
    info: dict[str, Any], pre: Preprocessing, calibrator: Calibrator | None
) -> dict[str, Any]:
    if calibrator is None:
        output = (
            "score sigmoid(logit) of the positive class, shape (rows,): monotone in the logit, "
            "not a calibrated probability"
        )
        calibration = None
    else:
        output = (
            f"calibrated probability of the positive class ({calibrator.method} calibration "
            "of the logit, from calibration.json), shape (rows,)"
        )
        calibration = {"method": calibrator.method, "parameters": calibrator.parameters()}
    return {
        "input": "float32 raw features, shape (rows, *input_shape)",
        "input_shape": list(pre.raw_shape),
        "input_columns": pre.raw_columns,
        "output": output,
        "calibration": calibration,
        "labels": info.get("labels"),
        "model": info["model"],
        "slate_version": info.get("slate_version"),
    }
