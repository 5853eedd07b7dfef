"""``benchmarks/tables.py``: the label, the boosting encoding and the settings' flags."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.tables import encode_for_boosting, read_table, setting_flags


def test_the_rarer_label_is_positive_and_text_becomes_categories(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("age,sex,class\n30,M,neg\n?,F,pos\n41,M,neg\n")
    header, features, y, positive = read_table(path, "class")
    assert header == ["age", "sex"] and positive == "pos" and y.tolist() == [0, 1, 0]
    train, test, categorical = encode_for_boosting(features, [["50", "X"]])
    assert categorical == [False, True]
    assert math.isnan(train[1, 0]) and train[0, 0] == 30  # '?' is missing
    assert train[:, 1].tolist() == [1, 0, 1]  # F < M, codes fitted on the training rows
    assert test[0, 0] == 50 and math.isnan(test[0, 1])  # an unseen category is missing


def test_setting_flags() -> None:
    assert setting_flags("default") == []
    assert setting_flags("lr=0.1 T=5000") == ["--lr", "0.1", "--iterations", "5000"]
    assert setting_flags("lr=auto") == ["--lr", "auto"]
    assert setting_flags("hidden=128") == ["--hidden", "128"]
