"""The base model's weights, streamed: a single `.safetensors` file or a folder of shards with
`model.safetensors.index.json` (as transformers saves them). Only headers are read up front; a
weight is read in blocks of rows, its shard opened for one block and closed again, so a 7B base
never has to be in memory (nor its pages resident) at once.

    base = BaseWeights(Path("Llama-2-7b"))
    name = base.weight_of("model.layers.0.self_attn.q_proj")   # "model.layers.0.self_attn.q_proj.weight"
    for start, rows in base.row_blocks(name): ...                # float64 blocks [c, n]
"""

import math
import re
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..budget import require
from ..errors import EnsdiagError
from ..io import read_json

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_INDEX_BYTES = 64 << 20  # a 400B model's index is a few MiB
BLOCK_BYTES = 2 << 20  # float64 bytes per block of rows: a few blocks in flight stay far below a weight
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors$")  # a file beside the index, never a path


@contextmanager
def opened(path: Path):
    """A safetensors file open for reading; whatever reading it raises is one line naming it."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            yield handle
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise EnsdiagError(f"{path} is not a readable safetensors file ({reason[:160]})") from None


class BaseWeights:
    """Names, shapes and dtypes of a base model's tensors (from the headers), and blocks of rows on demand."""

    def __init__(self, path):
        self.path = Path(path)
        self.shard_of = self._shards()
        self.shape, self.dtype = {}, {}
        for shard in sorted(set(self.shard_of.values())):
            with opened(shard) as handle:
                for name in handle.keys():
                    info = handle.get_slice(name)
                    self.shape[name], self.dtype[name] = tuple(info.get_shape()), info.get_dtype()
        missing = [name for name in self.shard_of if name not in self.shape]
        if missing:
            raise EnsdiagError(f"{self.path / INDEX_FILE}: {missing[0]} is listed in {self.shard_of[missing[0]].name}, "
                               "which does not hold it (index and shards do not match)")

    def _shards(self) -> dict[str, Path]:
        """{tensor name: shard file}."""
        if self.path.is_file():
            return self._names_in(self.path)
        if not self.path.is_dir():
            raise EnsdiagError(f"--base {self.path} does not exist")
        index = self.path / INDEX_FILE
        if not index.is_file():
            if (self.path / SINGLE_FILE).is_file():
                return self._names_in(self.path / SINGLE_FILE)
            raise EnsdiagError(f"--base {self.path} holds neither {SINGLE_FILE} nor {INDEX_FILE}: give the base "
                               "model's safetensors file or the folder transformers saved it in")
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise EnsdiagError(f"{index} is {index.stat().st_size:,} bytes, far more than a shard index")
        data = read_json(index, "shard index", MAX_INDEX_BYTES)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(name, str) and isinstance(shard, str) for name, shard in weight_map.items()):
            raise EnsdiagError(f"{index}: weight_map must map tensor names to shard file names")
        for shard in sorted(set(weight_map.values())):
            if not SHARD_NAME.match(shard):
                raise EnsdiagError(f"{index}: shard {shard[:80]!r} is not a .safetensors file name beside the index")
            if not (self.path / shard).is_file():
                raise EnsdiagError(f"{index} lists {shard}, which is not in {self.path}")
        return {name: self.path / shard for name, shard in weight_map.items()}

    @staticmethod
    def _names_in(path: Path) -> dict[str, Path]:
        if path.suffix != ".safetensors":
            raise EnsdiagError(f"--base {path} is not a .safetensors file (ensdiag streams the base from safetensors)")
        with opened(path) as handle:
            return {name: path for name in handle.keys()}

    def weight_of(self, module: str) -> str:
        """The base tensor of a module: `<module>.weight`, or the one tensor whose name ends in it or
        that it ends in (a checkpoint saved with or without the task head's prefix)."""
        exact = f"{module}.weight"
        if exact in self.shape:
            return exact
        found = [name for name in self.shape if name.endswith(".weight") and
                 (name.endswith(f".{exact}") or exact.endswith(f".{name}"))]
        if len(found) != 1:
            why = "no tensor" if not found else f"{len(found)} tensors ({', '.join(found[:3])})"
            raise EnsdiagError(f"--base {self.path} has {why} for the adapted module {module}: is it the adapters' base?")
        return found[0]

    def check_weight(self, name: str, shape: tuple[int, int]):
        """The weight can be read as the matrix [m, n] of `shape` (from the headers alone)."""
        stored = self.shape[name]
        if self.dtype[name] not in FLOAT_DTYPES:
            raise EnsdiagError(f"{self.shard_of[name]}: {name} is {self.dtype[name]}; ensdiag reads float bases "
                               "(dequantise a quantised base first)")
        if not stored or stored[0] != shape[0] or math.prod(stored) != shape[0] * shape[1]:
            raise EnsdiagError(f"{self.shard_of[name]}: {name} has shape {list(stored)}, but the adapters' updates of "
                               f"it are {shape[0]}×{shape[1]}: is it the adapters' base?")

    def row_blocks(self, name: str, shape: tuple[int, int]):
        """(first row, float64 block [c, n]) over the weight, as the matrix [m, n] of `shape` (a
        convolution's kernels flattened into rows); only one block is in memory at a time."""
        self.check_weight(name, shape)
        rows = max(1, BLOCK_BYTES // (8 * shape[1]))
        require(8 * rows * shape[1], f"a block of rows of {name}")
        for start in range(0, shape[0], rows):
            with opened(self.shard_of[name]) as handle:  # mapped for one block: its pages stay resident only while open
                block = handle.get_slice(name)[start:start + rows].to(torch.float64).reshape(-1, shape[1])
            if not torch.isfinite(block).all():
                raise EnsdiagError(f"{self.shard_of[name]}: {name} holds NaN or infinite values")
            yield start, block

