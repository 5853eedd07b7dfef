"""Figures for experiment reports: PR curves, AP-versus-iteration curves, heat maps, scaling.

Built on :class:`matplotlib.figure.Figure` directly, never on ``pyplot``: no global figure
registry, no interactive backend, safe to call from several threads. Each ``*_figure``
function builds and returns a figure (handy for tests and notebooks); each ``plot_*``
function builds the same figure, writes it as a PNG at 120 dpi (creating parent folders)
and releases it.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "ap_curves_figure",
    "heatmap_figure",
    "plot_ap_curves",
    "plot_heatmap",
    "plot_pr_curves",
    "plot_reliability",
    "plot_scaling",
    "pr_curves_figure",
    "reliability_figure",
    "scaling_figure",
]

DPI = 120
"""Resolution of every written PNG, in dots per inch."""

PathLike = str | os.PathLike[str]


MANY_LINES = 10  # more lines than the default colour cycle: a 20-colour palette, legend aside


def _new_figure(figsize: tuple[float, float], canvas: bool = False) -> Figure:
    """A figure of ``figsize`` inches, with an Agg canvas when ``canvas`` (to measure text).
    matplotlib is imported here, on the first figure, not with this module."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    if canvas:
        FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: PathLike) -> Path:
    """Write ``fig`` as a PNG at :data:`DPI` to ``path`` (creating parent folders), release it,
    and return the destination as a :class:`~pathlib.Path`."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, format="png", dpi=DPI)
    finally:
        fig.clear()
    return out


def _require_nonempty(mapping: Mapping[str, object], what: str) -> None:
    """Raise ``ValueError`` if there is nothing to draw."""
    if len(mapping) == 0:
        raise ValueError(f"{what} is empty: nothing to plot")


# --------------------------------------------------------------------------- PR curves


def pr_curves_figure(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray, float]],
    title: str,
    points: Sequence[tuple[float, float, str]] = (),
    *,
    unreached: Sequence[str] = (),
    prevalence: float | None = None,
) -> Figure:
    """Build a figure with one precision-recall curve per method.

    Each curve is drawn as a right-continuous step function (``steps-post``), the shape
    whose area is the step-wise average precision
    :math:`\\mathrm{AP} = \\sum_k (R_k - R_{k-1}) P_k`.

    Args:
        curves: maps a method name to ``(precision, recall, ap)``, e.g. the first two
            outputs of :func:`slate.metrics.precision_recall_curve` and the AP.
        title: figure title (wrapped beyond :data:`TITLE_WIDTH` characters); name the scored
            file in it.
        points: operating points to mark, ``(recall, precision, label)`` each (e.g. from
            :func:`slate.metrics.operating_points.marks`): one marker per point and one label per
            distinct point (the labels of coinciding points joined, ``R≥0.90, R≥0.95``),
            placed by :func:`_place_labels` so that no two labels overlap.
        unreached: labels of the operating points no threshold reaches (``P≥0.90``), listed
            in the legend as one entry ``not reached: P≥0.90``.
        prevalence: the scored set's positive rate :math:`\\pi = n_+ / n`, drawn as a dashed
            horizontal line: the precision of flagging rows at random at any recall, so the
            expected AP of a random scorer.

    Returns:
        The figure; its single axes holds one line per method, labelled
        ``"name (AP=0.xxxx)"``, then the prevalence line, one marker line ``"operating
        points"`` when ``points`` is not empty, and the ``not reached`` entry.

    Raises:
        ValueError: ``curves`` is empty, or a precision and recall differ in length.
    """
    _require_nonempty(curves, "curves")
    fig = _new_figure((6.4, 4.8), canvas=True)  # a renderer, to measure the labels
    ax = fig.add_subplot()
    for name, (precision, recall, ap) in curves.items():
        p = np.asarray(precision, dtype=float).ravel()
        r = np.asarray(recall, dtype=float).ravel()
        if p.shape != r.shape:
            raise ValueError(
                f"curve {name!r}: precision and recall lengths differ ({p.size} vs {r.size})"
            )
        ax.plot(r, p, drawstyle="steps-post", label=f"{name} (AP={float(ap):.4f})")
    if prevalence is not None:
        ax.axhline(
            float(prevalence), linestyle="--", linewidth=1, color="grey",
            label=f"random scorer: positive rate {float(prevalence):.2%}",
        )  # fmt: skip
    labels: dict[tuple[float, float], list[str]] = {}
    for r, p, text in points:
        labels.setdefault((float(r), float(p)), []).append(text)
    if labels:
        xs, ys = zip(*labels, strict=True)
        ax.plot(xs, ys, linestyle="none", marker="o", markersize=5, color="black",
                label="operating points")  # fmt: skip
    if unreached:
        ax.plot([], [], linestyle="none", label=f"not reached: {', '.join(unreached)}")
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.02)
    ax.set_title(_wrapped(title))
    ax.grid(True, alpha=0.3)
    fig.tight_layout()  # first: the labels are placed in the final layout
    _place_labels(fig, ax, [(x, y, ", ".join(t)) for (x, y), t in labels.items()])
    ax.legend(loc="best", fontsize="small" if prevalence is not None or unreached else None)
    return fig


TITLE_WIDTH = 70  # characters per title line


def _wrapped(title: str) -> str:
    """``title`` broken into lines of at most :data:`TITLE_WIDTH` characters (at spaces)."""
    return "\n".join(textwrap.wrap(title, TITLE_WIDTH)) if len(title) > TITLE_WIDTH else title


LABEL_GAP = 3.0  # points between a marker and its label
LABEL_STEP = 9.0  # points between stacked labels (7-point text is about 8 points tall)


def _place_labels(fig: Figure, ax, labels: Sequence[tuple[float, float, str]]) -> None:
    """Write each ``(x, y, text)`` beside its point where it overlaps no label placed before.

    The candidates, in order: above right, below right, above left, below left of the point,
    then further up or down by :data:`LABEL_STEP` points at a time; the first whose bounding
    box (measured with the Agg renderer, after the layout is final) lies inside the axes and
    clear of the labels already placed is kept (else the last one tried). Labels are placed in
    the order given.
    """
    if not labels:
        return
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    placed: list = []
    g = LABEL_GAP
    offsets = [(g, g), (g, -g), (-g, g), (-g, -g)]
    for k in range(1, 13):
        offsets += [(g, g + k * LABEL_STEP), (g, -g - k * LABEL_STEP)]
        offsets += [(-g, g + k * LABEL_STEP), (-g, -g - k * LABEL_STEP)]
    for x, y, text in labels:
        for dx, dy in offsets:
            note = ax.annotate(
                text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=7,
                ha="left" if dx > 0 else "right", va="bottom" if dy > 0 else "top",
                annotation_clip=False,
            )  # fmt: skip
            box = note.get_window_extent(renderer)
            fits = (
                box.x0 >= inside.x0 and box.x1 <= inside.x1
                and box.y0 >= inside.y0 and box.y1 <= inside.y1
            )  # fmt: skip
            if fits and not any(box.overlaps(other) for other in placed):
                break
            if (dx, dy) != offsets[-1]:
                note.remove()
        placed.append(box.expanded(1.0, 1.0).padded(1.0))


def plot_pr_curves(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray, float]],
    path: PathLike,
    title: str,
    points: Sequence[tuple[float, float, str]] = (),
    *,
    unreached: Sequence[str] = (),
    prevalence: float | None = None,
) -> Path:
    """Write precision-recall curves, one per method, as a PNG.

    Args:
        curves: maps a method name to ``(precision, recall, ap)``.
        path: destination PNG file; parent folders are created.
        title: figure title, naming the scored file.
        points: operating points to mark, ``(recall, precision, label)`` each.
        unreached: labels of the operating points no threshold reaches.
        prevalence: the positive rate, drawn as the random scorer's dashed line.

    Returns:
        The path written.

    Raises:
        ValueError: see :func:`pr_curves_figure`.
    """
    figure = pr_curves_figure(curves, title, points, unreached=unreached, prevalence=prevalence)
    return _save(figure, path)


# --------------------------------------------------------------------------- reliability


def reliability_figure(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
    *,
    predictions: Mapping[str, np.ndarray] | None = None,
    positive_rate: float | None = None,
) -> Figure:
    """Build a reliability diagram: observed positive fraction against mean predicted
    probability per bin, one line per predictor, and the diagonal :math:`y = x` of a
    calibrated one.

    Args:
        curves: maps a predictor's name to ``(mean_predicted, observed)`` per bin, e.g. from
            :func:`sklearn.calibration.calibration_curve` (which returns them the other way
            round).
        title: figure title (name the file).
        predictions: optional, maps a name to its predicted probabilities: their histograms
            (log counts) are drawn in a second axes below.
        positive_rate: optional, drawn as a dotted horizontal line (the constant predictor's
            observed fraction).

    Returns:
        The figure: the diagram's axes first (the diagonal, then one line per curve, then the
        positive-rate line), the histogram's second when ``predictions`` is given.

    Raises:
        ValueError: ``curves`` is empty, or a curve's two sequences differ in length.
    """
    _require_nonempty(curves, "curves")
    fig = _new_figure((6.4, 6.4 if predictions else 4.8))
    if predictions:
        ax, hist = fig.subplots(2, 1, height_ratios=(3, 1), sharex=True)
    else:
        ax, hist = fig.add_subplot(), None
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="calibrated: y = x")
    for name, (predicted, observed) in curves.items():
        x = np.asarray(predicted, dtype=float).ravel()
        y = np.asarray(observed, dtype=float).ravel()
        if x.shape != y.shape:
            raise ValueError(f"curve {name!r}: {x.size} predicted values for {y.size} observed")
        ax.plot(x, y, marker="o", markersize=4, label=name)
    if positive_rate is not None:
        ax.axhline(
            float(positive_rate), linestyle=":", color="black", linewidth=1,
            label=f"positive rate {float(positive_rate):.2%}",
        )  # fmt: skip
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel("observed positive fraction")
    ax.set_title(_wrapped(title))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    if hist is not None:
        for name, values in predictions.items():
            hist.hist(np.asarray(values, dtype=float).ravel(), bins=50, range=(0.0, 1.0),
                      histtype="step", label=name)  # fmt: skip
        hist.set_yscale("log")
        hist.set_ylabel("rows")
        hist.legend(loc="upper right", fontsize="small")
        hist.grid(True, alpha=0.3)
    if hist is not None:
        hist.set_xlabel("predicted probability (above: the bin's mean; below: each row's)")
    else:
        ax.set_xlabel("mean predicted probability in the bin")
    fig.tight_layout()
    return fig


def plot_reliability(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: PathLike,
    title: str,
    *,
    predictions: Mapping[str, np.ndarray] | None = None,
    positive_rate: float | None = None,
) -> Path:
    """Write a reliability diagram as a PNG (see :func:`reliability_figure`).

    Returns:
        The path written.
    """
    figure = reliability_figure(curves, title, predictions=predictions, positive_rate=positive_rate)
    return _save(figure, path)


# --------------------------------------------------------------------------- AP curves


def ap_curves_figure(
    histories: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    title: str,
    ylabel: str = "test AP",
    *,
    xlabel: str = "iteration",
    logx: bool = False,
    logy: bool = False,
    bands: Mapping[str, Sequence[float]] | None = None,
) -> Figure:
    """Build a figure of a metric against the iteration, one line per method.

    Args:
        histories: maps a method name to ``(iterations, values)`` of equal length.
        title: figure title.
        ylabel: label of the y axis.
        xlabel: label of the x axis (e.g. gradient evaluations instead of iterations).
        logx: logarithmic x axis; points at ``x <= 0`` are left out.
        logy: logarithmic y axis; points at ``y <= 0`` are left out.
        bands: optional half-widths (e.g. standard deviations over seeds) per method, drawn as
            a shaded band around its line.

    Returns:
        The figure; its single axes holds one line per method, labelled by its name.

    Raises:
        ValueError: ``histories`` is empty, or iterations and values differ in length.
    """
    _require_nonempty(histories, "histories")
    fig = _new_figure((6.4, 4.8) if len(histories) <= MANY_LINES else (9.6, 5.4))
    ax = fig.add_subplot()
    if len(histories) > MANY_LINES:  # the default cycle repeats its 10 colours
        from matplotlib import colormaps

        palette = colormaps["tab20"]
        ax.set_prop_cycle(color=[palette(i) for i in range(20)])
    for name, (iterations, values) in histories.items():
        it = np.asarray(iterations, dtype=float).ravel()
        v = np.asarray(values, dtype=float).ravel()
        if it.shape != v.shape:
            raise ValueError(
                f"history {name!r}: iterations and values lengths differ ({it.size} vs {v.size})"
            )
        keep = np.ones(it.shape, dtype=bool)
        if logx:
            keep &= it > 0
        if logy:
            keep &= v > 0
        it, v = it[keep], v[keep]
        (line,) = ax.plot(it, v, marker="o" if it.size <= 30 else None, markersize=3, label=name)
        if bands is not None and name in bands:
            half = np.asarray(bands[name], dtype=float).ravel()[keep]
            ax.fill_between(it, v - half, v + half, color=line.get_color(), alpha=0.15)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if len(histories) > MANY_LINES:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    else:
        ax.legend(loc="best")
    fig.tight_layout()
    return fig


def plot_ap_curves(
    histories: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    path: PathLike,
    title: str,
    ylabel: str = "test AP",
    *,
    xlabel: str = "iteration",
    logx: bool = False,
    logy: bool = False,
    bands: Mapping[str, Sequence[float]] | None = None,
) -> Path:
    """Write a metric-versus-iteration plot, one line per method, as a PNG.

    Args:
        histories: maps a method name to ``(iterations, values)``.
        path: destination PNG file; parent folders are created.
        title: figure title.
        ylabel: label of the y axis.
        xlabel: label of the x axis.
        logx: logarithmic x axis (points at ``x <= 0`` left out).
        logy: logarithmic y axis (points at ``y <= 0`` left out).

    Returns:
        The path written.

    Raises:
        ValueError: see :func:`ap_curves_figure`.
    """
    figure = ap_curves_figure(
        histories, title, ylabel, xlabel=xlabel, logx=logx, logy=logy, bands=bands
    )
    return _save(figure, path)


# --------------------------------------------------------------------------- scaling


def scaling_figure(
    x: Sequence[float],
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    reference: tuple[str, Sequence[float]] | None = None,
) -> Figure:
    """Build a log-log plot of a cost against a size, one line with error bars per series.

    Args:
        x: the sizes (e.g. numbers of parties), shared by every series; all > 0.
        series: maps a name to ``(means, stds)``, one entry per size; a NaN mean (the cost
            was never reached) leaves that point out.
        title: figure title.
        xlabel: label of the x axis.
        ylabel: label of the y axis.
        reference: an optional ``(name, values)`` drawn dashed, e.g. ideal linear scaling.

    Returns:
        The figure; its single axes holds one line per series, then the reference.

    Raises:
        ValueError: ``series`` is empty, or a series' length differs from ``x``.
    """
    _require_nonempty(series, "series")
    sizes = np.asarray(x, dtype=float).ravel()
    fig = _new_figure((6.4, 4.8))
    ax = fig.add_subplot()
    for name, (means, stds) in series.items():
        m = np.asarray(means, dtype=float).ravel()
        s = np.asarray(stds, dtype=float).ravel()
        if m.shape != sizes.shape or s.shape != sizes.shape:
            raise ValueError(f"series {name!r}: {m.size} values for {sizes.size} sizes")
        keep = np.isfinite(m) & (m > 0)
        ax.errorbar(
            sizes[keep], m[keep], yerr=np.nan_to_num(s[keep]), marker="o", markersize=4,
            capsize=3, label=name,
        )  # fmt: skip
    if reference is not None:
        name, values = reference
        r = np.asarray(values, dtype=float).ravel()
        keep = np.isfinite(r) & (r > 0)
        ax.plot(sizes[keep], r[keep], linestyle="--", color="grey", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, labels=[f"{v:g}" for v in sizes])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    return fig


def plot_scaling(
    x: Sequence[float],
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: PathLike,
    title: str,
    xlabel: str,
    ylabel: str,
    reference: tuple[str, Sequence[float]] | None = None,
) -> Path:
    """Write a log-log cost-versus-size plot as a PNG (see :func:`scaling_figure`).

    Args:
        x: the sizes, all > 0.
        series: maps a name to ``(means, stds)`` per size.
        path: destination PNG file; parent folders are created.
        title: figure title.
        xlabel: label of the x axis.
        ylabel: label of the y axis.
        reference: an optional dashed ``(name, values)`` line.

    Returns:
        The path written.

    Raises:
        ValueError: see :func:`scaling_figure`.
    """
    return _save(scaling_figure(x, series, title, xlabel, ylabel, reference), path)


# --------------------------------------------------------------------------- heat map


def heatmap_figure(
    values: np.ndarray,
    row_labels: Sequence[object],
    col_labels: Sequence[object],
    title: str,
    xlabel: str,
    ylabel: str,
) -> Figure:
    """Build an annotated heat map with a colour bar.

    Cell :math:`(i, j)` shows ``values[i, j]`` as colour and as text with 4 decimals; the
    text is white on the dark half of the colour map and black on the light half.

    Args:
        values: 2-D array of shape ``(len(row_labels), len(col_labels))``.
        row_labels: tick labels of the rows (y axis, top to bottom).
        col_labels: tick labels of the columns (x axis, left to right).
        title: figure title.
        xlabel: label of the x axis (columns).
        ylabel: label of the y axis (rows).

    Returns:
        The figure: the heat map axes first, the colour bar axes second.

    Raises:
        ValueError: ``values`` is not 2-D or its shape disagrees with the labels.
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 2:
        raise ValueError(f"values must be 2-D, got shape {v.shape}")
    if v.shape != (len(row_labels), len(col_labels)):
        raise ValueError(
            f"values has shape {v.shape} but there are {len(row_labels)} row labels "
            f"and {len(col_labels)} column labels"
        )
    n_rows, n_cols = v.shape
    fig = _new_figure((max(4.8, 1.1 * n_cols + 2.5), max(3.6, 0.6 * n_rows + 1.8)))
    ax = fig.add_subplot()
    im = ax.imshow(v, cmap="viridis", aspect="auto")
    fig.colorbar(im, ax=ax)

    ax.set_xticks(np.arange(n_cols), labels=[str(c) for c in col_labels])
    ax.set_yticks(np.arange(n_rows), labels=[str(r) for r in row_labels])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)

    finite = v[np.isfinite(v)]
    mid = 0.5 * (finite.min() + finite.max()) if finite.size else 0.0
    for i in range(n_rows):
        for j in range(n_cols):
            colour = "white" if np.isfinite(v[i, j]) and v[i, j] < mid else "black"
            ax.text(j, i, f"{v[i, j]:.4f}", ha="center", va="center", color=colour, fontsize=8)
    fig.tight_layout()
    return fig


def plot_heatmap(
    values: np.ndarray,
    row_labels: Sequence[object],
    col_labels: Sequence[object],
    path: PathLike,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path:
    """Write an annotated heat map with a colour bar as a PNG.

    Args:
        values: 2-D array of shape ``(len(row_labels), len(col_labels))``.
        row_labels: tick labels of the rows.
        col_labels: tick labels of the columns.
        path: destination PNG file; parent folders are created.
        title: figure title.
        xlabel: label of the x axis (columns).
        ylabel: label of the y axis (rows).

    Returns:
        The path written.

    Raises:
        ValueError: see :func:`heatmap_figure`.
    """
    return _save(heatmap_figure(values, row_labels, col_labels, title, xlabel, ylabel), path)
