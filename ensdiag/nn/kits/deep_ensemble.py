"""`deep-ensemble`: k independent networks, vectorised.

Stacked weights, per-member BatchNorm statistics, each member its own shuffle of the data.
Layouts (k members, B examples):
- member-major `[k*B, ...]` for `EnsembleLinear` (one batched matmul);
- channel-stacked `[B, k*C, H, W]` for `EnsembleConv2d`: a grouped convolution with one group
  per member, so one kernel call runs all members and BatchNorm over k·C channels keeps
  per-member statistics for free.
Every layer hands back member i as a plain layer's state (`member_state(i)`) and all members
at once as member-first views (`stacked_state()`), which members.py runs with vmap or a loop.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ..kit import Kit, register_method
from ..layers import default_linear_init_, members_first, stack_channels
from ..members import FORWARDS


class _MemberLinear(torch.autograd.Function):
    """y[i] = x[i] W[i]ᵀ + b[i] for x [k, B, in], W [k, out, in], b [k, out] or None.

    Autograd through `baddbmm(b, x, W.transpose(1, 2))` returns W's gradient as the transpose
    of a [k, in, out] product, which the gradient accumulator then copies into W's layout
    (a full pass over the largest weight, every step). Here it is computed as gᵀx, already in
    W's layout; the input gradient is skipped when the input needs none (the first layer).

    Under autocast the forward's products run in the autocast dtype (bf16) but the saved
    weight is the fp32 parameter; backward runs outside autocast, so it computes in the
    incoming gradient's dtype (autograd casts the weight's gradient back to fp32)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        if bias is None:
            return torch.bmm(x, weight.transpose(1, 2))
        return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight.to(grad.dtype)) if ctx.needs_input_grad[0] else None
        grad_weight = torch.bmm(grad.transpose(1, 2), x.to(grad.dtype)) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(1) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


class _Stacked:
    """A layer that holds its members' tensors stacked (`stacked_state()`: member-first views): member i is
    their i-th slices (a shared scalar, such as BatchNorm's step count, as it is)."""

    def member_state(self, i):
        return {name: tensor[i] if tensor.dim() else tensor for name, tensor in self.stacked_state().items()}


class EnsembleLinear(_Stacked, nn.Module):
    """k independent linear layers run as one batched matmul on a member-major batch."""

    weight_layer = True

    def __init__(self, in_features, out_features, num_members, bias=True):
        super().__init__()
        self.in_features, self.out_features, self.num_members = in_features, out_features, num_members
        self.weight = nn.Parameter(torch.empty(num_members, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(num_members, out_features)) if bias else None
        for i in range(num_members):  # each member initialised exactly like its own nn.Linear
            default_linear_init_(self.weight.data[i], None if self.bias is None else self.bias.data[i], in_features)

    def forward(self, x):
        return _MemberLinear.apply(x.unflatten(0, (self.num_members, -1)), self.weight, self.bias).flatten(0, 1)

    def forward_shared(self, x):
        """x [B, in], seen by every member -> member-major [k*B, out], as one wide matmul."""
        bias = None if self.bias is None else self.bias.flatten()
        return members_first(F.linear(x, self.weight.flatten(0, 1), bias), self.num_members)

    def stacked_state(self):
        state = {"weight": self.weight}
        if self.bias is not None:
            state["bias"] = self.bias
        return state


class EnsembleConv2d(_Stacked, nn.Conv2d):
    """k independent convolutions as one grouped convolution on channel-stacked input.

    PyTorch's default init computes fan-in per group, so each member is initialised exactly
    as a plain nn.Conv2d(in_channels, out_channels) would be.
    """

    def __init__(self, in_channels, out_channels, kernel_size, num_members, stride=1, padding=0, bias=False):
        super().__init__(num_members * in_channels, num_members * out_channels, kernel_size,
                         stride=stride, padding=padding, bias=bias, groups=num_members)
        self.num_members = num_members

    def stacked_state(self):
        """Member-first views [k, Cout, Cin, K, K] of the grouped weights (no copy)."""
        state = {"weight": self.weight.unflatten(0, (self.num_members, -1))}
        if self.bias is not None:
            state["bias"] = self.bias.unflatten(0, (self.num_members, -1))
        return state


class EnsembleBatchNorm2d(_Stacked, nn.BatchNorm2d):
    """BatchNorm over channel-stacked input: every member keeps its own statistics."""

    def __init__(self, num_features, num_members):
        super().__init__(num_members * num_features)
        self.num_members = num_members

    def stacked_state(self):
        """Member-first views [k, C] of weights and running statistics; the step count is shared."""
        state = {name: getattr(self, name).unflatten(0, (self.num_members, -1))
                 for name in ("weight", "bias", "running_mean", "running_var")}
        return {**state, "num_batches_tracked": self.num_batches_tracked}


@register_method("deep-ensemble")
class DeepEnsembleKit(Kit):
    """k independent networks: stacked weights, per-member BatchNorm statistics, each member its
    own shuffle of the data; members run stacked, with vmap or in a loop (members.py)."""

    label = "Deep Ensemble"
    order = 20
    independent_members = own_weights = True
    reference_separate_members = True
    strategies = ("stacked", "vmap", "loop")

    def passes_per_example(self, split_batch=False):
        return self.num_members

    def data_orders(self):
        return self.num_members

    def forward_members(self, model, xs):
        if model.member_strategy != "stacked":
            return FORWARDS[model.member_strategy](model, xs)
        return super().forward_members(model, xs)

    def linear(self, in_features, out_features, bias=True, role="hidden"):
        return EnsembleLinear(in_features, out_features, self.num_members, bias=bias)

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block", bias=False):
        return EnsembleConv2d(in_channels, out_channels, kernel_size, self.num_members, stride, padding, bias)

    def bn(self, num_features):
        return EnsembleBatchNorm2d(num_features, self.num_members)

    def enter_images(self, xs):
        return stack_channels(xs)  # [B, k*C, H, W]

    def pooled_features(self, h):
        return members_first(h.mean(dim=(2, 3)), self.num_members)  # [B, k*F] -> [k*B, F]
