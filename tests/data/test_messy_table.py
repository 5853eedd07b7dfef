"""A user's table as it comes, on real data: a messy copy of w7a (an ID, an ISO date, a percent and
a thousands-separated column, a 400-value text column, missing cells) trains with the default flags
to the AP of the same table cleaned by hand, and each reduced or parsed column is named."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

from slate.config import TrainConfig
from slate.data.readers.libsvm import read_libsvm
from slate.training.loop import train

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(
    not (SHARED / "w7a" / "w7a.gz").is_file(), reason="w7a not in ../shared/data"
)
COLUMNS = 30


def _write(source: Path, messy: Path, clean: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = read_libsvm(source, n_features=300)
    x = x[:, :COLUMNS].astype(int)
    n = len(y)
    days = rng.integers(0, 900, size=n)
    share = 100 * x.sum(1) / COLUMNS + 2 * y * rng.random(n)
    amount = (rng.lognormal(8, 1, size=n) * (1 + y)).round(2)
    site = rng.integers(0, 400, size=n)
    blank = rng.random(n) < 0.03
    features = [f"f{j}" for j in range(COLUMNS)]
    messy_lines = [",".join(["specimen_id", "taken", "share", "amount", "site", *features, "y"])]
    clean_lines = [",".join(["taken_days", "share", "amount", "site", *features, "y"])]
    for i in range(n):
        day = dt.date(2021, 1, 1) + dt.timedelta(days=int(days[i]))
        cells = ",".join(map(str, x[i]))
        pct = "" if blank[i] else f"{share[i]:.1f}"
        messy_lines.append(
            f"S{rng.integers(0, 10**9)}-{i},{day.isoformat()},{pct}{'%' if pct else ''},"
            f'"{amount[i]:,.2f}",site{site[i]},{cells},{int(y[i])}'
        )
        clean_lines.append(
            f"{(day - dt.date(1970, 1, 1)).days},{pct},{amount[i]:.2f},site{site[i]},{cells},"
            f"{int(y[i])}"
        )
    messy.write_text("\n".join(messy_lines) + "\n")
    clean.write_text("\n".join(clean_lines) + "\n")


def _run(tmp_path: Path, kind: str, notes: list[str]):
    config = TrainConfig(
        dataset="csv", train=str(tmp_path / f"{kind}_train.csv"),
        test=str(tmp_path / f"{kind}_test.csv"), label_column="y", positive_label="1",
        iterations=300, lr=0.01, threads=1, party_ap=False,  # a fixed step: no --lr auto
    )  # fmt: skip
    # 300 iterations: the two tables' test APs are equal to the last digit for seeds 0, 1 and 2
    # (0.0790, 0.0778, 0.0795), measured here, as at 600 (0.0827 for seed 0).
    return train(config, write=False, progress=False, log=notes.append).summary


@pytest.mark.slow
def test_a_messy_table_trains_like_the_table_cleaned_by_hand(tmp_path):
    for part, seed in (("", 0), (".t", 1)):
        name = "train" if part == "" else "test"
        _write(SHARED / "w7a" / f"w7a{part}.gz", tmp_path / f"messy_{name}.csv",
               tmp_path / f"clean_{name}.csv", seed)  # fmt: skip
    clean_notes: list[str] = []
    messy_notes: list[str] = []
    clean = _run(tmp_path, "clean", clean_notes)
    messy = _run(tmp_path, "messy", messy_notes)
    assert clean["test_positives"] >= 300
    assert abs(messy["test_ap"] - clean["test_ap"]) <= 0.02
    for column, what in (
        ("taken", "ISO dates"),
        ("share", "'%'"),
        ("amount", "thousands"),
        ("specimen_id", "ID or free text"),
        ("site", "--max-categories"),
    ):
        assert any(f"column {column!r}" in n and what in n for n in messy_notes), column
