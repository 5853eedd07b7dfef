"""After a party is lost, ``summary.json`` counts only the test rows the final AP covers, and
the closing ``test AP`` line and the summary name the sites whose rows those are."""

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


def _own_files(tmp_path, sizes: dict[int, int]) -> None:
    """Each party's own train and test CSV (two features and a label)."""
    rng = np.random.default_rng(1)
    for rank, rows in sizes.items():
        for part, n in (("train", 3 * rows), ("test", rows)):
            y = (rng.random(n) < 0.2).astype(int)
            lines = ["a,b,y"] + [f"{rng.normal() + t:.4f},{rng.normal():.4f},{t}" for t in y]
            (tmp_path / f"{part}{rank}.csv").write_text("\n".join(lines) + "\n")


def _run(tmp_path, *drops: str) -> tuple[dict, str]:
    """A simulator run of four parties on their own files: its summary and its closing line."""
    config = TrainConfig(
        dataset="csv", train=str(tmp_path / "train{rank}.csv"),
        test=str(tmp_path / "test{rank}.csv"), label_column="y", positive_label="1", nodes=4,
        iterations=100, eval_every=50, drop_party=drops, threads=1, party_ap=False,
    )  # fmt: skip
    said: list[str] = []
    summary = train(config, write=False, progress=False, log=said.append).summary
    return summary, next(line for line in said if line.startswith("test AP "))


def test_the_closing_line_names_the_sites_whose_test_rows_the_ap_covers(tmp_path):
    _own_files(tmp_path, {0: 100, 1: 120, 2: 140, 3: 110})
    summary, line = _run(tmp_path, "2@40")
    covers = "over the test rows of sites 0, 1, 3 (site 2 lost at iteration 40)"
    assert summary["test_ap_sites"] == [0, 1, 3]
    assert summary["test_ap_coverage"] == covers
    bound = f" (+-{summary['test_ap_error_bound']:.1e}, federated)"
    assert line.startswith(f"test AP {summary['test_ap']:.4f}{bound} {covers}  AUROC "), line
    summary, line = _run(tmp_path, "2@40", "1@60")
    assert summary["test_ap_coverage"] == (
        "over the test rows of sites 0, 3 (site 1 lost at iteration 60; site 2 lost at "
        "iteration 40)"
    )
    assert summary["test_ap_coverage"] in line


def test_without_a_loss_the_closing_line_is_unchanged(tmp_path):
    _own_files(tmp_path, {0: 100, 1: 120, 2: 140, 3: 110})
    summary, line = _run(tmp_path)
    assert summary["test_ap_sites"] == [0, 1, 2, 3] and summary["test_ap_coverage"] is None
    bound = f" (+-{summary['test_ap_error_bound']:.1e}, federated)"
    assert line.startswith(f"test AP {summary['test_ap']:.4f}{bound}  AUROC "), line
