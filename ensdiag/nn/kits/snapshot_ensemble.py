"""`snapshot-ensemble`: k snapshots of one network along a cyclic cosine schedule (Huang et al.,
ICLR 2017, "Snapshot Ensembles: Train 1, get M for free").

One plain network trains; the run's epochs are cut into k near-equal cycles, the learning rate
restarts at the run's lr at the start of each cycle and follows half a cosine down to 0 within
it, lr(e) = lr₀/2 · (1 + cos(π·t)), t the fraction of the cycle done before epoch e (per epoch;
the paper anneals per iteration). At the end of cycle c the network's weights, BatchNorm
statistics included, are stored as member c. The members are a procedural ensemble: they are
captured by the kit's epoch hook (`Kit.end_epoch`) and live in the model's state (buffers), so
a run saved after any epoch resumes to exactly the same snapshots.

Prediction runs every member (member-major `[k·B, ...]`, one member's weights per chunk); a
member not captured yet runs the network as it is now, so validation during training measures
the snapshots so far with the current network in the empty slots. Training sees one member
(`[1·B, ...]`) with the live weights. The run's early stopping does not apply: the cycles are
the schedule. `checkpoint-ensemble` (checkpoint_ensemble.py) stores the same kind of members
from an ordinary run's schedule.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import EnsdiagError
from ..kit import Kit, register_method


class _Snapshots:
    """A plain layer's state kept k times beside the live one it trains: each tensor's k copies
    concatenated along its first axis in a buffer `snapshot_<name>` ([k·d₀, ...], so a
    convolution's stays 4-D and channels-last conversion applies to it), `captured[i]` saying
    whether member i has been stored. Under --ddp every rank captures its own copy of weights
    the ranks keep equal, at the same epoch, so these buffers need no broadcast."""

    def _keep_snapshots(self, k: int):
        self.num_members = k
        for key, tensor in self._live_state().items():
            stacked = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
            self.register_buffer(f"snapshot_{key}", torch.cat([stacked] * k).clone())
        self.register_buffer("captured", torch.zeros(k, dtype=torch.bool))

    def _live_state(self) -> dict:
        names = [name for name, _ in self.named_parameters(recurse=False)]
        names += [name for name, buffer in self.named_buffers(recurse=False)
                  if not name.startswith("snapshot_") and name != "captured" and buffer is not None]
        return {name: getattr(self, name) for name in names}

    def _snapshot(self, key: str, live: torch.Tensor, i: int) -> torch.Tensor:
        stored = getattr(self, f"snapshot_{key}")
        return stored[i] if live.dim() == 0 else stored[i * live.shape[0]:(i + 1) * live.shape[0]]

    @torch.no_grad()
    def capture(self, i: int):
        for key, tensor in self._live_state().items():
            self._snapshot(key, tensor, i).copy_(tensor)
        self.captured[i] = True

    def member_state(self, i: int) -> dict:
        """Member i as the plain layer's state (the live one while it is not captured)."""
        live = self._live_state()
        if not bool(self.captured[i]):
            return {key: tensor.detach() for key, tensor in live.items()}
        return {key: self._snapshot(key, tensor, i) for key, tensor in live.items()}

    def _per_member(self, x, run):
        """The live forward in training, else each member's state on its chunk of `[k·B, ...]`."""
        if self.training:
            return run(x, self._live_state())
        return torch.cat([run(chunk, self.member_state(i)) for i, chunk in enumerate(x.chunk(self.num_members))])


class SnapshotLinear(_Snapshots, nn.Linear):
    def __init__(self, in_features, out_features, k, bias=True):
        super().__init__(in_features, out_features, bias=bias)
        self._keep_snapshots(k)

    def forward(self, x):
        return self._per_member(x, lambda chunk, state: F.linear(chunk, state["weight"], state.get("bias")))


class SnapshotConv2d(_Snapshots, nn.Conv2d):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, k):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, bias=False)
        self._keep_snapshots(k)

    def forward(self, x):
        return self._per_member(x, lambda chunk, state: F.conv2d(chunk, state["weight"], None, self.stride, self.padding))


class SnapshotBatchNorm2d(_Snapshots, nn.BatchNorm2d):
    def __init__(self, num_features, k):
        super().__init__(num_features)
        self._keep_snapshots(k)

    def forward(self, x):
        if self.training:
            return super().forward(x)
        return self._per_member(x, lambda chunk, state: F.batch_norm(
            chunk, state["running_mean"], state["running_var"], state["weight"], state["bias"], False, 0.0, self.eps))


def cycle_ends(epochs: int, members: int) -> list[int]:
    """The epochs (1-based) after which each member is stored: k near-equal cycles."""
    return [round(epochs * (c + 1) / members) for c in range(members)]


class _CapturingKit(Kit):
    """Plain layers that keep k snapshots; members are stored after the epochs `capture_epochs` says."""

    own_weights = True
    conv_bias = False  # its convolutions carry the biases its own layout defines
    early_stopping = False

    def linear(self, in_features, out_features, bias=True, role="hidden"):
        return SnapshotLinear(in_features, out_features, self.num_members, bias)

    def conv(self, in_channels, out_channels, kernel_size, stride=1, padding=0, role="block"):
        return SnapshotConv2d(in_channels, out_channels, kernel_size, stride, padding, self.num_members)

    def bn(self, num_features):
        return SnapshotBatchNorm2d(num_features, self.num_members)

    def enter_features(self, layer, xs):
        return layer(xs.flatten(2).flatten(0, 1))  # every member its own weights: no shared-input shortcut

    def check_members(self, m: int):
        if m not in (1, self.num_members):
            raise ValueError(f"{self.name} with k={self.num_members} runs 1 member (training) or all k, not {m}")

    def forward_members(self, model, xs):
        if model.training and xs.shape[0] != 1:
            xs = xs[:1]  # training runs the live network once, whatever the caller expanded
        return model.body(xs).unflatten(0, (xs.shape[0], xs.shape[1]))

    @classmethod
    def check_training(cls, config, members: int):
        if config.epochs < members:
            raise EnsdiagError(f"{cls.name} stores one member per cycle: k = {members} members need --epochs {members} "
                               f"or more, not {config.epochs}")

    def capture_epochs(self, epochs: int) -> list[int]:
        if epochs < self.num_members:
            raise EnsdiagError(f"{self.name} stores one member per cycle: k = {self.num_members} members need at least "
                               f"{self.num_members} epochs, not {epochs}")
        return cycle_ends(epochs, self.num_members)

    def end_epoch(self, model, epoch: int, epochs: int):
        ends = self.capture_epochs(epochs)
        if epoch in ends:
            member = ends.index(epoch)
            for module in model.modules():
                if isinstance(module, _Snapshots):
                    module.capture(member)


@register_method("snapshot-ensemble")
class SnapshotEnsembleKit(_CapturingKit):
    label = "Snapshot Ensemble"
    order = 60

    def make_scheduler(self, optimizer, config):
        ends = [0, *self.capture_epochs(config.epochs)]

        def factor(epoch: int) -> float:  # the lr of epoch `epoch` (0-based) as a share of the run's
            cycle = next(c for c in range(len(ends) - 1) if epoch < ends[c + 1]) if epoch < ends[-1] else len(ends) - 2
            done = (epoch - ends[cycle]) / (ends[cycle + 1] - ends[cycle])
            return 0.5 * (1 + math.cos(math.pi * done))
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
