"""slate calibrate: Platt and isotonic calibrators equal to scikit-learn's fits on the run's
logits, stored as JSON in the run folder; predict's probability column, evaluate's Brier score
and the exported program apply them; bad input exits 2 with one paragraph naming what is wrong.

A small CSV run (two parties, a text column and numeric ones) is trained once per module in about
a second; each test that changes it works on its own copy of the run folder, and the tests that
only read a calibrated run share one copy per method, calibrated once per module (``calibrated``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.calibration import CalibratedClassifierCV, FrozenEstimator
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import brier_score_loss

from slate.cli import main
from slate.config import TrainConfig
from slate.inference.calibration import (
    Calibrator,
    IsotonicModule,
    PlattModule,
    fit_isotonic,
    fit_sigmoid,
    load_calibrator,
)
from slate.inference.model_file import load_model
from slate.inference.scoring import logits_of, read_input


def _write_table(path: Path, rows: int, seed: int, label: bool = True) -> None:
    """Rows of ``id,sex,length,weight[,rings]``; "old" when length plus noise exceeds 1."""
    rng = np.random.default_rng(seed)
    lines = ["id,sex,length,weight" + (",rings" if label else "")]
    for i in range(rows):
        sex, length, weight = rng.choice(["M", "F", "I"]), rng.normal(), rng.normal()
        old = length + 0.3 * weight + 0.5 * rng.normal() > 1.0
        tail = f",{'old' if old else 'young'}" if label else ""
        lines.append(f"{i},{sex},{length:.4f},{weight:.4f}{tail}")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A CSV run folder (``run/``) with a labelled held-out file (``held.csv``) beside it."""
    from slate.training.loop import train

    root = tmp_path_factory.mktemp("calibrate")
    _write_table(root / "train.csv", 400, seed=1)
    _write_table(root / "held.csv", 600, seed=2)
    config = TrainConfig(
        dataset="csv", train=str(root / "train.csv"), label_column="rings", positive_label="old",
        id_columns=("id",), nodes=2, iterations=200, threads=1, party_ap=False,
        lr=0.01,  # a step that leaves the AP-trained scores miscalibrated (tests below)
        out=str(root / "run"),
    )  # fmt: skip
    threads = torch.get_num_threads()
    try:
        train(config, progress=False, figures=False, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A fresh copy of the trained run folder (no calibration.json yet)."""
    copy = tmp_path / "run"
    shutil.copytree(trained / "run", copy)
    return copy


def _held(trained: Path) -> Path:
    return trained / "held.csv"


def _logits(run: Path, data: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The run's logits on ``data`` (float64 of float32), its labels and its raw features."""
    model, pre = load_model(run)
    read = read_input(pre, data, "required")
    return logits_of(model, read.features).double().numpy(), read.labels, read.raw


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(args)
    printed = capsys.readouterr()
    return code, printed.out, printed.err


def _calibrate(run: Path, data: Path, method: str, capsys) -> dict:
    code, out, err = _cli(
        ["calibrate", "--run", str(run), "--data", str(data), "--method", method], capsys
    )
    assert code == 0, err
    assert "Brier" in out and "calibration.json and reliability.png written" in out
    return json.loads((run / "calibration.json").read_text())


@pytest.fixture(scope="module")
def calibrated(trained, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Per method, a copy of the trained run calibrated on the held-out file by ``slate
    calibrate`` (checked as :func:`_calibrate` checks it), and its calibration.json: made once
    per module for the tests that only read a calibrated run (a calibration writes its
    reliability figure, most of its cost)."""
    runs = {}
    for method in ("sigmoid", "isotonic"):
        run = tmp_path_factory.mktemp(f"calibrated-{method}") / "run"
        shutil.copytree(trained / "run", run)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = main(["calibrate", "--run", str(run), "--data", str(_held(trained)),
                         "--method", method])  # fmt: skip
        out = printed.getvalue()
        assert code == 0 and "Brier" in out
        assert "calibration.json and reliability.png written" in out
        runs[method] = run, json.loads((run / "calibration.json").read_text())
    return runs


class _Logit(ClassifierMixin, BaseEstimator):
    """A fitted "classifier" whose decision function is its one feature: the logit."""

    def fit(self, X, y=None):
        self.classes_ = np.array([0, 1])
        return self

    def decision_function(self, X):
        return np.asarray(X, dtype=np.float64)[:, 0]

    def predict(self, X):
        return (self.decision_function(X) >= 0).astype(np.int64)


def _sklearn_calibrated(method: str, z: np.ndarray, y: np.ndarray) -> CalibratedClassifierCV:
    """scikit-learn's own calibration of the logits, on the same rows."""
    frozen = FrozenEstimator(_Logit().fit(None))
    return CalibratedClassifierCV(frozen, method=method).fit(z[:, None], y)


# --------------------------------------------------------------------------- the fits


def test_sigmoid_parameters_equal_scikit_learns(calibrated, trained):
    run, saved = calibrated["sigmoid"]
    z, y, _ = _logits(run, _held(trained))
    a, b = saved["parameters"]["a"], saved["parameters"]["b"]
    # LogisticRegression fitted directly, on Platt's targets as weights of duplicated rows.
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    t = np.where(y == 1, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))
    direct = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(
        np.concatenate([z, z])[:, None], np.r_[np.ones(len(z)), np.zeros(len(z))],
        sample_weight=np.r_[t, 1 - t],
    )  # fmt: skip
    assert a == pytest.approx(direct.coef_[0, 0], abs=1e-6)
    assert b == pytest.approx(direct.intercept_[0], abs=1e-6)
    # scikit-learn's CalibratedClassifierCV(method="sigmoid"): p = 1 / (1 + exp(A f + B)).
    platt = _sklearn_calibrated("sigmoid", z, y)
    fitted = platt.calibrated_classifiers_[0].calibrators[0]
    assert a == pytest.approx(-fitted.a_, abs=1e-6)
    assert b == pytest.approx(-fitted.b_, abs=1e-6)
    calibrator = load_calibrator(run)
    np.testing.assert_allclose(calibrator(z), platt.predict_proba(z[:, None])[:, 1], atol=1e-6)
    assert saved["fitted_on"]["rows"] == len(y) == 600
    assert saved["fitted_on"]["positives"] == int(y.sum())
    assert saved["fitted_on"]["data"] == str(_held(trained))
    assert len(saved["fitted_on"]["sha256"]) == 64
    assert (run / "reliability.png").stat().st_size > 1000


def test_isotonic_thresholds_equal_scikit_learns(calibrated, trained):
    run, saved = calibrated["isotonic"]
    z, y, _ = _logits(run, _held(trained))
    direct = IsotonicRegression(out_of_bounds="clip").fit(z, y)
    np.testing.assert_allclose(saved["parameters"]["x"], direct.X_thresholds_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(saved["parameters"]["y"], direct.y_thresholds_, rtol=0, atol=1e-12)
    calibrator = load_calibrator(run)
    beyond = np.r_[z, z.min() - 5, z.max() + 5, np.linspace(z.min() - 1, z.max() + 1, 101)]
    np.testing.assert_allclose(calibrator(beyond), direct.predict(beyond), atol=1e-12)
    cv = _sklearn_calibrated("isotonic", z, y)
    np.testing.assert_allclose(calibrator(beyond), cv.predict_proba(beyond[:, None])[:, 1],
                               atol=1e-9)  # fmt: skip


def test_fits_keep_finite_parameters_on_separable_logits():
    """Platt's targets keep a and b finite where plain logistic regression would diverge."""
    z = np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0])
    y = np.array([0, 0, 0, 1, 1, 1])
    platt = fit_sigmoid(z, y)
    assert np.isfinite([platt.a, platt.b]).all() and platt.a > 0
    isotonic = fit_isotonic(z, y)  # the ends of each flat run: linear between -1 and 1
    assert isotonic.x == (-3.0, -1.0, 1.0, 3.0) and isotonic.y == (0.0, 0.0, 1.0, 1.0)


def test_calibration_json_round_trips_exactly(calibrated):
    for method in ("sigmoid", "isotonic"):
        run, saved = calibrated[method]
        again = Calibrator.from_parameters(method, json.loads(json.dumps(saved["parameters"])))
        assert again == load_calibrator(run)
        assert saved["format"] == "slate-calibration" and saved["method"] == method


# --------------------------------------------------------------------------- predict, evaluate


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("method", ["sigmoid", "isotonic"])
def test_predict_adds_the_calibrated_probability(calibrated, trained, tmp_path, method):
    """The uncalibrated run predicts scores; the same run calibrated (``calibrated``: a copy
    of it) adds the probability and keeps the scores."""
    new = tmp_path / "new.csv"
    _write_table(new, 50, seed=3, label=False)
    out = tmp_path / "before.csv"
    plain = trained / "run"
    assert main(["predict", "--run", str(plain), "--data", str(new), "--out", str(out)]) == 0
    before = _rows(out)
    assert list(before[0]) == ["id", "score"]
    run, _ = calibrated[method]
    out = tmp_path / "after.csv"
    args = ["predict", "--run", str(run), "--data", str(new), "--out", str(out)]
    assert main([*args, "--at-recall", "0.8"]) == 0
    after = _rows(out)
    assert list(after[0]) == ["id", "score", "probability", "decision"]
    assert [r["score"] for r in after] == [r["score"] for r in before]  # the score is unchanged
    model, pre = load_model(run)
    z = logits_of(model, read_input(pre, new).features).numpy()
    expected = load_calibrator(run)(z)
    got = np.array([float(r["probability"]) for r in after])
    np.testing.assert_allclose(got, expected, rtol=1e-8, atol=1e-12)


def test_evaluate_reports_the_brier_score_of_the_probability(calibrated, trained, tmp_path, capsys):
    """The uncalibrated run reports no calibration; the same run calibrated (``calibrated``:
    a copy of it) reports the Brier scores of its probability, score and base rate."""
    test = tmp_path / "test.csv"
    _write_table(test, 300, seed=4)
    plain = trained / "run"
    code, out, _ = _cli(["evaluate", "--run", str(plain), "--data", str(test), "--json"], capsys)
    assert code == 0 and json.loads(out)["calibration"] is None
    run, _ = calibrated["sigmoid"]
    code, out, _ = _cli(["evaluate", "--run", str(run), "--data", str(test), "--json"], capsys)
    reported = json.loads(out)["calibration"]
    z, y, _ = _logits(run, test)
    probability = load_calibrator(run)(z)
    assert reported["method"] == "sigmoid"
    assert reported["probability"]["brier"] == pytest.approx(brier_score_loss(y, probability))
    score = torch.sigmoid(torch.from_numpy(z.astype(np.float32))).double().numpy()
    assert reported["score"]["brier"] == pytest.approx(brier_score_loss(y, score))
    rate = y.mean()
    assert reported["constant"]["brier"] == pytest.approx(rate * (1 - rate))
    code, out, _ = _cli(["evaluate", "--run", str(run), "--data", str(test)], capsys)
    assert code == 0 and "calibrated probability (sigmoid, calibration.json): Brier" in out


@pytest.mark.parametrize("method", ["sigmoid", "isotonic"])
def test_brier_after_is_at_most_before_on_a_miscalibrated_run(calibrated, method):
    _, saved = calibrated[method]
    scores = saved["scores"]
    assert scores["score"]["brier"] > scores["constant"]["brier"]  # AP training: not calibrated
    assert scores["probability"]["brier"] <= scores["score"]["brier"]
    assert scores["probability"]["brier"] <= scores["constant"]["brier"] + 1e-12
    assert scores["probability"]["log_loss"] < scores["score"]["log_loss"]


# --------------------------------------------------------------------------- export


def _export(run: Path, path: Path, *flags: str) -> tuple[torch.nn.Module, dict]:
    assert main(["export", "--run", str(run), "--out", str(path), *flags]) == 0
    extra = {"slate.json": ""}
    program = torch.export.load(path, extra_files=extra).module()
    return program, json.loads(extra["slate.json"])


@pytest.mark.parametrize("method", ["sigmoid", "isotonic"])
def test_exported_program_matches_scikit_learn(calibrated, trained, tmp_path, method):
    """The exported program of a calibrated run gives scikit-learn's calibrated probability;
    with ``--no-calibration``, the scores. (That export never reads the calibration, whatever
    its method: one method's run shows it.)"""
    run, _ = calibrated[method]
    z_held, y_held, _ = _logits(run, _held(trained))
    reference = _sklearn_calibrated(method, z_held, y_held)
    test = tmp_path / "test.csv"
    _write_table(test, 200, seed=5)
    z, _, raw = _logits(run, test)
    program, sidecar = _export(run, tmp_path / "model.pt2")
    with torch.no_grad():
        got = program(torch.from_numpy(raw)).double().numpy()
    np.testing.assert_allclose(got, reference.predict_proba(z[:, None])[:, 1], atol=1e-6)
    assert sidecar["calibration"]["method"] == method
    assert "calibrated probability" in sidecar["output"]
    if method != "sigmoid":
        return
    plain, sidecar = _export(run, tmp_path / "plain.pt2", "--no-calibration")
    with torch.no_grad():
        scores = plain(torch.from_numpy(raw)).double().numpy()
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-z)), atol=1e-6)
    assert sidecar["calibration"] is None and "not a calibrated probability" in sidecar["output"]


@pytest.mark.parametrize(
    "calibrator",
    [
        Calibrator("sigmoid", a=0.7, b=-2.5),
        Calibrator("isotonic", x=(-1.0, 0.5, 2.0, 2.25), y=(0.0, 0.1, 0.1, 0.9)),
        Calibrator("isotonic", x=(0.3,), y=(0.25,)),  # one threshold: a constant
    ],
)
def test_torch_calibrators_export_and_equal_numpy(calibrator):
    module = calibrator.module()
    assert isinstance(module, PlattModule | IsotonicModule)
    z = torch.tensor([-40.0, -1.5, -1.0, 0.0, 0.5, 1.0, 2.0, 2.1, 2.25, 3.0, 40.0])
    rows = torch.export.Dim("rows", min=1)
    program = torch.export.export(module, (z[:2],), dynamic_shapes=({0: rows},)).module()
    for out in (module(z), program(z)):
        assert out.dtype == torch.float32
        np.testing.assert_allclose(out.double().numpy(), calibrator(z.numpy()), atol=1e-7)


# --------------------------------------------------------------------------- errors and notes


def test_bad_input_exits_2_with_one_paragraph(run, trained, tmp_path, capsys):
    held = str(_held(trained))
    code, _, err = _cli(["calibrate", "--run", str(tmp_path / "nope"), "--data", held,
                         "--method", "sigmoid"], capsys)  # fmt: skip
    assert code == 2 and "--run" in err and "nope" in err and "Traceback" not in err
    unlabelled = tmp_path / "unlabelled.csv"
    _write_table(unlabelled, 20, seed=6, label=False)
    code, _, err = _cli(["calibrate", "--run", str(run), "--data", str(unlabelled),
                         "--method", "sigmoid"], capsys)  # fmt: skip
    assert code == 2 and str(unlabelled) in err and "label" in err
    code, _, err = _cli(["calibrate", "--run", str(run), "--data", held, "--method", "beta"],
                        capsys)  # fmt: skip
    assert code == 2 and "--method" in err and "'beta'" in err
    assert "sigmoid" in err and "isotonic" in err
    one_class = tmp_path / "young.csv"
    one_class.write_text("id,sex,length,weight,rings\n1,M,0.1,0.2,young\n2,F,0.3,0.1,young\n")
    code, _, err = _cli(["calibrate", "--run", str(run), "--data", str(one_class),
                         "--method", "isotonic"], capsys)  # fmt: skip
    assert code == 2 and str(one_class) in err and "no positive" in err
    assert not (run / "calibration.json").exists()
    with pytest.raises(SystemExit) as stopped:
        main(["calibrate", "--run", str(run), "--data", held])  # no --method
    assert stopped.value.code == 2
    assert "--method" in capsys.readouterr().err


def test_a_broken_calibration_json_is_one_paragraph(run, trained, tmp_path, capsys):
    (run / "calibration.json").write_text('{"format": "slate-calibration", "format_version": 1, '
                                          '"method": "isotonic", "parameters": {"x": [1, 0], '
                                          '"y": [0, 1]}}')  # fmt: skip
    code, _, err = _cli(["predict", "--run", str(run), "--data", str(_held(trained))], capsys)
    assert code == 2 and "calibration.json" in err and "not increasing" in err


def test_few_positives_and_the_runs_own_files_are_noted(run, trained, tmp_path, capsys):
    few = tmp_path / "few.csv"
    _write_table(few, 60, seed=7)
    code, out, _ = _cli(["calibrate", "--run", str(run), "--data", str(few),
                         "--method", "sigmoid"], capsys)  # fmt: skip
    positives = sum(r["rings"] == "old" for r in _rows(few))
    assert code == 0 and 0 < positives < 30
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"only {positives} positive" in warnings[0]
    code, out, _ = _cli(["calibrate", "--run", str(run), "--data", str(trained / "train.csv"),
                         "--method", "sigmoid"], capsys)  # fmt: skip
    assert code == 0 and "the run's training file" in out


def test_out_writes_elsewhere_and_leaves_the_run_uncalibrated(run, trained, tmp_path, capsys):
    out = tmp_path / "elsewhere"
    args = ["calibrate", "--run", str(run), "--data", str(_held(trained)), "--method", "sigmoid"]
    code, printed, _ = _cli([*args, "--out", str(out)], capsys)
    assert code == 0 and f"written to {out}" in printed
    assert (out / "calibration.json").is_file() and (out / "reliability.png").is_file()
    assert load_calibrator(run) is None
