"""Convolutional image classifiers: ResNet (v1.5 bottleneck, torchvision layout
and parameter counts), WideResNet, VGG and a tiny CNN.

``forward(images, labels) -> cross-entropy loss``; images (B, 3, H, W), labels (B,) int64.

Module names (FQNs):

    ResNet:  conv1, bn1 (stem); layers.{i}.{conv1,bn1,conv2,bn2,conv3,bn3}
             and layers.{i}.downsample.{0 (conv), 1 (bn)} on the first block of each
             stage (blocks of all stages flattened: resnet50 has layers.0 .. layers.15); fc
    VGG:     layers.{i}.conv (13 conv blocks; layers.{i}.pool = True after each stage's
             last conv); fc1, fc2, fc3 (classifier)
    TinyCNN: layers.{i}.{conv,bn}; fc
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def _init_cnn(model: nn.Module) -> None:
    """torchvision-style init: conv kaiming-normal (fan_out, relu), BN 1/0 with reset
    running stats, Linear N(0, 0.01), biases 0. Meta tensors are skipped."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                if not m.weight.is_meta:
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                    if m.bias is not None:
                        m.bias.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                if not m.weight.is_meta:
                    m.weight.fill_(1.0)
                    m.bias.zero_()
                if m.running_mean is not None and not m.running_mean.is_meta:
                    m.reset_running_stats()
            elif isinstance(m, nn.Linear):
                if not m.weight.is_meta:
                    m.weight.normal_(0.0, 0.01)
                    if m.bias is not None:
                        m.bias.zero_()


# --------------------------------------------------------------------------- ResNet

@dataclass(frozen=True)
class ResNetConfig:
    blocks: tuple[int, ...] = (3, 4, 6, 3)   # bottleneck blocks per stage (resnet50)
    width_per_group: int = 64                 # 128 for wide_resnet50_2
    num_classes: int = 1000
    image_size: int = 224                     # only used by example_inputs


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int, base_width: int) -> None:
        super().__init__()
        width = int(planes * (base_width / 64.0))
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))
        else:
            self.downsample = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + identity)


class ResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig = ResNetConfig()) -> None:
        super().__init__()
        self.config = cfg
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        layers: list[nn.Module] = []
        inplanes = 64
        for stage, n in enumerate(cfg.blocks):
            planes = 64 * 2 ** stage
            for j in range(n):
                stride = 2 if (j == 0 and stage > 0) else 1
                layers.append(Bottleneck(inplanes, planes, stride, cfg.width_per_group))
                inplanes = planes * Bottleneck.expansion
        self.layers = nn.ModuleList(layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, cfg.num_classes)
        self.init_weights()

    def init_weights(self) -> None:
        _init_cnn(self)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(images))))
        for layer in self.layers:
            x = layer(x)
        logits = self.fc(torch.flatten(self.avgpool(x), 1))
        return F.cross_entropy(logits, labels)


# --------------------------------------------------------------------------- VGG

VGG16_CHANNELS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                  512, 512, 512, "M", 512, 512, 512, "M")


@dataclass(frozen=True)
class VGGConfig:
    channels: tuple = VGG16_CHANNELS  # ints = 3x3 conv widths, "M" = 2x2 max-pool
    hidden: int = 4096
    num_classes: int = 1000
    dropout: float = 0.0              # torchvision uses 0.5; 0 keeps the step deterministic
    image_size: int = 224


class VGGBlock(nn.Module):
    """3x3 conv + ReLU, then 2x2 max-pool if ``pool``."""

    def __init__(self, cin: int, cout: int, pool: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        if self.pool:  # static (construction-time) flag
            x = F.max_pool2d(x, 2, 2)
        return x


class VGG(nn.Module):
    def __init__(self, cfg: VGGConfig = VGGConfig()) -> None:
        super().__init__()
        self.config = cfg
        blocks: list[VGGBlock] = []
        cin = 3
        spec = list(cfg.channels)
        for i, c in enumerate(spec):
            if c == "M":
                continue
            pool = i + 1 < len(spec) and spec[i + 1] == "M"
            blocks.append(VGGBlock(cin, int(c), pool))
            cin = int(c)
        self.layers = nn.ModuleList(blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.fc1 = nn.Linear(cin * 7 * 7, cfg.hidden)
        self.fc2 = nn.Linear(cfg.hidden, cfg.hidden)
        self.fc3 = nn.Linear(cfg.hidden, cfg.num_classes)
        self.drop = nn.Dropout(cfg.dropout)
        self.init_weights()

    def init_weights(self) -> None:
        _init_cnn(self)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = images
        for layer in self.layers:
            x = layer(x)
        x = torch.flatten(self.avgpool(x), 1)
        x = self.drop(F.relu(self.fc1(x)))
        x = self.drop(F.relu(self.fc2(x)))
        return F.cross_entropy(self.fc3(x), labels)


# --------------------------------------------------------------------------- tiny CNN

@dataclass(frozen=True)
class TinyCNNConfig:
    channels: tuple[int, ...] = (16, 32)   # one stride-2 3x3 conv + BN + ReLU per entry
    num_classes: int = 10
    image_size: int = 32


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class TinyCNN(nn.Module):
    def __init__(self, cfg: TinyCNNConfig = TinyCNNConfig()) -> None:
        super().__init__()
        self.config = cfg
        chans = (3, *cfg.channels)
        self.layers = nn.ModuleList(ConvBlock(a, b) for a, b in zip(chans[:-1], chans[1:]))
        self.fc = nn.Linear(chans[-1], cfg.num_classes)
        self.init_weights()

    def init_weights(self) -> None:
        _init_cnn(self)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = images
        for layer in self.layers:
            x = layer(x)
        logits = self.fc(x.mean(dim=(2, 3)))
        return F.cross_entropy(logits, labels)
