"""``--positive-label`` with LIBSVM files: ``--positive-label -1`` makes the -1 rows the
positives, as summary.json records (ignoring it would keep +1 positive under a record that says
otherwise). The reference is the file itself: the rows whose label is -1, counted and scored with
scikit-learn."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from slate.cli import main
from slate.data.readers.libsvm import read_libsvm
from tests.sites import slate_here


def write(path: Path, rows: int, seed: int) -> np.ndarray:
    """Rows whose label is -1 (a 12% minority) carry a high feature 1; returns the labels."""
    rng = np.random.default_rng(seed)
    labels = np.where(rng.random(rows) < 0.12, -1, 1)
    lines = [
        f"{label:+d} 1:{rng.normal() + 2.5 * (label == -1):.4f} 2:{rng.normal():.4f} "
        f"3:{rng.normal():.4f}"
        for label in labels
    ]
    path.write_text("\n".join(lines) + "\n")
    return labels


def test_the_reader_takes_the_named_class_as_positive(tmp_path):
    labels = write(tmp_path / "a.svm", 200, 0)
    _, default = read_libsvm(tmp_path / "a.svm")
    _, flipped = read_libsvm(tmp_path / "a.svm", positive="-1")
    assert np.array_equal(default, (labels == 1).astype(int))
    assert np.array_equal(flipped, (labels == -1).astype(int))


def test_a_run_with_positive_label_minus_one_learns_and_scores_the_minus_one_class(
    tmp_path, capsys
):
    write(tmp_path / "train.svm", 1500, 1)
    test_labels = write(tmp_path / "test.svm", 600, 2)
    out = tmp_path / "run"
    code = main(["train", "--dataset", "libsvm", "--train", str(tmp_path / "train.svm"),
                 "--test", str(tmp_path / "test.svm"), "--positive-label", "-1", "--nodes", "3",
                 "--iterations", "1000", "--threads", "1", "--no-progress", "--no-party-ap",
                 "--no-plots", "--out", str(out)])  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_positives"] == int((test_labels == -1).sum())
    model = json.loads((out / "model.json").read_text())
    assert model["labels"]["positive_label"] == "-1"
    capsys.readouterr()
    assert main(["predict", "--run", str(out), "--data", str(tmp_path / "test.svm"),
                 "--out", str(tmp_path / "scores.csv")]) == 0  # fmt: skip
    capsys.readouterr()
    scores = np.genfromtxt(tmp_path / "scores.csv", delimiter=",", names=True)["score"]
    reference = average_precision_score(test_labels == -1, scores)
    assert summary["test_ap"] == pytest.approx(reference, abs=1e-6)
    # It learned the -1 class (12% of the rows), not the +1 class (AP about 0.07): with seed 0
    # the AP is 0.07 after 250 iterations and 0.80-0.81 from 500 to 2000 (0.804 at 1000).
    assert reference > 0.6
    assert main(["evaluate", "--run", str(out), "--data", str(tmp_path / "test.svm"),
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["ap"] == pytest.approx(reference, abs=1e-6)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            ["--dataset", "libsvm", "--train", "x.svm", "--positive-label", "2"],
            "+1 (the default), -1 or 0",
        ),
        (["--dataset", "w7a", "--positive-label", "-1"], "fixed positive class"),
    ],
)
def test_a_positive_label_that_cannot_apply_is_refused(flags, said):
    done = slate_here("train", *flags)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr
