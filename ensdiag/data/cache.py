"""Data ensdiag makes itself (the embedded default's sets), made once: per process, and on disk.

    tensors = made("digits-c", {"seed": 0}, make, check)   # {name: tensor}, `make(seed=0)` at most once

The first call in a process reads `$ENSDIAG_CACHE/made/<name>-<key>.safetensors` or, when it is
not there, calls `make(**params)` and writes it (atomically; a cache that cannot be written is skipped). The
key covers the parameters, ensdiag's and torch's versions (a procedural set depends on both), so a
new release never reads an old file. A cache folder is a place anyone may write to: a file is read
as safetensors (no code runs), must hold exactly what `check(tensors, **params)` accepts, and is made
again otherwise.
"""

import hashlib
import json
from contextlib import suppress
from functools import lru_cache

from .. import __version__
from ..io import atomic_write_bytes, cache_dir, read_safetensors


def made(name: str, params: dict, make, check) -> dict:
    """{key: tensor} of `make(**params)`, from this process, the disk cache or `make`."""
    return _made(name, json.dumps(params, sort_keys=True), make, check)


@lru_cache(maxsize=16)
def _made(name: str, params: str, make, check) -> dict:
    import torch
    from safetensors.torch import save
    key = hashlib.sha256(f"{params}|{__version__}|{torch.__version__}".encode()).hexdigest()[:16]
    path = cache_dir() / "made" / f"{name}-{key}.safetensors"
    with suppress(Exception):  # damaged, replaced or unreadable: made again
        if path.is_file() and check(found := read_safetensors(path, "cached data")[0], **json.loads(params)):
            return found
    found = {key: value.contiguous() for key, value in make(**json.loads(params)).items()}
    with suppress(OSError):  # a read-only home: the data is made in every process instead
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, save(found))
    return found


def images_in_unit_range(tensors: dict, shapes: dict) -> bool:
    """Exactly the keys of `shapes`, float32 images of those shapes with values in [0, 1]."""
    import torch
    return set(tensors) == set(shapes) and all(
        tensors[key].dtype == torch.float32 and tuple(tensors[key].shape) == tuple(shape)
        and bool(((tensors[key] >= 0) & (tensors[key] <= 1)).all()) for key, shape in shapes.items())

