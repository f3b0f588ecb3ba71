"""torch-uncertainty's checkpoints onto ensdiag's models: BatchEnsemble, Packed-Ensembles, MIMO.

Each function takes one state_dict (plain key names, Lightning's `model.` prefix already gone)
and returns (ModelSpec, ensdiag body state) or None when the keys are not that method's.
- BatchEnsemble (`batched_mlp`, batched ResNet): W in `<layer>.linear.weight` / `.conv.weight`,
  `r_group` [k, in] scales the inputs, `s_group` [k, out] the outputs: ensdiag's r <- s_group,
  s <- r_group; the ResNet is the paper layout (shortcut biases kept, missing block biases 0).
- Packed-Ensembles (`packed_mlp`, packed ResNet): `PackedLinear.weight` [groups, out/g, in/g]
  is ensdiag's [out, in/g]; convolutions in `.conv.weight`. α and the base width only matter
  through their product (the layers' channel counts), so α = 2 is taken where it divides them.
- MIMO (`mimo_mlp`, MIMO ResNet): a plain network whose first layer reads k inputs and whose
  head has k·C outputs; k cannot be told from the shapes alone, so `num_classes` is needed.
"""

import math
import re

import torch

from ..errors import EnsdiagError
from ..nn.model import ModelSpec


def renamed(state, rules):
    out = {}
    for key, value in state.items():
        for pattern, replacement in rules:
            key = re.sub(pattern, replacement, key)
        out[key] = value
    return out


TU_MLP_RULES = [(r"^layers\.([0-9]+)\.", r"hidden.\1."), (r"^final_layer\.", "head.")]
TU_RESNET_RULES = [(r"^linear\.", "fc.")]


def input_shape(features: int) -> tuple[int, ...]:
    """An MLP's input shape: one channel of a square image where the features make one, else the features."""
    side = math.isqrt(features)
    return (1, side, side) if side * side == features else (features,)


def mlp_shape(state):
    weight = state.get("hidden.0.weight")
    return None if weight is None or weight.dim() != 2 else input_shape(weight.shape[1])


def resnet18_layout(state):
    """(input channels, base width) when `state` has ResNet-18's layer names (plain names)."""
    names = {key.rsplit(".", 1)[0] for key in state}
    blocks = {f"layer{s}.{b}" for s in range(1, 5) for b in range(2)}
    if "conv1" not in names or not all(f"{block}.conv1" in names for block in blocks) or "layer1.2.conv1" in names:
        return None
    stem = state["conv1.weight"]
    return stem.shape[1], stem.shape[0]


def batch_ensemble(state, source):
    """(spec, ensdiag state) for a torch-uncertainty BatchEnsemble state_dict, or None."""
    plain = {}
    for key, value in state.items():  # BatchLinear/BatchConv2d wrap W as .linear / .conv; r, s swap roles
        key = re.sub(r"\.(linear|conv)\.weight$", ".weight", key)
        key = re.sub(r"\.r_group$", ".s", key) if key.endswith(".r_group") else re.sub(r"\.s_group$", ".r", key)
        plain[key] = value
    fast = [key for key in state if key.endswith((".r_group", ".s_group"))]
    counts = {key: state[key].shape[0] if state[key].dim() else 0 for key in fast}
    k = counts[fast[0]]
    odd = next((key for key, count in counts.items() if count != k), None)
    if odd is not None or k < 1:
        raise EnsdiagError(f"{source}: BatchEnsemble layers disagree on the number of members ({fast[0]} has {k}, "
                           f"{odd} has {counts.get(odd)}): a damaged or mixed checkpoint")
    if "layers.0.weight" in plain or "final_layer.weight" in plain:
        plain = renamed(plain, TU_MLP_RULES)
        shape = mlp_shape(plain)
        if shape is None or "head.weight" not in plain:
            return None
        return ModelSpec("mlp", "batch-ensemble", k, plain["head.weight"].shape[0], shape, {"layout": "paper"}), plain
    plain = renamed(plain, TU_RESNET_RULES)
    layout = resnet18_layout(plain)
    if layout is None or "fc.weight" not in plain:
        return None
    channels, width = layout
    for name in [f"layer{s}.{b}.conv{c}" for s in range(1, 5) for b in range(2) for c in (1, 2)]:
        plain.setdefault(f"{name}.bias", torch.zeros(k, plain[f"{name}.weight"].shape[0]))  # conv_bias=False: zero
    shortcut_bias = any(re.match(r"layer[0-9]\.[0-9]\.shortcut\.0\.bias$", key) for key in plain)
    spec = ModelSpec("resnet18", "batch-ensemble", k, plain["fc.weight"].shape[0], (channels, 32, 32),
                     {"layout": "paper", "shortcut_bias": shortcut_bias}, {"width": width} if width != 64 else {})
    return spec, plain


def _flat_linear(state):
    """PackedLinear weights [groups, out/g, in/g] as ensdiag stores grouped linear layers: [out, in/g]."""
    return {key: value.flatten(0, 1) if key.endswith("weight") and value.dim() == 3 else value
            for key, value in state.items()}


def grouped(state, source, num_classes=None):
    """(spec, body state) for a torch-uncertainty Packed-Ensembles MLP or CIFAR-style ResNet-18."""
    plain = {re.sub(r"\.conv\.weight$", ".weight", key): value for key, value in state.items()}
    if "layers.0.weight" in plain and plain["layers.0.weight"].dim() == 3:  # packed_mlp
        plain = renamed(_flat_linear(plain), TU_MLP_RULES)
        groups, wide, head = state["layers.1.weight"].shape[0], plain["hidden.0.weight"].shape[0], plain["head.weight"]
        if num_classes is None:
            raise EnsdiagError(f"{source}: a Packed-Ensembles MLP's members and subgroups cannot be told apart from the "
                               f"shapes ({groups} groups, {head.shape[0]} outputs); pass --num-classes")
        members = head.shape[0] // num_classes
        if members < 1 or head.shape[0] % num_classes or groups % members:
            raise EnsdiagError(f"{source}: {head.shape[0]} outputs in {groups} groups do not fit {num_classes} classes")
        head_groups = state["final_layer.weight"].shape[0]
        options = {"alpha": wide / 64, "gamma": groups // members, "head_subgroups": head_groups != members}
        return ModelSpec("mlp", "packed-ensemble", members, num_classes, mlp_shape(plain), options), plain
    if "conv1.weight" not in plain or "linear.weight" not in plain or plain["linear.weight"].dim() != 3:
        return None
    plain = renamed(_flat_linear(plain), TU_RESNET_RULES)
    members, classes = state["linear.weight"].shape[:2]
    if num_classes is not None and num_classes != classes:
        raise EnsdiagError(f"{source}: its head has {classes} classes per member, not --num-classes {num_classes}")
    layout = resnet18_layout(plain)
    if layout is None:
        return None
    wide = plain["conv1.weight"].shape[0]
    # γ as declared: the most subgroups any block's second convolution kept (ensdiag's rule then
    # drops them where torch-uncertainty's did: the same rule, tried from the same start)
    gamma = max(plain[key.replace("conv2", "conv1")].shape[0] // plain[key].shape[1] // members
                for key in plain if key.endswith(".conv2.weight"))
    alpha, width = (2.0, wide // 2) if wide % 2 == 0 else (1.0, wide)
    spec = ModelSpec("resnet18", "packed-ensemble", members, classes, (plain["conv1.weight"].shape[1], 32, 32),
                     {"alpha": alpha, "gamma": max(gamma, 1)}, {"width": width} if width != 64 else {})
    return spec, plain


def multi_input(state, source, num_classes=None):
    """(spec, body state) for a torch-uncertainty MIMO MLP or ResNet-18: one plain network with k inputs
    and k·C outputs (k = outputs / `num_classes`)."""
    if num_classes is None:
        return None
    if "layers.0.weight" in state and "final_layer.weight" in state:
        plain = renamed(state, TU_MLP_RULES)
        arch, head, first = "mlp", plain["head.weight"], plain["hidden.0.weight"]
    elif "conv1.weight" in state and "linear.weight" in state:
        plain = renamed(state, TU_RESNET_RULES)
        arch, head, first = "resnet18", plain["fc.weight"], plain["conv1.weight"]
    else:
        return None
    members = head.shape[0] // num_classes
    if members < 2 or head.shape[0] % num_classes or first.shape[1] % members:
        return None
    inputs = first.shape[1] // members
    if arch == "mlp":
        return ModelSpec("mlp", "mimo", members, num_classes, input_shape(inputs), {}), plain
    layout = resnet18_layout(plain)
    if layout is None:
        return None
    width = first.shape[0]
    return ModelSpec("resnet18", "mimo", members, num_classes, (inputs, 32, 32), {},
                     {"width": width} if width != 64 else {}), plain
