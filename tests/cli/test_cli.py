"""End-to-end tests of the ``slate`` command line: user errors, ``topology`` and ``train``."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.model_selection import train_test_split

from slate.cli import main
from slate.models import build_model
from tests.sites import slate_here

FAST = ["--iterations", "5", "--eval-every", "5", "--no-progress"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY_KEYS = {
    "dataset",
    "algorithm",
    "topology",
    "nodes",
    "lambda",
    "iterations",
    "test_ap",
    "test_auroc",
    "party_ap_min",
    "party_ap_max",
    "evaluation_seconds",
    "consensus_distance",
    "wall_seconds",
    "test_split",
    "seed",
    "config",
}
HISTORY_COLUMNS = [
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
]


def _user_error(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """Run ``slate argv`` in-process; it must fail cleanly with exit code 2 and a message."""
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("slate: error:"), err
    assert "Traceback" not in err
    body = err.strip()
    assert "\n\n" not in body, "the message must be one paragraph"
    assert len(body) > len("slate: error:") + 10
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def _ring_lambda(n: int) -> float:
    return (1 + 2 * math.cos(2 * math.pi / n)) / 3


# --------------------------------------------------------------------------------------------
# input files used by the error cases
# --------------------------------------------------------------------------------------------


@pytest.fixture
def small_csv(tmp_path: Path) -> Path:
    """80 rows, 20 positives, label column ``y``."""
    rng = np.random.default_rng(0)
    lines = ["a,b,y"]
    for i in range(80):
        lines.append(f"{rng.random():.3f},{rng.random():.3f},{int(i % 4 == 0)}")
    path = tmp_path / "small.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _matrix_file(tmp_path: Path, rows: list[list[float]], name: str) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(",".join(str(v) for v in row) for row in rows) + "\n")
    return path


# --------------------------------------------------------------------------------------------
# user errors: exit code 2, "slate: error: ..." naming the culprit, no traceback
# --------------------------------------------------------------------------------------------


def test_malformed_libsvm_line(capsys, tmp_path: Path) -> None:
    path = tmp_path / "broken.svm"
    path.write_text("+1 1:0.5 2:0.25\n-1 1:0.1\n-1 3=0.2\n+1 2:1\n")
    err = _user_error(capsys, ["train", "--dataset", "libsvm", "--train", str(path), *FAST])
    assert str(path) in err and "line 3" in err and "3=0.2" in err


def test_csv_without_label_column(capsys, small_csv: Path) -> None:
    argv = ["train", "--dataset", "csv", "--train", str(small_csv), "--label-column", "target"]
    err = _user_error(capsys, [*argv, "--positive-label", "1", *FAST])
    assert str(small_csv) in err and "'target'" in err
    assert "'y'" in err  # lists the available columns


def test_csv_without_label_column_flag(capsys, small_csv: Path) -> None:
    argv = ["train", "--dataset", "csv", "--train", str(small_csv), "--positive-label", "1"]
    _user_error(capsys, [*argv, *FAST], "--label-column")


def test_libsvm_labels_not_binary(capsys, tmp_path: Path) -> None:
    path = tmp_path / "multi.svm"
    path.write_text("1 1:0.5\n-1 1:0.3\n1 2:0.1\n2 1:0.7\n")
    err = _user_error(capsys, ["train", "--dataset", "libsvm", "--train", str(path), *FAST])
    assert str(path) in err and "line 4" in err and "binary" in err and "'2'" in err


def test_csv_labels_not_binary(capsys, tmp_path: Path) -> None:
    path = tmp_path / "three.csv"
    path.write_text("x,label\n1,cat\n2,dog\n3,cat\n4,bird\n")
    argv = ["train", "--dataset", "csv", "--train", str(path), "--label-column", "label"]
    err = _user_error(capsys, [*argv, "--positive-label", "cat", *FAST])
    assert str(path) in err and "line 5" in err and "'bird'" in err and "binary" in err


def test_positive_label_never_occurs(capsys, small_csv: Path) -> None:
    argv = ["train", "--dataset", "csv", "--train", str(small_csv), "--label-column", "y"]
    err = _user_error(capsys, [*argv, "--positive-label", "7", *FAST])
    assert str(small_csv) in err and "'7'" in err and "never occurs" in err


def test_positives_above_batch_size(capsys) -> None:
    err = _user_error(capsys, ["train", "--positives", "30", "--batch-size", "20", *FAST])
    assert "--positives" in err and "--batch-size" in err and "30" in err and "20" in err


def test_positives_zero(capsys) -> None:
    err = _user_error(capsys, ["train", "--positives", "0", *FAST], "--positives")
    assert re.search(r"\b0\b", err)


def test_party_with_too_few_positives(capsys, small_csv: Path) -> None:
    argv = ["train", "--dataset", "csv", "--train", str(small_csv), "--label-column", "y"]
    err = _user_error(capsys, [*argv, "--positive-label", "1", "--nodes", "50", *FAST])
    # 15 training positives over 50 parties: parties 0..14 hold one each, the rest none; a
    # party without positives may take part, one with fewer than b but some may not
    assert "15 of 50 parties hold fewer" in err and "Every party that holds positives" in err
    assert "15 parties (0-14): 1" in err
    assert "--positives" in err and "--nodes" in err


def test_topology_file_not_doubly_stochastic(capsys, tmp_path: Path) -> None:
    path = _matrix_file(tmp_path, [[0.5, 0.5, 0], [0.5, 0.3, 0.2], [0, 0.2, 0.7]], "W.csv")
    argv = ["train", "--topology", f"file:{path}", "--nodes", "3", *FAST]
    err = _user_error(capsys, argv)
    assert str(path) in err and "doubly stochastic" in err and "row 2" in err


def test_topology_file_disconnected(capsys, tmp_path: Path) -> None:
    path = _matrix_file(tmp_path, [[0.5, 0.5, 0], [0.5, 0.5, 0], [0, 0, 1]], "W.csv")
    argv = ["train", "--topology", f"file:{path}", "--nodes", "3", *FAST]
    err = _user_error(capsys, argv)
    assert str(path) in err and "not connected" in err


def test_topology_file_wrong_size(capsys, tmp_path: Path) -> None:
    path = _matrix_file(tmp_path, [[0.5, 0.5], [0.5, 0.5]], "W.csv")
    err = _user_error(capsys, ["train", "--topology", f"file:{path}", "--nodes", "3", *FAST])
    assert str(path) in err and "--nodes" in err


def test_unknown_dataset(capsys) -> None:
    err = _user_error(capsys, ["train", "--dataset", "nope", *FAST], "'nope'", "--dataset")
    assert "digits" in err and "w8a" in err


def test_unknown_topology(capsys) -> None:
    err = _user_error(capsys, ["train", "--topology", "nope", *FAST], "'nope'")
    assert "ring" in err and "file:PATH" in err


def test_unknown_topology_command(capsys) -> None:
    _user_error(capsys, ["topology", "hypercube-ish"], "'hypercube-ish'", "ring")


def test_nodes_zero(capsys) -> None:
    _user_error(capsys, ["train", "--nodes", "0", *FAST], "--nodes", "0")


def test_missing_data_dir(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    argv = ["train", "--dataset", "w7a", "--data-dir", str(missing), *FAST]
    _user_error(capsys, argv, str(missing), "--download")


def test_non_finite_loss(capsys) -> None:
    argv = ["train", "--lr", "1e30", "--iterations", "10", "--eval-every", "10", "--no-progress"]
    err = _user_error(capsys, argv)
    match = re.search(r"party (\d+) at iteration (\d+)", err)
    assert match, err
    # The step-wise check names the step; the overflow of the averaged model's test scores
    # (saturated sigmoids keep the losses finite) is seen at the evaluation after step 10.
    assert 0 <= int(match.group(1)) < 8 and 0 <= int(match.group(2)) <= 10
    assert "non-finite" in err or "NaN" in err
    assert "--lr" in err and "lower" in err


def test_non_finite_loss_dpsgd_huge_features(capsys, tmp_path: Path) -> None:
    path = tmp_path / "huge.svm"
    lines = [f"{'+1' if i % 3 == 0 else '-1'} 1:1e30 2:{i % 7}e29" for i in range(60)]
    path.write_text("\n".join(lines) + "\n")
    argv = ["train", "--dataset", "libsvm", "--train", str(path), "--algorithm", "dpsgd"]
    err = _user_error(capsys, [*argv, "--nodes", "2", *FAST])
    assert re.search(r"party \d+ (at|by) iteration \d+", err), err
    assert "--lr" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda(capsys) -> None:
    _user_error(capsys, ["train", "--device", "cuda", *FAST], "--device cuda", "--device cpu")


def test_bad_device_name(capsys) -> None:
    _user_error(capsys, ["train", "--device", "tpu-9000", *FAST], "--device")


# Inputs that once reached the user as tracebacks instead of "slate: error:".


def test_tiny_csv_split_is_a_user_error(capsys, tmp_path: Path) -> None:
    path = tmp_path / "tiny.csv"
    path.write_text("a,b,y\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    argv = ["train", "--dataset", "csv", "--train", str(path), "--label-column", "y"]
    _user_error(capsys, [*argv, "--positive-label", "1", "--nodes", "50", *FAST])


def test_negative_threads_is_a_user_error(capsys) -> None:
    _user_error(capsys, ["train", "--threads", "-1", *FAST], "--threads")


def test_out_is_a_file_is_a_user_error(capsys, tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("not a folder")
    _user_error(capsys, ["train", "--out", str(target), *FAST], str(target))


# --------------------------------------------------------------------------------------------
# real processes: exit codes and stderr
# --------------------------------------------------------------------------------------------


def _slate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slate", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_help(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "train" in out and "topology" in out


@pytest.mark.processes
def test_subprocess_malformed_libsvm(tmp_path: Path) -> None:
    path = tmp_path / "broken.svm"
    path.write_text("+1 1:0.5\n-1 1:zero\n")
    proc = _slate("train", "--dataset", "libsvm", "--train", str(path), *FAST, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("slate: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert str(path) in proc.stderr and "line 2" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_is_one_paragraph(tmp_path: Path) -> None:
    proc = slate_here("train", "--device", "cuda", *FAST, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("slate: error:")
    assert "Traceback" not in proc.stderr and "--device" in proc.stderr


# --------------------------------------------------------------------------------------------
# slate topology
# --------------------------------------------------------------------------------------------


def _printed_number(text: str, label: str) -> float:
    match = re.search(rf"{re.escape(label)}[^\n:]*:\s*([0-9.]+)", text)
    assert match, (label, text)
    return float(match.group(1))


def test_topology_ring_lambda(capsys) -> None:
    assert main(["topology", "ring", "--nodes", "20"]) == 0
    out = capsys.readouterr().out
    lam = _printed_number(out, "lambda")
    gap = _printed_number(out, "spectral gap")
    expected = _ring_lambda(20)
    assert f"{expected:.4f}" == "0.9674"
    assert f"{lam:.4f}" == "0.9674"
    assert lam == pytest.approx(expected, abs=1e-6)
    assert gap == pytest.approx(1 - expected, abs=1e-6)


def test_topology_show_prints_matrix(capsys) -> None:
    assert main(["topology", "ring", "--nodes", "6", "--show"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.fullmatch(r"[0-9. ]+", line.strip())]
    W = np.array(rows[-6:], dtype=float)
    expected = np.zeros((6, 6))
    for i in range(6):
        for j in (i - 1, i, i + 1):
            expected[i, j % 6] = 1 / 3
    np.testing.assert_allclose(W, expected, atol=1e-4)
    assert _printed_number(out, "lambda") == pytest.approx(_ring_lambda(6), abs=1e-6)


def test_topology_without_show_prints_no_matrix(capsys) -> None:
    assert main(["topology", "ring", "--nodes", "6"]) == 0
    out = capsys.readouterr().out
    assert "lambda" in out
    assert not any(re.fullmatch(r"[0-9. ]+", line.strip()) for line in out.splitlines())


# --------------------------------------------------------------------------------------------
# slate train on digits
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "run"
    argv = ["train", "--iterations", "60", "--eval-every", "20", "--margin", "0.3", "--party-ap"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def digits_test_set() -> tuple[np.ndarray, np.ndarray]:
    raw = load_digits()
    x = (raw.data / 16.0).astype(np.float32)
    _, x_te, _, c_te = train_test_split(
        x, raw.target, test_size=0.25, stratify=raw.target, random_state=0
    )
    return x_te, (c_te >= 5).astype(np.int64)


def test_train_writes_run_folder(digits_run: Path) -> None:
    for name in ("summary.json", "history.csv", "pr_curve.png", "ap_curve.png", "model.pt"):
        assert (digits_run / name).is_file(), name
    for name in ("pr_curve.png", "ap_curve.png"):
        assert (digits_run / name).read_bytes()[:8] == PNG_MAGIC


def test_train_summary(digits_run: Path) -> None:
    summary = json.loads((digits_run / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert summary["dataset"] == "digits" and summary["algorithm"] == "slate"
    assert summary["topology"] == "ring" and summary["iterations"] == 60
    assert summary["seed"] == 0
    nodes = summary["nodes"]
    assert summary["lambda"] == pytest.approx(_ring_lambda(nodes), abs=1e-9)
    assert 0 <= summary["party_ap_min"] <= summary["party_ap_max"] <= 1
    assert 0 < summary["test_ap"] <= 1 and 0 <= summary["test_auroc"] <= 1
    assert summary["consensus_distance"] >= 0 and summary["wall_seconds"] > 0
    assert 0 < summary["evaluation_seconds"] < summary["wall_seconds"]
    assert "stratified" in summary["test_split"]

    config = summary["config"]
    assert config["nodes"] == nodes and config["iterations"] == 60
    assert config["margin"] == 0.3  # the flag
    for key in ("lr", "batch_size", "positives"):  # resolved defaults, not None
        assert isinstance(config[key], (int, float)) and config[key] > 0, key
    assert 1 <= config["positives"] <= config["batch_size"]
    assert config["eval_every"] == 20 and config["dataset"] == "digits"


def test_train_history(digits_run: Path) -> None:
    with open(digits_run / "history.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == HISTORY_COLUMNS
        rows = list(reader)
    assert [int(r["iteration"]) for r in rows] == [0, 20, 40, 60]
    summary = json.loads((digits_run / "summary.json").read_text())
    assert float(rows[-1]["test_ap"]) == pytest.approx(summary["test_ap"], abs=1e-12)
    assert float(rows[-1]["test_auroc"]) == pytest.approx(summary["test_auroc"], abs=1e-12)
    assert math.isnan(float(rows[0]["train_loss"]))
    assert all(math.isfinite(float(r["train_loss"])) for r in rows[1:])
    elapsed = [float(r["elapsed_seconds"]) for r in rows]
    assert elapsed == sorted(elapsed)
    assert float(rows[0]["consensus_distance"]) == pytest.approx(0.0, abs=1e-12)
    # The paper's protocol on a ring: one round per iteration, two neighbours' worth of the
    # float32 parameters per round; no --wan, no estimate.
    assert [float(r["rounds"]) for r in rows] == [0, 20, 40, 60]
    parameter_bytes = 4 * summary["n_parameters"]
    assert [float(r["comm_bytes_per_party"]) for r in rows] == [
        2 * parameter_bytes * t for t in (0, 20, 40, 60)
    ]
    assert all(math.isnan(float(r["estimated_wan_seconds"])) for r in rows)


def test_train_model_reproduces_test_ap(digits_run: Path, digits_test_set) -> None:
    summary = json.loads((digits_run / "summary.json").read_text())
    state = torch.load(digits_run / "model.pt", weights_only=True)
    model = build_model("mlp", (64,))
    model.load_state_dict(state)
    model.eval()
    x_te, y_te = digits_test_set
    assert len(y_te) == summary.get("n_test", len(y_te))
    with torch.no_grad():
        logits = model(torch.from_numpy(x_te)).double().numpy()
    assert logits.shape == (len(y_te),)
    assert average_precision_score(y_te, logits) == pytest.approx(summary["test_ap"], abs=1e-6)
    assert roc_auc_score(y_te, logits) == pytest.approx(summary["test_auroc"], abs=1e-6)
    # the saved model is not the untrained one
    fresh = build_model("mlp", (64,))
    assert any(not torch.equal(v, fresh.state_dict()[k]) for k, v in state.items())


def test_train_default_out_dir(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    quiet = ["--eval-every", "1", "--no-progress", "--no-plots"]
    assert main(["train", "--iterations", "2", *quiet]) == 0
    folders = list((tmp_path / "runs").iterdir())
    assert len(folders) == 1 and folders[0].is_dir()
    assert folders[0].name.startswith("digits-slate")
    summary = json.loads((folders[0] / "summary.json").read_text())
    assert summary["iterations"] == 2
    assert main(["train", "--iterations", "1", *quiet]) == 0
    assert len(list((tmp_path / "runs").iterdir())) == 2  # a second run gets a fresh folder


# --------------------------------------------------------------------------------------------
# party losses: --drop-party's errors


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--drop-party", "9@10"], ("--drop-party 9@10", "rank 9")),
        (["--drop-party", "2"], ("RANK@ITER",)),
        (["--drop-party", "1@5", "--engine", "distributed"], ("simulator",)),
        (["--drop-party", "1@5", "--drop-party", "1@7"], ("names party 1 twice",)),
    ],
)
def test_drop_party_errors(capsys, flags, needles) -> None:
    _user_error(capsys, ["train", "--nodes", "4", "--iterations", "20", "--no-progress",
                         *flags], *needles)  # fmt: skip


def test_drop_party_is_reported(capsys, tmp_path: Path) -> None:
    rc = main(["train", "--nodes", "4", "--iterations", "40", "--drop-party", "2@20",
               "--no-progress", "--no-plots", "--out", str(tmp_path / "run")])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "party 2 lost at iteration 20 (--drop-party): 3 parties continue" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["on_party_loss"] == "continue"
    assert summary["config"]["drop_party"] == ["2@20"]


def test_on_party_loss_choices(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--on-party-loss", "ignore"])
    assert "invalid choice" in capsys.readouterr().err


def test_rendezvous_refuses_a_bad_port(capsys) -> None:
    _user_error(capsys, ["rendezvous", "--port", "99999"], "--port", "1..65535")
