"""``slate predict --at-recall`` on a run with validation rows: the threshold is chosen on the
kept model's validation curve (saved in the run folder and named in model.json), and the test
precision and recall of that threshold are reported beside it.

The reference is independent of slate's curves: the validation rows are read again, scored with
the saved model, and the threshold is found by brute force over scikit-learn's
``precision_recall_curve``; the test recall is counted on the test file's rows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score
from sklearn.metrics import precision_recall_curve as sk_precision_recall_curve

from slate.cli import main
from slate.config import TrainConfig
from slate.inference.model_file import load_model
from slate.inference.predict import predict
from slate.inference.scoring import logits_of
from slate.training.loop import train


def _table(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    y = (x1 + 0.5 * x2 + rng.normal(scale=0.8, size=n) > 1.0).astype(int)
    lines = ["row,x1,x2,fraud"] + [
        f"{k},{a:.4f},{b:.4f},{'yes' if t else 'no'}"
        for k, (a, b, t) in enumerate(zip(x1, x2, y, strict=True))
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def validated_run(tmp_path_factory) -> tuple[TrainConfig, Path]:
    """A CSV run with a test file and 30% validation rows, early stopping on them."""
    where = tmp_path_factory.mktemp("validated")
    _table(where / "train.csv", 900, 0)
    _table(where / "test.csv", 400, 1)
    config = TrainConfig(
        dataset="csv", train=str(where / "train.csv"), test=str(where / "test.csv"),
        label_column="fraud", positive_label="yes", id_columns=("row",), nodes=2,
        iterations=300, eval_every=10, threads=1, party_ap=False, lr=0.05,
        validation_fraction=0.3, early_stopping=5, out=str(where / "run"),
    )  # fmt: skip
    threads = torch.get_num_threads()
    try:
        train(config, progress=False, figures=False, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    return config, where


def _validation_rows(config: TrainConfig) -> tuple[np.ndarray, np.ndarray]:
    """The run's validation rows, encoded, as the run split them."""
    from slate.data.sources import load_dataset

    data = load_dataset(config, config.validation_fraction, config.split_seed)
    return data.x_test, np.asarray(data.y_test)


def _brute_force_at_recall(y: np.ndarray, logits: np.ndarray, target: float) -> float:
    """The highest-precision threshold with recall >= target; ties to the higher recall, then
    the higher threshold (scikit-learn's curve, every candidate looked at)."""
    precision, recall, thresholds = sk_precision_recall_curve(y, logits)
    best = None
    for p, r, t in zip(precision[:-1], recall[:-1], thresholds, strict=True):
        if r >= target and (best is None or (p, r, t) > best):
            best = (p, r, t)
    assert best is not None
    return float(best[2])


def test_the_threshold_comes_from_the_validation_rows(validated_run, capsys):
    config, where = validated_run
    run = where / "run"
    info = json.loads((run / "model.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model_iteration"] < summary["iterations"]  # early stopping kept an earlier one
    x_val, y_val = _validation_rows(config)
    assert info["validation_curve"].pop("ap") == pytest.approx(summary["validation_ap"], abs=1e-9)
    assert info["validation_curve"] == {
        "file": "validation_pr_curve.csv", "rows": len(y_val), "positives": int(y_val.sum()),
        "evaluation": "pooled", "source": "pooled", "pooled_file": None, "pooled_positives": None,
        "note": "one set of rows for every site: its own rows are the pooled rows (one curve)",
    }  # fmt: skip
    model, _ = load_model(run)
    val_logits = logits_of(model, x_val).numpy().astype(np.float64)
    # The saved curve is the kept (saved) model's: its AP is summary.json's validation AP.
    assert average_precision_score(y_val, val_logits) == pytest.approx(
        summary["validation_ap"], abs=1e-9
    )
    expected = _brute_force_at_recall(y_val, val_logits, 0.9)

    out = predict(run, where / "test.csv", at_recall_of=0.9)
    assert out.point is not None and out.point.logit == pytest.approx(expected, abs=1e-6)
    assert ((val_logits >= out.point.logit) == (val_logits >= expected)).all()
    assert "validation rows" in out.threshold_source

    # The test recall and precision of that threshold, counted on the test file's rows.
    test = np.array([line.endswith("yes") for line in (where / "test.csv").read_text().split()[1:]])
    flagged = out.logits.astype(np.float64) >= out.point.logit
    true_positives = int((flagged & test).sum())
    assert out.test_point is not None
    assert out.test_point.recall == pytest.approx(true_positives / test.sum(), abs=1e-12)
    assert out.test_point.precision == pytest.approx(true_positives / flagged.sum(), abs=1e-12)
    assert out.test_point.true_positives == true_positives
    assert out.test_point.flagged == int(flagged.sum())
    assert int(out.decisions.sum()) == int(flagged.sum())

    capsys.readouterr()
    code = main(["predict", "--run", str(run), "--data", str(where / "test.csv"),
                 "--at-recall", "0.9", "--out", str(where / "scores.csv")])  # fmt: skip
    assert code == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("decision"))
    assert "on the run's validation rows" in line
    assert (
        f"on the run's test set ({run / 'pr_curve.csv'}) it gives precision "
        f"{true_positives / flagged.sum():.4f}" in line
    )
    assert f"recall {true_positives / test.sum():.4f}" in line


def test_at_precision_and_calibrate_keep_their_meaning(validated_run):
    config, where = validated_run
    run = where / "run"
    x_val, y_val = _validation_rows(config)
    model, _ = load_model(run)
    val_logits = logits_of(model, x_val).numpy().astype(np.float64)
    out = predict(run, where / "test.csv", at_precision_of=0.6)
    precision, recall, thresholds = sk_precision_recall_curve(y_val, val_logits)
    best = max(
        (r, p, t)
        for p, r, t in zip(precision[:-1], recall[:-1], thresholds, strict=True)
        if p >= 0.6
    )
    assert out.point.logit == pytest.approx(float(best[2]), abs=1e-6)
    assert out.test_point is not None
    # --calibrate FILE overrides the run's curves; no test figure is added then.
    own = predict(run, where / "test.csv", at_recall_of=0.9, calibrate=where / "test.csv")
    assert own.threshold_source.startswith("the calibration file")
    assert own.test_point is None


def test_few_validation_positives_are_warned_of(validated_run, tmp_path):
    _, where = validated_run
    run = tmp_path / "run"
    shutil.copytree(where / "run", run)
    info = json.loads((run / "model.json").read_text())
    info["validation_curve"]["positives"] = 12
    (run / "model.json").write_text(json.dumps(info))
    out = predict(run, where / "test.csv", at_recall_of=0.9)
    warnings = [n for n in out.notes if n.startswith("warning")]
    assert len(warnings) == 1 and "the run's validation set holds" in warnings[0]
    assert "only 12 positives" in warnings[0]
    # Without the curve named, the test curve is used as before.
    del info["validation_curve"]
    (run / "model.json").write_text(json.dumps(info))
    out = predict(run, where / "test.csv", at_recall_of=0.9)
    assert out.threshold_source.startswith("the run's test set") and out.test_point is None
