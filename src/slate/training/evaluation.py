"""How a run scores its test rows: as one pool, or federated through summed histograms; and the
run's evaluations that use them (:class:`Evaluator`).

The choice of scoring follows the data source (:mod:`slate.data.sources`) and is made once, in
:func:`evaluation_for`:

* :class:`PooledEvaluation`: every process holds the whole test set (the paper's experiments).
  The main process computes AP and AUROC exactly (:mod:`slate.metrics`, equal to scikit-learn).
* :class:`FederatedEvaluation`: each party holds only its own test rows. It counts them per
  bin of a fixed public grid of scores and per class, the counts are summed over all parties
  (one all-reduce, masked under a roster: the only exchange), and every party computes the AP
  and AUROC of the union of all test sets, with error bounds (:mod:`slate.metrics.histograms`).
  No score leaves a party. Each party also scores its own test rows exactly (``party_test_ap``,
  kept in its own folder).

  Logits beyond about :data:`~slate.metrics.histograms.LOGIT_RANGE` share the two end bins,
  where their order is lost; when more than :data:`END_BIN_SHARE` of the test scores lie there,
  the scores carry a warning (:func:`end_bin_warning`), printed by the run and kept in
  ``summary.json``.

:class:`Evaluator` holds a run's test rows and scoring, and makes its evaluations: the averaged
model's AP, AUROC and consensus distance (``history.csv``), each party's own AP, the final scores;
it stops a run whose test scores overflow, notes one that stopped learning, and times itself.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from slate import metrics
from slate.data.declared import DeclarationBroken, evaluation_count_problem
from slate.errors import TrainingDiverged
from slate.faults.lies import Lies
from slate.metrics.histograms import (
    DEFAULT_BINS,
    LOGIT_RANGE,
    BinnedMetrics,
    binned_counts,
    lower_edges,
    metrics_from_counts,
)
from slate.training.sum_checks import distance_problem, flag_problem, refusal

if TYPE_CHECKING:
    from slate.algorithms.compute import PartyCompute
    from slate.engines.base import Engine
    from slate.faults.kills import Kills

__all__ = [
    "END_BIN_SHARE",
    "SATURATED_LOGIT",
    "Evaluation",
    "Evaluator",
    "FederatedEvaluation",
    "PooledEvaluation",
    "Scored",
    "TestScores",
    "end_bin_warning",
    "evaluation_for",
    "mean_buffers",
]

END_BIN_SHARE = 0.01  # warn when more of the test scores than this fall in an end bin
SATURATED_LOGIT = 15.0  # float32 sigmoid(15) = 1 - 3e-7: its gradient is about zero
REFUSED_VALUES = ("test_ap", "test_auroc")  # NaN in an evaluation whose counts were refused


@dataclass
class TestScores:
    r"""The test metrics of one model, and how to draw its precision-recall curve.

    ``thresholds`` are the logit thresholds of the curve's points: point ``k`` is the precision
    and recall of the decision "positive when logit >= thresholds[k]". The last point,
    :math:`(P, R) = (1, 0)`, flags nothing: its threshold is :math:`+\infty`.
    """

    values: dict[str, float]
    curve: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    thresholds: np.ndarray | None = field(default=None, repr=False)
    warning: str | None = None  # a line for the user: the metrics may mislead (end bins)

    def pr_curve(self) -> tuple[np.ndarray, np.ndarray]:
        if self.curve is None:
            raise RuntimeError("this process holds no precision-recall curve")
        return self.curve


@dataclass
class Scored:
    """One scored averaged model: the iteration, the parameters and buffers (what a run saves
    is exactly this), its logits on this process's test rows, and its metrics."""

    iteration: int
    parameters: Tensor = field(repr=False)
    buffers: dict[str, Tensor] = field(repr=False)
    logits: Tensor = field(repr=False)
    scores: TestScores
    refused: bool = False  # its counts broke the declarations (its metrics are NaN)


class Evaluation(ABC):
    """Scores the logits of this process's test rows (a collective: every process calls it).

    In two steps: :meth:`exchange` gathers what the metrics need from every process (and sums
    the caller's ``riders``, other numbers of the evaluation, in the same exchange), then
    :meth:`metrics` computes them locally.
    """

    name: str

    def score(self, logits: Tensor, labels: Tensor, total, is_main: bool) -> TestScores:
        """Metrics of the whole test set; ``total`` sums a tensor over all processes."""
        state, _ = self.exchange(logits, labels, total, None)
        return self.metrics(state, is_main)

    @abstractmethod
    def exchange(
        self, logits: Tensor, labels: Tensor, totals, riders: Tensor | None, tamper=None
    ) -> tuple[Any, Tensor | None]:
        """``(state, summed riders)``: what :meth:`metrics` needs, and ``riders`` (``float64``)
        summed over all processes, in one exchange (``totals``:
        :meth:`slate.engines.base.Engine.totals`); ``tamper`` changes this process's counts
        before they are sent (a lying party's, :mod:`slate.faults.lies`)."""

    @abstractmethod
    def metrics(self, state: Any, is_main: bool) -> TestScores:
        """The metrics from :meth:`exchange`'s state (no communication)."""

    def party_test_aps(self, logits: Tensor, labels: Tensor) -> list[float | None]:
        """Each local party's AP on its own test rows; empty when the test set is one pool."""
        del logits, labels
        return []

    def describe(self) -> dict[str, object]:
        return {"evaluation": self.name}


class PooledEvaluation(Evaluation):
    """Exact metrics of the whole test set, on the main process (NaN elsewhere)."""

    name = "pooled"

    def exchange(
        self, logits: Tensor, labels: Tensor, totals, riders: Tensor | None, tamper=None
    ) -> tuple[Any, Tensor | None]:
        del tamper  # (every process holds every row: there are no counts to send)
        return (logits, labels), (None if riders is None else totals([riders], "evaluation")[0])

    def metrics(self, state: Any, is_main: bool) -> TestScores:
        logits, labels = state
        if not is_main:
            return TestScores({"test_ap": math.nan, "test_auroc": math.nan})
        precision, recall, thresholds = metrics.precision_recall_curve(logits, labels)
        values = {
            "test_ap": metrics.average_precision(logits, labels),
            "test_auroc": metrics.auroc(logits, labels),
        }
        edges = np.append(thresholds.astype(np.float64), np.inf)
        return TestScores(values, (precision, recall), edges)


class FederatedEvaluation(Evaluation):
    """Metrics of the union of the parties' test sets from summed per-bin class counts.

    One exchange: this process's ``(2, bins)`` counts on the public grid
    (:func:`slate.metrics.histograms.grid_edges`, fixed before the run and the same at every
    site), with the riders, summed over all processes (masked under a roster). The metrics are
    exactly those of the summed table; nothing else about a site's scores is sent.
    """

    name = "federated"

    def __init__(self, test_parts: list[np.ndarray], bins: int = DEFAULT_BINS) -> None:
        self.test_parts = test_parts
        self.bins = bins

    def exchange(
        self, logits: Tensor, labels: Tensor, totals, riders: Tensor | None, tamper=None
    ) -> tuple[Any, Tensor | None]:
        local = binned_counts(logits, labels, self.bins)  # float64: exact below 2^53 rows
        if tamper is not None:  # (a lying party's counts, slate.faults.lies)
            local = tamper(local)
        extra = riders.to(torch.float64).cpu() if riders is not None else local.new_zeros(0)
        # The counts as integers: under a roster one masked word each, where a float takes two.
        counts, summed = totals([local.round().to(torch.int64), extra], "evaluation")
        return counts.to(torch.float64), (summed if riders is not None else None)

    def metrics(self, state: Any, is_main: bool) -> TestScores:
        del is_main
        counts = state
        precision, recall, bins = BinnedMetrics(counts).precision_recall_curve()
        edges = np.append(lower_edges(bins, self.bins), np.inf)
        values = metrics_from_counts(counts)
        warning = end_bin_warning(counts, values["test_ap"], values["test_ap_error_bound"])
        return TestScores(values, (precision, recall), edges, warning)

    def party_test_aps(self, logits: Tensor, labels: Tensor) -> list[float | None]:
        aps: list[float | None] = []
        for rows in self.test_parts:
            own = labels[rows]
            aps.append(metrics.average_precision(logits[rows], own) if bool(own.any()) else None)
        return aps

    def describe(self) -> dict[str, object]:
        return {"evaluation": self.name, "evaluation_bins": self.bins}


def end_bin_warning(
    counts: Tensor, ap: float, bound: float, limit: float = LOGIT_RANGE
) -> str | None:
    """A one-line warning when more than :data:`END_BIN_SHARE` of the rows counted in the
    summed ``(2, bins)`` table lie in its end bins (logits beyond about ``-limit`` or ``limit``,
    :func:`slate.metrics.histograms.grid_edges`).

    Scores there are ties to the histogram: with every logit beyond the range, all rows share
    one bin and the binned AP is the positive rate, whatever the model's ranking. The exact AP
    needs the scores in one place: the pooled evaluation of a run with one ``--test`` file, or
    ``slate evaluate`` on a test file.
    """
    table = counts.detach().to(torch.float64).cpu()
    rows = float(table.sum())
    if rows == 0:
        return None
    low, high = float(table[:, 0].sum()), float(table[:, -1].sum())
    share = (low + high) / rows
    if share <= END_BIN_SHARE:
        return None
    return (
        f"warning: {share:.1%} of the test scores lie beyond the federated histogram's logit "
        f"range of about +-{limit:g} ({low:.0f} below, {high:.0f} above), in its end bins, "
        f"where their order is lost: the test AP {ap:.4f} (+-{bound:.1e}) may be far from the AP "
        "of the raw scores. Lower --lr or standardise the features (--standardize) to keep the "
        "logits in range, or get the exact AP from pooled scores: one --test file instead of "
        "per-party test files, or slate evaluate --run RUN --data TEST_FILE."
    )


def evaluation_for(test_parts: list[np.ndarray] | None) -> Evaluation:
    """Federated when each party holds its own test rows, pooled otherwise."""
    return PooledEvaluation() if test_parts is None else FederatedEvaluation(test_parts)


def mean_buffers(engine: Engine, buffers: dict[str, Tensor]) -> dict[str, Tensor]:
    """BatchNorm statistics of the averaged model: the mean over all parties of the float
    buffers, party 0's counters (collective)."""
    return {
        name: engine.mean(buf) if buf.is_floating_point() else buf[0]
        for name, buf in buffers.items()
    }


class Evaluator:
    """A run's evaluations on this process's test rows (each one a collective).

    It scores the averaged model :math:`\\bar x` (Alg. 1's output) for ``history.csv`` and at
    the end, and each party's own model (``party_aps``); it stops a run whose test scores
    overflow, notes once a run that stopped learning (``learning_warning``), and adds the wall
    time of every evaluation to ``seconds``. The parameters ``x`` (``(P, d)``, this process's
    parties) and the iteration are the caller's; the model's buffers are ``compute``'s.
    """

    def __init__(
        self,
        engine: Engine,
        compute: PartyCompute,
        device: torch.device,
        rows: tuple[np.ndarray, np.ndarray, list[np.ndarray] | None],
        faults: Kills,
        lies: Lies | None = None,
        *,
        lr: float,
        standardize: bool,
        stop_on_refusal: bool,
    ) -> None:
        """``lr`` and ``standardize`` (the run's step size and ``--standardize``) go into the
        advice of its divergence and not-learning messages; ``stop_on_refusal``: an evaluation
        whose counts break the declarations stops every site (else it is dropped: ``--on-party-loss
        continue``)."""
        self.engine, self.compute, self.device = engine, compute, device
        self.lr, self.standardize, self.stop_on_refusal = lr, standardize, stop_on_refusal
        self.faults = faults  # SLATE_KILL_AT's "evaluation" moment (tests of a lost party)
        self.lies = lies if lies is not None else Lies([])  # a lying party's (tests only)
        span = compute.layout.last_linear(compute.module)
        self.output = slice(*span) if span is not None else None  # final-poison's output layer
        # () -> (negatives, positives) that the summed counts must hold: the declared test
        # rows of the sites in the run (per-party files; None: nothing to check against)
        self.expected_counts: Callable[[], tuple[int, int]] | None = None
        self.refused: list[dict[str, Any]] = []  # evaluations dropped under continue
        self.use_rows(*rows)
        self.learning_warning: str | None = None  # set once, when the run stops learning
        self.seconds = 0.0  # wall time spent in evaluate() and party_aps()
        self.sent_bytes = 0.0  # what this process sent in them (Engine.collective_bytes)
        # The iteration and averaged model of the last evaluation.
        self._previous_average: tuple[int, Tensor] | None = None

    def use_rows(
        self, features: np.ndarray, labels: np.ndarray, parts: list[np.ndarray] | None
    ) -> None:
        """Score these test rows from now on: pooled, or federated when ``parts`` gives each
        local party's positions in them (:func:`evaluation_for`)."""
        self.evaluation = evaluation_for(parts)
        self.test_features = torch.from_numpy(features).to(self.device)
        self.test_labels = torch.from_numpy(labels).to(self.device)
        self.forget_scores()

    @property
    def federated(self) -> bool:
        """Whether each party holds only its own test rows (per-party files)."""
        return isinstance(self.evaluation, FederatedEvaluation)

    def keep_parties(self, rows: list[int]) -> None:
        """Keep only these local parties' test rows (federated; a pooled test set stays whole)."""
        if not isinstance(self.evaluation, FederatedEvaluation):
            return
        parts = [self.evaluation.test_parts[k] for k in rows]
        kept = torch.from_numpy(np.concatenate(parts)).to(self.device)
        self.test_features = self.test_features.index_select(0, kept)
        self.test_labels = self.test_labels.index_select(0, kept)
        starts = np.cumsum([0, *(len(p) for p in parts)])
        self.evaluation = evaluation_for([np.arange(a, b) for a, b in itertools.pairwise(starts)])

    def forget_scores(self) -> None:
        """Drop the scores kept from the last evaluation (the model or the rows changed)."""
        self._last: Scored | None = None

    def test_scores(self, x: Tensor, iteration: int) -> Scored:
        """The averaged model, its logits on this process's test rows and its metrics
        (collective unless just evaluated): the model a run saves is the model it scored.

        Those of the evaluation at this iteration are reused: every process evaluated at the
        same iterations, so all take the same branch.
        """
        if self._last is not None and self._last.iteration == iteration:
            return self._last
        xbar, buffers = self._mean(x, iteration)
        logits = self.compute.logits(xbar, self.test_features, buffers)
        state, _ = self._exchange(logits, iteration, None)
        scored = Scored(iteration, xbar, buffers, logits, self._metrics(state), state is None)
        self._last = scored
        return scored

    def _mean(self, x: Tensor, iteration: int) -> tuple[Tensor, dict[str, Tensor]]:
        """The averaged model and its buffers (collective)."""
        engine = self.engine
        sent = self.lies.mean_input(x, iteration, engine.n_parties, self.output)
        return engine.mean_parameters(sent), mean_buffers(engine, self.compute.buffers)

    def _exchange(
        self, logits: Tensor, iteration: int, riders: Tensor | None
    ) -> tuple[Any, Tensor | None]:
        """The evaluation's exchange, and its counts checked against the declared test rows
        (:func:`slate.data.declared.evaluation_count_problem`)."""
        engine = self.engine
        state, summed = self.evaluation.exchange(
            logits, self.test_labels, engine.totals, riders,
            lambda counts: self.lies.evaluation_counts(counts, iteration),
        )  # fmt: skip
        if self.expected_counts is not None and self.federated:
            problem = evaluation_count_problem(state, *self.expected_counts())
            if problem is not None:
                state = self._refuse_counts(problem, iteration)
        return state, summed

    def _refuse_counts(self, problem: str, iteration: int) -> None:
        """A sum of evaluation counts that breaks the declarations: every site stops, or with
        ``--on-party-loss continue`` the evaluation is dropped (its metrics NaN)."""
        text = (
            f"The evaluation at iteration {iteration} was refused: {problem}. A participant "
            "lied in its evaluation counts (or runs modified code); a sum does not show who."
        )
        if self.stop_on_refusal:
            raise DeclarationBroken(
                f"{text} Every site stops here, and no AP built on these counts is reported. "
                "Remove a site you do not trust from the roster."
            )
        self.refused.append({"iteration": iteration, "problem": problem})
        return None

    def _metrics(self, state: Any) -> TestScores:
        """The metrics of an exchange's state (NaN for a refused one)."""
        if state is None:
            return TestScores({name: math.nan for name in REFUSED_VALUES})
        return self.evaluation.metrics(state, self.engine.is_main)

    def evaluate(self, x: Tensor, iteration: int, riders: Tensor | None = None) -> dict[str, float]:
        """AP and AUROC of the averaged model on the whole test set, and the consensus distance.

        Every process must call it (it averages over all parties); the numbers are meaningful on
        the main process (the distance, on every process that writes a run folder). AP is
        computed on the logits: the sigmoid is monotone, so the ranking (and AP) is that of the
        sigmoid scores, without the ties that float32 saturation of the sigmoid would add.
        ``riders`` (``float64``, local) are summed over all processes in the evaluation's own
        exchange; the sums are left in :attr:`summed_riders`.

        Exchanges: the mean model (an all-reduce), then the evaluation's one sum (federated: the
        counts on the public grid; pooled: the riders alone), which also carries the consensus
        distance, the non-finite flag and the riders.
        """
        with self._timing():
            return self._evaluate(x, iteration, riders)

    def _evaluate(self, x: Tensor, iteration: int, riders: Tensor | None) -> dict[str, float]:
        self.faults.check("evaluation", iteration)
        engine, size = self.engine, self.compute.layout.size
        xbar, buffers = self._mean(x, iteration)  # one reduction: scores, distance, saving
        logits = self.compute.logits(xbar, self.test_features, buffers)
        spread = ((x[:, :size] - xbar[:size]) ** 2).sum()
        overflow = not bool(torch.isfinite(logits).all())
        local = torch.tensor([float(spread), float(overflow)], dtype=torch.float64)
        if riders is not None:
            local = torch.cat([local, riders.to(torch.float64).cpu()])
        state, summed = self._exchange(logits, iteration, local)
        assert summed is not None
        self._check_sum(x, float(summed[0]), float(spread), float(summed[1]), iteration)
        self.summed_riders = summed[2:]
        self._watch_learning(xbar, logits, iteration)
        scores = self._metrics(state)
        self._last = Scored(iteration, xbar, buffers, logits, scores, state is None)
        writes_outputs = engine.is_main or self.federated  # as Run.writes_outputs
        distance = float(summed[0]) / engine.n_parties if writes_outputs else math.nan
        return {
            "test_ap": scores.values["test_ap"],
            "test_auroc": scores.values["test_auroc"],
            "consensus_distance": distance,
        }

    def _check_sum(
        self, x: Tensor, distance: float, own: float, flags: float, iteration: int
    ) -> None:
        """Refuse a summed consensus distance or non-finite flag that cannot be true
        (:mod:`slate.training.sum_checks`), and stop a run whose own training diverged. Every
        process sees the same sum, so all stop together."""
        processes = self.engine.n_parties // max(len(self.engine.local_parties), 1)
        problem = distance_problem(distance, own, processes)
        if problem is None and flags != 0:
            own_logits = self.compute.party_logits(x, self.test_features)
            finite = bool(torch.isfinite(x).all()) and bool(torch.isfinite(own_logits).all())
            largest = float(x.abs().max()) if finite and x.numel() else math.nan
            problem = flag_problem(flags, processes, finite, largest)
            if problem is None:
                self._diverged(x, iteration)
        if problem is not None:
            raise refusal(problem, iteration, self.engine.own_party)

    def _diverged(self, x: Tensor, iteration: int) -> None:
        """Stop when the averaged model's test scores overflow (collective: all stop together).

        A saturated sigmoid keeps the losses finite while the parameters grow without bound, so
        the step-wise check of losses and parameters cannot see this divergence.
        """
        sizes = x.abs().amax(dim=1)
        row = int(sizes.argmax())
        lr = self.lr
        raise TrainingDiverged(
            f"Training diverged: the parameters of party {self.engine.local_parties[row]} at "
            f"iteration {iteration} reach {float(sizes[row]):.1e}, and the averaged model's "
            f"test scores are non-finite (NaN or inf) with --lr {lr}. Try a lower "
            f"learning rate, e.g. --lr {lr / 10:g}."
        )

    def _watch_learning(self, xbar: Tensor, logits: Tensor, iteration: int) -> None:
        """Note, once, a run that has stopped learning: every test score saturated, or the
        averaged model unchanged over a whole evaluation interval (a zero gradient)."""
        previous, self._previous_average = self._previous_average, (iteration, xbar.clone())
        if self.learning_warning is not None or iteration == 0:
            return
        if len(logits) and bool((logits.abs() > SATURATED_LOGIT).all()):
            self.learning_warning = (
                f"warning: the model is not learning: every test score is saturated (|logit| > "
                f"{SATURATED_LOGIT:g}, a sigmoid of exactly 0 or 1), so its gradients vanish. "
                + (
                    f"The features are standardised, so the likely cause is a learning rate "
                    f"too large: try a lower --lr than {self.lr:g}."
                    if self.standardize
                    else "Likely cause: features on raw scales; try --standardize, or a lower --lr."
                )
            )
        elif previous is not None and previous[0] < iteration and torch.equal(previous[1], xbar):
            # (an evaluation made again after a rollback compares with an earlier one only)
            self.learning_warning = (
                f"warning: the model is not learning: the averaged model did not change between "
                f"iterations {previous[0]} and {iteration} (a "
                "zero gradient). "
                + (
                    "The features are standardised, so the likely cause is a learning rate too "
                    "small for float32 (try a larger --lr) or too large (saturated scores)."
                    if self.standardize
                    else "Likely cause: saturated scores from features on raw scales (try "
                    "--standardize) or a learning rate too small for float32."
                )
            )

    def own_model(self, x: Tensor) -> Scored:
        """This process's own model (one party's, ``x (1, d)``) scored exactly on its own test
        rows, with no exchange: what a site keeps when it refuses the average
        (:mod:`slate.training.final_check`)."""
        buffers = {name: value[0] for name, value in self.compute.buffers.items()}
        logits = self.compute.logits(x[0], self.test_features, buffers)
        labels = self.test_labels
        if len(labels) and bool(labels.any()) and not bool(labels.all()):
            scores = PooledEvaluation().metrics((logits, labels), True)
        else:  # (no AP without both classes: such a site never refuses, final_check)
            scores = TestScores({name: math.nan for name in REFUSED_VALUES})
        return Scored(-1, x[0], buffers, logits, scores)

    def party_aps(self, x: Tensor) -> list[float]:
        """AP of every party's own model on the test set (collective; empty off the main)."""
        with self._timing():
            return self._party_aps(x)

    def _party_aps(self, x: Tensor) -> list[float]:
        everyone = self.engine.gather(x)
        buffers = {k: self.engine.gather(v) for k, v in self.compute.buffers.items()}
        if everyone is None:
            return []
        logits = self.compute.party_logits(everyone, self.test_features, buffers)
        return [metrics.average_precision(row, self.test_labels) for row in logits]

    @contextlib.contextmanager
    def _timing(self) -> Iterator[None]:
        """Add the wall time of the enclosed evaluation to ``seconds``, and the bytes this
        process sent in it to ``sent_bytes``.

        On CUDA, queued training kernels are waited for first, so that they are not counted.
        """
        _synchronize(self.device)
        started, sent = time.perf_counter(), self.engine.collective_bytes
        try:
            yield
        finally:
            _synchronize(self.device)
            self.seconds += time.perf_counter() - started
            self.sent_bytes += float(self.engine.collective_bytes - sent)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
