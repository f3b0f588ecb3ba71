"""A list of `nn.Module` members (each maps a batch [B, …] to logits [B, C]), and what every
adapter of user modules shares: member weights declared by the user, the plain-network view
geometry reads, CKA's layers.

Members that share parameter storage (k views of one BatchEnsemble, the same module twice) are
detected: comparing their parameters would compare one set of weights with itself (cosine 1,
CKA 1, barrier 0 — artefacts, not findings), so weight-space, path, rank and representation
numbers are skipped with the reason, unless the user declares each member's effective weights
(`member_weights=`), which then give weight cosine and rank.
"""

import copy
from types import SimpleNamespace

import torch
from torch import nn

from ..errors import EnsdiagError, InputTypeError, Skip
from ..nn.layers import function_parameters
from ..nn.model import MemberWeights
from .base import Ensemble, adapter, seeded

LAYOUTS = ("channels-first", "channels-last", "tokens")
DECLARE = ("declare each member's effective weights (ensdiag.as_ensemble(…, member_weights=…), or a member_weights() method "
           "on your module; docs/own-models.md: 'Your own BatchEnsemble')")


class Member(nn.Module):
    """One member as ensdiag's geometry reads a plain network: logits [1, B, C], its weights
    under `body.`, and its representation points."""

    def __init__(self, module: nn.Module, layers: dict):
        super().__init__()
        self.body = module
        self.spec = SimpleNamespace(arch=f"user module {type(module).__name__}")
        self.layers = layers

    def forward(self, x):
        return self.body(x).unsqueeze(0)

    def representation_points(self) -> dict:
        return {name: (self.body.get_submodule(name), layout) for name, layout in self.layers.items()}


def declared_weights(function, k: int | None):
    """`MemberWeights` from the user's `member_weights` function: k dicts {name: tensor}, one set of
    names and shapes, floating point."""
    found = function()
    if not isinstance(found, (list, tuple)) or not found or not all(isinstance(d, dict) and d for d in found):
        raise InputTypeError("member_weights must return a list with one {name: tensor} dict per member")
    if k is not None and len(found) != k:
        raise EnsdiagError(f"member_weights gave {len(found)} weight sets for {k} members")
    names = {key: value.shape for key, value in found[0].items() if isinstance(value, torch.Tensor)}
    for i, weights in enumerate(found):
        if not all(isinstance(key, str) and isinstance(value, torch.Tensor) and value.is_floating_point()
                   for key, value in weights.items()):
            raise InputTypeError(f"member_weights: member {i}'s dict must map names to floating-point tensors")
        if {key: value.shape for key, value in weights.items()} != names:
            raise EnsdiagError(f"member_weights: member {i} has other names or shapes than member 0")
    return MemberWeights([{key: value.detach().clone() for key, value in weights.items()} for weights in found])


def shared_storage(members) -> str | None:
    """How two members share parameters ("member 0's 'w' overlaps member 1's 'w'"), or None: the
    memory their parameters occupy overlaps. Disjoint slices of one buffer (stacked member states,
    flat-parameter optimisers) share storage but no parameter, and are not flagged; a module listed
    twice, or views of one module, are."""
    spans = []  # (first byte, end, member, name) of every parameter with memory of its own
    for i, member in enumerate(members):
        for name, parameter in member.named_parameters():
            if parameter.numel() == 0 or parameter.device.type == "meta":
                continue
            start = parameter.data_ptr()
            spans.append((start, start + parameter.numel() * parameter.element_size(), i, name))
    spans.sort()
    reach = None  # the span reaching furthest so far
    for span in spans:
        if reach is not None and span[0] < reach[1] and span[2] != reach[2]:
            return f"member {reach[2]}'s {reach[3]!r} overlaps member {span[2]}'s {span[3]!r}"
        if reach is None or span[1] > reach[1]:
            reach = span
    return None


class ModuleEnsemble(Ensemble):
    """k `nn.Module` members; the user's modules are read, never moved or re-moded."""

    own_weights = True
    method = "user modules"

    def __init__(self, members, layers=None, member_weights=None):
        members = tuple(members)
        for i, member in enumerate(members):
            if any(member is other for other in members[:i]):
                raise EnsdiagError(f"member {i} is member {next(j for j, other in enumerate(members) if other is member)} "
                                   "(the same module object): one member given twice would count as two; give each "
                                   "member once")
        if member_weights is not None and not callable(member_weights):
            raise InputTypeError("member_weights must be a function returning one {name: tensor} dict per member")
        super().__init__(len(members), self._forward_members, members)
        self.members = members
        self.layers = user_layers(members[0], layers)
        for member in members[1:]:
            missing = [name for name in self.layers if not _has(member, name)]
            if missing:
                raise EnsdiagError(f"layer {missing[0]!r} is not a module of every member")
        self.declared, self.weights_skip, self.networks_skip = member_weights, None, None
        shared = shared_storage(members)
        layouts = {tuple((key, tuple(value.shape)) for key, value in member.state_dict().items()) for member in members}
        self.own_weights = shared is None and len(layouts) == 1
        if shared is not None:
            self.networks_skip = (f"the members share parameter storage ({shared}): paths, CKA and alignment would "
                                  "read one network; give k separate modules, or " + DECLARE + " for weight cosine")
            self.weights_skip = (None if member_weights is not None else
                                 f"the members share parameter storage ({shared}), so their parameters are not their "
                                 f"effective weights: {DECLARE}")
        elif len(layouts) > 1:
            self.networks_skip = ("the members have different layers or shapes (other architectures or widths): a path "
                                  "between them, CKA and alignment need members of one architecture")
        self.devices = [next(member.parameters(), torch.empty(0)).device for member in members]

    def _forward_members(self, x):
        first = self.devices[0]
        outputs = [member(x if device == x.device else x.to(device)) for member, device in zip(self.members, self.devices)]
        for i, output in enumerate(outputs):
            if not isinstance(output, torch.Tensor):
                raise InputTypeError(f"member {i} returned a {type(output).__name__}, not a logits tensor [B, C] "
                                     "(wrap it, e.g. lambda x: net(x)[0])")
            if output.dim() != 2:
                raise EnsdiagError(f"member {i} returned logits of shape {tuple(output.shape)}: every member must map "
                                   "a batch [B, …] to logits [B, C]")
            if output.shape != outputs[0].shape:
                raise EnsdiagError(f"member {i} returned logits of shape {tuple(output.shape)}, member 0 "
                                   f"{tuple(outputs[0].shape)}: every member must give logits over the same classes")
        return torch.stack([output.to(first) for output in outputs])

    def _weights(self):
        if self.declared is not None:
            return declared_weights(self.declared, self.num_members)
        # each member's floating-point parameters that carry its function (`nn.layers.function_parameters`:
        # normalisation layers' scales and shifts left out, as the alignment analyzer leaves them out) and that
        # every member has under the same name and shape; what is compared is said (`MemberWeights.scope`)
        states = [dict(member.named_parameters()) for member in self.members]
        carrying = [set(function_parameters(member)) for member in self.members]
        shared = [key for key, value in states[0].items() if value.is_floating_point()
                  and all(key in kept for kept in carrying)
                  and all(key in state and state[key].shape == value.shape for state in states[1:])]
        if not shared:
            raise Skip("the members have no parameter in common (by name and shape) outside normalisation layers: "
                       "their weights cannot be compared")
        every = {key for state in states for key in state}
        normalisation = {key for state, kept in zip(states, carrying) for key in state if key not in kept}
        parts = ([f"{len(shared)} of {len(every - normalisation)} parameters, those every member has under the same "
                  "name and shape"] if len(shared) < len(every - normalisation) else [])
        if normalisation:
            parts.append(NORMALISATION_LEFT_OUT)
        return MemberWeights([{key: state[key].detach().clone() for key in shared} for state in states],
                             "; ".join(parts) or None)

    def _network(self, i: int):
        return Member(copy.deepcopy(self.members[i]), self.layers).eval()

    def untrained_members(self, count: int, seed: int = 0) -> list | None:
        """Copies of member 0 with every submodule re-initialised by its own `reset_parameters()`,
        seeded: the aligned cosine's null baseline (for modules that declare a permutation rule)."""
        if self.networks_skip:
            return None
        with seeded(self, seed):
            networks = []
            for _ in range(count):
                network = Member(copy.deepcopy(self.members[0]), self.layers).eval()
                for module in network.body.modules():
                    if callable(getattr(module, "reset_parameters", None)):
                        module.reset_parameters()
                networks.append(network)
        return networks


NORMALISATION_LEFT_OUT = "normalisation layers' scales and shifts left out (they start at 1 and 0 in every member)"


def _has(module, name) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def default_layers(module: nn.Module) -> list[str]:
    """The top-level children that have parameters of their own (anywhere inside them): what CKA reads
    when the user names no layers. A parameter-free child (Dropout, Identity, an activation, pooling,
    Flatten) passes on its input's representation unchanged or elementwise, so its CKA would only
    repeat the layer before it."""
    return [name for name, child in module.named_children() if next(child.parameters(), None) is not None]


def user_layers(module, layers) -> dict:
    """{name: layout} from the user's `layers` (names, or {name: layout}), or `default_layers`."""
    if layers is None:
        layers = default_layers(module)
    if isinstance(layers, str) or not isinstance(layers, (dict, list, tuple, set)):
        raise InputTypeError(f"layers must be a list of module names or {{name: layout}}, got {type(layers).__name__}")
    if not isinstance(layers, dict):
        layers = {name: None for name in layers}
    for name, layout in layers.items():
        if not isinstance(name, str) or not _has(module, name):
            raise EnsdiagError(f"layer {name!r} is not a module of the members (named_modules() lists them)")
        if layout is not None and layout not in LAYOUTS:
            raise EnsdiagError(f"layer {name!r}: layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    return dict(layers)


@adapter("a list of nn.Modules", order=30)
def _module_list(obj, hints):
    if isinstance(obj, (list, tuple, nn.ModuleList)) and len(obj) and all(isinstance(m, nn.Module) for m in obj):
        if hints.get("num_members") not in (None, len(obj)):
            raise EnsdiagError(f"num_members = {hints['num_members']} but {len(obj)} member modules were given")
        return ModuleEnsemble(obj, hints.get("layers"), hints.get("member_weights"))
    return None
