"""Helpers every method's layers share (the layers themselves live with their method in nn/kits/).

Batch layouts (k members, B examples): member-major `[k*B, ...]` means rows i*B..(i+1)*B
belong to member i; "side by side" `[B, k*F]` means member i owns features i*F..(i+1)*F.
"""

import math

import torch
from torch import nn

def default_linear_init_(weight: torch.Tensor, bias: torch.Tensor | None, fan_in: int) -> None:
    """PyTorch's own nn.Linear / nn.Conv2d initialisation, for one member's slice."""
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(bias, -bound, bound)


def members_first(h, num_members):
    """[B, k*out] (members side by side) -> member-major [k*B, out]."""
    return h.unflatten(1, (num_members, -1)).transpose(0, 1).flatten(0, 1)


def stack_channels(xs):
    """Member images [k, B, C, H, W] -> [B, k*C, H, W], members side by side along the channels
    (grouped convolutions). Channels-last members give a channels-last result: stacking
    interleaves them, so it copies once, straight into the layout the convolutions want (a plain
    flatten would copy into NCHW and the first convolution would convert it back)."""
    if xs.shape[2] > 1 and xs.flatten(0, 1).is_contiguous(memory_format=torch.channels_last):
        k, b, c, h, w = xs.shape
        return xs.permute(1, 3, 4, 0, 2).reshape(b, h, w, k * c).permute(0, 3, 1, 2)
    return xs.transpose(0, 1).flatten(1, 2)


def member_rows(layer, i, names=("weight", "bias")) -> dict:
    """Member i's block of rows of the layer's tensors `names` (members side by side along the first axis),
    those the layer has."""
    return {name: getattr(layer, name).chunk(layer.num_members)[i] for name in names if getattr(layer, name) is not None}


def shared_input_linear(layer, x, num_members):
    """Member-major [k*B, out] for input x [B, in] that every member sees.

    Ensemble layers stack their k weight matrices into one wide matmul (better use of the
    cores than k small ones, and no k-fold copy of the input); a plain layer's output is the
    same for every member, so it is computed once."""
    if hasattr(layer, "forward_shared"):
        return layer.forward_shared(x)
    return layer(x).expand(num_members, *x.shape[:-1], -1).flatten(0, 1)


# BatchNorm, LayerNorm, GroupNorm, InstanceNorm, RMSNorm: their scales start at 1 and their shifts at 0 in every
# member, by construction, so they say nothing of how members differ
NORMALISATION = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)


def function_parameters(network: nn.Module) -> list[str]:
    """The names of a network's floating-point parameters that carry its function: every one but the
    normalisation layers' scales and shifts (`NORMALISATION`). What weight cosine compares, in the
    weight-similarity and alignment analyzers alike."""
    return [f"{owner}.{name}" if owner else name for owner, module in network.named_modules()
            if not isinstance(module, NORMALISATION)
            for name, value in module.named_parameters(recurse=False) if value.is_floating_point()]


def is_weight_layer(module) -> bool:
    """Whether the module's weights and biases belong to a member's parameter vector (weight cosine):
    plain linear and conv layers, their subclasses, and ensemble layers that say so."""
    return isinstance(module, (nn.Linear, nn.Conv2d)) or getattr(module, "weight_layer", False)
