"""How ensdiag computes on each device: fast arithmetic for training, exact fp32 for every number
a reader acts on.

- **Training** (`train --precision`): `auto` is bf16 autocast on CUDA and fp32 on the CPU (where
  bf16 was measured slower); `fp32` and `bf16` force one on any device, so the bf16 path runs on
  the CPU too. On CUDA, training also turns on `cudnn.benchmark` (every batch has the same shape,
  so the fastest convolution algorithm is picked once) and allows TF32 for the fp32 matmuls and
  convolutions that autocast leaves in fp32.
- **Predictions, validation, metrics, member geometry**: fp32 with TF32 off, on every device, so
  a GPU run reports the numbers a CPU run would, up to float rounding. Rounding logits to bf16
  would move the smallest diversity numbers (BatchEnsemble's JSD is about 0.002) most.

meta.json records what a run used (`precision`).

    with training_math(device):
        train_epoch(..., autocast=uses_bf16(config.precision, device))
    with exact_math():
        logits = model(x)
"""

from contextlib import ExitStack, contextmanager

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def uses_bf16(precision: str, device) -> bool:
    """Whether training runs under bf16 autocast: asked for, or `auto` on CUDA."""
    return precision == "bf16" or (precision == "auto" and torch.device(device).type == "cuda")


@contextmanager
def _math(benchmark: bool, tf32: bool):
    matmul = torch.backends.cuda.matmul
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, matmul.allow_tf32
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, matmul.allow_tf32 = benchmark, tf32, tf32
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, matmul.allow_tf32 = saved


def training_math(device):
    """cudnn.benchmark and TF32 on CUDA while training; on the CPU neither flag changes anything."""
    cuda = torch.device(device).type == "cuda"
    return _math(benchmark=cuda, tf32=cuda)


@contextmanager
def exact_math():
    """fp32 as IEEE single precision: autocast off, and no TF32 in matmuls or convolutions (PyTorch
    allows it in cuDNN convolutions by default)."""
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    with ExitStack() as stack:
        for device_type in devices:
            stack.enter_context(torch.autocast(device_type, enabled=False))
        stack.enter_context(_math(benchmark=False, tf32=False))
        yield


def policy(precision: str, device) -> dict:
    """What meta.json records about a run's arithmetic."""
    cuda = torch.device(device).type == "cuda"
    return {"train": "bf16 autocast" if uses_bf16(precision, device) else "fp32", "asked": precision,
            "train_tf32": cuda, "cudnn_benchmark": cuda, "predict": "fp32 (no TF32)"}
