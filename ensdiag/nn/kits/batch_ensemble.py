"""`batch-ensemble`: shared weights with rank-1 fast weights per member (Wen et al., 2020).

Member i uses W ∘ r_i s_iᵀ and its own bias; every layer hands back member i's effective
dense weights as a plain layer's state (`member_state(i)`). Batches run member-major
`[k*B, ...]`: rows i*B..(i+1)*B belong to member i.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import EnsdiagError
from ..kit import Kit, Option, register_method
from ..layers import default_linear_init_, members_first

DEFAULT_FAST_WEIGHT_INIT = "normal:0.5"


def parse_fast_weight_init(spec: str) -> tuple[str, float]:
    """'normal[:std]' | 'ones' | 'random-sign[:p]' -> (kind, parameter)."""
    kind, _, arg = spec.partition(":")
    defaults = {"normal": 0.5, "ones": 0.0, "random-sign": 0.5}
    if kind not in defaults or (kind == "ones" and arg):
        raise EnsdiagError(f"unknown BatchEnsemble init (--be-init) {spec!r}; use normal[:std], ones or "
                           "random-sign[:p]")
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


class _FastWeights:
    """A BatchEnsemble layer: a shared W, fast weights r and s, and per-member biases; member i's dense
    weight is `dense_weights()[i]`."""

    weight_layer = True

    def fast_weights(self):
        return [self.r, self.s]

    def member_state(self, i):
        state = {"weight": self.dense_weights()[i]}
        if self.bias is not None:
            state["bias"] = self.bias[i]
        return state


class BatchLinear(_FastWeights, nn.Module):
    """BatchEnsemble linear layer: member i uses W ∘ r_i s_iᵀ and its own bias."""

    def __init__(self, in_features, out_features, num_members, bias=True, init=DEFAULT_FAST_WEIGHT_INIT,
                 random_bias=False):
        super().__init__()
        self.in_features, self.out_features, self.num_members = in_features, out_features, num_members
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.r = nn.Parameter(torch.empty(num_members, out_features))
        self.s = nn.Parameter(torch.empty(num_members, in_features))
        # Per-member bias: zero as in the original implementation, or random (the paper's code).
        self.bias = nn.Parameter(torch.zeros(num_members, out_features)) if bias else None
        default_linear_init_(self.weight, self.bias if random_bias else None, in_features)
        init_fast_weights_(self.r, init)
        init_fast_weights_(self.s, init)

    def dense_weights(self):
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
        return members_first(self._output(h, self.r.flatten(), bias), self.num_members)


class BatchConv2d(_FastWeights, nn.Module):
    """BatchEnsemble convolution, channel-wise or kernel-wise.

    channel: input channels scaled by s_i, output channels by r_i, broadcast over space,
             so the shared kernel runs once on the whole member-major batch.
    kernel:  r_i, s_i ∈ R^{Cout×Cin×K} perturb each kernel along its two spatial axes;
             member kernels differ, so all members run as one grouped convolution.
    """

    def __init__(self, in_channels, out_channels, kernel_size, num_members, stride=1, padding=0,
                 bias=False, variant="channel", init=DEFAULT_FAST_WEIGHT_INIT, random_bias=False):
        super().__init__()
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
        default_linear_init_(self.weight, self.bias if random_bias else None, in_channels * kernel_size**2)
        init_fast_weights_(self.r, init)
        init_fast_weights_(self.s, init)

    def dense_weights(self):
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
            kernels = self.dense_weights().flatten(0, 1)  # [k*Cout, Cin, K, K]
            h = F.conv2d(stacked, kernels, None, self.stride, self.padding, groups=k)
            h = h.unflatten(1, (k, -1)).transpose(0, 1)  # [k, B, Cout, H', W']
        if self.bias is not None:
            h = h + self.bias[:, None, :, None, None]
        return h.flatten(0, 1)


BE_LAYOUTS = ("original", "paper")


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
    conv_bias = False  # its convolutions carry the biases its own layout defines

    label = "BatchEnsemble"
    order = 30
    rank_one_by_construction = True  # W ∘ r_i s_iᵀ
    declared = (Option("variant", "channel", "convolutions perturbed channel-wise or kernel-wise",
                       choices=("channel", "kernel"), flag="--be-variant"),
                Option("init", DEFAULT_FAST_WEIGHT_INIT, "fast-weight initialisation: normal[:std], ones, random-sign[:p]",
                       parse=parse_fast_weight_init, flag="--be-init"),
                Option("layout", "original", "bias and shortcut layout: original or the paper's",
                       choices=BE_LAYOUTS, flag="--be-layout"),
                Option("loss", "mean", "cross-entropy averaged over all k·B rows, or summed over members",
                       choices=("mean", "sum"), flag="--be-loss"),
                Option("shortcut_bias", False, "a shared bias on the paper layout's plain shortcut convolutions "
                       "(torch-uncertainty's batched_resnet with conv_bias)", bool))

    @classmethod
    def check_options(cls, options, convolutional, arch):
        if options["shortcut_bias"] and options["layout"] != "paper":
            raise EnsdiagError("batch-ensemble option shortcut_bias needs the paper layout (the original "
                               "perturbs its shortcuts like every other convolution)")
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
    def paper_layout(self):
        return self.options["layout"] == "paper"

    def linear(self, in_features, out_features, bias=True, role="hidden"):
        return BatchLinear(in_features, out_features, self.num_members, bias=bias, init=self.options["init"],
                           random_bias=self.paper_layout)

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block"):
        if self.paper_layout and role == "shortcut":
            return nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=self.options["shortcut_bias"])
        bias = self.paper_layout and role in ("entry", "block")
        return BatchConv2d(in_channels, out_channels, kernel_size, self.num_members, stride, padding, bias=bias,
                           variant=self.options["variant"], init=self.options["init"], random_bias=bias)
