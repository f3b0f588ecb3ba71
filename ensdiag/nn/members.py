"""Three ways to run a Deep Ensemble's k members, on the same stacked parameters.

- `stacked`: the layers' own forward: grouped convolution on channel-stacked input, BatchNorm
  over k·C channels, bmm for linear layers (one kernel call per layer for all members);
- `vmap`: `torch.func.vmap` of the plain `single` network over member-first views of the
  parameters and BatchNorm statistics (`stacked_state()`), so each member runs ordinary
  convolutions, batched by functorch;
- `loop`: the plain network called once per member on its slice of the parameters, as a
  Python loop over separate modules would.

All three read and train the same tensors, give the same numbers (tests), and update the
BatchNorm running statistics alike. `ensdiag bench --strategies` times them; the fastest per
device and architecture is `FASTEST` (docs/performance.md has the measurements).

    model.member_strategy = "vmap"      # any Deep-Ensemble EnsembleModel
"""

from contextlib import contextmanager
from functools import lru_cache

import torch
from torch.func import functional_call, vmap

from .architectures import ARCHITECTURES
from .kit import Kit

STRATEGIES = ("stacked", "vmap", "loop")
# Chosen by `ensdiag bench --strategies` (docs/performance.md): on CPU the bmm-stacked MLP wins,
# but for ResNet-18 one plain convolution per member beats the grouped one. On CUDA (an H200,
# bf16) stacked beats vmap and the loop for the MLP; ResNet-18 on CUDA: see docs/performance.md.
FASTEST = {("cpu", "mlp"): "stacked", ("cpu", "resnet18"): "loop"}


def fastest(device_type: str, arch: str) -> str:
    return FASTEST.get((device_type, arch), "stacked")


def unsupported(strategy: str, device_type: str, arch: str) -> str | None:
    """Why `strategy` cannot run `arch` on `device_type`, or None."""
    if strategy == "vmap" and device_type == "cuda" and _has_batchnorm(arch):
        return ("torch's CUDA batch_norm asks its input for its memory layout, which vmap does not implement "
                "(NYI: querying is_contiguous inside of vmap)")
    return None


@lru_cache(maxsize=8)
def _has_batchnorm(arch: str) -> bool:
    network = _meta_single(arch, 10, (3, 32, 32) if arch != "mlp" else (1, 28, 28))
    return any(isinstance(module, torch.nn.modules.batchnorm._BatchNorm) for module in network.modules())


def stacked_state(model) -> dict[str, torch.Tensor]:
    """Member-first views [k, ...] of every parameter and buffer, under `single` names."""
    return {f"{name}.{key}": value for name, module in model.body.named_modules() if hasattr(module, "stacked_state")
            for key, value in module.stacked_state().items()}


def _plain_network(model):
    return _meta_single(model.spec.arch, model.spec.num_classes, model.spec.input_shape).train(model.training)


@lru_cache(maxsize=8)
def _meta_single(arch, num_classes, input_shape):
    """The architecture built as `single` on the meta device: a shape with no storage."""
    with torch.device("meta"):
        return ARCHITECTURES[arch](Kit(1), num_classes, input_shape)  # the base kit: plain layers


@contextmanager
def _under_autocast(plain, state, xs):
    """(state, inputs) to run `plain` with under autocast inside vmap, which autocast does not
    reach: inputs and convolution and linear weights cast to the autocast dtype (what autocast
    would do outside vmap), BatchNorm run in float32 and its output cast back (vmap's batch_norm wants one dtype
    for input, parameters and statistics, and the running statistics stay fp32 buffers that are
    updated in place)."""
    if not torch.is_autocast_enabled(xs.device.type):
        yield state, xs
        return
    dtype = torch.get_autocast_dtype(xs.device.type)
    cast = {f"{name}.{key}" for name, module in plain.named_modules()
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)) for key, _ in module.named_parameters(recurse=False)}
    norms = [module for module in plain.modules() if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)]
    handles = [hook for module in norms for hook in (
        module.register_forward_pre_hook(lambda module, args: (args[0].float(), *args[1:])),
        module.register_forward_hook(lambda module, args, output: output.to(dtype)))]
    try:
        yield {name: tensor.to(dtype) if name in cast else tensor for name, tensor in state.items()}, xs.to(dtype)
    finally:
        for handle in handles:
            handle.remove()


def forward_vmap(model, xs):
    """xs [k, B, ...] -> logits [k, B, C], members batched by vmap."""
    why = unsupported("vmap", xs.device.type, model.spec.arch)
    if why is not None:
        raise ValueError(f"member_strategy 'vmap' cannot run {model.spec.arch} on {xs.device.type}: {why}; "
                         "use 'stacked' or 'loop'")
    plain = _plain_network(model)
    with _under_autocast(plain, stacked_state(model), xs) as (state, xs):
        # channels_last tensors (a CUDA model's layout) inside vmap make cuDNN ask for their layout,
        # which vmap does not implement: the members run in the default layout (a copy, differentiable)
        state = {name: tensor.contiguous() for name, tensor in state.items()}
        xs = xs.contiguous()
        dims = {name: 0 if tensor.dim() else None for name, tensor in state.items()}  # scalars are shared

        def member(tensors, x):
            return functional_call(plain, tensors, (x[None],))

        return vmap(member, in_dims=(dims, 0))(state, xs)


def forward_loop(model, xs):
    """xs [k, B, ...] -> logits [k, B, C], one plain forward per member."""
    plain, state = _plain_network(model), stacked_state(model)
    # unbind, not t[i]: its backward stacks the k member gradients once, where k separate
    # index views would each scatter into a zero-filled tensor of the whole stacked size
    members = {name: t.unbind(0) for name, t in state.items() if t.dim()}
    outputs = []
    for i in range(model.num_members):
        # shared scalars (BatchNorm's step count) advance once per step, as in the other strategies
        tensors = {name: members[name][i] if t.dim() else (t if i == 0 else t.clone()) for name, t in state.items()}
        outputs.append(functional_call(plain, tensors, (xs[i:i + 1],)))
    return torch.stack(outputs)


FORWARDS = {"vmap": forward_vmap, "loop": forward_loop}
