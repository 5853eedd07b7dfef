"""Using a trained run: slate predict, slate evaluate, operating points, slate export.

Checked on real runs: w7a trained for 500 iterations (4 parties, to
stay quick) and a Fashion-MNIST CNN trained for a few iterations. Every command runs through
``slate.cli.main`` in this process (no interpreter start-up per command); the exported programs
are loaded in a fresh Python that cannot import slate.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score
from sklearn.metrics import precision_recall_curve as sk_precision_recall_curve

from slate import load_model, metrics
from slate.cli import main
from slate.config import TrainConfig
from slate.data.readers.libsvm import read_libsvm
from slate.metrics.operating_points import at_recall
from slate.training.loop import train

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
W7A_TEST = SHARED_DATA / "w7a" / "w7a.t.gz"
FASHION = SHARED_DATA / "fashion-mnist"

needs_w7a = pytest.mark.skipif(not W7A_TEST.is_file(), reason="w7a is not in the shared data")
needs_fashion = pytest.mark.skipif(
    not (FASHION / "t10k-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST is not in the shared data",
)


def _train(config: TrainConfig) -> Path:
    threads = torch.get_num_threads()
    try:
        train(config, progress=False, figures=False, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)  # the run's --threads 1 must not outlive it
    return Path(config.out)


@pytest.fixture(scope="module")
def w7a_run(tmp_path_factory) -> Path:
    """The acceptance run: w7a, 500 iterations (4 parties instead of 20, to be quick)."""
    if not W7A_TEST.is_file():
        pytest.skip("w7a is not in the shared data")
    out = tmp_path_factory.mktemp("w7a") / "run"
    config = TrainConfig(
        dataset="w7a", data_dir=str(SHARED_DATA), iterations=500, nodes=4, threads=1,
        party_ap=False, out=str(out),
    )  # fmt: skip
    return _train(config)


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory) -> Path:
    if not (FASHION / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip("Fashion-MNIST is not in the shared data")
    out = tmp_path_factory.mktemp("fashion") / "run"
    config = TrainConfig(
        dataset="fashion-mnist", data_dir=str(SHARED_DATA), iterations=10, nodes=2, threads=1,
        party_ap=False, out=str(out),
    )  # fmt: skip
    return _train(config)


@pytest.fixture(scope="module")
def w7a_test_set() -> tuple[np.ndarray, np.ndarray]:
    return read_libsvm(W7A_TEST, n_features=300)


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def _predictions(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------- evaluate


@needs_w7a
def test_evaluate_json_on_the_runs_test_file_gives_its_test_ap(w7a_run, w7a_test_set, capsys):
    code, out, _ = _cli(["evaluate", "--run", str(w7a_run), "--data", str(W7A_TEST), "--json"],
                        capsys)  # fmt: skip
    assert code == 0
    result = json.loads(out)
    summary = _summary(w7a_run)
    assert {"ap", "auroc", "positive_rate", "rows", "operating_points"} <= set(result)
    assert abs(result["ap"] - summary["test_ap"]) <= 1e-9
    assert abs(result["auroc"] - summary["test_auroc"]) <= 1e-9
    assert result["rows"] == summary["n_test"] == 25057
    assert result["operating_points"] == summary["operating_points"]
    assert result["positive_rate"] == w7a_test_set[1].mean()


@needs_w7a
def test_evaluate_prints_the_table_and_writes_json_and_plot(w7a_run, tmp_path, capsys):
    out_dir = tmp_path / "eval"
    code, out, _ = _cli(
        ["evaluate", "--run", str(w7a_run), "--data", str(W7A_TEST), "--out", str(out_dir)], capsys
    )
    assert code == 0
    for line in ("AP ", "AUROC", "recall >= 0.50", "recall >= 0.95", "precision >= 0.90"):
        assert line in out
    saved = json.loads((out_dir / "evaluation.json").read_text())
    assert saved["ap"] == pytest.approx(_summary(w7a_run)["test_ap"], abs=1e-9)
    assert (out_dir / "pr_curve.png").stat().st_size > 0


# --------------------------------------------------------------------------- operating points


@needs_w7a
def test_summary_operating_points_follow_the_rules_on_the_test_logits(w7a_run, w7a_test_set):
    """Every point is the best choice over scikit-learn's curve of the test logits."""
    table = _summary(w7a_run)["operating_points"]
    assert [(p["kind"], p["target"]) for p in table] == [
        *(("precision_at_recall", r) for r in (0.5, 0.8, 0.9, 0.95)),
        *(("recall_at_precision", p) for p in (0.5, 0.8, 0.9)),
    ]
    model, pre = load_model(w7a_run)
    x, y = w7a_test_set
    with torch.no_grad():
        logits = model(torch.from_numpy(pre(x))).numpy()
    precision, recall, _ = sk_precision_recall_curve(y, logits)
    precision, recall = precision[:-1], recall[:-1]  # the (1, 0) point flags nothing
    for point in table:
        target = point["target"]
        if point["kind"] == "precision_at_recall":
            best = precision[recall >= target].max()
            assert point["precision"] == best and point["recall"] >= target
        else:
            assert point["recall"] == recall[precision >= target].max()
            assert point["precision"] >= target
        flagged = logits >= point["logit"]  # the stored threshold gives exactly that point
        tp = int((flagged & (y == 1)).sum())
        assert point["precision"] == tp / flagged.sum()
        assert point["recall"] == tp / (y == 1).sum()
        assert point["threshold"] == float(torch.sigmoid(torch.tensor(point["logit"])))


@needs_w7a
def test_pr_curve_csv_holds_each_points_threshold(w7a_run):
    rows = _predictions(w7a_run / "pr_curve.csv")
    assert list(rows[0]) == ["precision", "recall", "threshold", "logit"]
    assert rows[-1]["logit"] == "inf" and rows[-1]["precision"] == "1.0"
    logits = np.array([float(r["logit"]) for r in rows[:-1]])
    assert np.all(np.diff(logits) > 0)  # thresholds increasing, as scikit-learn's
    probability = torch.sigmoid(torch.from_numpy(logits.astype(np.float32))).numpy()
    np.testing.assert_array_equal([float(r["threshold"]) for r in rows[:-1]], probability)


# --------------------------------------------------------------------------- predict


@needs_w7a
def test_predict_writes_one_score_per_row_in_input_order(w7a_run, w7a_test_set, tmp_path, capsys):
    out = tmp_path / "scores.csv"
    code, _, _ = _cli(
        ["predict", "--run", str(w7a_run), "--data", str(W7A_TEST), "--out", str(out)], capsys
    )
    assert code == 0
    rows = _predictions(out)
    x, y = w7a_test_set
    assert len(rows) == len(y) == 25057
    assert list(rows[0]) == ["score"]
    scores = np.array([float(r["score"]) for r in rows])
    model, pre = load_model(w7a_run)
    with torch.no_grad():
        expected = torch.sigmoid(model(torch.from_numpy(pre(x)))).numpy()
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-6)
    assert average_precision_score(y, scores) == pytest.approx(
        _summary(w7a_run)["test_ap"], abs=1e-3
    )  # the rounded probabilities: ties only where float32 saturates


@needs_w7a
def test_predict_at_recall_reaches_that_recall_on_the_test_file(
    w7a_run, w7a_test_set, tmp_path, capsys
):
    out = tmp_path / "scores.csv"
    code, stdout, _ = _cli(
        ["predict", "--run", str(w7a_run), "--data", str(W7A_TEST), "--at-recall", "0.9",
         "--out", str(out)], capsys,
    )  # fmt: skip
    assert code == 0
    assert "recall >= 0.90 on the run's test set" in stdout
    decisions = np.array([int(r["decision"]) for r in _predictions(out)])
    _, y = w7a_test_set
    recall = decisions[y == 1].mean()
    point = next(p for p in _summary(w7a_run)["operating_points"] if p["target"] == 0.9)
    assert recall >= 0.9
    assert recall == pytest.approx(point["recall"], abs=0)
    precision = y[decisions == 1].mean()
    assert precision == pytest.approx(point["precision"], abs=0)


@pytest.fixture(scope="module")
def w7a_head(tmp_path_factory) -> Path:
    """The first 2000 rows of w7a.t as a plain LIBSVM file (quicker to read)."""
    import gzip

    path = tmp_path_factory.mktemp("head") / "head.svm"
    with gzip.open(W7A_TEST, "rt") as handle:
        path.write_text("".join(line for _, line in zip(range(2000), handle, strict=False)))
    return path


@needs_w7a
def test_predict_calibrated_on_a_file_and_with_a_fixed_threshold(
    w7a_run, w7a_head, tmp_path, capsys
):
    """--calibrate on a file chooses that file's point; --threshold T decides score >= T;
    --at-precision takes the run's test-set point."""
    x, y = read_libsvm(w7a_head, n_features=300)
    out = tmp_path / "calibrated.csv"
    code, stdout, _ = _cli(
        ["predict", "--run", str(w7a_run), "--data", str(w7a_head), "--at-recall", "0.8",
         "--calibrate", str(w7a_head), "--out", str(out)], capsys,
    )  # fmt: skip
    assert code == 0 and f"calibration file {w7a_head} (2000 rows)" in stdout
    rows = _predictions(out)
    scores = np.array([float(r["score"]) for r in rows])
    decisions = np.array([int(r["decision"]) for r in rows])
    precision, recall, _ = sk_precision_recall_curve(y, scores)  # float32 ties aside, the same
    recall_here = decisions[y == 1].mean()
    assert recall_here >= 0.8
    assert y[decisions == 1].mean() == pytest.approx(precision[:-1][recall[:-1] >= 0.8].max())

    code, _, _ = _cli(
        ["predict", "--run", str(w7a_run), "--data", str(w7a_head), "--threshold", "0.6",
         "--out", str(out)], capsys,
    )  # fmt: skip
    rows = _predictions(out)
    scores = np.array([float(r["score"]) for r in rows])
    np.testing.assert_array_equal([int(r["decision"]) for r in rows], scores >= 0.6)

    code, stdout, _ = _cli(
        ["predict", "--run", str(w7a_run), "--data", str(w7a_head), "--at-precision", "0.8",
         "--out", str(out)], capsys,
    )  # fmt: skip
    point = next(p for p in _summary(w7a_run)["operating_points"] if p["kind"] == "recall_at_"
                 "precision" and p["target"] == 0.8)  # fmt: skip
    assert code == 0 and f"logit >= {point['logit']:.9g}" in stdout
    model, pre = load_model(w7a_run)
    with torch.no_grad():
        logits = model(torch.from_numpy(pre(x))).numpy()
    decisions = np.array([int(r["decision"]) for r in _predictions(out)])
    np.testing.assert_array_equal(decisions, logits >= point["logit"])


@needs_w7a
def test_predict_to_stdout_and_threshold_flag_errors(w7a_run, tmp_path, capsys):
    small = tmp_path / "three.svm"
    small.write_text("+1 3:1 7:1\n-1 2:1\n-1 300:1\n")
    code, out, err = _cli(["predict", "--run", str(w7a_run), "--data", str(small)], capsys)
    assert code == 0 and out.splitlines()[0] == "score" and len(out.splitlines()) == 4
    for flags, words in (
        (["--threshold", "0.5", "--at-recall", "0.9"], "Give one of"),
        (["--calibrate", str(small)], "--calibrate FILE chooses"),
        (["--at-recall", "1.5"], "--at-recall must lie in (0, 1]"),
        (["--at-precision", "0.7", "--calibrate", str(small)], "No threshold reaches"),
    ):
        code, _, err = _cli(["predict", "--run", str(w7a_run), "--data", str(small), *flags],
                            capsys)  # fmt: skip
        assert code == 2, flags
        assert words in err and "Traceback" not in err


# --------------------------------------------------------------------------- errors


@needs_w7a
def test_libsvm_index_above_the_model_width_is_a_clear_error(w7a_run, tmp_path, capsys):
    wide = tmp_path / "wide.svm"
    wide.write_text("+1 3:1 7:1\n-1 2:1 301:0.5\n")
    for command in ("predict", "evaluate"):
        code, _, err = _cli([command, "--run", str(w7a_run), "--data", str(wide)], capsys)
        assert code == 2
        assert err.startswith("slate: error: ") and "Traceback" not in err
        assert "301" in err and "line 2" in err and "takes 300 features" in err
        assert len(err.strip().splitlines()) == 1


def test_a_folder_without_model_json_is_a_clear_error(tmp_path, capsys):
    torch.save({"w": torch.zeros(2)}, tmp_path / "model.pt")
    code, _, err = _cli(["predict", "--run", str(tmp_path), "--data", "x.svm"], capsys)
    assert code == 2 and "no model.json" in err and "older slate" in err
    code, _, err = _cli(["evaluate", "--run", str(tmp_path / "nope"), "--data", "x"], capsys)
    assert code == 2 and "no such run folder" in err


# --------------------------------------------------------------------------- images


@needs_fashion
def test_evaluate_a_cnn_on_its_test_folder_gives_its_test_ap(cnn_run, capsys):
    code, out, _ = _cli(["evaluate", "--run", str(cnn_run), "--data", str(FASHION), "--json"],
                        capsys)  # fmt: skip
    assert code == 0
    assert json.loads(out)["ap"] == pytest.approx(_summary(cnn_run)["test_ap"], abs=1e-9)


def _write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file of unsigned bytes (type code 0x08)."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@needs_fashion
def test_image_files_and_arrays_of_the_wrong_shape(cnn_run, tmp_path, capsys):
    """An IDX images file takes its labels from the file beside it; a .npy of raw pixels
    scores the same; a .npy of another shape is refused with both shapes named."""
    from slate.data.readers.idx import read_mnist_split

    images, classes = read_mnist_split(FASHION, "test")
    images, classes = images[:300], classes[:300]
    idx = tmp_path / "few-images-idx3-ubyte"
    _write_idx(idx, images)
    _write_idx(tmp_path / "few-labels-idx1-ubyte", classes)
    np.save(tmp_path / "p.npy", images)  # (n, 28, 28) uint8: one channel
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert main(["predict", "--run", str(cnn_run), "--data", str(idx), "--out", str(a)]) == 0
    assert main(["predict", "--run", str(cnn_run), "--data", str(tmp_path / "p.npy"),
                 "--out", str(b)]) == 0  # fmt: skip
    from_idx = [float(r["score"]) for r in _predictions(a)]
    np.testing.assert_allclose(from_idx, [float(r["score"]) for r in _predictions(b)], atol=1e-6)
    capsys.readouterr()
    code, out, _ = _cli(["evaluate", "--run", str(cnn_run), "--data", str(idx), "--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["rows"] == 300
    assert result["positive_rate"] == (classes >= 5).mean()  # classes 5-9 are positive
    np.save(tmp_path / "bad.npy", np.zeros((4, 3, 32, 32), dtype=np.uint8))
    code, _, err = _cli(["predict", "--run", str(cnn_run), "--data", str(tmp_path / "bad.npy")],
                        capsys)  # fmt: skip
    assert code == 2 and "(3, 32, 32)" in err and "(1, 28, 28)" in err
    code, _, err = _cli(["evaluate", "--run", str(cnn_run), "--data", str(tmp_path / "p.npy")],
                        capsys)  # fmt: skip
    assert code == 2 and "holds no labels" in err


# --------------------------------------------------------------------------- export

FRESH_PYTHON = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class NoSlate(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "slate" or name.startswith("slate."):
                raise ImportError("the exported program must run without slate")

    sys.meta_path.insert(0, NoSlate())
    import numpy as np
    import torch

    for program_path, inputs, outputs in json.loads(sys.argv[1]):
        program = torch.export.load(program_path).module()
        x = torch.from_numpy(np.load(inputs))
        assert x.dtype == torch.float32
        with torch.no_grad():
            np.save(outputs, program(x).numpy())
    print(sorted(m for m in sys.modules if m.split(".")[0] == "slate"))
    """
)


@pytest.mark.processes
@needs_w7a
@needs_fashion
def test_exported_programs_equal_predict_in_a_python_without_slate(
    w7a_run, cnn_run, w7a_test_set, tmp_path, capsys
):
    """The MLP and the CNN, each exported with preprocessing and sigmoid inside, loaded by plain
    PyTorch: the probabilities equal slate predict's to 1e-6 (any number of rows: 1000 of
    each, where the programs were traced on 2)."""
    from slate.data.readers.idx import read_idx

    jobs, expected = [], []
    x = w7a_test_set[0][:1000]
    pixels = read_idx(FASHION / "t10k-images-idx3-ubyte.gz")[:1000, None].astype(np.float32)
    for name, run, raw in (("mlp", w7a_run, x), ("cnn", cnn_run, pixels)):
        assert main(["export", "--run", str(run), "--format", "torch-export",
                     "--out", str(tmp_path / f"{name}.pt2")]) == 0  # fmt: skip
        np.save(tmp_path / f"{name}_x.npy", raw)
        np.save(tmp_path / f"{name}_raw.npy", raw if name == "mlp" else raw[:, 0].astype(np.uint8))
        scores = tmp_path / f"{name}.csv"
        source = tmp_path / f"{name}_raw.npy"
        assert main(["predict", "--run", str(run), "--data", str(source),
                     "--out", str(scores)]) == 0  # fmt: skip
        expected.append(np.array([float(r["score"]) for r in _predictions(scores)]))
        jobs.append([str(tmp_path / f"{name}.pt2"), str(tmp_path / f"{name}_x.npy"),
                     str(tmp_path / f"{name}_p.npy")])  # fmt: skip
    # One fresh interpreter loads both programs, each on its own (torch.export.load), as a user
    # would: the import of torch, most of a fresh interpreter's cost, is paid once.
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PYTHON, json.dumps(jobs)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # slate was never imported
    for (_, _, outputs), want in zip(jobs, expected, strict=True):
        got = np.load(outputs)
        assert got.shape == want.shape and got.dtype == np.float32
        assert np.abs(got - want).max() <= 1e-6


def test_export_error_names_the_module_and_the_operation():
    from slate.errors import ConfigError
    from slate.inference.export import ProbabilityProgram, export_program

    class DataDependent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 1)

        def forward(self, x):
            y = self.linear(x).squeeze(-1)
            if y.sum().item() > 0:  # Python control flow on a tensor's value
                return y
            return -y

    program = ProbabilityProgram(torch.nn.Identity(), DataDependent())
    with pytest.raises(ConfigError) as caught:
        export_program(program, (3,), what="The test model")
    message = str(caught.value)
    assert "module model (DataDependent.forward" in message
    assert "y.sum().item() > 0" in message
    assert "cannot be exported with torch.export" in message


def test_metrics_agree_with_sklearn_on_the_operating_point_inputs():
    """The curve the points are chosen on is scikit-learn's (guards the shared kernel)."""
    rng = np.random.default_rng(0)
    y = (rng.random(300) < 0.2).astype(np.int64)
    s = np.round(rng.normal(size=300) + y, 1).astype(np.float32)  # ties
    precision, recall, thresholds = metrics.precision_recall_curve(
        torch.from_numpy(s), torch.from_numpy(y)
    )
    point = at_recall(precision, recall, np.append(thresholds, np.inf), 0.9)
    flagged = s >= point.logit
    assert (flagged & (y == 1)).sum() / y.sum() == pytest.approx(point.recall)


def test_csv_reading_flags_are_refused_for_a_libsvm_run(w7a_run, capsys):
    for flags in (["--delimiter", ";"], ["--on-bad-row", "skip"]):
        capsys.readouterr()
        code = main(["predict", "--run", str(w7a_run), "--data", str(W7A_TEST), *flags])
        err = capsys.readouterr().err
        assert code == 2 and "apply to the CSV files of a CSV run" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
