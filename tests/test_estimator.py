"""``slate.SlateClassifier``: scikit-learn's API and checks, and equality with ``slate train``.

The references are scikit-learn itself (``check_estimator``, ``cross_val_score``, ``clone``,
``average_precision_score``) and ``slate train`` run from the command line on the same rows,
written to CSV files, whose saved model is scored by ``slate predict``'s code.
"""

from __future__ import annotations

import csv
import json
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.inspection import permutation_importance
from sklearn.metrics import average_precision_score, brier_score_loss
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

import slate
from slate.cli import main
from slate.config import TrainConfig, resolve_config
from slate.estimator import EXPECTED_FAILED_CHECKS, PARAMETER_FIELDS, SlateClassifier
from slate.inference.scoring import logits_of, read_input
from slate.training.configuration import resolve_and_check

# The equality tests' length. Their learning bound (AP > 3 x the positive rate, 0.29): at 100
# iterations the 4-party fit's test AP is 0.68 (0.84 standardised) for seed 0, 0.91 (0.88) and
# 0.76 (0.71) for seeds 1 and 2, measured here; 300 gave 0.92 (0.92).
ITERATIONS = 100


@pytest.fixture(scope="module")
def imbalanced() -> tuple[np.ndarray, np.ndarray]:
    """1 600 rows, 12 features, about 10% positive."""
    return make_classification(
        n_samples=1600, n_features=12, n_informative=6, weights=[0.9], random_state=1
    )


def _write_csv(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Each float32 feature in full (its float64 repr reads back to the same float32)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([f"f{j}" for j in range(x.shape[1])] + ["label"])
        for row, label in zip(x, y, strict=True):
            writer.writerow([repr(float(v)) for v in row] + [int(label)])


def _slate_train(tmp_path: Path, *flags: str) -> Path:
    out = tmp_path / "run"
    table = ["--dataset", "csv", "--label-column", "label", "--positive-label", "1"]
    # The estimator's step size (its default; a table's slate train would choose one, --lr auto).
    run = ["--iterations", str(ITERATIONS), "--lr", "0.01", "--out", str(out), "--no-progress",
           "--no-plots"]  # fmt: skip
    assert main(["train", *table, *run, *flags]) == 0
    return out


def _run_logits(run: Path, data: Path) -> np.ndarray:
    """The logits of the run's saved model on a CSV file, read and preprocessed as ``slate
    predict`` reads it (``slate.load_model``, ``slate.inference.scoring``)."""
    model, preprocessing = slate.load_model(run)
    features = read_input(preprocessing, data).features
    return logits_of(model, features).numpy().astype(np.float64)


# ------------------------------------------------------------------ equality with slate train


@pytest.mark.parametrize("standardize", [False, True])
def test_equals_slate_train_on_the_same_rows_and_partition(tmp_path, imbalanced, standardize):
    x, y = imbalanced
    x = x.astype(np.float32)
    x_train, y_train, x_test, y_test = x[:1200], y[:1200], x[1200:], y[1200:]
    _write_csv(tmp_path / "tr.csv", x_train, y_train)
    _write_csv(tmp_path / "te.csv", x_test, y_test)
    run = _slate_train(
        tmp_path, "--train", str(tmp_path / "tr.csv"), "--test", str(tmp_path / "te.csv"),
        "--nodes", "4", "--standardize" if standardize else "--no-standardize",
    )  # fmt: skip
    clf = SlateClassifier(n_parties=4, iterations=ITERATIONS, standardize=standardize)
    clf.fit(x_train, y_train)
    logits = clf.decision_function(x_test)
    summary = json.loads((run / "summary.json").read_text())
    ap = average_precision_score(y_test, logits)
    assert ap == pytest.approx(summary["test_ap"], abs=1e-6)  # the run's exact (pooled) AP
    assert ap > 3 * y_test.mean()
    np.testing.assert_allclose(logits, _run_logits(run, tmp_path / "te.csv"), atol=1e-6, rtol=0)
    predictions = tmp_path / "predictions.csv"
    assert main(["predict", "--run", str(run), "--data", str(tmp_path / "te.csv"),
                 "--out", str(predictions)]) == 0  # fmt: skip
    with open(predictions) as handle:
        scores = np.array([float(row["score"]) for row in csv.DictReader(handle)])
    # slate predict's score is the float32 sigmoid, written with 9 digits
    np.testing.assert_allclose(clf.predict_proba(x_test)[:, 1], scores, atol=1e-6, rtol=0)


def test_party_ids_equal_slate_train_with_each_partys_own_files(tmp_path, imbalanced) -> None:
    """``parties=`` ids give the model of ``slate train`` with ``{rank}`` files holding those
    rows (the test rows are split too: each party scores its own)."""
    x, y = imbalanced
    x = x.astype(np.float32)
    x_train, y_train, x_test = x[:1200], y[:1200], x[1200:]
    ids = np.random.default_rng(0).integers(0, 3, len(y_train))
    for k in range(3):
        _write_csv(tmp_path / f"tr{k}.csv", x_train[ids == k], y_train[ids == k])
        _write_csv(tmp_path / f"te{k}.csv", x_test[k::3], y[1200:][k::3])
    run = _slate_train(
        tmp_path, "--train", str(tmp_path / "tr{rank}.csv"), "--test",
        str(tmp_path / "te{rank}.csv"), "--nodes", "3", "--no-standardize",
    )  # fmt: skip
    clf = SlateClassifier(iterations=ITERATIONS).fit(x_train, y_train, parties=ids)
    assert clf.n_parties_ == 3
    np.testing.assert_array_equal(clf.party_sizes_, np.bincount(ids))
    _write_csv(tmp_path / "te.csv", x_test, y[1200:])
    np.testing.assert_allclose(
        clf.decision_function(x_test), _run_logits(run, tmp_path / "te.csv"), atol=1e-6, rtol=0
    )


# ------------------------------------------------------------------ scikit-learn's tools


def test_cross_val_score_in_a_pipeline_beats_the_positive_rate(imbalanced) -> None:
    x, y = imbalanced
    x = x * np.linspace(1, 1000, x.shape[1])  # raw scales: the pipeline's scaler matters
    # 150 iterations: the folds' smallest AP is 0.88 (0.89 with parties=) for seed 0; seeds 1
    # and 2 give 0.88 and 0.76 (0.89, 0.78), measured here; 300 gave 0.90 (0.89).
    pipeline = Pipeline(
        [("scale", StandardScaler()), ("slate", SlateClassifier(n_parties=4, iterations=150))]
    )
    scores = cross_val_score(pipeline, x, y, cv=3, scoring="average_precision")
    assert scores.shape == (3,)
    assert scores.min() > 0.6 > 5 * y.mean()
    # parties= routed to fit and cut by each fold, like any per-row fit parameter
    ids = {"slate__parties": np.arange(len(y)) % 3}
    scores = cross_val_score(pipeline, x, y, cv=3, scoring="average_precision", params=ids)
    assert scores.min() > 0.6


def test_params_round_trip_through_clone_and_set_params() -> None:
    clf = SlateClassifier(n_parties=5, lr=0.05, topology="torus", compress="int8")
    params = clf.get_params()
    assert params["n_parties"] == 5 and params["topology"] == "torus"
    twin = clone(clf)
    assert twin is not clf and twin.get_params() == params
    assert twin.set_params(lr=0.2, algorithm="slate-m") is twin
    assert twin.get_params() == {**params, "lr": 0.2, "algorithm": "slate-m"}
    assert clf.get_params() == params
    assert SlateClassifier(**params).get_params() == params


def test_defaults_are_slate_trains_for_a_table() -> None:
    """Every parameter that is a flag defaults to ``slate train --dataset csv``'s value, except
    ``standardize`` (off: scale in a Pipeline), ``n_parties`` (None: chosen from the
    positives at ``fit``, as ``slate train`` chooses ``--nodes`` for a table), and ``lr`` and
    ``iterations``: the paper's 0.01 and 2000, where a table's ``slate train`` chooses its step
    size (``--lr auto``, which the estimator takes as ``lr="auto"``) and runs 5000 iterations."""
    resolved = resolve_and_check(TrainConfig(dataset="csv")).flags  # the algorithms' defaults too
    for name, value in SlateClassifier().get_params().items():
        field = PARAMETER_FIELDS.get(name, name)
        if name == "n_parties":
            assert value is None
        elif name in ("lr", "iterations"):
            assert (name, value) in (("lr", 0.01), ("iterations", 2000))
            assert (resolved.lr, resolved.iterations) == ("auto", 5000)
        elif name == "standardize":
            assert value is False and resolved.standardize is True
        elif hasattr(resolved, field):
            assert value == getattr(resolved, field), name
        else:
            assert name in ("verbose", "pos_label")
    config = SlateClassifier(n_parties=6, lr=0.3).train_config()
    assert (config.nodes, config.lr, config.eval_every, config.party_ap) == (6, 0.3, 2000, False)


def test_permutation_importance_finds_the_informative_feature() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 3))
    y = (x[:, 1] + 0.3 * rng.normal(size=600) > 1.3).astype(int)
    clf = SlateClassifier(n_parties=3, iterations=200).fit(x, y)
    result = permutation_importance(
        clf, x, y, scoring="average_precision", n_repeats=3, random_state=0
    )
    assert result.importances_mean.shape == (3,)
    assert int(np.argmax(result.importances_mean)) == 1


def test_calibrated_classifier_cv_turns_scores_into_probabilities(imbalanced) -> None:
    """The sigmoid of the logit ranks but is not a probability; scikit-learn's calibration,
    which the docstring points to, fits one."""
    x, y = imbalanced
    # 100 iterations: calibration's Brier score is 0.11 of the raw one for seed 0 (0.08 at 200),
    # 0.08 for seed 1 (0.08); seed 2 gives 0.65 (0.58 at 200: it fails either way), measured here.
    clf = SlateClassifier(n_parties=4, iterations=100)
    raw = clf.fit(x, y).predict_proba(x)[:, 1]
    calibrated = CalibratedClassifierCV(clf, cv=3).fit(x, y).predict_proba(x)[:, 1]
    assert brier_score_loss(y, calibrated) < 0.5 * brier_score_loss(y, raw)
    assert calibrated.mean() == pytest.approx(y.mean(), abs=0.02)


def test_check_estimator_fails_only_the_listed_checks() -> None:
    """Every scikit-learn check passes except those in ``EXPECTED_FAILED_CHECKS``, and those
    do fail (the list stays honest). With ``positives=1`` only the float32 one may fail.

    ``check_methods_subset_invariance`` fails only where a row's float32 logit depends on how
    many rows its matrix product holds, which the CPU's kernels decide: AVX2 and AVX-512 ones
    block by shape, ATen's scalar kernels (``ATEN_CPU_CAPABILITY=default``) and MKL held to
    SSE4.2 gave every row the same bits here. So it may pass; every other check is as listed."""
    kernel_dependent = {"check_methods_subset_invariance"}
    # Both at 20 iterations (a fit's cost is its steps: about 41 fits per run). positives=1:
    # its verdicts (54 passed, none or only the kernel-dependent one failed) were those of 50,
    # and of 10 too, measured here; 20 keeps a margin on the accuracy-bound checks. positives=2:
    # its verdicts at 20 and 30 (53 passed, check_fit2d_1feature failed, the kernel-dependent
    # one passed on this CPU) were those of 50, measured here; EXPECTED_FAILED_CHECKS's comment
    # names 20, and neither listed reason depends on the number of iterations.
    for positives, iterations, expected in (
        (2, 20, set(EXPECTED_FAILED_CHECKS)),
        (1, 20, {"check_methods_subset_invariance"}),
    ):
        estimator = SlateClassifier(n_parties=2, iterations=iterations, positives=positives)
        results = check_estimator(estimator, on_fail=None)
        failed = {r["check_name"] for r in results if r["status"] == "failed"}
        differ = (failed ^ expected) - kernel_dependent
        assert not differ, [r for r in results if r["check_name"] in differ]
        assert failed <= expected
        assert sum(r["status"] == "passed" for r in results) > 40


# ------------------------------------------------------------------ parties and bad input


def test_party_ids_and_index_lists_give_the_same_model(imbalanced) -> None:
    x, y = imbalanced
    ids = np.random.default_rng(1).choice(np.array(["a", "b", "c"]), size=len(y))
    # 30 iterations: the claim is bit equality, which any difference in the parties' rows (or in
    # the order their batches are drawn) breaks from the first step on; no learning bound here.
    by_ids = SlateClassifier(iterations=30).fit(x, y, parties=ids)
    rows = [np.flatnonzero(ids == name) for name in ("a", "b", "c")]
    by_rows = SlateClassifier(iterations=30).fit(x, y, parties=[r[::-1] for r in rows])
    by_list = SlateClassifier(iterations=30).fit(x, y, parties=list(ids))
    expected = by_ids.decision_function(x)
    np.testing.assert_array_equal(by_rows.decision_function(x), expected)
    np.testing.assert_array_equal(by_list.decision_function(x), expected)
    assert by_ids.n_parties_ == 3
    np.testing.assert_array_equal(by_ids.party_sizes_, [len(r) for r in rows])


def test_a_party_without_positives_takes_part_and_one_short_of_b_is_a_value_error(
    imbalanced,
) -> None:
    x, y = imbalanced
    ids = np.where(y == 1, 0, np.arange(len(y)) % 2)  # party 1 holds negatives only
    fitted = SlateClassifier(iterations=10).fit(x, y, parties=ids)
    assert np.isfinite(fitted.decision_function(x)).all()
    ids = np.where(y == 1, 0, np.arange(len(y)) % 2)
    ids[np.flatnonzero(y == 1)[0]] = 1  # party 1 holds one positive, fewer than b = 2
    with pytest.raises(ValueError, match=r"at least b = 2 \('positives'\)") as info:
        SlateClassifier(iterations=10).fit(x, y, parties=ids)
    assert "party 1: 1" in str(info.value)
    assert "sorted order of their ids: 0 = 0, 1 = 1" in str(info.value)
    with pytest.raises(ValueError, match="'n_parties'"):
        SlateClassifier(n_parties=500, iterations=10).fit(x, y)


@pytest.mark.parametrize(
    ("parties", "message"),
    [
        (np.zeros(5), r"one party id per row of X \(1600 rows\)"),
        ([np.arange(800), np.arange(700, 1600)], "100 rows are in several parties"),
        ([np.arange(800), np.arange(900, 1600)], "100 rows are in no party"),
        ([np.arange(800), np.arange(800, 1601)], "outside 0..1599"),
        ([np.arange(800) * 1.0, np.arange(800, 1600)], "integer row indices"),
    ],
)
def test_malformed_parties_are_value_errors(imbalanced, parties, message) -> None:
    x, y = imbalanced
    with pytest.raises(ValueError, match=message):
        SlateClassifier(iterations=10).fit(x, y, parties=parties)


def test_bad_targets_and_parameters_are_value_errors(imbalanced) -> None:
    x, y = imbalanced
    with pytest.raises(ValueError, match="Only binary classification is supported"):
        SlateClassifier(iterations=10).fit(x, y % 3 + (x[:, 0] > 0))
    with pytest.raises(ValueError, match="one class only"):
        SlateClassifier(iterations=10).fit(x, np.zeros(len(y)))
    with pytest.raises(ValueError, match="Unknown label type"):
        SlateClassifier(iterations=10).fit(x, x[:, 0])
    with pytest.raises(ValueError, match=r"'positives' \(b = 30\) cannot exceed 'batch_size'"):
        SlateClassifier(positives=30, iterations=10).fit(x, y)
    with pytest.raises(ValueError, match="float32's range"):
        SlateClassifier(iterations=10).fit(np.full_like(x, 1e300), y)
    with pytest.warns(ConvergenceWarning, match=r"not learning: every training score.*'lr'"):
        SlateClassifier(n_parties=4, lr=1e6, iterations=50).fit(x, y)


def test_labels_probabilities_and_pickle(imbalanced) -> None:
    x, y = imbalanced
    names = np.array(["benign", "malignant"])[y]
    clf = SlateClassifier(n_parties=4, iterations=100, standardize=True).fit(x, names)
    assert list(clf.classes_) == ["benign", "malignant"]
    logits = clf.decision_function(x)
    assert logits.dtype == np.float64 and logits.shape == (len(y),)
    np.testing.assert_array_equal(clf.predict(x), np.where(logits > 0, "malignant", "benign"))
    proba = clf.predict_proba(x)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_allclose(proba[:, 1], 1 / (1 + np.exp(-logits)))
    assert average_precision_score(y, logits) > 0.5
    again = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(again.decision_function(x), logits)


@pytest.mark.processes
def test_import_slate_leaves_the_estimator_unloaded() -> None:
    code = (
        "import sys, slate; assert 'slate.estimator' not in sys.modules; "
        "assert 'sklearn.base' not in sys.modules; "
        "assert slate.SlateClassifier.__module__ == 'slate.estimator'; "
        "assert 'SlateClassifier' in slate.__all__"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pos_label_ranks_the_named_class_first(imbalanced) -> None:
    """``pos_label`` names the positive class: with labels cancer/normal the default,
    classes_[1] = 'normal' (the majority), is the positive class and fit warns that it is the
    majority; pos_label='cancer' ranks cancer first. The reference: the same rows with cancer
    as 1."""
    X, y = imbalanced  # class 1 is the 10% minority
    names = np.where(y == 1, "cancer", "normal")
    small = dict(n_parties=4, iterations=200, threads=1)
    with pytest.warns(UserWarning, match="majority class"):
        default = SlateClassifier(**small).fit(X, names)
    assert default.pos_label_ == "normal"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        named = SlateClassifier(pos_label="cancer", **small).fit(X, names)
        reference = SlateClassifier(**small).fit(X, (y == 1).astype(int))
    assert named.pos_label_ == "cancer" and list(named.classes_) == ["cancer", "normal"]
    # The same model: its logit ranks cancer first; scikit-learn's sign points to 'normal'.
    np.testing.assert_array_equal(named.decision_function(X), -reference.decision_function(X))
    np.testing.assert_array_equal(named.predict(X) == "cancer", reference.predict(X) == 1)
    minority_ap = average_precision_score(names == "cancer", -named.decision_function(X))
    assert minority_ap > average_precision_score(names == "cancer", -default.decision_function(X))
    with pytest.raises(ValueError, match="pos_label='benign' is not a class of y"):
        SlateClassifier(pos_label="benign", **small).fit(X, names)


def test_n_parties_is_chosen_from_the_positives_as_slate_train_chooses_it() -> None:
    """Without n_parties, N is picked from the positives as slate train picks it, so
    cross_val_score runs on small tables (a fixed 20 parties failed there with "Use 'n_parties'
    11 or fewer")."""
    from sklearn.model_selection import cross_val_score

    rng = np.random.default_rng(5)
    x = rng.normal(size=(400, 3))
    y = (x[:, 0] + rng.normal(0, 0.5, 400) > 1.6).astype(int)
    scores = cross_val_score(SlateClassifier(iterations=20), x, y, cv=3,
                             scoring="average_precision")  # fmt: skip
    assert np.all(np.isfinite(scores))
    clf = SlateClassifier(iterations=50).fit(x, y)
    b = resolve_config(TrainConfig(dataset="csv")).positives
    assert clf.n_parties_ == max(1, min(20, int(y.sum()) // b)) < 20


def test_threads_default_to_the_cli_rule_for_the_fit_only(imbalanced) -> None:
    """``threads=None`` follows ``slate train``'s default (one thread for a
    small model) during ``fit``, then gives the process its own count back; an explicit count
    is set for the process, as ``--threads`` is. The model is the same either way, to a bound:
    a kernel may split one sum among threads, which changes its float32 rounding (the logits
    were equal bit for bit on the machines tried; docs/testing.md)."""
    import torch

    X, y = imbalanced
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        default = SlateClassifier(n_parties=4, iterations=100).fit(X, y)
        assert default.threads_ == 1 and torch.get_num_threads() == 2
        two = SlateClassifier(n_parties=4, iterations=100, threads=2).fit(X, y)
        assert two.threads_ == 2 and torch.get_num_threads() == 2
        np.testing.assert_allclose(
            default.decision_function(X), two.decision_function(X), rtol=0, atol=1e-5
        )
    finally:
        torch.set_num_threads(before)
