"""Tests of slate.metrics.plots: files written as PNG, one line per method, legend texts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from slate.metrics import average_precision, precision_recall_curve
from slate.metrics.plots import (
    ap_curves_figure,
    heatmap_figure,
    plot_ap_curves,
    plot_heatmap,
    plot_pr_curves,
    plot_scaling,
    pr_curves_figure,
    scaling_figure,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path: Path) -> None:
    assert path.is_file()
    with path.open("rb") as fh:
        assert fh.read(8) == PNG_MAGIC
    assert path.stat().st_size > 1000


def _pr_curves() -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
    rng = np.random.default_rng(0)
    y = torch.tensor(rng.integers(0, 2, 200))
    y[0] = 1
    curves = {}
    for name, noise in (("SLATE", 0.5), ("SLATE-M", 1.0), ("CE", 2.0)):
        s = y.double() + noise * torch.tensor(rng.normal(size=200))
        p, r, _ = precision_recall_curve(s, y)
        curves[name] = (p, r, average_precision(s, y))
    return curves


def _legend_texts(fig) -> list[str]:
    ax = fig.axes[0]
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_pr_curves_figure_lines_and_legend() -> None:
    curves = _pr_curves()
    fig = pr_curves_figure(curves, "PR")
    ax = fig.axes[0]
    assert len(ax.get_lines()) == len(curves)
    assert _legend_texts(fig) == [f"{k} (AP={v[2]:.4f})" for k, v in curves.items()]
    assert ax.get_xlabel() == "recall" and ax.get_ylabel() == "precision"
    assert ax.get_xlim() == (0.0, 1.0) and ax.get_ylim() == (0.0, 1.02)
    assert ax.get_title() == "PR"


def test_plot_pr_curves_writes_png(tmp_path: Path) -> None:
    out = plot_pr_curves(_pr_curves(), tmp_path / "a" / "b" / "pr.png", "PR curves")
    assert out == tmp_path / "a" / "b" / "pr.png"
    _assert_png(out)


def test_ap_curves_figure_and_png(tmp_path: Path) -> None:
    histories = {
        "SLATE": ([0, 10, 20, 30], [0.2, 0.4, 0.5, 0.55]),
        "SLATE-M": ([0, 10, 20, 30], [0.2, 0.45, 0.6, 0.62]),
    }
    fig = ap_curves_figure(histories, "AP", ylabel="train AP")
    ax = fig.axes[0]
    assert len(ax.get_lines()) == len(histories)
    assert _legend_texts(fig) == list(histories)
    assert ax.get_xlabel() == "iteration" and ax.get_ylabel() == "train AP"
    assert ap_curves_figure(histories, "AP").axes[0].get_ylabel() == "test AP"
    _assert_png(plot_ap_curves(histories, str(tmp_path / "sub" / "ap.png"), "AP"))


def test_heatmap_figure_and_png(tmp_path: Path) -> None:
    values = np.array([[0.12345, 0.5], [0.75, 0.99999], [0.0, 1.0]])
    rows, cols = ["a", "b", "c"], [1, 2]
    fig = heatmap_figure(values, rows, cols, "H", "cols", "rows")
    ax = fig.axes[0]
    assert len(fig.axes) == 2  # heat map + colour bar
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == sorted(f"{v:.4f}" for v in values.ravel())
    assert [t.get_text() for t in ax.get_yticklabels()] == rows
    assert ax.get_xlabel() == "cols" and ax.get_ylabel() == "rows"
    _assert_png(plot_heatmap(values, rows, cols, tmp_path / "h" / "heat.png", "H", "x", "y"))


def test_ap_curves_log_axes_drop_nonpositive_points() -> None:
    histories = {"SLATE": ([0, 10, 100], [0.0, 1e-3, 1e-5])}
    fig = ap_curves_figure(histories, "C", "distance", xlabel="gradients", logx=True, logy=True)
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale(), ax.get_xlabel()) == ("log", "log", "gradients")
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [10, 100])  # x = 0 left out


def test_scaling_figure_leaves_out_unreached_points(tmp_path: Path) -> None:
    sizes = [1, 2, 4, 8]
    series = {"fixed": ([100.0, 90.0, np.nan, 80.0], [5.0, 4.0, np.nan, 3.0])}
    fig = scaling_figure(sizes, series, "S", "N", "iterations", ("linear", [100, 50, 25, 12.5]))
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [1, 2, 8])  # N = 4 never reached
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["fixed", "linear"]
    _assert_png(plot_scaling(sizes, series, tmp_path / "s.png", "S", "N", "iterations"))
    with pytest.raises(ValueError, match="3 values for 4 sizes"):
        scaling_figure(sizes, {"x": ([1, 2, 3], [0, 0, 0])}, "S", "N", "y")


def test_input_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        pr_curves_figure({}, "t")
    with pytest.raises(ValueError, match="empty"):
        ap_curves_figure({}, "t")
    with pytest.raises(ValueError, match="lengths differ"):
        ap_curves_figure({"m": ([0, 1, 2], [0.1, 0.2])}, "t")
    with pytest.raises(ValueError, match="lengths differ"):
        pr_curves_figure({"m": (np.ones(3), np.ones(2), 0.5)}, "t")
    with pytest.raises(ValueError, match="shape"):
        heatmap_figure(np.zeros((2, 2)), ["a"], ["x", "y"], "t", "x", "y")
    with pytest.raises(ValueError, match="2-D"):
        heatmap_figure(np.zeros(3), ["a"], ["x"], "t", "x", "y")


# --------------------------------------------------------------------------- PR plot marks


def _label_boxes(fig) -> dict[str, object]:
    """The operating-point labels' window extents, after drawing."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return {t.get_text(): t.get_window_extent(renderer) for t in fig.axes[0].texts}


def test_pr_labels_of_coinciding_and_close_points_do_not_overlap() -> None:
    curves = {"m": (np.array([0.2, 0.5, 0.6, 1.0]), np.array([1.0, 0.95, 0.9, 0.0]), 0.5)}
    points = [
        (0.95, 0.5, "R≥0.90"),  # the same threshold chosen for two targets
        (0.95, 0.5, "R≥0.95"),
        (0.90, 0.6, "P≥0.50"),  # three points within 1% of the axes
        (0.905, 0.6, "R≥0.80"),
        (0.90, 0.605, "P≥0.60"),
    ]
    boxes = _label_boxes(pr_curves_figure(curves, "PR", points))
    assert set(boxes) == {"R≥0.90, R≥0.95", "P≥0.50", "R≥0.80", "P≥0.60"}
    listed = list(boxes.values())
    for i, box in enumerate(listed):
        for other in listed[i + 1 :]:
            assert not box.overlaps(other)


def test_pr_labels_stay_inside_the_axes_at_recall_one() -> None:
    curves = {"m": (np.array([0.1, 1.0]), np.array([1.0, 0.0]), 0.1)}
    fig = pr_curves_figure(curves, "PR", [(1.0, 0.1, "R≥0.95"), (1.0, 0.1, "R≥0.90")])
    box = _label_boxes(fig)["R≥0.95, R≥0.90"]
    inside = fig.axes[0].get_window_extent(fig.canvas.get_renderer())
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and box.y1 <= inside.y1


def test_pr_plot_notes_unreached_points_and_draws_the_prevalence() -> None:
    curves = _pr_curves()
    fig = pr_curves_figure(
        curves, "Precision-recall on test.svm", [(0.5, 0.7, "R≥0.50")],
        unreached=["P≥0.80", "P≥0.90"], prevalence=0.0312,
    )  # fmt: skip
    legend = _legend_texts(fig)
    assert "not reached: P≥0.80, P≥0.90" in legend
    assert "random scorer: positive rate 3.12%" in legend
    ax = fig.axes[0]
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == [0.0312, 0.0312]
    assert ax.get_title() == "Precision-recall on test.svm"


def test_long_titles_are_wrapped() -> None:
    title = "Precision-recall on the csv test set: seeded stratified 25% split of data/train.csv"
    fig = pr_curves_figure(_pr_curves(), title)
    shown = fig.axes[0].get_title()
    assert "\n" in shown and shown.replace("\n", " ") == title


def test_reliability_figure_and_png(tmp_path: Path) -> None:
    from slate.metrics.plots import plot_reliability, reliability_figure

    curves = {"score": ([0.7, 0.8, 0.9], [0.05, 0.1, 0.4]), "probability": ([0.1, 0.2], [0.1, 0.2])}
    fig = reliability_figure(
        curves, "Reliability on held.csv", predictions={"score": np.array([0.7, 0.9])},
        positive_rate=0.15,
    )  # fmt: skip
    top, hist = fig.axes
    assert [t.get_text() for t in top.get_legend().get_texts()] == [
        "calibrated: y = x", "score", "probability", "positive rate 15.00%"
    ]  # fmt: skip
    assert hist.get_yscale() == "log"
    _assert_png(plot_reliability(curves, tmp_path / "r.png", "Reliability"))
    with pytest.raises(ValueError, match="curve 'bad'"):
        reliability_figure({"bad": ([0.1, 0.2], [0.1])}, "t")
