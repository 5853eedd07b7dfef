"""``SlateClassifier``: a scikit-learn estimator that trains with slate on simulated parties.

``fit(X, y)`` cuts the training rows into ``n_parties`` parties (or takes the caller's
assignment, ``parties=``) and runs :func:`slate.training.loop.train` on the simulator, as ``slate
train`` does, without writing a run folder. The result is the averaged model of Alg. 1, kept as
a torch module that maps a feature row to one logit: :meth:`SlateClassifier.decision_function`.
On the same rows, partition and settings it computes the logits of ``slate train``'s
``model.pt``, so both have the same AP.

The estimator follows scikit-learn's conventions (parameters stored unchanged in ``__init__``,
fitted attributes ending in ``_``, ``validate_data``), so it works in a ``Pipeline``, with
``clone``, ``GridSearchCV``, ``cross_val_score(..., scoring="average_precision")`` and
``permutation_importance``.

Checks of ``sklearn.utils.estimator_checks.check_estimator`` that cannot pass are listed in
:data:`EXPECTED_FAILED_CHECKS`, each with its reason.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted
from torch import nn

from slate.config import TrainConfig
from slate.data.datasets import Dataset
from slate.data.partition import make_partition, parties_for_positives
from slate.data.preprocess import Standardizer
from slate.errors import ConfigError, DataError, TopologyError, TrainingDiverged
from slate.inference.scoring import logits_of
from slate.models import build_model
from slate.training.configuration import resolve_and_check
from slate.training.loop import train

try:
    from sklearn.utils.validation import validate_data
except ImportError as err:  # scikit-learn < 1.6
    import sklearn

    raise ImportError(
        f"slate.SlateClassifier needs scikit-learn >= 1.6 (validate_data, estimator tags); "
        f"this is scikit-learn {sklearn.__version__}. Upgrade it: pip install -U scikit-learn"
    ) from err

__all__ = ["EXPECTED_FAILED_CHECKS", "PARAMETER_FIELDS", "SlateClassifier"]

#: Each estimator parameter and the :class:`slate.config.TrainConfig` field (the ``slate
#: train`` flag) it sets; the others are the same name in both.
PARAMETER_FIELDS: dict[str, str] = {"n_parties": "nodes"}

#: The checks of ``check_estimator(SlateClassifier(n_parties=2, iterations=20))`` that fail,
#: and why; every other check passes (``tests/test_estimator.py`` runs them all). Pass it as
#: ``check_estimator(..., expected_failed_checks=EXPECTED_FAILED_CHECKS)``.
EXPECTED_FAILED_CHECKS: dict[str, str] = {
    "check_methods_subset_invariance": (
        "the model computes in float32, as slate train does, and a matrix product's rounding "
        "depends on how many rows it holds: a row's logit can move by 1 ulp (about 2e-7) "
        "between a batch and a subset of it, beyond the check's 1e-7 tolerance (on CPU "
        "kernels that block by shape, such as AVX2 and AVX-512 ones; elsewhere it passes)"
    ),
    "check_fit2d_1feature": (
        "10 rows with 3 positives cannot give each of 2 parties b = 2 positives, so fit raises "
        "a ValueError about positives, not about the single feature (it passes with positives=1)"
    ),
}

_SLATE_INPUT_ERRORS = (ConfigError, DataError, TopologyError, TrainingDiverged)


class SlateClassifier(ClassifierMixin, BaseEstimator):
    """A binary classifier trained by SLATE (or SLATE-M, D-PSGD, CODA) across simulated parties.

    The training rows are split across ``n_parties`` parties that never pool them: each party
    steps on mini-batches of its own rows (``positives`` of them positive among
    ``batch_size``), then averages its model with its neighbours on ``topology``; after
    ``iterations`` such rounds the parties' models are averaged into the one this estimator
    keeps (Alg. 1 of the KDD '23 paper). The objective is the paper's surrogate of average
    precision, so score with ``scoring="average_precision"``; :meth:`score` is scikit-learn's
    accuracy at the threshold 0 of the logit.

    Parameters mirror ``slate train``'s flags (``docs/outputs.md``, "scikit-learn estimator"),
    with its defaults for a user's table; ``n_parties`` is ``--nodes``. Three things differ from
    ``slate train --dataset csv``. ``lr`` is 0.01 and ``iterations`` 2000 by default, not
    ``"auto"`` and 5000 (see ``lr``). ``standardize`` is off, as scikit-learn's convention is to
    scale in a ``Pipeline`` (e.g. with ``StandardScaler``); ``standardize=True`` z-scores with
    the training rows' mean and standard deviation, and again in prediction. And the run's
    evaluations score the training rows, only at iteration 0 and at the end; they do not
    change the model.

    Parameters:
        n_parties: the number of parties N (``--nodes``); ignored when ``fit`` gets ``parties``.
            ``None`` (the default) chooses it as ``slate train`` does for a table: the largest
            N <= 20 whose parties each hold ``positives`` training positives.
        algorithm: ``slate``, ``slate-m``, ``dpsgd`` or ``coda``.
        iterations: local steps of every party, each followed by a gossip exchange.
        lr: the step size eta, or ``"auto"``: chosen by short runs scored on a seeded
            stratified 20% of the training rows (``slate train --lr auto``,
            :mod:`slate.training.lr_choice`); ``lr_`` holds the step size used. The default
            stays the paper's 0.01 (and ``iterations`` 2000), unlike ``slate train`` on a
            table (``auto`` and 5000): a fit inside a cross-validation or a grid search would
            otherwise train five short runs more each time.
        topology: the communication graph (``ring``, ``full``, ``torus``, ``base-2``, ...).
        batch_size: samples per party per step (m).
        positives: positives among them (b); every party needs at least this many positives.
        margin: the squared-hinge margin s of the AP surrogate.
        partition: ``stratified`` (every party the same class mix) or ``dirichlet``.
        dirichlet_alpha: the concentration of ``partition="dirichlet"`` (smaller: more skewed).
        model: the model's name; ``mlp`` is the one that takes rows of features.
        hidden: the hidden width of the MLP.
        standardize: z-score the features with the training rows' statistics.
        alpha: SLATE-M's momentum coefficient.
        momentum: SLATE-M's estimator, ``storm`` or ``ema``.
        initial_batch: SLATE-M's initial batch of positives (``None``: 5 b).
        lr_dual: CODA's dual step size.
        coda_objective: CODA's loss, ``square`` or ``margin``.
        gradient_tracking: run Alg. 1 line 8 (off in the paper's experiments).
        fed_period: ``topology="federated"``: average every this many iterations.
        gossip_every: local steps per gossip round.
        compress: CHOCO compressed gossip: ``none``, ``int8``, ``topk:F`` or ``sign``.
        consensus_step: CHOCO's consensus step gamma, ``"auto"``, or ``None`` (per compressor).
        seed: the seed of the partition, the model's initial weights and the sampling.
        device: ``cpu`` or ``cuda``.
        threads: torch CPU threads, set for the whole process as ``slate train --threads``
            does. ``None``: ``slate train``'s default, for this fit only: one thread when the
            model is small (parameters x parties x ``batch_size`` below
            :data:`slate.training.checks.SMALL_STEP_WORK`), else torch's setting; the
            process's own count is restored after ``fit``. ``threads_`` is the count used.
        compile: ``torch.compile`` the parties' steps: ``auto``, ``on`` or ``off``.
        dp_epsilon: train with record-level (epsilon, ``dp_delta``) differential privacy per
            party against the other parties (``slate train --dp-epsilon``, docs/privacy.md);
            ``None``: off. It refuses ``lr="auto"``, ``standardize=True`` and SLATE-M's
            ``momentum="storm"``. The guarantee covers the model (``model_``); ``history_``
            scores the training rows and is not private.
        dp_delta, dp_clip, dp_groups: its delta, clip C and groups G.
        verbose: show the progress bar and ``slate train``'s console lines (their "test" rows
            are the training rows).
        pos_label: the class whose AP is maximised, as ``slate train --positive-label``
            (``None``: ``classes_[1]``, scikit-learn's positive class; a warning says when that
            is the majority class, whose AP is rarely what an imbalanced task wants).

    Attributes:
        classes_: the two labels, sorted; :meth:`decision_function` is positive towards
            ``classes_[1]``, as scikit-learn expects of a binary classifier.
        pos_label_: the class the model was trained to rank first (``pos_label``, or
            ``classes_[1]``); when it is ``classes_[0]``, :meth:`decision_function` is minus
            the model's logit.
        n_features_in_: the number of features seen in ``fit``.
        feature_names_in_: the column names, when ``X`` had string column names.
        n_parties_: the number of parties that trained.
        party_sizes_: the training rows of each party.
        model_: the averaged model, a torch module in eval mode that maps features to a logit.
        history_: the run's evaluations (iteration 0 and the last): ``test_ap`` and
            ``test_auroc`` there score the training rows.
        privacy_: with ``dp_epsilon``, the guarantee reached (``summary.json``'s ``privacy``:
            epsilon for positives and negatives, delta, z, C, G, the releases, the rates);
            else ``None``.
    """

    def __init__(
        self,
        n_parties: int | None = None,
        algorithm: str = "slate",
        iterations: int = 2000,
        lr: float | str = 0.01,
        topology: str = "ring",
        batch_size: int = 20,
        positives: int = 2,
        margin: float = 0.1,
        partition: str = "stratified",
        dirichlet_alpha: float = 0.5,
        model: str = "mlp",
        hidden: int = 28,
        standardize: bool = False,
        alpha: float = 0.1,
        momentum: str = "storm",
        initial_batch: int | None = None,
        lr_dual: float = 0.0001,
        coda_objective: str = "square",
        gradient_tracking: bool = False,
        fed_period: int = 10,
        gossip_every: int = 1,
        compress: str = "none",
        consensus_step: str | float | None = None,
        seed: int = 0,
        device: str = "cpu",
        threads: int | None = None,
        compile: str = "auto",
        dp_epsilon: float | None = None,
        dp_delta: float = 1e-5,
        dp_clip: float = 1.0,
        dp_groups: int = 8,
        verbose: bool = False,
        pos_label: Any = None,
    ) -> None:
        self.n_parties = n_parties
        self.algorithm = algorithm
        self.iterations = iterations
        self.lr = lr
        self.topology = topology
        self.batch_size = batch_size
        self.positives = positives
        self.margin = margin
        self.partition = partition
        self.dirichlet_alpha = dirichlet_alpha
        self.model = model
        self.hidden = hidden
        self.standardize = standardize
        self.alpha = alpha
        self.momentum = momentum
        self.initial_batch = initial_batch
        self.lr_dual = lr_dual
        self.coda_objective = coda_objective
        self.gradient_tracking = gradient_tracking
        self.fed_period = fed_period
        self.gossip_every = gossip_every
        self.compress = compress
        self.consensus_step = consensus_step
        self.seed = seed
        self.device = device
        self.threads = threads
        self.compile = compile
        self.dp_epsilon = dp_epsilon
        self.dp_delta = dp_delta
        self.dp_clip = dp_clip
        self.dp_groups = dp_groups
        self.verbose = verbose
        self.pos_label = pos_label

    def __sklearn_tags__(self):
        """Binary only; no missing values, sparse input or sample weights. ``poor_score``: the
        logit is trained to rank (AP), and nothing fits its threshold 0 that :meth:`predict`
        and :meth:`score` use (on scikit-learn's two-blob check, 50 iterations give AP 0.997
        and accuracy 0.5)."""
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        tags.classifier_tags.poor_score = True
        return tags

    # ------------------------------------------------------------------------------ fitting

    def train_config(self, n_parties: int | None = None) -> TrainConfig:
        """The ``slate train`` configuration these parameters describe (``--dataset csv``'s
        defaults for the flags they leave open). ``n_parties`` replaces ``self.n_parties``.

        Two settings are the estimator's own: no ``--standardize`` (``fit`` z-scores the rows
        itself when ``standardize`` is on, so that prediction can do the same), and evaluations
        only at iteration 0 and at the end (``--eval-every`` = ``iterations``, no party APs).
        """
        fields = {
            PARAMETER_FIELDS.get(name, name): value
            for name, value in self.get_params(deep=False).items()
            if name not in _ESTIMATOR_ONLY
        }
        if n_parties is not None:
            fields["nodes"] = n_parties
        return TrainConfig(
            dataset="csv", standardize=False, eval_every=self.iterations, party_ap=False, **fields
        )

    def fit(self, X: Any, y: Any, parties: Any = None) -> SlateClassifier:
        """Train on the rows of ``X`` (features) and ``y`` (two classes), split across parties.

        Args:
            X: ``(n_samples, n_features)`` numbers, finite.
            y: ``(n_samples,)`` labels of exactly two classes; ``pos_label`` (by default
                ``classes_[1]``, the larger in sorted order) is the positive class.
            parties: which party holds each row. ``None``: ``n_parties`` parties cut by
                ``partition`` with ``seed``, as ``slate train`` cuts them. Or one party id per
                row (any sortable values; party ``k`` holds the rows of the ``k``-th id in
                sorted order), or a list of index arrays, one per party, that together hold
                every row exactly once. Either sets the number of parties: ``n_parties`` and
                ``partition`` are then not used.

        Raises:
            ValueError: bad input: ``X`` or ``y`` malformed, ``y`` not two classes, ``parties``
                malformed, a party short of positives (each needs ``positives``), a parameter
                out of range, or training that diverged (the message names the parameter).
        """
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32])
        check_classification_targets(y)
        kind = type_of_target(y, input_name="y", raise_unknown=True)
        if kind != "binary":
            raise ValueError(
                f"Only binary classification is supported. The type of the target is {kind}."
            )
        classes = np.unique(y)
        if len(classes) < 2:
            raise ValueError(
                f"SlateClassifier needs both classes in y, but y holds one class only "
                f"({classes[0]!r}); average precision needs positives and negatives."
            )
        positive = self._positive_class(classes, y)
        labels = (y == positive).astype(np.int64)
        parts, ids = party_rows(parties, len(labels))
        features = _float32(X)
        if self.standardize and self.dp_epsilon is not None:
            raise ValueError(
                f"Refused under dp_epsilon={self.dp_epsilon:g}: standardize=True computes means "
                "and standard deviations from the private rows, which the privacy accounting "
                "does not count. Scale X with public statistics and pass standardize=False."
            )
        standardizer = Standardizer.fit([features]) if self.standardize else None
        if standardizer is not None:
            features = standardizer.apply(features)
        config = self.train_config(None if parts is None else len(parts))
        dataset = Dataset(
            name="array", x_train=features, y_train=labels, x_test=features, y_test=labels,
            test_split="the training rows (SlateClassifier: scored at the start and the end)",
            parts=parts,
        )  # fmt: skip
        log = _RunLog(self.verbose)
        try:
            settings = resolve_and_check(config)
            if config.nodes is None:  # as slate train chooses N for a table
                b = settings.algorithm.positives
                config = dataclasses.replace(
                    config, nodes=parties_for_positives(int(labels.sum()), b)
                )
            threads = torch.get_num_threads()
            try:
                result = train(settings, data=dataset, nodes=config.nodes, write=False,
                               progress=self.verbose, log=log)  # fmt: skip
            finally:
                if self.threads is None:  # the default's count is this fit's, not the process's
                    torch.set_num_threads(threads)
        except _SLATE_INPUT_ERRORS as err:
            raise ValueError(_with_parameter_names(str(err)) + _party_note(err, ids)) from err
        log.warn_if_not_learning()

        parameters = result.parameters.detach().to("cpu")
        self.model_ = averaged_model(config, features.shape[1:], parameters)
        self.classes_ = classes
        self.pos_label_ = positive
        self.standardizer_ = standardizer
        self.n_parties_ = config.nodes
        self.party_sizes_ = _party_sizes(parts, labels, config)
        self.history_ = result.history
        self.threads_ = result.summary["config"]["threads"]
        self.lr_ = result.summary["config"]["lr"]
        self.lr_choice_ = result.summary.get("lr_choice")
        self.privacy_ = result.summary.get("privacy")
        return self

    def _positive_class(self, classes: np.ndarray, y: np.ndarray) -> Any:
        """``pos_label``, checked to be a class of ``y``; by default ``classes_[1]``, with one
        warning line when it is the majority class."""
        if self.pos_label is not None:
            matches = [c for c in classes if c == self.pos_label]
            if not matches:
                raise ValueError(
                    f"pos_label={self.pos_label!r} is not a class of y; y holds "
                    f"{classes.tolist()!r}."
                )
            return matches[0]
        share = float(np.mean(y == classes[1]))
        if share > 0.5:
            warnings.warn(
                f"SlateClassifier maximises the AP of classes_[1] = {classes[1].item()!r}, the "
                f"majority class ({share:.0%} of the rows); pass "
                f"pos_label={classes[0].item()!r} to rank the minority class first.",
                UserWarning,
                stacklevel=3,
            )
        return classes[1]

    # ------------------------------------------------------------------------------ predicting

    def decision_function(self, X: Any) -> np.ndarray:
        """The averaged model's logit of every row of ``X``: float64 ``(n_samples,)``.

        Positive means ``classes_[1]`` at the threshold 0. These are the logits that ``slate
        predict`` computes from ``slate train``'s ``model.pt`` (the same float32 forward pass,
        in chunks of 256 rows), negated when ``pos_label_`` is ``classes_[0]`` (the model then
        ranks ``classes_[0]`` first, and scikit-learn reads the sign towards ``classes_[1]``).
        """
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        features = _float32(X)
        if self.standardizer_ is not None:
            features = self.standardizer_.apply(features)
        logits = logits_of(self.model_, features).numpy().astype(np.float64)
        return logits if self.pos_label_ == self.classes_[1] else -logits

    def predict_proba(self, X: Any) -> np.ndarray:
        """``(n_samples, 2)``: column 1 is the sigmoid of the logit, column 0 one minus it.

        This is the model's score, trained to rank the rows (AP), not a calibrated probability:
        wrap the estimator in ``sklearn.calibration.CalibratedClassifierCV`` for one.
        """
        score = expit(self.decision_function(X))
        return np.column_stack([1.0 - score, score])

    def predict(self, X: Any) -> np.ndarray:
        """The class of every row: ``classes_[1]`` where the logit is above 0."""
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(np.intp)]


_ESTIMATOR_ONLY = ("standardize", "verbose", "pos_label")


def party_rows(parties: Any, n_rows: int) -> tuple[list[np.ndarray] | None, np.ndarray | None]:
    """``fit``'s ``parties`` as one index array per party (sorted), and the party ids when
    ``parties`` gave one id per row (else ``None``).

    Raises:
        ValueError: not one id per row, nor index arrays that hold every row exactly once.
    """
    if parties is None:
        return None, None
    if _is_index_lists(parties):
        parts = [_index_array(rows, k, n_rows) for k, rows in enumerate(parties)]
        counts = np.bincount(np.concatenate(parts), minlength=n_rows)
        missing, repeated = np.flatnonzero(counts == 0), np.flatnonzero(counts > 1)
        if len(missing) or len(repeated):
            raise ValueError(
                "parties, as index arrays, must hold every row of X exactly once: "
                + "; ".join(
                    f"{len(rows)} rows are in {what} (e.g. {rows[:5].tolist()})"
                    for rows, what in ((missing, "no party"), (repeated, "several parties"))
                    if len(rows)
                )
                + "."
            )
        return [np.sort(rows) for rows in parts], None
    ids = np.asarray(parties)
    if ids.ndim != 1 or len(ids) != n_rows:
        raise ValueError(
            f"parties must be one party id per row of X ({n_rows} rows) or a list of index "
            f"arrays, one per party; got an array of shape {ids.shape}."
        )
    try:
        names, which = np.unique(ids, return_inverse=True)
    except TypeError as err:
        raise ValueError(f"parties: the party ids cannot be sorted ({err}).") from err
    return [np.flatnonzero(which == k) for k in range(len(names))], names


def _is_index_lists(parties: Any) -> bool:
    if isinstance(parties, np.ndarray):
        return parties.ndim == 2 or (
            parties.dtype == object and all(np.ndim(p) == 1 for p in parties)
        )
    return (
        isinstance(parties, Sequence)
        and not isinstance(parties, str)
        and len(parties) > 0
        and all(np.ndim(p) == 1 for p in parties)
    )


def _index_array(rows: Any, party: int, n_rows: int) -> np.ndarray:
    array = np.asarray(rows)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise ValueError(
            f"parties[{party}] must hold integer row indices, got dtype {array.dtype}."
        )
    if array.min() < 0 or array.max() >= n_rows:
        raise ValueError(
            f"parties[{party}] holds row indices outside 0..{n_rows - 1} (X has {n_rows} rows)."
        )
    return array.astype(np.int64)


def averaged_model(config: TrainConfig, input_shape: Sequence[int], parameters: torch.Tensor):
    """The model of Alg. 1's output: the mean of the parties' parameter rows ``(N, d + extra)``
    (the simulator's mean, as ``slate train`` saves it), loaded into a fresh ``config.model``
    on the CPU, in eval mode. The ``extra`` tail (an algorithm's own variables) is dropped."""
    module = build_model(config.model, tuple(input_shape), hidden=config.hidden, seed=config.seed)
    size = sum(p.numel() for p in module.parameters())
    nn.utils.vector_to_parameters(parameters.mean(dim=0)[:size], module.parameters())
    return module.eval()


def _float32(X: np.ndarray) -> np.ndarray:
    """``X`` as the model's float32 input, refused where a value overflows float32."""
    with np.errstate(over="ignore"):  # reported below, as a ValueError
        features = np.ascontiguousarray(X, dtype=np.float32)
    if not np.isfinite(features).all():
        raise ValueError(
            "X holds values beyond float32's range (about 3.4e38), which the model computes in; "
            "scale the features first (e.g. StandardScaler)."
        )
    return features


def _party_sizes(parts: list[np.ndarray] | None, labels: np.ndarray, config: TrainConfig):
    if parts is None:
        parts = make_partition(
            labels, config.nodes, config.partition, config.seed, config.dirichlet_alpha
        )
    return np.array([len(rows) for rows in parts])


_FLAG = re.compile(r"--([a-z][a-z0-9-]*)")


def _with_parameter_names(message: str) -> str:
    """``message`` with each ``slate train`` flag that is an estimator parameter renamed to it
    (``--nodes`` becomes ``'n_parties'``)."""
    names = {field: name for name, field in PARAMETER_FIELDS.items()}
    parameters = set(SlateClassifier().get_params(deep=False))

    def rename(match: re.Match[str]) -> str:
        field = match.group(1).replace("-", "_")
        name = names.get(field, field)
        return f"'{name}'" if name in parameters else match.group(0)

    return _FLAG.sub(rename, message)


def _party_note(err: Exception, ids: np.ndarray | None) -> str:
    if ids is None or not isinstance(err, DataError):
        return ""
    shown = ", ".join(f"{k} = {name!r}" for k, name in enumerate(ids[:10].tolist()))
    more = ", ..." if len(ids) > 10 else ""
    return f" (Parties are numbered in sorted order of their ids: {shown}{more}.)"


class _RunLog:
    """``train``'s console lines: printed when verbose; a model that stops learning warns."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.verbose:
            print(line)

    def warn_if_not_learning(self) -> None:
        """A ``ConvergenceWarning`` for the run's "not learning" line, if it wrote one (its
        "test" rows are the training rows here)."""
        for line in self.lines:
            if "not learning" in line:
                message = line.removeprefix("warning: ").replace("test score", "training score")
                warnings.warn(_with_parameter_names(message), ConvergenceWarning, stacklevel=3)
