"""ResNet-18 (He et al., 2016) with one output logit, for the paper's Tiny-ImageNet runs.

BasicBlock with layers ``[2, 2, 2, 2]`` and widths 64-128-256-512, the ImageNet stem
(7x7 stride-2 convolution and a 3x3 max-pool) and global average pooling. Convolutions get
Kaiming-normal weights (fan-out, ReLU), BatchNorm weight 1 and bias 0.

BatchNorm keeps running statistics as buffers. In the simulator every party has its own copy,
stacked like the parameters and updated in place by its own batches; they are not mixed during
training (only parameters are exchanged, as in the authors' scripts), and the averaged model
used for evaluation carries their average over the parties.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["BasicBlock", "ResNet18"]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a (projected when needed) identity shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn1(self.conv1(x)).relu()
        out = self.bn2(self.conv2(out))
        return (out + self.shortcut(x)).relu()


class ResNet18(nn.Module):
    """ResNet-18 for ``in_channels``-channel images, returning one logit per image."""

    def __init__(self, in_channels: int = 3, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages, c_in = [], width
        for k, blocks in enumerate((2, 2, 2, 2)):
            c_out = width * 2**k
            for j in range(blocks):
                stages.append(BasicBlock(c_in, c_out, stride=2 if (k > 0 and j == 0) else 1))
                c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, 1)
        for layer in self.modules():
            if isinstance(layer, nn.Conv2d):
                nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(layer, nn.BatchNorm2d):
                nn.init.ones_(layer.weight)
                nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.stages(self.stem(x))).flatten(1)).squeeze(-1)
