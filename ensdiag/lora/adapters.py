"""The tensors of LoRA adapters, read like user input: PEFT's `<module>.lora_A.weight` [r, n] and
`<module>.lora_B.weight` [m, r] (convolutions: [r, c, kh, kw] and [m, r, 1, 1], read as matrices),
from `adapter_model.safetensors` (headers first, one module's tensors at a time) or from
`adapter_model.bin` through `torch.load(weights_only=True, mmap=True)`, which never runs pickled code.

    modules = adapted_modules(configs)          # [Module], the same in every member, shapes checked
    A, B = read_factors(configs[0], modules[0])  # float64, finite, ranks checked
"""

import math
import re
import zipfile
from dataclasses import dataclass
from functools import lru_cache

import torch
from safetensors import SafetensorError, safe_open

from ..budget import require
from ..errors import EnsdiagError
from ..foreign.state_dicts import check_zip_sizes, load_tensors
from .base import FLOAT_DTYPES, opened
from .config import AdapterConfig, check_targets

PREFIX = "base_model.model."  # what PEFT's wrapper puts before the base model's module names
FACTOR = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")
BIN_DTYPES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64"}


@dataclass(frozen=True)
class Module:
    """One adapted module: its name in the base model, its factors' keys, ΔW's shape [m, n]."""

    name: str
    key_a: str
    key_b: str
    shape: tuple[int, int]


def _version(path) -> tuple[int, int]:
    """What tells one version of a file from the next (the caches below read each version once)."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@lru_cache(maxsize=16)
def _bin_state(path, mtime, size) -> dict:
    """A .bin adapter's tensors, memory-mapped where the file allows it (zip format)."""
    check_zip_sizes(path)
    state = load_tensors(path, "adapter_model.bin", mmap=zipfile.is_zipfile(path))
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise EnsdiagError(f"{path} holds no state_dict of named tensors")
    return state


def _header(config: AdapterConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """{key: (shape, dtype)} without reading any tensor's data."""
    path = config.weights
    if path.suffix == ".bin":
        return {key: (tuple(value.shape), BIN_DTYPES.get(value.dtype, str(value.dtype)))
                for key, value in _bin_state(path, *_version(path)).items()}
    with opened(path) as handle:
        return {key: (tuple(handle.get_slice(key).get_shape()), handle.get_slice(key).get_dtype()) for key in handle.keys()}


@lru_cache(maxsize=64)
def _modules_of(config: AdapterConfig, mtime, size) -> tuple[dict[str, Module], list[str]]:
    """The adapter's modules, every factor's shape and dtype checked, and the keys that are no LoRA
    factor."""
    header, path = _header(config), config.weights
    factors, other = {}, []
    for key in header:
        match = FACTOR.match(key)
        if match is None:
            other.append(key)
            continue
        factors.setdefault(match["module"], {})[match["which"]] = key
    modules = {}
    for module, keys in factors.items():
        if len(keys) != 2:
            have, lacks = ("A", "B") if "A" in keys else ("B", "A")
            raise EnsdiagError(f"{path}: {module} has lora_{have} but no lora_{lacks}: the file is incomplete")
        (shape_a, dtype_a), (shape_b, dtype_b) = header[keys["A"]], header[keys["B"]]
        for key, dtype in ((keys["A"], dtype_a), (keys["B"], dtype_b)):
            if dtype not in FLOAT_DTYPES:
                raise EnsdiagError(f"{path}: {key} is {dtype}, not a float tensor")
        if len(shape_a) < 2 or len(shape_b) < 2 or any(extent != 1 for extent in shape_b[2:]) or min(shape_a + shape_b) < 1:
            raise EnsdiagError(f"{path}: {module}'s factors have shapes {list(shape_a)} and {list(shape_b)}, not "
                               "lora_A [r, n] and lora_B [m, r]")
        if shape_a[0] != shape_b[1] or shape_a[0] != config.rank:
            raise EnsdiagError(f"{path}: {module} has lora_A of rank {shape_a[0]} and lora_B of rank {shape_b[1]}, "
                               f"but the config says r = {config.rank}")
        name = module.removeprefix(PREFIX)  # a convolution's A [r, c, kh, kw] is read as [r, c·kh·kw]
        modules[name] = Module(name, keys["A"], keys["B"], (shape_b[0], math.prod(shape_a[1:])))
    if not modules:
        raise EnsdiagError(f"{path} holds no LoRA factors (keys ending in .lora_A.weight and .lora_B.weight)")
    return modules, other


def adapted_modules(configs: list[AdapterConfig]) -> tuple[list[Module], list[str]]:
    """The modules every member adapts, in the model's order (layer numbers compared as numbers), and
    the other tensors of the first member's file (not compared)."""
    first, other = _modules_of(configs[0], *_version(configs[0].weights))
    check_targets(configs[0], list(first))  # every member's config names the same modules (config.py)
    for config in configs[1:]:
        modules, _ = _modules_of(config, *_version(config.weights))
        for name in sorted(set(first) ^ set(modules)):
            has, lacks = (configs[0], config) if name in first else (config, configs[0])
            raise EnsdiagError(f"{has.weights} adapts {name} but {lacks.weights} does not; members must adapt the "
                               "same modules")
        for name, module in modules.items():
            if module.shape != first[name].shape:
                raise EnsdiagError(f"{name} is {first[name].shape[0]}×{first[name].shape[1]} in {configs[0].weights} but "
                                   f"{module.shape[0]}×{module.shape[1]} in {config.weights}: not the same base model")
    return sorted(first.values(), key=lambda module: natural_order(module.name)), other


def natural_order(name: str):
    """layers.2 before layers.10 (a part of at most 18 ASCII digits is a number; "²" or 5,000 digits are text)."""
    return [(0, int(part), "") if part.isascii() and part.isdigit() and len(part) <= 18 else (1, 0, part)
            for part in name.split(".")]


def read_factors(config: AdapterConfig, module: Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [r, n], B [m, r]) of one member's module in float64, checked finite (`adapted_modules` checked
    that every member has the module, under keys of its own)."""
    m, n = module.shape
    require(8 * config.rank * (m + n), f"the LoRA factors of {module.name}")
    path = config.weights
    own = _modules_of(config, *_version(path))[0][module.name]
    key_a, key_b = own.key_a, own.key_b
    try:
        if path.suffix == ".bin":
            state = _bin_state(path, *_version(path))
            a, b = state[key_a], state[key_b]
        else:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                a, b = handle.get_tensor(key_a), handle.get_tensor(key_b)
    except EnsdiagError:
        raise  # already one line for the user
    except (SafetensorError, OSError, ValueError, RuntimeError, KeyError) as error:
        raise EnsdiagError(f"{path}: cannot read {module.name}'s factors ({str(error)[:120] or type(error).__name__})") from None
    a, b = a.to(torch.float64).reshape(config.rank, n), b.to(torch.float64).reshape(m, config.rank)
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise EnsdiagError(f"{path}: {module.name}'s LoRA factors hold NaN or infinite values")
    return a, b
