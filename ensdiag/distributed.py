"""Running under `torchrun`: which rank this process is, and the few collectives ensdiag needs.

    torchrun --nproc-per-node 8 -m ensdiag train --preset cifar10 --out runs/c10     # the grid over 8 GPUs
    torchrun --nproc-per-node 8 -m ensdiag train --preset cifar10 --ddp --out runs/c10-ddp

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them ensdiag is one process (rank 0 of
1) and nothing here does anything. Two process groups:
- the default one (NCCL on CUDA, gloo on the CPU) carries tensors: gradients, BatchNorm
  statistics, logits. Its timeout is `TIMEOUT` (30 minutes): a rank that stops answering
  mid-training ends the job within that, instead of holding every GPU;
- a gloo group carries small Python values (who trains what, validation results, failures).
  These are the places where a rank waits for the others' work: at the end of the grid for
  the slowest rank's runs (CIFAR-10 runs take hours), for rank 0's data download or its
  writing. Its timeout is `WAIT_TIMEOUT` (7 days).
"""

import inspect
import os
import types
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.nn.functional as F

from .device import resolve_device
from .errors import EnsdiagError

TIMEOUT = timedelta(minutes=30)
WAIT_TIMEOUT = timedelta(days=7)


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def from_environment() -> Ranks:
    """The ranks torchrun set, checked (a hand-set environment may be wrong)."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    if not any(name in os.environ for name in names):
        return Ranks()
    try:
        rank, world, local = (int(os.environ.get(name, "0")) for name in names)
    except ValueError:
        raise EnsdiagError("RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers (torchrun sets them)") from None
    if not (world >= 1 and 0 <= rank < world and local >= 0):
        raise EnsdiagError(f"inconsistent torchrun environment: RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}")
    return Ranks(rank, world, local)


_RANKS = Ranks()
_WAITS = {"group": None}  # the gloo group for Python values (module docstring)


def start(device_name: str = "auto") -> tuple[Ranks, torch.device]:
    """Join the process group (when launched by torchrun) and pick this rank's device: CUDA
    device LOCAL_RANK on a GPU machine, else the CPU."""
    global _RANKS
    ranks = from_environment()
    device = resolve_device(device_name)
    if device.type == "cuda" and ranks.distributed:
        if ranks.local_rank >= torch.cuda.device_count():
            raise EnsdiagError(f"LOCAL_RANK {ranks.local_rank} but this node has {torch.cuda.device_count()} CUDA "
                               "devices: start at most one process per GPU (--nproc-per-node)")
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    if ranks.distributed and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend, timeout=TIMEOUT,
                                             **({"device_id": device} if device.type == "cuda" else {}))
    if ranks.distributed and _WAITS["group"] is None:
        _WAITS["group"] = torch.distributed.new_group(backend="gloo", timeout=WAIT_TIMEOUT)
    _RANKS = ranks
    return ranks, device


def ranks() -> Ranks:
    return _RANKS


def barrier() -> None:
    """Wait until every rank gets here (over the waiting group: WAIT_TIMEOUT)."""
    if _RANKS.distributed:
        torch.distributed.barrier(group=_WAITS["group"])


def broadcast(value):
    """A picklable value from rank 0 to every rank (over the waiting group)."""
    if not _RANKS.distributed:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0, group=_WAITS["group"])
    return box[0]


def all_gather(value) -> list:
    """Every rank's picklable value, in rank order (over the waiting group)."""
    if not _RANKS.distributed:
        return [value]
    gathered = [None] * _RANKS.world_size
    torch.distributed.all_gather_object(gathered, value, group=_WAITS["group"])
    return gathered


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if _RANKS.distributed:
        torch.distributed.all_reduce(tensor)
    return tensor


def shard(n: int, ranks_: Ranks | None = None) -> slice:
    """This rank's contiguous share of n items (the first n mod world ranks get one more)."""
    ranks_ = ranks_ or _RANKS
    base, extra = divmod(n, ranks_.world_size)
    start = ranks_.rank * base + min(ranks_.rank, extra)
    return slice(start, start + base + (ranks_.rank < extra))


def gather_rows(local: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Every rank's `local` concatenated along `dim` in rank order (shapes may differ along `dim`)."""
    if not _RANKS.distributed:
        return local
    sizes = all_gather(local.shape[dim])
    padded = torch.nn.functional.pad(local.movedim(dim, -1), (0, max(sizes) - local.shape[dim])).movedim(-1, dim).contiguous()
    pieces = [torch.empty_like(padded) for _ in sizes]
    torch.distributed.all_gather(pieces, padded)
    return torch.cat([piece.narrow(dim, 0, size) for piece, size in zip(pieces, sizes)], dim=dim)


def finish() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # every group, the waiting one included
    _WAITS["group"] = None


# ------------------------------------------------------------------ one run over all ranks (--ddp)

class _AllReduceSum(torch.autograd.Function):
    """Σ over ranks, with the gradient summed over ranks too (every rank's loss reaches every input)."""

    @staticmethod
    def forward(ctx, tensor):
        tensor = tensor.clone()
        torch.distributed.all_reduce(tensor)
        return tensor

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        torch.distributed.all_reduce(grad)
        return grad


def _momentum(norm) -> float:
    """The running statistics' update factor for this step, counting the step (as BatchNorm does)."""
    norm.num_batches_tracked.add_(1)
    return norm.momentum if norm.momentum is not None else 1.0 / float(norm.num_batches_tracked)


def _synced_batchnorm_forward(self, x):
    """BatchNorm whose training statistics are those of the global batch over all ranks: the
    per-channel sums and sums of squares (in float32, whatever autocast does) are all-reduced
    with autograd, so gradients flow back to every rank's examples and the update equals one
    process's on the whole batch. The portable path: it runs on the CPU (gloo), where torch's
    SyncBatchNorm does not; CUDA uses `_cuda_synced_batchnorm_forward`."""
    if not self.training:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
    dims = [0, *range(2, x.dim())]
    wide = x.float()
    count = wide.new_full((1,), wide.numel() / max(wide.shape[1], 1))  # a fill, not a host-to-device copy
    stats = _AllReduceSum.apply(torch.cat([wide.sum(dims), wide.square().sum(dims), count]))
    channels = x.shape[1]
    n = stats[-1]  # (no .item(): a device synchronisation per layer and step)
    mean = stats[:channels] / n
    var = (stats[channels:2 * channels] / n - mean.square()).clamp(min=0)
    shape = (1, channels, *([1] * (x.dim() - 2)))
    out = (wide - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
    if self.affine:
        out = out * self.weight.view(shape) + self.bias.view(shape)
    if self.track_running_stats:
        with torch.no_grad():
            momentum = _momentum(self)
            self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
            self.running_var.mul_(1 - momentum).add_(var.detach() * (n / (n - 1).clamp(min=1)), alpha=momentum)
    return out.to(x.dtype)


def _cuda_synced_batchnorm_forward(self, x):
    """The same BatchNorm over the global batch on CUDA, through torch's SyncBatchNorm kernels
    (fused statistics in fp32 for bf16 input, channels-last kept, one all-gather per layer and
    no host synchronisation); it computes what `_synced_batchnorm_forward` does."""
    from torch.nn.modules._functions import SyncBatchNorm
    if not self.training:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
    momentum = _momentum(self)
    return SyncBatchNorm.apply(x, self.weight, self.bias, self.running_mean, self.running_var, self.eps, momentum,
                               torch.distributed.group.WORLD, torch.distributed.get_world_size())


def synced_batchnorm_forward(device):
    return _cuda_synced_batchnorm_forward if torch.device(device).type == "cuda" else _synced_batchnorm_forward


def no_buffer_sync() -> dict:
    """DDP's argument for "no buffer broadcast before each forward": `forward_sync_buffers` where
    torch has it (it deprecated `broadcast_buffers`), else `broadcast_buffers`."""
    if "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


class DataParallel:
    """A model trained by every rank at once: DistributedDataParallel around its member forward,
    BatchNorm synchronised over the global batch while it is in use (`with parallel:`).

    DDP does not broadcast buffers before each forward (`no_buffer_sync`): the only buffers are
    BatchNorm's running statistics, which every rank updates from the same global statistics, so
    they stay identical without it."""

    def __init__(self, model, device):
        self.model = model
        self.norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        self.norm_forward = synced_batchnorm_forward(device)
        self.forward = torch.nn.parallel.DistributedDataParallel(  # looked up here: tests stand in a fake
            _MemberForward(model), device_ids=[device] if device.type == "cuda" else None, **no_buffer_sync())

    def __enter__(self):
        for module in self.norms:
            module.forward = types.MethodType(self.norm_forward, module)
        return self

    def __exit__(self, *exc):
        for module in self.norms:
            del module.forward  # back to the class's own forward
        return False

    def __call__(self, xs):
        return self.forward(xs)


class _MemberForward(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, xs):
        return self.model.forward_members(xs)
