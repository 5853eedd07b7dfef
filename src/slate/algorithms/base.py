"""What every algorithm shares: its hyperparameters, their validation, state, the step
signature, and the :class:`Mixer` it mixes through.

An algorithm's hyperparameters come in two parts: :class:`AlgorithmConfig`, the ones the
algorithms share (the step size, the AP surrogate's margin, gradient tracking, the sampler's
positive rate), and its own parameter dataclass (:attr:`Algorithm.Params`, e.g.
:class:`slate.algorithms.coda.CodaParams`). Each field of either that is a flag of
``slate train`` carries its ``help`` (and where needed ``flag``, ``choices``) in its metadata,
with its classification (:func:`slate.config.agreed`): the registry
(:func:`slate.algorithms.parameter_fields`) builds the flags from them, so that a new parameter
of one algorithm is a field of its own dataclass, plus the flag's slot in
:class:`slate.config.TrainConfig` that ``summary.json`` stores.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from slate.algorithms.compute import Batch, Objective, PartyCompute
from slate.algorithms.privacy import row_objective
from slate.config import agreed
from slate.errors import ConfigError

__all__ = ["Algorithm", "AlgorithmConfig", "Mixer", "NoParams", "validate_positive"]


class Mixer(Protocol):
    r"""All an algorithm asks of the parties' communication: both engines' communicators
    (:class:`slate.engines.base.Communicator`) satisfy it, and the algorithms never know which
    engine carries it out.

    ``mix(x)`` applies the current round's gossip matrix to the stacked parameters ``x (P, d)``,
    :math:`x_n \leftarrow \sum_r w_{nr} x_r` (the identity on an iteration without gossip);
    ``mix_step(x, direction, lr)`` is ``mix(x - lr * direction)``, a local step then one round
    (Alg. 1 line 9), which an engine may carry out in one fused pass.
    """

    def mix(self, x: Tensor) -> Tensor: ...

    def mix_step(self, x: Tensor, direction: Tensor, lr: float) -> Tensor: ...


def validate_positive(name: str, value: float) -> None:
    """Raise a :class:`ConfigError` unless ``value`` is a finite number > 0."""
    if not (value > 0 and value < float("inf")):
        raise ConfigError(f"{name} must be a positive number, got {value!r}.")


@dataclass(frozen=True)
class AlgorithmConfig:
    """Hyperparameters shared by the algorithms; each uses the ones it needs.

    Attributes:
        lr: step size eta (its flag, ``--lr``, also takes ``auto``: chosen by the run's plan).
        margin: squared-hinge margin s of the AP surrogate (eq. 2) of SLATE and SLATE-M.
        gradient_tracking: run Alg. 1 line 8 / Alg. 2 line 11 (off in the paper's experiments).
        sampled_positive_rate: the share of positives in every mini-batch the sampler draws,
            ``b / m`` (CODA's ``p``); ``None`` when batches are drawn uniformly from each
            party's data, so that the party's own positive rate is the sampling rate.
    """

    lr: float = agreed(0.01)
    margin: float = agreed(0.1, help="squared-hinge margin s")
    gradient_tracking: bool = agreed(
        False, help="run Alg. 1 line 8 (off in the paper's experiments)"
    )
    sampled_positive_rate: float | None = agreed(None)


@dataclass(frozen=True)
class NoParams:
    """The parameters of an algorithm that has none beyond :class:`AlgorithmConfig`'s."""


class Algorithm(ABC):
    """A decentralised update rule on stacked parameters ``x (P, d)``.

    Subclasses define the objective and one iteration. State that must survive a checkpoint
    (gradient estimators, trackers, previous iterates) lives in ``self.state``, a dict of tensors.
    """

    name: str = ""
    n_extra: int = 0
    #: The algorithm's own parameter dataclass (its fields: its flags, :mod:`slate.algorithms`).
    Params: ClassVar[type] = NoParams
    #: Under ``--dp-epsilon`` (:mod:`slate.algorithms.privacy`): ``"row"``, a loss that is a
    #: sum over rows, clipped per row (groups of one); ``"group"``, a loss over a whole batch
    #: (SLATE's AP surrogate), clipped per group of rows.
    private_unit: ClassVar[str] = "row"

    def __init__(self, config: AlgorithmConfig, params: Any = None) -> None:
        validate_positive("--lr", config.lr)
        self.config = config
        self.params = self.Params() if params is None else params
        if not isinstance(self.params, self.Params):
            raise TypeError(
                f"{type(self).__name__} takes {self.Params.__name__}, got "
                f"{type(self.params).__name__}"
            )
        self.state: dict[str, Tensor] = {}

    def initial_batches(self, positives: int) -> int:
        """How many mini-batches iteration 0 consumes (SLATE-M's initial batch); default none.

        When this is positive, the run calls :meth:`first_step` with that many batches instead
        of :meth:`step` at iteration 0.
        """
        del positives
        return 0

    def first_step(
        self, x: Tensor, batch: Batch, comm: Mixer, compute: PartyCompute
    ) -> tuple[Tensor, Tensor]:
        """Iteration 0 on ``k`` stacked batches (block major); only algorithms that need it."""
        raise NotImplementedError

    def context(self, labels_per_party: list[Tensor]) -> Tensor | None:
        """Per-party constants for the objective, from each party's own labels; default none."""
        del labels_per_party
        return None

    @abstractmethod
    def objective(self) -> Objective:
        """The loss each party differentiates: ``(logits, labels, extra) -> scalar``."""

    def masked_objective(self, with_context: bool) -> Objective:
        """The loss of one group under ``--dp-epsilon``, empty slots (label -1) left out; by
        default :meth:`objective` on a group of one row (``with_context``: it takes the
        per-party context, as CODA's does)."""
        return row_objective(self.objective(), with_context)

    def initial_extra(self, n_parties: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Initial values of the algorithm's own variables, appended after the model's."""
        return torch.zeros(n_parties, self.n_extra, device=device, dtype=dtype)

    def init_state(self, x: Tensor) -> None:
        """Create the state for parameters ``x``: with gradient tracking, ``u_{-1} = v_{-1} = 0``.

        Alg. 1 line 1 sets the estimator and the tracker to zero; line 8 needs the previous ones.
        """
        zeros = x.new_zeros(x.shape)
        self.state = {"u": zeros, "v": zeros.clone()} if self.config.gradient_tracking else {}

    def restart_tracking(self) -> None:
        r"""Re-anchor the gradient tracker after the party set changed: :math:`v_n \leftarrow u_n`.

        Tracking keeps :math:`\frac1N \sum_n v_n = \frac1N \sum_n u_n` because W is doubly
        stochastic (Alg. 1 line 8). A lost party takes its :math:`v - u` with it, and a
        returning one brings another, so the survivors' means would differ by a constant from
        then on; setting every tracker to the party's own latest estimate restores the
        equality, as line 1's :math:`u_{-1} = v_{-1}` does at the start.
        """
        if "v" in self.state and "u" in self.state:
            self.state["v"] = self.state["u"]

    @abstractmethod
    def step(
        self, x: Tensor, batch: Batch, comm: Mixer, compute: PartyCompute
    ) -> tuple[Tensor, Tensor]:
        """One iteration on every party. Returns the new ``x`` and the parties' losses ``(P,)``."""
