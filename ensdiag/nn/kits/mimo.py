"""MIMO (Havasi et al., ICLR 2021): M members that share one network but its input and output.

    model = build_model("resnet18", "mimo", num_members=3, input_repetition=0.0, batch_repetition=4)

The M members' inputs are concatenated along the channels (the MLP: along the features) into
the first layer, one shared body follows, and the head has M·C outputs, C per member. At test
time every member gets the same image, so member i is exactly a plain network whose first
layer is the sum of the M input blocks and whose head is member i's rows (`member_network(i)`).

Training, as the authors' code (uncertainty-baselines) does it: a step draws B/r distinct
examples (B = --batch-size, r = `batch_repetition`), so an epoch has r times the steps; they
are repeated r times into B rows and shuffled once; each member reshuffles the first
(1 − ρ)·B rows for itself and keeps the last ρ·B rows (ρ = `input_repetition`) in the shared
order, so all members see the same example there. The loss is the sum over members of their
mean cross-entropies. (torch-uncertainty's MIMOBatchFormat builds the same rows from a whole
loader batch, making each step r times larger instead.)

The members' weights differ only in the input and output layers; the weight similarity
compares those (member i's input block and head rows) and reports say so.
"""

import torch
from torch import nn

from ..kit import Kit, Option, register_method
from ..layers import member_rows, members_first, stack_channels


class _MembersIn:
    """A first layer whose input is the M members' side by side: member i owns a block of its weight's columns."""

    def member_state(self, i):
        """What member i computes when every member gets the same input: the blocks summed."""
        state = {"weight": self.weight.unflatten(1, (self.num_members, -1)).sum(1)}
        return state if self.bias is None else {**state, "bias": self.bias}

    def distinct_state(self, i):
        return {"weight": self.weight.unflatten(1, (self.num_members, -1))[:, i]}


class MIMOInputLinear(_MembersIn, nn.Linear):
    """The first linear layer over M members' features side by side [B, M*in]."""

    def __init__(self, in_features, out_features, num_members, bias=True):
        super().__init__(in_features * num_members, out_features, bias)
        self.num_members = num_members


class MIMOStem(_MembersIn, nn.Conv2d):
    """The first convolution over M members' images stacked along the channels [B, M*C, H, W]."""

    def __init__(self, in_channels, out_channels, kernel_size, num_members, stride=1, padding=0):
        super().__init__(in_channels * num_members, out_channels, kernel_size, stride, padding, bias=False)
        self.num_members = num_members


class MIMOHead(nn.Linear):
    """M·C outputs, C per member -> member-major logits [M*B, C]."""

    def __init__(self, in_features, out_features, num_members, bias=True):
        super().__init__(in_features, out_features * num_members, bias)
        self.num_members = num_members

    def forward(self, h):
        return members_first(super().forward(h), self.num_members)

    def member_state(self, i):
        return member_rows(self, i)


def mimo_rows(batch_size, num_members, input_repetition, batch_repetition, generator, device):
    """[M, r·b] row indices into a batch of b examples: one shuffled order of the b examples
    repeated r times, kept for the last ρ·r·b rows by every member, reshuffled per member before."""
    rows = torch.arange(batch_size, device=device).repeat(batch_repetition)
    main = rows[torch.randperm(len(rows), generator=generator, device=device)]
    cut = int(len(main) * (1.0 - input_repetition))
    own = [main[:cut][torch.randperm(cut, generator=generator, device=device)] for _ in range(num_members)]
    return torch.stack([torch.cat([mine, main[cut:]]) for mine in own])


@register_method("mimo")
class MIMOKit(Kit):
    label = "MIMO"
    conv_bias = False  # its convolutions carry the biases its own layout defines
    order = 50
    declared = (Option("input_repetition", 0.0, "probability ρ that all members see the same example in training",
                       float, low=0.0, high=1.0, closed=True),
                Option("batch_repetition", 4, "times each batch is repeated, each member shuffling it (r)", int,
                       low=1, high=64))
    weight_scope = "input and output layers only; the members share the body"

    def linear(self, in_features, out_features, bias=True, role="hidden"):
        if role == "input":
            return MIMOInputLinear(in_features, out_features, self.num_members, bias)
        if role == "head":
            return MIMOHead(in_features, out_features, self.num_members, bias)
        return nn.Linear(in_features, out_features, bias=bias)

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block"):
        if role == "stem":
            return MIMOStem(in_channels, out_channels, kernel_size, self.num_members, stride, padding)
        return super().conv(in_channels, out_channels, kernel_size, stride, padding, role)

    def enter_images(self, xs):
        return stack_channels(xs)  # [B, M*C, H, W]

    def enter_features(self, layer, xs):
        return layer(xs.flatten(2).transpose(0, 1).flatten(1))  # [B, M*features]

    def examples_per_batch(self, batch_size):
        return max(1, batch_size // self.options["batch_repetition"])

    def member_batch(self, images, labels, split_batch=False, generator=None):
        x, y = images[0], labels[0]
        rows = mimo_rows(len(y), self.num_members, self.options["input_repetition"],
                         self.options["batch_repetition"], generator, y.device)
        return x[rows], y[rows]

    def passes_per_example(self, split_batch=False):
        return self.num_members * self.options["batch_repetition"]
