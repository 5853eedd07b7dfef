"""After a party is lost, ``summary.json`` counts only the test rows the final AP covers."""

from __future__ import annotations

import numpy as np

from slate.config import TrainConfig
from slate.training.loop import train


def test_n_test_and_test_positives_cover_the_survivors_only(tmp_path):
    rng = np.random.default_rng(0)
    sizes = {0: 100, 1: 150, 2: 200}
    positives = {}
    for rank, rows in sizes.items():
        for part, n in (("train", 3 * rows), ("test", rows)):
            y = (rng.random(n) < 0.2).astype(int)
            if part == "test":
                positives[rank] = int(y.sum())
            lines = ["a,b,y"] + [f"{rng.normal() + t:.4f},{rng.normal():.4f},{t}" for t in y]
            (tmp_path / f"{part}{rank}.csv").write_text("\n".join(lines) + "\n")
    config = TrainConfig(
        dataset="csv", train=str(tmp_path / "train{rank}.csv"),
        test=str(tmp_path / "test{rank}.csv"), label_column="y", positive_label="1", nodes=3,
        iterations=100, eval_every=50, drop_party=("2@50",), threads=1, party_ap=False,
    )  # fmt: skip
    summary = train(config, write=False, progress=False, log=lambda _: None).summary
    assert summary["members"] == [0, 1]
    assert summary["n_test"] == sizes[0] + sizes[1]
    assert summary["test_positives"] == positives[0] + positives[1]
