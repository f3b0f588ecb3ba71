"""Ensemble layers: BatchEnsemble (rank-1 fast weights) and Deep-Ensemble (stacked) layers.

Every layer here holds the weights of k members and can hand back member i's weights as a
plain layer's state (`member_state(i)`, keys as in `nn.Linear` / `nn.Conv2d` /
`nn.BatchNorm2d`), so that any member can be rebuilt as an ordinary network. Deep-Ensemble
layers also give all members at once as member-first views (`stacked_state()`), which is
what `members.py` runs with vmap or a loop.

Batch layouts (k members, B examples):
- member-major `[k*B, ...]`: rows i*B..(i+1)*B belong to member i. Used by BatchEnsemble
  layers and `EnsembleLinear`.
- channel-stacked `[B, k*C, H, W]`: member i owns channels i*C..(i+1)*C. Used by the
  Deep-Ensemble conv layers, which are grouped convolutions with one group per member, so
  one kernel call runs all members and BatchNorm keeps per-member statistics for free.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EnsdiagError

DEFAULT_FAST_WEIGHT_INIT = "normal:0.5"


def parse_fast_weight_init(spec: str) -> tuple[str, float]:
    """'normal[:std]' | 'ones' | 'random-sign[:p]' -> (kind, parameter)."""
    kind, _, arg = spec.partition(":")
    defaults = {"normal": 0.5, "ones": 0.0, "random-sign": 0.5}
    if kind not in defaults or (kind == "ones" and arg):
        raise EnsdiagError(
            f"unknown BatchEnsemble init (--be-init) {spec!r}; use normal[:std], ones or random-sign[:p]"
        )
    try:
        value = float(arg) if arg else defaults[kind]
    except ValueError:
        raise EnsdiagError(f"BatchEnsemble init (--be-init) {spec!r}: {arg!r} is not a number") from None
    if not math.isfinite(value):
        raise EnsdiagError(f"BatchEnsemble init (--be-init) {spec!r}: {arg!r} is not a finite number")
    if kind == "random-sign" and not 0.0 <= value <= 1.0:
        raise EnsdiagError(f"BatchEnsemble init (--be-init) {spec!r}: p must lie in [0, 1]")
    if kind == "normal" and value < 0:
        raise EnsdiagError(f"BatchEnsemble init (--be-init) {spec!r}: std must be >= 0")
    return kind, value


@torch.no_grad()
def init_fast_weights_(tensor: torch.Tensor, spec: str) -> torch.Tensor:
    """Fill r or s: Normal(1, std) (the original's default), ones, or ±1 with P(+1) = p."""
    kind, value = parse_fast_weight_init(spec)
    if kind == "normal":
        return tensor.normal_(1.0, value)
    if kind == "ones":
        return tensor.fill_(1.0)
    return tensor.bernoulli_(value).mul_(2).sub_(1)


def _default_linear_init_(weight: torch.Tensor, bias: torch.Tensor | None, fan_in: int) -> None:
    """PyTorch's own nn.Linear / nn.Conv2d initialisation, for one member's slice."""
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(bias, -bound, bound)


def _members_first(h, num_members):
    """[B, k*out] (members side by side) -> member-major [k*B, out]."""
    return h.unflatten(1, (num_members, -1)).transpose(0, 1).flatten(0, 1)


def shared_input_linear(layer, x, num_members):
    """Member-major [k*B, out] for input x [B, in] that every member sees.

    Ensemble layers stack their k weight matrices into one wide matmul (better use of the
    cores than k small ones, and no k-fold copy of the input); a plain layer's output is the
    same for every member, so it is computed once."""
    if hasattr(layer, "forward_shared"):
        return layer.forward_shared(x)
    return layer(x).expand(num_members, *x.shape[:-1], -1).flatten(0, 1)


class BatchLinear(nn.Module):
    """BatchEnsemble linear layer: member i uses W ∘ r_i s_iᵀ and its own bias."""

    weight_layer = True

    def __init__(self, in_features, out_features, num_members, bias=True, init=DEFAULT_FAST_WEIGHT_INIT,
                 random_bias=False):
        super().__init__()
        self.in_features, self.out_features, self.num_members = in_features, out_features, num_members
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.r = nn.Parameter(torch.empty(num_members, out_features))
        self.s = nn.Parameter(torch.empty(num_members, in_features))
        # Per-member bias: zero as in the original implementation, or random (the paper's code).
        self.bias = nn.Parameter(torch.zeros(num_members, out_features)) if bias else None
        _default_linear_init_(self.weight, self.bias if random_bias else None, in_features)
        init_fast_weights_(self.r, init)
        init_fast_weights_(self.s, init)

    def fast_weights(self):
        return [self.r, self.s]

    def member_weights(self):
        """[k, out, in]: every member's effective dense weight W ∘ r_i s_iᵀ."""
        return self.weight * self.r[:, :, None] * self.s[:, None, :]

    # Only W ∘ s_i is materialised ([k, out, in], small next to a batch of activations); r_i
    # scales the (narrow) outputs. Against scaling the [k·B, in] inputs by s_i this saves a
    # full-size elementwise pass and, on the first layer, the input-gradient matmul; against
    # materialising W ∘ r_i s_iᵀ it halves the elementwise work on the weights. The numbers
    # are in docs/performance.md.
    def _scaled_weight(self):
        return self.weight * self.s[:, None, :]

    def _output(self, h, r, bias):
        return h * r if bias is None else torch.addcmul(bias, h, r)

    def forward(self, x):
        h = torch.bmm(x.unflatten(0, (self.num_members, -1)), self._scaled_weight().transpose(1, 2))
        bias = None if self.bias is None else self.bias[:, None, :]
        return self._output(h, self.r[:, None, :], bias).flatten(0, 1)

    def forward_shared(self, x):
        """x [B, in], seen by every member -> member-major [k*B, out], as one wide matmul."""
        h = F.linear(x, self._scaled_weight().flatten(0, 1))
        bias = None if self.bias is None else self.bias.flatten()
        return _members_first(self._output(h, self.r.flatten(), bias), self.num_members)

    def member_state(self, i):
        state = {"weight": self.member_weights()[i]}
        if self.bias is not None:
            state["bias"] = self.bias[i]
        return state


class BatchConv2d(nn.Module):
    """BatchEnsemble convolution, channel-wise or kernel-wise.

    channel: input channels scaled by s_i, output channels by r_i, broadcast over space,
             so the shared kernel runs once on the whole member-major batch.
    kernel:  r_i, s_i ∈ R^{Cout×Cin×K} perturb each kernel along its two spatial axes;
             member kernels differ, so all members run as one grouped convolution.
    """

    weight_layer = True

    def __init__(self, in_channels, out_channels, kernel_size, num_members, stride=1, padding=0,
                 bias=False, variant="channel", init=DEFAULT_FAST_WEIGHT_INIT, random_bias=False):
        super().__init__()
        if variant not in ("channel", "kernel"):
            raise EnsdiagError(f"unknown BatchEnsemble variant {variant!r}; use channel or kernel")
        self.in_channels, self.out_channels, self.num_members = in_channels, out_channels, num_members
        self.kernel_size, self.stride, self.padding, self.variant = kernel_size, stride, padding, variant
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        if variant == "channel":
            r_shape, s_shape = (num_members, out_channels), (num_members, in_channels)
        else:
            r_shape = s_shape = (num_members, out_channels, in_channels, kernel_size)
        self.r = nn.Parameter(torch.empty(r_shape))
        self.s = nn.Parameter(torch.empty(s_shape))
        self.bias = nn.Parameter(torch.zeros(num_members, out_channels)) if bias else None
        _default_linear_init_(self.weight, self.bias if random_bias else None, in_channels * kernel_size**2)
        init_fast_weights_(self.r, init)
        init_fast_weights_(self.s, init)

    def fast_weights(self):
        return [self.r, self.s]

    def member_kernels(self):
        """[k, Cout, Cin, K, K]: every member's effective dense kernel."""
        if self.variant == "channel":
            return self.weight * self.r[:, :, None, None, None] * self.s[:, None, :, None, None]
        return self.weight * self.r[..., :, None] * self.s[..., None, :]

    def forward(self, x):
        k = self.num_members
        if self.variant == "channel":
            h = x.unflatten(0, (k, -1)) * self.s[:, None, :, None, None]
            h = F.conv2d(h.flatten(0, 1), self.weight, None, self.stride, self.padding)
            h = h.unflatten(0, (k, -1)) * self.r[:, None, :, None, None]
        else:
            stacked = x.unflatten(0, (k, -1)).transpose(0, 1).flatten(1, 2)  # [B, k*Cin, H, W]
            kernels = self.member_kernels().flatten(0, 1)  # [k*Cout, Cin, K, K]
            h = F.conv2d(stacked, kernels, None, self.stride, self.padding, groups=k)
            h = h.unflatten(1, (k, -1)).transpose(0, 1)  # [k, B, Cout, H', W']
        if self.bias is not None:
            h = h + self.bias[:, None, :, None, None]
        return h.flatten(0, 1)

    def member_state(self, i):
        state = {"weight": self.member_kernels()[i]}
        if self.bias is not None:
            state["bias"] = self.bias[i]
        return state


class _MemberLinear(torch.autograd.Function):
    """y[i] = x[i] W[i]ᵀ + b[i] for x [k, B, in], W [k, out, in], b [k, out] or None.

    Autograd through `baddbmm(b, x, W.transpose(1, 2))` returns W's gradient as the transpose
    of a [k, in, out] product, which the gradient accumulator then copies into W's layout
    (a full pass over the largest weight, every step). Here it is computed as gᵀx, already in
    W's layout; the input gradient is skipped when the input needs none (the first layer)."""

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
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        grad_weight = torch.bmm(grad.transpose(1, 2), x) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(1) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


class EnsembleLinear(nn.Module):
    """k independent linear layers run as one batched matmul on a member-major batch."""

    weight_layer = True

    def __init__(self, in_features, out_features, num_members, bias=True):
        super().__init__()
        self.in_features, self.out_features, self.num_members = in_features, out_features, num_members
        self.weight = nn.Parameter(torch.empty(num_members, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(num_members, out_features)) if bias else None
        for i in range(num_members):  # each member initialised exactly like its own nn.Linear
            _default_linear_init_(self.weight.data[i], None if self.bias is None else self.bias.data[i], in_features)

    def forward(self, x):
        return _MemberLinear.apply(x.unflatten(0, (self.num_members, -1)), self.weight, self.bias).flatten(0, 1)

    def forward_shared(self, x):
        """x [B, in], seen by every member -> member-major [k*B, out], as one wide matmul."""
        bias = None if self.bias is None else self.bias.flatten()
        return _members_first(F.linear(x, self.weight.flatten(0, 1), bias), self.num_members)

    def stacked_state(self):
        state = {"weight": self.weight}
        if self.bias is not None:
            state["bias"] = self.bias
        return state

    def member_state(self, i):
        return {name: tensor[i] for name, tensor in self.stacked_state().items()}


class EnsembleConv2d(nn.Conv2d):
    """k independent convolutions as one grouped convolution on channel-stacked input.

    PyTorch's default init computes fan-in per group, so each member is initialised exactly
    as a plain nn.Conv2d(in_channels, out_channels) would be.
    """

    def __init__(self, in_channels, out_channels, kernel_size, num_members, stride=1, padding=0, bias=False):
        super().__init__(num_members * in_channels, num_members * out_channels, kernel_size,
                         stride=stride, padding=padding, bias=bias, groups=num_members)
        self.num_members, self.member_out = num_members, out_channels

    def stacked_state(self):
        """Member-first views [k, Cout, Cin, K, K] of the grouped weights (no copy)."""
        state = {"weight": self.weight.unflatten(0, (self.num_members, -1))}
        if self.bias is not None:
            state["bias"] = self.bias.unflatten(0, (self.num_members, -1))
        return state

    def member_state(self, i):
        return {name: tensor[i] for name, tensor in self.stacked_state().items()}


class EnsembleBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm over channel-stacked input: every member keeps its own statistics."""

    def __init__(self, num_features, num_members):
        super().__init__(num_members * num_features)
        self.num_members, self.member_features = num_members, num_features

    def stacked_state(self):
        """Member-first views [k, C] of weights and running statistics; the step count is shared."""
        state = {name: getattr(self, name).unflatten(0, (self.num_members, -1))
                 for name in ("weight", "bias", "running_mean", "running_var")}
        return {**state, "num_batches_tracked": self.num_batches_tracked}

    def member_state(self, i):
        return {name: tensor[i] if tensor.dim() else tensor for name, tensor in self.stacked_state().items()}


class MCDropout(nn.Module):
    """Dropout that stays on in eval mode: every pass draws a fresh mask (MC Dropout).

    `in_training=False` trains the network without dropout (a deterministic network, dropout
    only at test time, as the reference paper's text describes)."""

    def __init__(self, p, in_training=True):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise EnsdiagError(f"dropout rate must lie in [0, 1), got {p}")
        self.p, self.in_training = p, in_training

    def forward(self, x):
        if self.training and not self.in_training:
            return x
        return F.dropout(x, self.p, training=True)

    def extra_repr(self):
        return f"p={self.p}, in_training={self.in_training}"


def is_weight_layer(module) -> bool:
    """Whether the module's weights and biases belong to a member's parameter vector (weight cosine):
    plain linear and conv layers, their subclasses, and ensemble layers that say so."""
    return isinstance(module, (nn.Linear, nn.Conv2d)) or getattr(module, "weight_layer", False)
