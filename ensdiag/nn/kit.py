"""The base of every method's kit: plain layers, and what training asks of a method.

A kit builds an architecture's layers (`linear`, `conv`, `bn`, `dropout`, and the batch
layout `enter_images` / `pooled_features`) and answers what training, prediction and reports
need to know of its method, so that none of them names a method:
- `data_orders()`: independent shuffles per epoch (1, or k for members with their own data);
- `member_batch(images, labels)`: how an index-gathered batch `[m, b, ...]` reaches the members;
- `loss_over_members`: "sum" or "mean" of the members' mean cross-entropies;
- `parameter_groups(model, config)`: parameters the optimiser treats apart (weight decay);
- `check_members(m)` and `forward_members(model, xs)`: how members run;
- `label`, `run_variants`, `options_from(config)`: names in reports, extra run names
  (a method with fixed options), and the method's options taken from a run's config.
The base class is the plain network (`single`); methods override what differs (methods.py).
"""

import math
from dataclasses import dataclass

from torch import nn

from ..errors import EnsdiagError


@dataclass(frozen=True)
class Option:
    """A method option, declared once: name, default, valid values, help, and the CLI flag
    that sets it (named in errors). `resolve_options` checks every value against it."""

    name: str
    default: object  # None: the architecture's default (the paper's dropout rates)
    help: str
    kind: type = str
    choices: tuple = ()
    low: float | None = None  # numbers: low <= value < high
    high: float | None = None
    parse: object = None  # a further check, raising EnsdiagError (e.g. the fast-weight init spec)
    flag: str | None = None

    def check(self, value, method: str):
        """The value, of the declared type and range, or one clear error."""
        name = self.flag or f"{method} option {self.name}"
        if self.kind is bool and not isinstance(value, bool):
            raise EnsdiagError(f"{name} must be true or false, got {value!r}")
        if self.kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise EnsdiagError(f"{name} must be a finite number, got {value!r}")
            value = float(value)
            if (self.low is not None and value < self.low) or (self.high is not None and value >= self.high):
                raise EnsdiagError(f"{name} must lie in [{self.low:g}, {self.high:g}), got {value:g}")
        if self.kind is str and not isinstance(value, str):
            raise EnsdiagError(f"{name} must be text, got {value!r}")
        if self.choices and value not in self.choices:
            allowed = " or ".join(self.choices) if len(self.choices) == 2 else "one of " + ", ".join(self.choices)
            raise EnsdiagError(f"{name} must be {allowed}, got {value!r}")
        if self.parse is not None:
            self.parse(value)
        return value


class Kit:
    """Plain layers on a member-major batch `[k*B, ...]`; subclasses override what differs."""

    name = "?"
    label = "?"  # how reports name the method
    declared: tuple[Option, ...] = ()  # the method's options (a kit may also give a plain `options` dict)
    options: dict = {}  # option name -> default, derived from `declared` by `register_method`
    run_variants: dict = {}  # extra run name -> (fixed options, label), e.g. batch-ensemble-kernel
    reference_separate_members = False  # the bench's reference pipeline trains k separate networks
    one_weight_set = False  # True when all members share one set of weights
    # How the members' mean cross-entropies combine into the training loss: "sum" when members
    # share no parameter (each then trains exactly as a single model would), "mean" when they
    # share weights (the shared weights then get a single model's gradient, not k times it).
    loss_over_members = "sum"

    def __init__(self, num_members, **options):
        self.num_members = num_members
        self.options = options

    def linear(self, in_features, out_features, bias=True):
        return nn.Linear(in_features, out_features, bias=bias)

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block"):
        """A convolution without bias; `role` (stem | block | shortcut) says where it sits."""
        return nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=False)

    def bn(self, num_features):
        return nn.BatchNorm2d(num_features)

    def dropout(self):
        return nn.Identity()

    def enter_images(self, xs):
        """Member inputs [k, B, C, H, W] -> the layout this kit's conv layers expect."""
        return xs.flatten(0, 1)

    def pooled_features(self, h):
        """Globally pooled conv features in this kit's layout -> member-major [k*B, F]."""
        return h.mean(dim=(2, 3))

    # --- what training and prediction ask of a method

    fixed_members: int | None = None  # a method with a fixed k (single: 1)
    strategies: tuple[str, ...] = ()  # ways to run the members, when there is a choice (members.py)

    def passes_per_example(self, split_batch=False) -> int:
        """Member forward passes one training example costs (the bench's member-images/s)."""
        return 1

    @classmethod
    def model_variants(cls, convolutional: bool) -> list[dict]:
        """Option sets `ensdiag models` lists for this method on an architecture."""
        return [{}]

    @staticmethod
    def options_from(config) -> dict:
        """The method's options as a run's config sets them."""
        return {}

    def data_orders(self) -> int:
        return 1

    def member_batch(self, images, labels, split_batch=False):
        return images, labels

    def parameter_groups(self, model, config) -> list[dict]:
        """Optimiser groups with settings of their own ({"params", "weight_decay"}); the rest of
        the parameters form one group with the run's settings."""
        return []

    @classmethod
    def check_options(cls, options: dict, convolutional: bool, arch: str):
        """Checks that span options or the architecture (each option alone: `Option.check`)."""

    def check_members(self, m: int):
        if m != self.num_members and not self.one_weight_set:
            raise ValueError(f"{self.name} with k={self.num_members} got inputs for {m} members")

    def forward_members(self, model, xs):
        return model.body(xs).unflatten(0, (xs.shape[0], xs.shape[1]))
