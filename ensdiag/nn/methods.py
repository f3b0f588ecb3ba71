"""Ensemble methods as layer kits: one architecture definition serves every method.

An architecture (`architectures.py`) asks its kit for each layer (`linear`, `conv`, `bn`,
`dropout`) and for the batch layout (`enter_images`, `pooled_features`). A kit decides what
those are: plain layers for `single`, always-on dropout for `mc-dropout`, stacked
independent layers for `deep-ensemble`, rank-1 fast-weight layers for `batch-ensemble`.
Because every kit builds modules under the same attribute names, member i of any method
loads straight into the `single` network (see `EnsembleModel.member_state_dict`).

Newer methods live in modules of their own (nn/kits/), each registering itself.

A kit also owns what training needs to know of its method (kit.py): how many data orders an
epoch draws, how a batch reaches the members, the loss reduction over members, which
parameters take no weight decay, how members are run, and its report label and run variants.
Register a new method with `@register_method("name")` on a Kit subclass.
"""

from torch import nn

from ..errors import EnsdiagError
from .kit import METHODS, Kit, Option, register_method
from .layers import (DEFAULT_FAST_WEIGHT_INIT, BatchConv2d, BatchLinear, EnsembleBatchNorm2d,
                     EnsembleConv2d, EnsembleLinear, MCDropout, parse_fast_weight_init)
from .members import FORWARDS

BE_LAYOUTS = ("original", "paper")
__all__ = ["METHODS", "register_method", "members_for", "run_methods", "run_label", "resolve_options",
           "parse_method_options"]


@register_method("single")
class SingleKit(Kit):
    label = "Single"
    one_weight_set = True
    fixed_members = 1

    def check_members(self, m):
        if m != 1:
            raise ValueError("a single model takes inputs for exactly one member")


@register_method("mc-dropout")
class MCDropoutKit(Kit):
    """One network whose dropout stays active at test time; members are stochastic passes.

    Option `train_dropout`: dropout also on in training (True: torch-uncertainty's MC Dropout,
    which the reference paper's numbers came from) or off (False: the paper's text)."""

    label = "MC Dropout"
    declared = (Option("dropout", None, "dropout rate (default: the architecture's, the paper's 0.05 / 0.1)",
                       float, low=0.0, high=1.0, flag="--dropout"),
                Option("train_dropout", True, "dropout on in training too (torch-uncertainty) or only at test time",
                       bool))
    one_weight_set = True

    @classmethod
    def options_from(cls, config) -> dict:
        return {"dropout": config.dropout, "train_dropout": config.mc_dropout_train == "on", **super().options_from(config)}

    def dropout(self):
        return MCDropout(self.options["dropout"], in_training=self.options["train_dropout"])


@register_method("deep-ensemble")
class DeepEnsembleKit(Kit):
    """k independent networks: stacked weights, per-member BatchNorm statistics, each member its
    own shuffle of the data; members run stacked, with vmap or in a loop (members.py)."""

    label = "Deep Ensemble"
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

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block"):
        return EnsembleConv2d(in_channels, out_channels, kernel_size, self.num_members, stride, padding)

    def bn(self, num_features):
        return EnsembleBatchNorm2d(num_features, self.num_members)

    def enter_images(self, xs):
        return xs.transpose(0, 1).flatten(1, 2)  # [B, k*C, H, W]

    def pooled_features(self, h):
        pooled = h.mean(dim=(2, 3))  # [B, k*F]
        return pooled.unflatten(1, (self.num_members, -1)).transpose(0, 1).flatten(0, 1)


@register_method("batch-ensemble")
class BatchEnsembleKit(Kit):
    """Shared weights with rank-1 fast weights per member; BatchNorm shared (as the original).

    Two layouts (option `layout`):
    - `original` (the original implementation's): per-member biases start at zero; every
      convolution, shortcuts included, is perturbed; convolutions have no bias.
    - `paper` (the code the reference paper's numbers came from): per-member biases start
      random (uniform ±1/√fan_in, like nn.Linear's); the blocks' 3×3 convolutions carry
      per-member biases; shortcut convolutions are plain shared convolutions, not perturbed.
      ResNet-18 (k = 4, 10 classes) then has the paper's 11.22 M parameters."""

    label = "BatchEnsemble"
    declared = (Option("variant", "channel", "convolutions perturbed channel-wise or kernel-wise",
                       choices=("channel", "kernel"), flag="--be-variant"),
                Option("init", DEFAULT_FAST_WEIGHT_INIT, "fast-weight initialisation: normal[:std], ones, random-sign[:p]",
                       parse=parse_fast_weight_init, flag="--be-init"),
                Option("layout", "original", "bias and shortcut layout: original or the paper's",
                       choices=BE_LAYOUTS, flag="--be-layout"),
                Option("loss", "mean", "cross-entropy averaged over all k·B rows, or summed over members",
                       choices=("mean", "sum"), flag="--be-loss"))

    @classmethod
    def check_options(cls, options, convolutional, arch):
        if options["variant"] == "kernel" and not convolutional:
            raise EnsdiagError(f"kernel-wise BatchEnsemble perturbs convolution kernels and {arch} has none: it would "
                               "be the channel-wise model under another name; use the channel variant")
    run_variants = {"batch-ensemble-channel": ({"variant": "channel"}, "BatchEnsemble (C)"),
                    "batch-ensemble-kernel": ({"variant": "kernel"}, "BatchEnsemble (K)")}

    @classmethod
    def options_from(cls, config) -> dict:
        return {"variant": config.be_variant, "init": config.be_init, "layout": config.be_layout, "loss": config.be_loss,
                **super().options_from(config)}

    def member_batch(self, images, labels, split_batch=False, generator=None):
        """Every member sees the whole batch (repeated k times), or in the original split mode
        member i gets its own B/k slice."""
        x, y, k = images[0], labels[0], self.num_members
        if split_batch:
            usable = len(x) - len(x) % k
            return x[:usable].unflatten(0, (k, -1)), y[:usable].unflatten(0, (k, -1))
        return x.expand(k, *x.shape), y.expand(k, *y.shape)

    def passes_per_example(self, split_batch=False):
        return 1 if split_batch else self.num_members

    @classmethod
    def model_variants(cls, convolutional):
        kinds = ("channel", "kernel") if convolutional else ("channel",)  # kernel-wise perturbs convolutions
        return [{"variant": v, "layout": layout} for v in kinds for layout in ("paper", "original")]

    def parameter_groups(self, model, config) -> list[dict]:
        """The fast weights r, s in a group of their own, decayed only if the run says so (the
        paper's stack did; the original did not)."""
        fast = [p for module in model.modules() if hasattr(module, "fast_weights") for p in module.fast_weights()]
        return [{"params": fast, "weight_decay": config.weight_decay if config.be_fast_weight_decay else 0.0}]

    @property
    def loss_over_members(self):
        """"mean" (the original and torch-uncertainty: mean CE over all k·B rows) or "sum"
        (ensdiag before 0.2, kept so that runs started then resume as they began)."""
        return self.options["loss"]

    @property
    def paper_layout(self):
        return self.options["layout"] == "paper"

    def linear(self, in_features, out_features, bias=True, role="hidden"):
        return BatchLinear(in_features, out_features, self.num_members, bias=bias, init=self.options["init"],
                           random_bias=self.paper_layout)

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block"):
        if self.paper_layout and role == "shortcut":
            return nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=False)
        bias = self.paper_layout and role in ("entry", "block")
        return BatchConv2d(in_channels, out_channels, kernel_size, self.num_members, stride, padding, bias=bias,
                           variant=self.options["variant"], init=self.options["init"], random_bias=bias)


def members_for(method: str, k: int) -> int:
    """The number of members a run of `method` builds with `--members k` (single: always 1)."""
    return METHODS[method].fixed_members or k


def run_methods() -> dict[str, tuple[str, dict]]:
    """Run name -> (method, fixed options): every method, and the variants kits declare."""
    runs = {name: (name, {}) for name in METHODS}
    for name, kit in METHODS.items():
        runs.update({run: (name, fixed) for run, (fixed, _) in kit.run_variants.items()})
    return runs


def run_label(run: str) -> str:
    """How reports name a run: the kit's label, or its variant's."""
    for kit in METHODS.values():
        if run in kit.run_variants:
            return kit.run_variants[run][1]
    return METHODS[run].label if run in METHODS else run


def parse_method_options(pairs) -> dict[str, dict]:
    """`--option METHOD.NAME=VALUE` pairs -> {method: {name: value}}, each value parsed and checked
    against the option's declaration."""
    parsed: dict[str, dict] = {}
    for pair in pairs or ():
        target, equals, text = pair.partition("=")
        method, dot, name = target.partition(".")
        if not equals or not dot:
            raise EnsdiagError(f"--option takes METHOD.NAME=VALUE, got {pair!r}")
        if method not in METHODS:
            raise EnsdiagError(f"--option {pair!r}: unknown method {method!r}; choose from {', '.join(METHODS)}")
        declared = {option.name: option for option in METHODS[method].declared}
        if name not in declared:
            raise EnsdiagError(f"--option {pair!r}: {method} has no option {name!r} "
                               f"(it has: {', '.join(declared) or 'none'})")
        parsed.setdefault(method, {})[name] = declared[name].from_text(text, method)
    return parsed


def resolve_options(method: str, given: dict, arch_defaults: dict, convolutional: bool = True,
                    arch: str = "this architecture") -> dict:
    """The method's full option dict: given values over architecture and method defaults."""
    if method not in METHODS:
        raise EnsdiagError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    allowed = METHODS[method].options
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        accepted = ", ".join(allowed) or "none"
        raise EnsdiagError(f"method {method!r} takes no option {', '.join(unknown)} (accepted: {accepted})")
    options = {name: given.get(name, arch_defaults.get(name, default)) for name, default in allowed.items()}
    for option in METHODS[method].declared:  # each value against its one declaration
        options[option.name] = option.check(options[option.name], method)
    METHODS[method].check_options(options, convolutional, arch)
    return options
