"""How far the federated evaluation's AP on the public grid is from scikit-learn's AP of the raw
scores: trained w7a models' logits on w7a's 25 057 test rows, split over 4 parties, each
party's counts on the grid summed as :class:`slate.training.evaluation.FederatedEvaluation`
sums them, against ``sklearn.metrics.average_precision_score`` on the raw logits.

``python -m benchmarks.histogram_grid [--data-dir DIR]`` prints a markdown table: per model,
the raw AP, the grid's AP, their difference and the bound the counts give.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_svmlight_file
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score

from benchmarks.roster import DEFAULT_DATA_DIR
from slate import SlateClassifier
from slate.training.evaluation import FederatedEvaluation

PARTIES = 4


def grid_ap(logits: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """The federated AP and its bound: each of :data:`PARTIES` parties' own rows counted on
    the grid, the counts summed, the metrics read from the sum."""
    evaluation = FederatedEvaluation([])
    summed: list[torch.Tensor] = []
    for r in range(PARTIES):
        s, y = torch.from_numpy(logits[r::PARTIES]), torch.from_numpy(labels[r::PARTIES])
        evaluation.exchange(s, y, lambda value, what="": summed.append(value) or value, None)
    values = evaluation.metrics(sum(summed).view(2, -1), True).values
    return values["test_ap"], values["test_ap_error_bound"]


def models(data_dir: Path):
    """``(name, logits on w7a.t, labels)`` of SLATE on 8 parties and logistic regressions."""
    train_x, train_y = load_svmlight_file(str(data_dir / "w7a" / "w7a.gz"), n_features=300)
    test_x, test_y = load_svmlight_file(str(data_dir / "w7a" / "w7a.t.gz"), n_features=300)
    labels, positive = (test_y > 0).astype(np.int64), (train_y > 0).astype(np.int64)
    dense_train = train_x.toarray().astype(np.float32)
    dense_test = test_x.toarray().astype(np.float32)
    for iterations, lr in ((2000, 0.01), (10000, 0.01), (10000, 0.1)):
        clf = SlateClassifier(n_parties=8, iterations=iterations, lr=lr, seed=0)
        logits = clf.fit(dense_train, positive).decision_function(dense_test)
        yield f"SLATE, N = 8, {iterations} iterations, lr {lr:g}", logits, labels
    for c in (1.0, 1e4):
        fit = LogisticRegression(C=c, max_iter=3000).fit(train_x, positive)
        yield f"logistic regression, C = {c:g}", fit.decision_function(test_x), labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args()
    print("| model | logits | raw AP (scikit-learn) | grid AP | difference | bound |")
    print("|---|---|---|---|---|---|")
    for name, logits, labels in models(args.data_dir):
        raw = average_precision_score(labels, logits)
        ap, bound = grid_ap(np.asarray(logits, dtype=np.float64), labels)
        span = f"{logits.min():.1f} to {logits.max():.1f}"
        print(f"| {name} | {span} | {raw:.5f} | {ap:.5f} | {ap - raw:+.1e} | {bound:.1e} |")


if __name__ == "__main__":
    main()
