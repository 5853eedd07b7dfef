"""Models, each returning one logit per sample, and a name registry shared by CLI and configs."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from slate.errors import ConfigError
from slate.models.init import seeded, xavier_normal_init
from slate.models.mlp import MLP

__all__ = ["MLP", "MODEL_NAMES", "build_model", "seeded", "xavier_normal_init"]

_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "mlp": lambda input_shape, hidden: MLP(_numel(input_shape), hidden),
}
MODEL_NAMES = tuple(_BUILDERS)


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def build_model(name: str, input_shape: tuple[int, ...], *, hidden: int = 28, seed: int = 0):
    """Build model ``name`` for inputs of ``input_shape`` with weights drawn from ``seed``.

    Every party starts from these same weights (Alg. 1 line 2).
    """
    if name not in _BUILDERS:
        raise ConfigError(f"Unknown model {name!r}; expected one of {', '.join(MODEL_NAMES)}.")
    with seeded(seed):
        return _BUILDERS[name](input_shape, hidden)
