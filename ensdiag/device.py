"""Which torch device a command runs on: `--device auto|cpu|cuda`."""

import torch

from .errors import EnsdiagError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise EnsdiagError("--device cuda asked for, but torch sees no CUDA device")
    if name not in ("cpu", "cuda"):
        raise EnsdiagError(f"unknown device {name!r}; use auto, cpu or cuda")
    return torch.device(name)
