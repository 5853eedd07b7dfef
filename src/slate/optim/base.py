"""What the decentralised optimizers share: validation and the step around an update rule.

A :class:`DecentralizedOptimizer` runs one of slate's algorithms (the same class the engines
run) inside the user's own training loop: the user computes a loss and calls ``backward()``;
``step()`` hands the flattened gradient to the algorithm as its per-party gradient and lets it
mix the parameters with the neighbours through a :class:`DistributedCommunicator`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from slate.algorithms.base import Algorithm, AlgorithmConfig
from slate.engines.distributed.wire.transport import DistributedCommunicator
from slate.errors import ConfigError
from slate.topology import Topology, build_topology

__all__ = ["DecentralizedOptimizer", "validate_learning_rate"]


def validate_learning_rate(lr: float) -> float:
    """A learning rate must be a finite number > 0."""
    if not (isinstance(lr, int | float) and 0 < lr < float("inf")):
        raise ConfigError(f"lr must be a positive number, got {lr!r}.")
    return float(lr)


class _UserGradient:
    """Stands in for the engines' per-party compute: returns the gradient the user computed."""

    def __init__(self) -> None:
        self.gradient: Tensor | None = None
        self.loss = torch.zeros(1)

    def __call__(self, x: Tensor, batch: Any) -> tuple[Tensor, Tensor]:
        del x, batch
        assert self.gradient is not None
        return self.loss, self.gradient


class DecentralizedOptimizer(torch.optim.Optimizer):
    """Base class: runs ``algorithm_class`` on this process's parameters, one party per process.

    Args:
        params: the parameters to optimise (one learning rate for all of them).
        lr: step size eta.
        topology: a :class:`~slate.topology.Topology` or a name (``ring``, ``full``, ...) built
            for the group's size.
        gradient_tracking: run the gradient-tracking step (Alg. 1 line 8).
        group: the ``torch.distributed`` process group of the parties (default: the world).
        fed_period: averaging period of the ``federated`` topology.
    """

    algorithm_class: type[Algorithm]

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float,
        *,
        topology: Topology | str = "ring",
        gradient_tracking: bool = False,
        group: Any = None,
        fed_period: int = 10,
    ) -> None:
        super().__init__(params, {"lr": validate_learning_rate(lr)})
        if not dist.is_initialized():
            raise ConfigError(
                f"{type(self).__name__} mixes parameters over torch.distributed: call "
                "torch.distributed.init_process_group first (e.g. launch with torchrun)."
            )
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        if isinstance(topology, str):
            topology = build_topology(topology, world, fed_period=fed_period)
        if topology.n != world:
            raise ConfigError(f"The topology has {topology.n} parties but the group has {world}.")
        self.comm = DistributedCommunicator(topology, rank, group)
        self._gradient = _UserGradient()
        self.algorithm = self.algorithm_class(
            AlgorithmConfig(lr=float(lr), gradient_tracking=gradient_tracking)
        )
        self.iteration = 0
        self._algorithm_ready = False

    def _parameters(self) -> list[Tensor]:
        params = [p for group in self.param_groups for p in group["params"]]
        if len({group["lr"] for group in self.param_groups}) != 1:
            raise ConfigError("Decentralized optimizers take one learning rate for all groups.")
        return params

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Local update with the current gradients, then one exchange with the neighbours."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._parameters()
        x = parameters_to_vector(params).unsqueeze(0)
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        self._gradient.gradient = parameters_to_vector(grads).unsqueeze(0)
        # A scheduler may have changed the learning rate since the last step.
        self.algorithm.config = dataclasses.replace(
            self.algorithm.config, lr=self.param_groups[0]["lr"]
        )
        if not self._algorithm_ready:
            self.algorithm.init_state(x)
            self._algorithm_ready = True
        self.comm.set_iteration(self.iteration)
        x, _ = self.algorithm.step(x, None, self.comm, self._gradient)
        vector_to_parameters(x.squeeze(0), params)
        self.iteration += 1
        return loss
