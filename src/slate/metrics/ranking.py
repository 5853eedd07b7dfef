"""Ranking metrics on torch tensors: average precision, AUROC, PR curve, consensus distance.

A functional core in the style of torchmetrics' functional API. Each public function validates
its inputs once, at the edge, then runs a vectorised computation in ``float64`` on the device
the tensors already live on (CPU or CUDA). Only the final scalar or curve leaves the device.

The binary metrics reproduce scikit-learn exactly, ties included:

* :func:`average_precision` equals :func:`sklearn.metrics.average_precision_score`,
* :func:`auroc` equals :func:`sklearn.metrics.roc_auc_score`,
* :func:`precision_recall_curve` equals :func:`sklearn.metrics.precision_recall_curve`
  (with its default ``drop_intermediate=False``).

All three are built on the same confusion counts at the distinct score thresholds. Sort the
``n`` scores in decreasing order, :math:`s_{(1)} \\ge \\dots \\ge s_{(n)}`, and let
:math:`i_1 < \\dots < i_K` be the last position of each run of equal scores, so that
:math:`t_k = s_{(i_k)}` are the :math:`K` distinct thresholds in decreasing order. At
threshold :math:`t_k` every sample with score :math:`\\ge t_k` is predicted positive:

.. math::

    \\mathrm{TP}_k = \\sum_{j \\le i_k} y_{(j)}, \\qquad
    \\mathrm{FP}_k = i_k - \\mathrm{TP}_k, \\qquad
    P_k = \\frac{\\mathrm{TP}_k}{i_k}, \\qquad
    R_k = \\frac{\\mathrm{TP}_k}{n_+},

with positions counted from 1 and :math:`n_+` the number of positives. Samples with equal
scores always enter together, which is how ties are handled.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["auroc", "average_precision", "consensus_distance", "precision_recall_curve"]


# --------------------------------------------------------------------------- validation


def _check_binary_inputs(
    scores: Tensor, labels: Tensor, *, need_negative: bool = False
) -> tuple[Tensor, Tensor]:
    """Validate a binary scoring problem and return both tensors as ``float64``.

    Args:
        scores: 1-D tensor of real, finite scores; a higher score means "more positive".
        labels: 1-D tensor of the same length with values in {0, 1} (any real or bool dtype).
        need_negative: also require at least one negative label.

    Returns:
        ``(scores, labels)`` as ``float64`` tensors on the original device.

    Raises:
        TypeError: an input is not a tensor, or is complex.
        ValueError: wrong shape, lengths differ, labels outside {0, 1}, non-finite scores,
            no positive label, or (with ``need_negative``) no negative label.
    """
    for name, t in (("scores", scores), ("labels", labels)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_complex():
            raise TypeError(f"{name} must be real-valued, got dtype {t.dtype}")
        if t.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if scores.shape[0] != labels.shape[0]:
        raise ValueError(
            f"scores and labels must have the same length, got {scores.shape[0]} "
            f"and {labels.shape[0]}"
        )
    if scores.device != labels.device:
        raise ValueError(
            f"scores and labels must be on the same device, got {scores.device} and {labels.device}"
        )

    s = scores.detach().to(torch.float64)
    y = labels.detach().to(torch.float64)
    if not bool(torch.all((y == 0) | (y == 1))):
        raise ValueError("labels must contain only the values 0 and 1")
    if not bool(torch.all(torch.isfinite(s))):
        raise ValueError("scores must be finite (found NaN or infinity)")
    n_pos = int(y.sum().item())
    if n_pos == 0:
        raise ValueError(
            "the metric is undefined without positives: labels contain no 1 "
            "(average precision and recall need at least one positive sample)"
        )
    if need_negative and n_pos == y.shape[0]:
        raise ValueError("AUROC is undefined without negatives: labels contain no 0")
    return s, y


# --------------------------------------------------------------------------- kernel


def _counts_at_thresholds(s: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Confusion counts at every distinct threshold, thresholds in decreasing order.

    Args:
        s: validated ``float64`` scores, shape ``(n,)``.
        y: validated ``float64`` labels in {0, 1}, shape ``(n,)``.

    Returns:
        ``(tps, fps, order, ends)``: ``tps[k]`` and ``fps[k]`` are
        :math:`\\mathrm{TP}_k` and :math:`\\mathrm{FP}_k` (``float64``, exact integers),
        ``order`` is the stable descending sort permutation of ``s`` and ``ends`` holds the
        0-based positions :math:`i_k - 1` in the sorted order where each run of equal scores
        ends.
    """
    s_sorted, order = torch.sort(s, descending=True, stable=True)
    y_sorted = y[order]
    # Last index of each run of equal scores: where the next score differs, plus the end.
    ends = torch.nonzero(torch.diff(s_sorted) != 0).flatten()
    last = torch.tensor([s.shape[0] - 1], dtype=ends.dtype, device=ends.device)
    ends = torch.cat([ends, last])
    tps = torch.cumsum(y_sorted, dim=0)[ends]
    fps = ends.to(torch.float64) + 1.0 - tps
    return tps, fps, order, ends


# --------------------------------------------------------------------------- public API


def average_precision(scores: Tensor, labels: Tensor) -> float:
    """Step-wise average precision, identical to ``sklearn.metrics.average_precision_score``.

    With :math:`P_k` and :math:`R_k` the precision and recall at the :math:`k`-th distinct
    threshold in decreasing order (see the module docstring) and :math:`R_0 = 0`,

    .. math::

        \\mathrm{AP} = \\sum_{k=1}^{K} (R_k - R_{k-1})\\, P_k
                     = \\frac{1}{n_+} \\sum_{k=1}^{K}
                       (\\mathrm{TP}_k - \\mathrm{TP}_{k-1})
                       \\frac{\\mathrm{TP}_k}{\\mathrm{TP}_k + \\mathrm{FP}_k}.

    Tied scores form a single threshold, so all tied samples share one precision. No
    interpolation is done (this is not the trapezoid area under the PR curve).

    Args:
        scores: 1-D tensor of finite scores, any real dtype, CPU or CUDA.
        labels: 1-D tensor of the same length with values in {0, 1}.

    Returns:
        The average precision in [0, 1], computed in ``float64``.

    Raises:
        TypeError: an input is not a real-valued tensor.
        ValueError: invalid shapes or values, or no positive label (AP is undefined then).
    """
    s, y = _check_binary_inputs(scores, labels)
    tps, fps, _, _ = _counts_at_thresholds(s, y)
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    d_recall = torch.diff(recall, prepend=recall.new_zeros(1))
    return float(torch.sum(d_recall * precision).item())


def auroc(scores: Tensor, labels: Tensor) -> float:
    """Area under the ROC curve, identical to ``sklearn.metrics.roc_auc_score``.

    The trapezoid rule over the distinct thresholds, starting from :math:`(0, 0)`:

    .. math::

        \\mathrm{AUROC} = \\frac{1}{n_+ n_-} \\sum_{k=1}^{K}
            (\\mathrm{FP}_k - \\mathrm{FP}_{k-1})
            \\frac{\\mathrm{TP}_k + \\mathrm{TP}_{k-1}}{2},

    which equals the Mann-Whitney statistic with ties counted as one half,
    :math:`\\Pr(s^+ > s^-) + \\tfrac12 \\Pr(s^+ = s^-)`. The sum is carried out on integer
    counts, so it is exact in ``float64`` up to :math:`2^{52}` pairs.

    Args:
        scores: 1-D tensor of finite scores, any real dtype, CPU or CUDA.
        labels: 1-D tensor of the same length with values in {0, 1}.

    Returns:
        The AUROC in [0, 1].

    Raises:
        TypeError: an input is not a real-valued tensor.
        ValueError: invalid shapes or values, or labels without both classes.
    """
    s, y = _check_binary_inputs(scores, labels, need_negative=True)
    tps, fps, _, _ = _counts_at_thresholds(s, y)
    zero = tps.new_zeros(1)
    d_fps = torch.diff(fps, prepend=zero)
    tps_prev = torch.cat([zero, tps[:-1]])
    twice_area = torch.sum(d_fps * (tps + tps_prev))  # exact integer
    return float((twice_area / (2.0 * tps[-1] * fps[-1])).item())


def precision_recall_curve(
    scores: Tensor, labels: Tensor
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision-recall curve, identical to ``sklearn.metrics.precision_recall_curve``.

    Matches scikit-learn's defaults (``drop_intermediate=False``): one point per distinct
    threshold, in increasing threshold order (so recall is non-increasing), followed by the
    extra point :math:`(P, R) = (1, 0)` that has no threshold:

    .. math::

        \\text{precision} = (P_K, \\dots, P_1, 1), \\quad
        \\text{recall} = (R_K, \\dots, R_1, 0), \\quad
        \\text{thresholds} = (t_K, \\dots, t_1).

    Args:
        scores: 1-D tensor of finite scores, any real dtype, CPU or CUDA.
        labels: 1-D tensor of the same length with values in {0, 1}.

    Returns:
        ``(precision, recall, thresholds)`` as NumPy arrays on the CPU. ``precision`` and
        ``recall`` are ``float64`` of length :math:`K + 1`; ``thresholds`` has length
        :math:`K` and keeps the dtype of ``scores`` (``bfloat16`` becomes ``float32``).

    Raises:
        TypeError: an input is not a real-valued tensor.
        ValueError: invalid shapes or values, or no positive label.
    """
    s, y = _check_binary_inputs(scores, labels)
    tps, fps, order, ends = _counts_at_thresholds(s, y)
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    thresholds = scores.detach()[order][ends]
    if thresholds.dtype == torch.bfloat16:
        thresholds = thresholds.to(torch.float32)
    one = precision.new_ones(1)
    precision = torch.cat([torch.flip(precision, (0,)), one])
    recall = torch.cat([torch.flip(recall, (0,)), one.new_zeros(1)])
    return (
        precision.cpu().numpy(),
        recall.cpu().numpy(),
        torch.flip(thresholds, (0,)).cpu().numpy(),
    )


def consensus_distance(X: Tensor) -> float:
    """Mean squared distance of N parameter vectors to their average.

    For stacked parameters :math:`X \\in \\mathbb{R}^{N \\times d}` with rows :math:`x_n`
    and mean :math:`\\bar x = \\frac1N \\sum_n x_n`,

    .. math::

        \\Xi(X) = \\frac{1}{N} \\sum_{n=1}^{N} \\lVert x_n - \\bar x \\rVert_2^2
               = \\frac{1}{N} \\lVert X - \\mathbf{1}\\bar x^\\top \\rVert_F^2.

    It is zero exactly when all parties agree. Computed in ``float64``, without gradients.

    Args:
        X: tensor of shape ``(N, d)`` with ``N >= 1``, real and finite, CPU or CUDA.

    Returns:
        The consensus distance as a Python float.

    Raises:
        TypeError: ``X`` is not a real-valued tensor.
        ValueError: ``X`` is not 2-D, has no rows, or holds non-finite values.
    """
    if not isinstance(X, Tensor):
        raise TypeError(f"X must be a torch.Tensor, got {type(X).__name__}")
    if X.is_complex():
        raise TypeError(f"X must be real-valued, got dtype {X.dtype}")
    if X.ndim != 2:
        raise ValueError(f"X must have shape (N, d), got shape {tuple(X.shape)}")
    if X.shape[0] == 0:
        raise ValueError("X must have at least one row (N >= 1)")
    x = X.detach().to(torch.float64)
    if not bool(torch.all(torch.isfinite(x))):
        raise ValueError("X must be finite (found NaN or infinity)")
    centred = x - x.mean(dim=0, keepdim=True)
    return float((centred.square().sum() / x.shape[0]).item())
