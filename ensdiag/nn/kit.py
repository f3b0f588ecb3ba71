"""The base of every method's kit: plain layers, and what training asks of a method.

A kit builds an architecture's layers (`linear`, `conv`, `bn`, `dropout`, and the batch
layout `enter_images` / `pooled_features`) and answers what training, prediction and reports
need to know of its method, so that none of them names a method:
- `data_orders()`: independent shuffles per epoch (1, or k for members with their own data);
- `examples_per_batch(batch_size)`: distinct examples a training step draws (a method that
  repeats examples inside a step draws fewer);
- `member_batch(images, labels, generator=...)`: how an index-gathered batch `[m, b, ...]` reaches
  the members (random choices, such as per-member shuffles, draw from the run's generator);
- `loss_over_members`: "sum" or "mean" of the members' mean cross-entropies;
- `parameter_groups(model, config)`: parameters the optimiser treats apart (weight decay);
- `check_members(m)` and `forward_members(model, xs)`: how members run;
- `label`, `run_variants`, `options_from(config)`: names in reports, extra run names
  (a method with fixed options), and the method's options taken from a run's config;
- `make_scheduler(optimizer, config)`, `end_epoch(model, epoch, epochs)`, `early_stopping`:
  a procedural ensemble's own schedule and the hook that captures members along the run;
- `member_width(width)`: a member's width where the architecture says `width` (a kit packing
  narrow members scales it), so that `MemberKit` rebuilds any member as a plain network;
- `weight_scope`: None, or what member weights are compared on when members share part of
  the network (members sharing a body), stated in reports.
The base class is the plain network (`single`); methods override what differs (methods.py and
the modules in nn/kits/, which register themselves).

Layer roles: linear layers are `input`, `hidden` or `head`; convolutions `stem`, `entry` (a
residual block's first), `block` (its second) or `shortcut`. Layouts between layers are the
kit's business; a body's output is member-major logits `[k*B, C]`.
"""

import math
from dataclasses import dataclass

from torch import nn

from ..errors import EnsdiagError, shown
from ..numbers import decimal, integer
from ..registry import Registry
from .layers import shared_input_linear

METHODS = Registry("method")  # name -> Kit subclass, in the kits' `order` (the paper's four first)


def register_method(name):
    """Class decorator: register a Kit subclass as the method `name`."""
    def register(cls):
        cls.name = name
        if cls.declared:
            cls.options = {option.name: option.default for option in cls.declared}
        return METHODS.add(name, cls, order=cls.order)
    return register


def shared_batch(xs) -> bool:
    """Whether member inputs [k, B, ...] are one batch shown to every member (expanded, not copied)."""
    return xs.shape[0] > 1 and xs.stride(0) == 0


@dataclass(frozen=True)
class Option:
    """A method option, declared once: name, default, valid values, help, and the CLI flag
    that sets it (named in errors). `resolve_options` checks every value against it."""

    name: str
    default: object  # None: the architecture's default (the paper's dropout rates)
    help: str
    kind: type = str
    choices: tuple = ()
    low: float | None = None  # numbers: low <= value < high (int: low <= value <= high)
    high: float | None = None
    parse: object = None  # a further check, raising EnsdiagError (e.g. the fast-weight init spec)
    flag: str | None = None
    closed: bool = False  # float: low <= value <= high
    def from_text(self, text: str, method: str):
        """The value of `--option METHOD.NAME=TEXT`, parsed as the declared type, then checked."""
        name = f"{self.flag} (-O {method}.{self.name})" if self.flag else f"-O {method}.{self.name}"
        try:
            if self.kind is bool:
                words = {"true": True, "on": True, "yes": True, "1": True,
                         "false": False, "off": False, "no": False, "0": False}
                value = words[text.strip().lower()]
            elif self.kind in (int, float):  # decimal digits only: int() also reads "²" and "٣"
                value = (integer if self.kind is int else decimal)(text, name)
            else:
                value = self.kind(text)
        except (KeyError, ValueError):  # EnsdiagError is a ValueError too
            digits = {int: " (in decimal digits)", float: " (finite, in decimal digits)"}.get(self.kind, "")
            raise EnsdiagError(f"{name} must be {self.describe()}{digits}, got {text[:40]!r}") from None
        return self.check(value, method)

    def describe(self) -> str:
        """The valid values, in words (`ensdiag models --options`)."""
        if self.choices:
            return " or ".join(self.choices)
        if self.kind is bool:
            return "true or false"
        if self.kind in (int, float) and self.low is not None and self.high is not None:
            if self.kind is int:
                return f"a whole number in {self.low:g}..{self.high:g}"
            return f"a number in [{self.low:g}, {self.high:g}{']' if self.closed else ')'}"
        return {int: "a whole number", float: "a number", str: "text"}[self.kind]

    def check(self, value, method: str):
        """The value, of the declared type and range, or one clear error."""
        name = f"{self.flag} (-O {method}.{self.name})" if self.flag else f"-O {method}.{self.name}"
        if self.kind is bool and not isinstance(value, bool):
            raise EnsdiagError(f"{name} must be true or false, got {value!r}")
        if self.kind is float:
            try:  # a 400-digit integer from a stored file does not fit a float
                finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            except OverflowError:
                finite = False
            if not finite:
                raise EnsdiagError(f"{name} must be a finite number, got {shown(value)}")
            value = float(value)
            above = self.high is not None and (value > self.high if self.closed else value >= self.high)
            if (self.low is not None and value < self.low) or above:
                bounds = f"[{self.low:g}, {self.high:g}{']' if self.closed else ')'}"
                raise EnsdiagError(f"{name} must lie in {bounds}, got {value:g}")
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise EnsdiagError(f"{name} must be a whole number, got {shown(value)}")
            if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
                raise EnsdiagError(f"{name} must lie in {self.low:g}..{self.high:g}, got {shown(value)}")
        if self.kind is str and not isinstance(value, str):
            raise EnsdiagError(f"{name} must be text, got {shown(value)}")
        if self.choices and value not in self.choices:
            allowed = " or ".join(self.choices) if len(self.choices) == 2 else "one of " + ", ".join(self.choices)
            raise EnsdiagError(f"{name} must be {allowed}, got {shown(value)}")
        if self.parse is not None:
            try:
                self.parse(value)
            except EnsdiagError as error:  # the option's own parser names its flag; say both ways of setting it
                raise EnsdiagError(f"-O {method}.{self.name}: {error}" if f"{method}.{self.name}" not in str(error)
                                   else str(error)) from None
        return value


class Kit:
    """Plain layers on a member-major batch `[k*B, ...]`; subclasses override what differs."""

    name = "?"
    label = "?"  # how reports name the method
    order = 100  # where the method is listed (models, bench, error messages)
    declared: tuple[Option, ...] = ()  # the method's options (a kit may also give a plain `options` dict)
    options: dict = {}  # option name -> default, derived from `declared` by `register_method`
    run_variants: dict = {}  # extra run name -> (fixed options, label), e.g. batch-ensemble-kernel
    reference_separate_members = False  # the bench's reference pipeline trains k separate networks
    one_weight_set = False  # True when all members share one set of weights

    @property
    def loss_over_members(self) -> str:
        """How the members' mean cross-entropies combine into the training loss: "sum" when members
        share no parameter (each then trains exactly as a single model would), "mean" when they
        share weights (the shared weights then get a single model's gradient, not k times it) or
        when the method's reference implementation averages; a kit with the option `loss` lets the
        run choose (BatchEnsemble's "sum" is ensdiag's before 0.2, kept so that runs started then
        resume as they began)."""
        return self.options.get("loss", "sum")

    def __init__(self, num_members, **options):
        self.num_members = num_members
        self.options = options

    weight_scope: str | None = None  # what member weights are compared on, when not the whole network
    independent_members = False  # members are whole separate networks (may run foreign architectures)
    # Members share no weight, so each may list its hidden units in its own order: member
    # geometry aligns them by permutation before comparing weights (geometry/align.py).
    own_weights = False
    conv_bias = True  # `conv(…, bias=True)` builds a bias (an architecture's conv_bias option); False: refused

    def linear(self, in_features, out_features, bias=True, role="hidden"):
        """A linear layer; `role` (input | hidden | head) says where it sits."""
        return nn.Linear(in_features, out_features, bias=bias)

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block", bias=False):
        """A convolution, without bias unless asked; `role` (stem | entry | block | shortcut) says where it sits."""
        return nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=bias)

    def bn(self, num_features):
        return nn.BatchNorm2d(num_features)

    def dropout(self):
        return nn.Identity()

    def enter_images(self, xs):
        """Member inputs [k, B, C, H, W] -> the layout this kit's conv layers expect."""
        return xs.flatten(0, 1)

    def pooled_features(self, h):
        """Globally pooled conv features in this kit's layout -> what the head layer takes."""
        return h.mean(dim=(2, 3))

    def enter_features(self, layer, xs):
        """Member inputs [k, B, ...] through the `input` linear layer -> member-major [k*B, out]."""
        if shared_batch(xs):
            return shared_input_linear(layer, xs[0].flatten(1), xs.shape[0])
        return layer(xs.flatten(2).flatten(0, 1))

    def member_width(self, width: int) -> int:
        """The width of one member's layer where the architecture asks for `width`."""
        return width

    # --- what training and prediction ask of a method

    fixed_members: int | None = None  # a method with a fixed k (single: 1)
    rank_one_by_construction = False  # members' weight ratios W_i ⊘ W_j are rank 1 whatever training does
    strategies: tuple[str, ...] = ()  # ways to run the members, when there is a choice (members.py)

    def passes_per_example(self, split_batch=False) -> int:
        """Member forward passes one training example costs (the bench's member-images/s)."""
        return 1

    @classmethod
    def model_variants(cls, convolutional: bool) -> list[dict]:
        """Option sets `ensdiag models` lists for this method on an architecture."""
        return [{}]

    @classmethod
    def options_from(cls, config) -> dict:
        """The method's options as a run's config sets them (`--option METHOD.NAME=VALUE`)."""
        return dict(config.method_options.get(cls.name, {}))

    def data_orders(self) -> int:
        return 1

    def examples_per_batch(self, batch_size: int) -> int:
        return batch_size

    def member_batch(self, images, labels, split_batch=False, generator=None):
        return images, labels

    def parameter_groups(self, model, config) -> list[dict]:
        """Optimiser groups with settings of their own ({"params", "weight_decay"}); the rest of
        the parameters form one group with the run's settings."""
        return []

    @classmethod
    def check_options(cls, options: dict, convolutional: bool, arch: str):
        """Checks that span options or the architecture (each option alone: `Option.check`)."""

    # --- procedural ensembles: members made along one training run (nn/kits/snapshot_ensemble.py)

    early_stopping = True  # whether the run's early stopping applies (a kit with its own schedule says no)

    @classmethod
    def check_training(cls, config, members: int):
        """Checks of a run's settings this method needs (a procedural ensemble: enough epochs)."""

    def make_scheduler(self, optimizer, config):
        """The learning-rate schedule, stepped once per epoch; None: the run's (milestones, gamma).
        Its state is saved with the training state, so it must resume from `state_dict` alone."""
        return None

    def end_epoch(self, model, epoch: int, epochs: int) -> None:
        """Called after epoch `epoch` (1-based) of `epochs`, before validation: a kit may store
        members here. What it stores must live in the model's state (buffers), so that a resumed
        run has it."""

    def check_members(self, m: int):
        if m != self.num_members and not self.one_weight_set:
            raise ValueError(f"{self.name} with k={self.num_members} got inputs for {m} members")

    def forward_members(self, model, xs):
        return model.body(xs).unflatten(0, (xs.shape[0], xs.shape[1]))


class MemberKit(Kit):
    """Plain layers at one member's widths: builds the network that `member_network(i)` fills."""

    name, label = "single", "Single"
    one_weight_set, fixed_members, independent_members = True, 1, True

    def __init__(self, width=lambda width: width):
        super().__init__(1)
        self.width = width

    def check_members(self, m):
        if m != 1:
            raise ValueError("a plain network (a single model, or one member's) takes inputs for exactly one member")

    def linear(self, in_features, out_features, bias=True, role="hidden"):
        return nn.Linear(in_features if role == "input" else self.width(in_features),
                         out_features if role == "head" else self.width(out_features), bias=bias)

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block", bias=False):
        return nn.Conv2d(in_channels if role == "stem" else self.width(in_channels), self.width(out_channels),
                         kernel_size, stride, padding, bias=bias)

    def bn(self, num_features):
        return nn.BatchNorm2d(self.width(num_features))
