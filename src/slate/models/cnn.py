"""The paper's small CNNs for MNIST, Fashion-MNIST and CIFAR-10 (REFERENCE.md, Models).

Each returns one logit per image; the objective applies the sigmoid. Weights are Xavier-normal
and every bias is ``1 / numel(bias)``, as in the authors' scripts.
"""

from __future__ import annotations

from torch import Tensor, nn

from slate.models.init import xavier_normal_init

__all__ = ["Cifar10CNN", "FashionMnistCNN", "MnistCNN"]


class _Classifier(nn.Module):
    """A feature stack followed by a fully connected head, squeezed to one logit."""

    features: nn.Sequential
    head: nn.Sequential

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x).flatten(1)).squeeze(-1)


class MnistCNN(_Classifier):
    """Conv(1,20,5)-ReLU-Pool-Conv(20,50,5)-ReLU-Pool-FC(800,500)-ReLU-FC(500,1)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 20, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(20, 50, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 1))
        xavier_normal_init(self)


class FashionMnistCNN(_Classifier):
    """Conv(1,5,3)-tanh-Pool-Conv(5,10,3)-tanh-Pool-FC(250,100)-tanh-FC(100,1)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 5, 3),
            nn.Tanh(),
            nn.MaxPool2d(2),
            nn.Conv2d(5, 10, 3),
            nn.Tanh(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Linear(250, 100), nn.Tanh(), nn.Linear(100, 1))
        xavier_normal_init(self)


class Cifar10CNN(_Classifier):
    """Three Conv(k3, pad 1)-ReLU-Pool blocks (16, 32, 64) then FC 1024-512-64-1 with ReLU."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c_in, c_out in ((3, 16), (16, 32), (32, 64)):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 1)
        )
        xavier_normal_init(self)
