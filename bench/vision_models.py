"""ResNet-18 and MobileNetV3-small for the benchmark, written here from the architectures.

torchvision's model definitions cannot be used: PyPI's torchvision does not import beside this
project's torch ("operator torchvision::nms does not exist"). These are plain `nn.Module`s with
the published layer structure:

- ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", 2015): a 7x7/2 conv
  stem with BatchNorm, ReLU and a 3x3/2 max pool, then four stages of two basic blocks (two 3x3
  convs with BatchNorm, ReLU, identity or 1x1-conv+BatchNorm shortcut) at 64, 128, 256, 512
  channels, stride 2 at the start of stages 2-4, global average pool and one linear layer.
- MobileNetV3-small (Howard et al., "Searching for MobileNetV3", 2019, table 2): a 3x3/2 conv
  stem with hardswish, eleven inverted-residual blocks (1x1 expansion, depthwise kxk conv,
  optional squeeze-and-excitation with a hardsigmoid gate, 1x1 linear projection, residual
  when the shape is kept) using ReLU or hardswish, a 1x1 conv to 576 channels, global average
  pool, and a classifier 576 -> 1024 (hardswish) -> classes. Dropout is left out, so gradients
  are deterministic and comparable between processes.

Both accept any input of at least 32x32 pixels; the benchmark uses small images (64x64).
"""

from torch import nn


def _conv_bn(cin, cout, kernel, stride=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    """Two 3x3 convs with BatchNorm; ReLU after the first and after the residual sum."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, cout, 3, stride, act=nn.ReLU), _conv_bn(cout, cout, 3))
        self.shortcut = (nn.Identity() if stride == 1 and cin == cout
                         else _conv_bn(cin, cout, 1, stride))
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, 64, 7, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, padding=1))
        stages, cin = [], 64
        for i, width in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(cin, width, stride), BasicBlock(width, width, 1)))
            cin = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.pool(self.stages(self.stem(x)))
        return self.fc(x.flatten(1))


def _round8(value):
    """Nearest multiple of 8, not below 90% of value (channel counts of MobileNetV3)."""
    rounded = max(8, int(value + 4) // 8 * 8)
    return rounded + 8 if rounded < 0.9 * value else rounded


class SqueezeExcite(nn.Module):
    """Channel gate: global average pool, 1x1 conv down (ReLU), 1x1 conv up, hardsigmoid."""

    def __init__(self, channels):
        super().__init__()
        hidden = _round8(channels / 4)
        self.down = nn.Conv2d(channels, hidden, 1)
        self.up = nn.Conv2d(hidden, channels, 1)
        self.relu = nn.ReLU()
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.up(self.relu(self.down(s))))


class InvertedResidual(nn.Module):
    def __init__(self, cin, kernel, expanded, cout, se, act, stride):
        super().__init__()
        layers = []
        if expanded != cin:
            layers.append(_conv_bn(cin, expanded, 1, act=act))
        layers.append(_conv_bn(expanded, expanded, kernel, stride, groups=expanded, act=act))  # depthwise
        if se:
            layers.append(SqueezeExcite(expanded))
        layers.append(_conv_bn(expanded, cout, 1))  # linear projection
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


# (kernel, expanded channels, output channels, squeeze-excite, activation, stride)
_SMALL = (
    (3, 16, 16, True, nn.ReLU, 2),
    (3, 72, 24, False, nn.ReLU, 2),
    (3, 88, 24, False, nn.ReLU, 1),
    (5, 96, 40, True, nn.Hardswish, 2),
    (5, 240, 40, True, nn.Hardswish, 1),
    (5, 240, 40, True, nn.Hardswish, 1),
    (5, 120, 48, True, nn.Hardswish, 1),
    (5, 144, 48, True, nn.Hardswish, 1),
    (5, 288, 96, True, nn.Hardswish, 2),
    (5, 576, 96, True, nn.Hardswish, 1),
    (5, 576, 96, True, nn.Hardswish, 1),
)


class MobileNetV3Small(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        layers, cin = [_conv_bn(3, 16, 3, 2, act=nn.Hardswish)], 16
        for kernel, expanded, cout, se, act, stride in _SMALL:
            layers.append(InvertedResidual(cin, kernel, expanded, cout, se, act, stride))
            cin = cout
        layers.append(_conv_bn(cin, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.pool(self.features(x)).flatten(1))
