"""Packed-Ensembles (Laurent et al., ICLR 2023): M narrow members packed into grouped layers.

    model = build_model("resnet18", "packed-ensemble", num_members=4, alpha=2, gamma=2)

Options: `alpha` (α, the width multiplier of the whole ensemble) and `gamma` (γ, subgroups
inside each member); M is `--members`. Where the architecture asks for width c, a layer holds

    width(c) = ⌈int(α·c) / (M·γ)⌉ · M·γ      channels (int(α·c) whenever M·γ divides it),

member i owning the i-th block of width(c)/M. Every layer is a grouped linear or convolution
layer with M·γ groups, so no member reads another member's channels, and γ > 1 splits each
member into γ sparser paths. BatchNorm is per channel, hence per member. As in
torch-uncertainty (the authors' library):
- the network's first layer has no subgroups: every member sees the whole image;
- a residual block's first convolution has no subgroups; its second and the shortcut have γ;
- a convolution falls back to fewer subgroups while a group would read fewer than 64 channels
  (with α = 2, γ = 2, M = 4 on ResNet-18 only the last stages keep γ = 2);
- the classifier head has no subgroups (torch-uncertainty's MLP gives its head γ as well;
  here every architecture follows the ResNet's rule, so that γ means one thing; option
  `head_subgroups` gives the head γ subgroups, which imported packed_mlp checkpoints need).
Training: every member sees the same batch, and the loss is the mean cross-entropy over the
M·B rows (torch-uncertainty's; option `loss`: `sum` over members gives every member a single
model's gradient, as for Deep Ensembles). Member i is the dense network `member_network(i)`: its
layers' weights are the member's blocks, with zeros between its γ subgroups.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import EnsdiagError
from ..kit import Kit, Option, register_method, shared_batch
from ..layers import default_linear_init_, member_rows, members_first, stack_channels

MIN_CHANNELS_PER_GROUP = 64  # torch-uncertainty's PackedConv2d: fewer subgroups below this


def _member_block_diagonal(weight, i, num_members, groups):
    """Member i's dense weight [out/M, in_per_group·γ, ...] from a grouped weight [out, in_per_group, ...]."""
    per_member = weight.shape[0] // num_members
    subgroups = groups // num_members
    rows, cols = per_member // subgroups, weight.shape[1]
    dense = weight.new_zeros(per_member, cols * subgroups, *weight.shape[2:])
    for g in range(subgroups):
        start = i * per_member + g * rows
        dense[g * rows:(g + 1) * rows, g * cols:(g + 1) * cols] = weight[start:start + rows]
    return dense


class PackedLinear(nn.Module):
    """A linear layer with `groups` independent blocks on members-side-by-side input [B, in]."""

    weight_layer = True

    def __init__(self, in_features, out_features, num_members, groups, bias=True, head=False):
        super().__init__()
        self.num_members, self.groups, self.head = num_members, groups, head
        # stored as a grouped convolution stores it: [out, in / groups]
        self.weight = nn.Parameter(torch.empty(out_features, in_features // groups))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        default_linear_init_(self.weight, self.bias, in_features // groups)

    def forward(self, x):
        if x.shape[1] == self.weight.shape[1]:  # the first layer on one input every member sees
            h = F.linear(x, self.weight, self.bias)
        else:
            xg = x.unflatten(1, (self.groups, -1)).transpose(0, 1)  # [G, B, in/G]
            h = torch.bmm(xg, self.weight.unflatten(0, (self.groups, -1)).transpose(1, 2)).transpose(0, 1).flatten(1)
            if self.bias is not None:
                h = h + self.bias
        return members_first(h, self.num_members) if self.head else h

    def member_state(self, i):
        return {**self.distinct_state(i), "weight": _member_block_diagonal(self.weight, i, self.num_members, self.groups)}

    def distinct_state(self, i):
        """Member i's own parameters as stored (its γ blocks stacked): what weight cosine compares,
        equal to comparing the dense weights (the zeros between blocks add nothing)."""
        return member_rows(self, i)


class PackedConv2d(nn.Conv2d):
    """A grouped convolution whose groups are M members × γ subgroups; the stem (groups = M)
    also takes one image every member sees, as a plain convolution with the same weights."""

    def __init__(self, in_channels, out_channels, kernel_size, num_members, groups, stride=1, padding=0):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, bias=False, groups=groups)
        self.num_members = num_members

    def forward(self, x):
        if x.shape[1] == self.weight.shape[1] and self.groups > 1:  # shared input to the stem
            return F.conv2d(x, self.weight, None, self.stride, self.padding)
        return super().forward(x)

    def member_state(self, i):
        return {"weight": _member_block_diagonal(self.weight, i, self.num_members, self.groups)}

    def distinct_state(self, i):
        return member_rows(self, i)


class PackedBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm over members side by side: member i's statistics are its own channels."""

    def __init__(self, num_features, num_members):
        super().__init__(num_features)
        self.num_members = num_members

    def member_state(self, i):
        state = member_rows(self, i, ("weight", "bias", "running_mean", "running_var"))
        return {**state, "num_batches_tracked": self.num_batches_tracked}


@register_method("packed-ensemble")
class PackedEnsembleKit(Kit):
    label = "Packed-Ensembles"
    conv_bias = False  # its convolutions carry the biases its own layout defines
    order = 40
    own_weights = True  # members are disjoint groups of channels
    declared = (Option("alpha", 2.0, "width multiplier α of the whole ensemble (the paper: 2)", float,
                       low=0.01, high=65.0),
                Option("gamma", 1, "subgroups γ inside each member (the paper's ResNet-18: 2)", int, low=1, high=64),
                Option("loss", "mean", "cross-entropy averaged over all M·B rows (torch-uncertainty) or summed over members",
                       choices=("mean", "sum")),
                Option("head_subgroups", False, "γ subgroups on the classifier head too (torch-uncertainty's packed_mlp)",
                       bool))

    def width(self, features):
        """Channels a layer holds where the architecture asks for `features`."""
        unit = self.num_members * self.options["gamma"]
        return max(1, math.ceil(int(features * self.options["alpha"]) / unit)) * unit

    def member_width(self, width):
        return self.width(width) // self.num_members

    def _subgroups(self, in_channels, out_channels, convolution):
        gamma, m = self.options["gamma"], self.num_members
        while convolution and gamma > 1 and (in_channels % (gamma * m) or out_channels % (gamma * m)
                                             or in_channels // (gamma * m) < MIN_CHANNELS_PER_GROUP):
            gamma -= 1
        return gamma

    def linear(self, in_features, out_features, bias=True, role="hidden"):
        m = self.num_members
        if role == "input":
            return PackedLinear(in_features * m, self.width(out_features), m, m, bias)
        if role == "head":
            subgroups = self.options["gamma"] if self.options["head_subgroups"] else 1
            if out_features % subgroups:
                raise EnsdiagError(f"packed-ensemble option head_subgroups: {out_features} classes do not split into "
                                   f"γ = {subgroups} subgroups")
            return PackedLinear(self.width(in_features), out_features * m, m, m * subgroups, bias, head=True)
        wide_in, wide_out = self.width(in_features), self.width(out_features)
        return PackedLinear(wide_in, wide_out, m, m * self._subgroups(wide_in, wide_out, False), bias)

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block"):
        m, wide_out = self.num_members, self.width(out_channels)
        if role == "stem":
            return PackedConv2d(in_channels * m, wide_out, kernel_size, m, m, stride, padding)
        wide_in = self.width(in_channels)
        gamma = 1 if role == "entry" else self._subgroups(wide_in, wide_out, True)
        return PackedConv2d(wide_in, wide_out, kernel_size, m, m * gamma, stride, padding)

    def bn(self, num_features):
        return PackedBatchNorm2d(self.width(num_features), self.num_members)

    def enter_images(self, xs):
        # the stem runs one batch every member sees once; else [B, M*C, H, W]
        return xs[0] if shared_batch(xs) else stack_channels(xs)

    def enter_features(self, layer, xs):
        if shared_batch(xs):
            return layer(xs[0].flatten(1))
        return layer(xs.flatten(2).transpose(0, 1).flatten(1))  # [B, M*features]

    def member_batch(self, images, labels, split_batch=False, generator=None):
        """Every member sees the whole batch."""
        x, y, k = images[0], labels[0], self.num_members
        return x.expand(k, *x.shape), y.expand(k, *y.shape)

    def passes_per_example(self, split_batch=False):
        return self.num_members

    @classmethod
    def model_variants(cls, convolutional):
        return [{"alpha": 2.0, "gamma": 1}] + ([{"alpha": 2.0, "gamma": 2}] if convolutional else [])
