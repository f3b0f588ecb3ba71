"""The paper's architectures, written once against a method's layer kit (methods.py).

- `mlp`: input -> 64 -> 32 -> 16 -> classes, ReLU; MC Dropout after every hidden linear
  layer, before the activation (torch-uncertainty's placement, which the paper used).
- `resnet18`: the CIFAR variant (3×3 stride-1 stem, no max-pool, stages 64/128/256/512,
  BasicBlocks [2,2,2,2]); MC Dropout in every block after the first convolution (and its
  BatchNorm), before the activation. Dropout is element-wise.

A body maps member inputs `xs[k, B, ...]` to member-major logits `[k*B, C]`. Layers name
their role (linear: `input`, `hidden`, `head`; convolutions: `stem`, `entry` and `block` for
a residual block's first and second, `shortcut`) so that a kit can treat them differently
(the paper's BatchEnsemble layout leaves shortcuts unperturbed; a multi-input kit widens the
input and the head). What flows between layers is in the kit's layout (`enter_images`,
`enter_features`, `pooled_features`).
Register a new architecture with `@register_arch("name")` on a builder
`(kit, num_classes, input_shape) -> nn.Module`; `default_options` gives per-architecture
method defaults (the paper's dropout rates), `convolutional=False` marks one without convolutions.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EnsdiagError
from ..registry import Registry
from .kit import Option

ARCHITECTURES = Registry("architecture")  # name -> builder(kit, num_classes, input_shape, **options)


def register_arch(name, convolutional=True, options=(), whole_networks=False, **default_options):
    """`options`: the architecture's own options (`Option`s, e.g. resnet18's base width), kept in a
    model's spec when set; `whole_networks`: built from networks defined elsewhere, so only kits with
    independent members run it (torchvision's); `default_options`: per-architecture defaults of method
    options."""
    def register(builder):
        builder.whole_networks = whole_networks
        builder.default_options = default_options
        builder.options = tuple(options)
        builder.convolutional = convolutional  # kernel-wise BatchEnsemble needs convolutions
        return ARCHITECTURES.add(name, builder)
    return register


class MLP(nn.Module):
    def __init__(self, kit, num_classes, input_shape, hidden=(64, 32, 16)):
        super().__init__()
        widths = (math.prod(input_shape), *hidden)
        self.kit = kit
        self.hidden = nn.ModuleList(kit.linear(a, b, role="input" if index == 0 else "hidden")
                                    for index, (a, b) in enumerate(zip(widths, widths[1:])))
        self.drops = nn.ModuleList(kit.dropout() for _ in hidden)
        self.head = kit.linear(widths[-1], num_classes, role="head")

    def forward(self, xs):
        h = F.relu(self.drops[0](self.kit.enter_features(self.hidden[0], xs)))
        for linear, drop in zip(self.hidden[1:], self.drops[1:]):
            h = F.relu(drop(linear(h)))
        return self.head(h)

    def representation_points(self) -> dict[str, nn.Module]:
        """Where member geometry reads representations: each linear layer's output (before the activation)."""
        return {**{f"hidden.{i}": layer for i, layer in enumerate(self.hidden)}, "head": self.head}

    def permutation_groups(self) -> dict[str, list[tuple[str, str]]]:
        """Hidden units that may be permuted without changing the function: each hidden layer's
        outputs, with the next layer's inputs ([(module, "out" | "in")])."""
        names = [f"hidden.{i}" for i in range(len(self.hidden))] + ["head"]
        return {name: [(name, "out"), (after, "in")] for name, after in zip(names, names[1:])}


def _conv(kit, *args, role, bias):
    """kit.conv, with a bias only when the architecture asks (kits without one never see the keyword)."""
    return kit.conv(*args, role=role, bias=True) if bias else kit.conv(*args, role=role)


class BasicBlock(nn.Module):
    def __init__(self, kit, in_channels, out_channels, stride, conv_bias=False):
        super().__init__()
        self.conv1 = _conv(kit, in_channels, out_channels, 3, stride, 1, role="entry", bias=conv_bias)
        self.bn1 = kit.bn(out_channels)
        self.drop = kit.dropout()
        self.conv2 = _conv(kit, out_channels, out_channels, 3, 1, 1, role="block", bias=conv_bias)
        self.bn2 = kit.bn(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(_conv(kit, in_channels, out_channels, 1, stride, 0, role="shortcut",
                                                bias=conv_bias), kit.bn(out_channels))

    def forward(self, x):
        out = F.relu(self.drop(self.bn1(self.conv1(x))))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, kit, num_classes, input_shape, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), conv_bias=False):
        super().__init__()
        if conv_bias and not kit.conv_bias:
            raise EnsdiagError(f"resnet18 option conv_bias: {kit.name} builds its convolutions' biases by its own layout "
                               "(BatchEnsemble: its options layout=paper and shortcut_bias=true give the paper's counts)")
        self.kit = kit
        self.conv1 = _conv(kit, input_shape[0], widths[0], 3, 1, 1, role="stem", bias=conv_bias)
        self.bn1 = kit.bn(widths[0])
        stages, in_channels = [], widths[0]
        for index, (width, count) in enumerate(zip(widths, blocks)):
            strides = [1 if index == 0 else 2] + [1] * (count - 1)
            stage = []
            for stride in strides:
                stage.append(BasicBlock(kit, in_channels, width, stride, conv_bias))
                in_channels = width
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = kit.linear(in_channels, num_classes, role="head")

    def forward(self, xs):
        h = F.relu(self.bn1(self.conv1(self.kit.enter_images(xs))))
        h = self.layer4(self.layer3(self.layer2(self.layer1(h))))
        return self.fc(self.kit.pooled_features(h))

    def _blocks(self):
        return [(f"{stage}.{i}", block) for stage in ("layer1", "layer2", "layer3", "layer4")
                for i, block in enumerate(getattr(self, stage))]

    def representation_points(self) -> dict[str, nn.Module]:
        """The stem (after its BatchNorm), every residual block's output, and the head."""
        return {"stem": self.bn1, **dict(self._blocks()), "fc": self.fc}

    def permutation_groups(self) -> dict[str, list[tuple[str, str]]]:
        """Channels that may be permuted without changing the function ([(module, "out" | "in")]):
        inside each block, conv1's outputs (with bn1 and conv2's inputs); and each stage's residual
        stream, which every block adds to, so one permutation spans the stem or the projecting
        shortcut that opens it, every block's conv2 and bn2 in it, the inputs of the blocks that
        read it, and the head."""
        groups, stream, opened = {}, [("conv1", "out"), ("bn1", "out")], "stem"
        for name, block in self._blocks():
            groups[f"{name}.inner"] = [(f"{name}.conv1", "out"), (f"{name}.bn1", "out"), (f"{name}.conv2", "in")]
            stream.append((f"{name}.conv1", "in"))
            if len(block.shortcut):  # a projecting shortcut: the block opens a new stream
                groups[f"{opened} stream"] = stream + [(f"{name}.shortcut.0", "in")]
                stream, opened = [(f"{name}.shortcut.0", "out"), (f"{name}.shortcut.1", "out")], name
            stream += [(f"{name}.conv2", "out"), (f"{name}.bn2", "out")]
        groups[f"{opened} stream"] = stream + [("fc", "in")]
        return groups


class MemberNetworks(nn.Module):
    """k whole networks built elsewhere (torchvision's), run one after another: independent members.

    Only kits whose members are independent networks can use it (`Kit.independent_members`)."""

    def __init__(self, networks):
        super().__init__()
        self.members = nn.ModuleList(networks)

    def forward(self, xs):
        return torch.cat([network(x) for network, x in zip(self.members, xs)])  # member-major [k*B, C]

    def member_module(self, i):
        return self.members[i]

    def representation_points(self) -> dict[str, nn.Module]:
        """The first member's top-level modules that hold weights (a foreign network's stages)."""
        return {name: module for name, module in self.members[0].named_children() if any(True for _ in module.parameters())}


def check_torchvision_name(name: str) -> None:
    """`name` is one of torchvision's classification models (not its detection, segmentation or video ones)."""
    from torchvision import models
    if name not in models.list_models(module=models):
        raise EnsdiagError(f"torchvision has no classification model {name!r} (e.g. resnet18, resnet50, vgg11, "
                           "densenet121, convnext_tiny)")


@register_arch("torchvision", whole_networks=True, options=(
        Option("name", "resnet18", "a torchvision classification model (torchvision.models.list_models())"),))
def build_torchvision(kit, num_classes, input_shape, name="resnet18"):
    """Any torchvision classification model, untrained (weights come from the files imported)."""
    from torchvision.models import get_model
    check_torchvision_name(name)
    if not getattr(kit, "independent_members", False):
        raise EnsdiagError(f"torchvision:{name} members are whole networks: import them as a Deep Ensemble "
                           f"(independent members), not as {kit.name}")
    return MemberNetworks([get_model(name, weights=None, num_classes=num_classes) for _ in range(kit.num_members)])


@register_arch("mlp", convolutional=False, dropout=0.05)
def build_mlp(kit, num_classes, input_shape):
    return MLP(kit, num_classes, input_shape)


@register_arch("resnet18", dropout=0.1, options=(
        Option("width", 64, "channels of the first stage (the stages have width, 2·, 4·, 8·width)", int,
               low=1, high=1024),
        Option("conv_bias", False, "a bias on every convolution (torch-uncertainty's ResNet-18 with conv_bias: the "
               "layout whose counts the paper's Table 4 gives; single, MC Dropout and Deep Ensemble)", bool)))
def build_resnet18(kit, num_classes, input_shape, width=64, conv_bias=False):
    return ResNet18(kit, num_classes, input_shape, widths=(width, 2 * width, 4 * width, 8 * width), conv_bias=conv_bias)
