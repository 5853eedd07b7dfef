"""Seeded weight initialisation that never touches torch's global RNG state."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["seeded", "xavier_normal_init"]


def xavier_normal_init(module: nn.Module) -> None:
    """The paper's initialisation: Xavier-normal weights and every bias set to ``1 / numel``.

    Applies to every ``nn.Linear`` and ``nn.Conv2d`` in ``module`` (REFERENCE.md, Models).
    """
    for layer in module.modules():
        # A meta tensor has no values to set (and torch's meta kernels import torch._dynamo).
        if isinstance(layer, (nn.Linear, nn.Conv2d)) and not layer.weight.is_meta:
            nn.init.xavier_normal_(layer.weight)
            if layer.bias is not None:
                nn.init.constant_(layer.bias, 1.0 / layer.bias.numel())


class seeded:  # noqa: N801 - used as a context manager, reads like a function
    """Context manager: run initialisation code under ``seed`` and restore the global RNG after.

    Library code must not reseed the user's global RNG (a LibAUC pitfall); this forks it instead.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._fork = torch.random.fork_rng(devices=[])

    def __enter__(self) -> None:
        self._fork.__enter__()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        self._fork.__exit__(*exc)
