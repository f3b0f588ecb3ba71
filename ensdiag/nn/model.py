"""`EnsembleModel`: the one model type every other part of ensdiag is written against.

    model = build_model("mlp", "batch-ensemble", num_members=4, num_classes=10,
                        input_shape=(1, 28, 28), variant="channel")
    logits = model(x)                          # [k, B, C], every member sees x
    logits = model.forward_members(xs)         # xs [k, B, ...]: member i sees xs[i]
    weights = model.member_weights()           # effective dense conv/linear weights per member
    plain = model.member_state_dict(i)         # member i as a `single` network's state dict
    network = model.member_network(i)          # member i as an independent plain network
"""

import json
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ..errors import EnsdiagError, InputTypeError, unknown
from ..io import UnreadableJson, parse_json
from .architectures import ARCHITECTURES
from .kit import MemberKit
from .layers import is_weight_layer
from .methods import METHODS, resolve_options

DEFAULT_MEMBERS = 4
# Bounds on what a (possibly hostile) stored spec may ask for; far above any real ensemble.
MAX_MEMBERS, MAX_CLASSES, MAX_INPUT_SIDE = 4096, 1_000_000, 4096


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a model; stored as JSON in every checkpoint."""

    arch: str
    method: str
    num_members: int
    num_classes: int
    input_shape: tuple[int, ...]
    options: dict = field(default_factory=dict)
    arch_options: dict = field(default_factory=dict)  # e.g. resnet18's base width; stored only when set

    def to_json(self) -> str:
        data = asdict(self)
        if not data["arch_options"]:
            del data["arch_options"]  # specs without them read as they always did
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelSpec":
        """A stored spec, checked like user input (types, names, ranges) before anything is built."""
        try:
            data = parse_json(text, "model spec")  # bounded nesting: no RecursionError
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            integers = {key: data[key] for key in ("num_members", "num_classes")}
            shape, options, arch_options = data["input_shape"], data.get("options", {}), data.get("arch_options", {})
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in [*integers.values(), *shape]):
                raise TypeError("num_members, num_classes and input_shape must be integers")
            if not all(isinstance(given, dict) and all(isinstance(value, (str, int, float, bool)) for value in given.values())
                       for given in (options, arch_options)):
                raise TypeError("options must map names to plain values")
            spec = cls(arch=str(data["arch"]), method=str(data["method"]), input_shape=tuple(shape),
                       options=dict(options), arch_options=dict(arch_options), **integers)
        except UnreadableJson as error:
            raise EnsdiagError(f"model spec is not valid JSON of the expected form ({error.reason})"[:300]) from None
        except (ValueError, KeyError, TypeError) as error:
            raise EnsdiagError(f"model spec is not valid JSON of the expected form ({error})"[:300]) from None
        spec.validate()
        return spec

    def validate(self) -> tuple[dict, dict]:
        """The spec checked; (the method's options, the architecture's), resolved."""
        builder = ARCHITECTURES.named(self.arch)
        fixed = METHODS.named(self.method).fixed_members
        if not 1 <= self.num_members <= MAX_MEMBERS or (fixed and self.num_members != fixed):
            raise EnsdiagError(f"a {self.method} model cannot have {self.num_members} members (1..{MAX_MEMBERS})")
        if not 2 <= self.num_classes <= MAX_CLASSES:
            raise EnsdiagError(f"num_classes must lie in 2..{MAX_CLASSES}, got {self.num_classes}")
        if not 1 <= len(self.input_shape) <= 3 or not all(1 <= d <= MAX_INPUT_SIDE for d in self.input_shape):
            raise EnsdiagError(f"input_shape must be 1 to 3 sizes in 1..{MAX_INPUT_SIDE}, got {list(self.input_shape)}")
        # convolutional=True: a model saved before kernel-wise was refused on the mlp still loads
        return (resolve_options(self.method, self.options, builder.default_options, True, self.arch),
                resolve_arch_options(self.arch, self.arch_options))


def flush_denormals() -> bool:
    """Treat subnormal floats as zero on the CPU (process-wide; returns whether it is supported).

    With weight decay, BatchEnsemble's fast weights decay into subnormal numbers within a few
    epochs, and x86 arithmetic on subnormals is ~100× slower: inference dropped from about
    500,000 to 7,000 images/s (docs/performance.md). Values that small (< 1.2e-38) change no
    result, so training, prediction and the bench all flush them."""
    return torch.set_flush_denormal(True)


class MemberWeights(list):
    """One {layer.weight: tensor} dict per member, and `scope`: None when the dicts hold the whole
    network, else what they hold (members that share the rest). `initial` ({"mean", "source"} or
    None) is the members' cosine before training, when the caller knows it (geometry/baselines.py)."""

    def __init__(self, members=(), scope: str | None = None):
        super().__init__(members)
        self.scope = scope
        self.initial = None


class EnsembleModel(nn.Module):
    def __init__(self, spec: ModelSpec, kit, body: nn.Module):
        super().__init__()
        self.spec, self.kit, self.body = spec, kit, body
        self.initial_cosine = None  # {"mean", "seed"} recorded at training (model files carry it)
        self.preprocess = None  # (mean, std) per channel of images in [0, 1], recorded at training
        self.holdout = None  # {"seed", "fraction", "train_size"}: the validation examples held out at training
        self.member_strategy = "stacked"  # members stacked | vmap | loop, where the kit offers them (members.py)

    method = property(lambda self: self.spec.method)
    num_members = property(lambda self: self.spec.num_members)
    num_classes = property(lambda self: self.spec.num_classes)

    def forward(self, x):
        """x [B, ...] -> member logits [k, B, C]; every member sees the same batch."""
        return self.forward_members(x.unsqueeze(0).expand(self.num_members, *x.shape))

    def forward_members(self, xs):
        """xs [m, B, ...] -> logits [m, B, C]; member i is fed xs[i].

        m must be k, except for kits whose members share one network (`one_weight_set`: m = 1
        trains it like a single model; any m draws m passes). Where members share a body fed by
        all of them, every member's logits depend on every xs[i]; with one batch for all
        (`forward`) each member is its plain network (`member_network`)."""
        self.kit.check_members(xs.shape[0])
        return self.kit.forward_members(self, xs)

    def member_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Member i as the state dict of the same architecture built as `single`."""
        if hasattr(self.body, "member_module"):  # a body of whole member networks (torchvision)
            return {f"members.0.{key}": value for key, value in self.body.member_module(i).state_dict().items()}
        return {f"{name}.{key}": value for name, module in self.body.named_modules()
                if hasattr(module, "member_state") or next(module.children(), None) is None  # layers, not containers
                for key, value in _member_tensors(module, i).items()}

    def member_network(self, i: int) -> "EnsembleModel":
        """Member i as an independent plain network (a `single` model holding its weights).

        The plain network has the member's widths (`Kit.member_width`: a kit may make its
        members narrower than the architecture). Where the member has a bias the plain
        architecture lacks (the paper's BatchEnsemble layout gives block convolutions
        per-member biases), the plain layer gets one. At other widths than the architecture's
        the result lives in memory only: its spec describes the unscaled network."""
        state = self.member_state_dict(i)
        plain = self.plain_network(biases_of=state)
        plain.load_state_dict({f"body.{key}": value for key, value in state.items()})
        return plain

    def plain_network(self, biases_of: dict | None = None) -> "EnsembleModel":
        """A freshly initialised plain network of the members' architecture and widths, on the
        model's device; with a zero bias wherever `biases_of` (a member state dict) has one the
        plain architecture lacks."""
        kit = MemberKit(self.kit.member_width)
        spec = ModelSpec(self.spec.arch, "single", 1, self.num_classes, self.spec.input_shape,
                         resolve_options("single", {}, {}), self.spec.arch_options)
        plain = EnsembleModel(spec, kit, ARCHITECTURES[spec.arch](kit, spec.num_classes, spec.input_shape,
                                                                  **resolve_arch_options(spec.arch, spec.arch_options)))
        for name, module in plain.body.named_modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)) and module.bias is None and f"{name}.bias" in (biases_of or {}):
                module.bias = nn.Parameter(torch.zeros_like(biases_of[f"{name}.bias"], device="cpu"))
        return plain.to(next(self.parameters()).device)

    def member_weights(self) -> "MemberWeights":
        """Effective dense weights and biases of every conv and linear layer, per weight set.

        One dict per member; single models and MC Dropout have one weight set, so one dict.
        A layer may give its member weights in a compact form that compares the same
        (`distinct_state(i)`: Packed blocks without the zeros between them). Where members share
        part of the network (`kit.weight_scope` says what is compared), only the layers that hold
        member-specific weights count, with what differs between members."""
        scoped = self.kit.weight_scope is not None
        layers = {name: module for name, module in self.body.named_modules() if is_weight_layer(module)
                  and (not scoped or hasattr(module, "member_state"))}
        sets = 1 if self.kit.one_weight_set else self.num_members
        weights = MemberWeights(scope=self.kit.weight_scope)
        with torch.no_grad():
            for i in range(sets):
                member = {}
                if hasattr(self.body, "member_module"):  # whole member networks: each one's own layers
                    layers = {name: module for name, module in self.body.member_module(i).named_modules()
                              if is_weight_layer(module)}
                for name, module in layers.items():
                    member.update({f"{name}.{key}": value.detach().clone()
                                   for key, value in _member_tensors(module, i, distinct=True).items()})
                weights.append(member)
        return weights


def _member_tensors(module, i: int, distinct: bool = False) -> dict:
    """Member i's tensors of a layer: its own where the layer holds every member's (`distinct`: in the compact
    form that compares the same, where the layer gives one), else the layer's shared state."""
    if distinct and hasattr(module, "distinct_state"):
        return module.distinct_state(i)
    return module.member_state(i) if hasattr(module, "member_state") else module.state_dict()


def resolve_arch_options(arch: str, given: dict) -> dict:
    """The architecture's options (declared by `register_arch(..., options=...)`), each checked."""
    declared = {option.name: option for option in ARCHITECTURES[arch].options}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise EnsdiagError(f"architecture {arch!r} takes no option {', '.join(unknown)} "
                           f"(accepted: {', '.join(declared) or 'none'})")
    return {name: option.check(given.get(name, option.default), arch) for name, option in declared.items()}


def build_model(arch: str, method: str, num_members: int | None = None, num_classes: int = 10,
                input_shape=(1, 28, 28), arch_options: dict | None = None, **options) -> EnsembleModel:
    """Build an `EnsembleModel`; options (dropout, variant, init) and architecture options (resnet18's
    `width`) are recorded in its spec."""
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise unknown("architecture", arch, ARCHITECTURES)
    for name, value in (("num_members", num_members), ("num_classes", num_classes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InputTypeError(f"{name} must be a whole number, got {type(value).__name__}")
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, (list, tuple, torch.Size)) or not all(
            isinstance(size, int) and not isinstance(size, bool) for size in input_shape):
        raise InputTypeError(f"input_shape must be a tuple of whole numbers (channels, height, width), got {input_shape!r}"[:200])
    builder = ARCHITECTURES[arch]
    options = resolve_options(method, options, builder.default_options, builder.convolutional, arch)
    fixed = METHODS[method].fixed_members
    if num_members is None:
        num_members = fixed or DEFAULT_MEMBERS
    if fixed and num_members != fixed:
        raise EnsdiagError(f"a {method} model has exactly {fixed} member{'s' if fixed > 1 else ''}, not {num_members}")
    if num_members < 1 or num_classes < 2:
        raise EnsdiagError(f"need at least one member and two classes (got k={num_members}, C={num_classes})")
    given = {name: value for name, value in (arch_options or {}).items()
             if value != getattr(next((o for o in builder.options if o.name == name), None), "default", object())}
    spec = ModelSpec(arch, method, int(num_members), int(num_classes), tuple(int(d) for d in input_shape), options,
                     given)
    return build_from_spec(spec)


def build_from_spec(spec: ModelSpec) -> EnsembleModel:
    options, arch_options = spec.validate()
    kit = METHODS[spec.method](spec.num_members, **options)
    return EnsembleModel(spec, kit, ARCHITECTURES[spec.arch](kit, spec.num_classes, spec.input_shape, **arch_options))
