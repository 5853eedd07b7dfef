"""Models, each returning one logit per sample, and a name registry shared by CLI and configs."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from slate.errors import ConfigError
from slate.models.cnn import Cifar10CNN, FashionMnistCNN, MnistCNN
from slate.models.init import seeded, xavier_normal_init
from slate.models.mlp import MLP
from slate.models.resnet import ResNet18

__all__ = [
    "MLP",
    "MODEL_NAMES",
    "Cifar10CNN",
    "FashionMnistCNN",
    "MnistCNN",
    "ResNet18",
    "build_model",
    "seeded",
    "xavier_normal_init",
]

_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "mlp": lambda input_shape, hidden: MLP(_numel(input_shape), hidden),
    "mnist-cnn": lambda input_shape, hidden: MnistCNN(),
    "fashion-mnist-cnn": lambda input_shape, hidden: FashionMnistCNN(),
    "cifar10-cnn": lambda input_shape, hidden: Cifar10CNN(),
    "resnet18": lambda input_shape, hidden: ResNet18(in_channels=input_shape[0]),
}
_INPUT_SHAPES = {
    "mnist-cnn": (1, 28, 28),
    "fashion-mnist-cnn": (1, 28, 28),
    "cifar10-cnn": (3, 32, 32),
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
    expected = _INPUT_SHAPES.get(name)
    if expected is not None and tuple(input_shape) != expected:
        raise ConfigError(
            f"--model {name} expects inputs of shape {expected}, but the data has shape "
            f"{tuple(input_shape)}; choose a model that fits the dataset (e.g. --model mlp)."
        )
    if name == "resnet18" and len(input_shape) != 3:
        raise ConfigError(
            f"--model resnet18 needs images (C, H, W), got shape {tuple(input_shape)}."
        )
    with seeded(seed):
        return _BUILDERS[name](input_shape, hidden)
