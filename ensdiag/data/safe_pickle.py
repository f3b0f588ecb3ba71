"""A restricted unpickler for data files that hold only NumPy arrays and builtin values.

The standard `pickle.load` calls any importable function a file names, so unpickling a
file from a data folder can run arbitrary code. `load` admits only the globals that NumPy
arrays and dtypes need (protocols 0 to 5, and Python 2 era pickles read with latin1, as the
official CIFAR-10 batches are); dicts, lists, tuples, strings, bytes and numbers need no
globals at all. Anything else, and any truncated or corrupt file, is one `EnsdiagError`
naming the file.
"""

import importlib
import pickle
from pathlib import Path

import numpy as np

from ..errors import EnsdiagError


def _latin1_encode(text, encoding="utf-8", errors="strict"):
    """`_codecs.encode`, which protocol 0-2 pickles use for bytes, limited to latin1."""
    if not isinstance(text, str) or encoding.lower().replace("_", "-") not in ("latin1", "latin-1", "iso-8859-1"):
        raise pickle.UnpicklingError(f"_codecs.encode only for latin1 strings, not {type(text).__name__} as {encoding!r}")
    return text.encode("latin1", errors)


def _plain_dtype(*args, **kwargs):
    """`numpy.dtype`, refusing object dtypes (they would hold arbitrary Python objects)."""
    dtype = np.dtype(*args, **kwargs)
    if dtype.hasobject:
        raise Refused(f"an array of dtype {dtype} (Python objects)")
    return dtype


class _ArrayType:
    """What a pickle gets for `numpy.ndarray`: a name to pass to `_reconstruct`, not a callable.

    Handing out `np.ndarray` itself would let a pickle call `ndarray(shape, dtype, buffer,
    0, strides)` with zero strides and a 1-byte buffer: a few hundred bytes of file would
    become an array of any size."""

    def __new__(cls, *args, **kwargs):
        raise Refused("numpy.ndarray called directly (NumPy's own pickles never do)")


def _empty_array(subtype, shape, dtype):
    """`_reconstruct`, only as NumPy pickles use it: an empty ndarray that `__setstate__` then
    fills from bytes stored in the file (so an array is never larger than the file)."""
    if subtype is not _ArrayType or tuple(shape) != (0,):
        raise Refused(f"numpy._core.multiarray._reconstruct({getattr(subtype, '__name__', subtype)!r}, {shape!r})")
    return _import("numpy._core.multiarray", "_reconstruct")(np.ndarray, (0,), dtype)


# (module, name) in NumPy 2's spelling -> the object to hand back (None: import it).
_ALLOWED = {
    ("numpy._core.multiarray", "_reconstruct"): _empty_array,
    ("numpy._core.numeric", "_frombuffer"): None,  # protocol 5: a view of bytes in the file
    ("numpy", "ndarray"): _ArrayType,
    ("numpy", "dtype"): _plain_dtype,
    ("_codecs", "encode"): _latin1_encode,  # bytes in protocol 0-2 pickles
}


class Refused(pickle.UnpicklingError):
    """What a pickle asked for that `RestrictedUnpickler` does not give."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def _import(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):  # NumPy < 1.26 has no numpy._core
        return getattr(importlib.import_module(module.replace("numpy._core", "numpy.core", 1)), name)


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles NumPy arrays, dtypes and builtin containers; refuses every other global."""

    def find_class(self, module, name):
        moved = module == "numpy.core" or module.startswith("numpy.core.")  # NumPy 2's numpy._core (the old name warns)
        key = ("numpy._core" + module[len("numpy.core"):] if moved else module, name)
        if key not in _ALLOWED:
            raise Refused(f"{module}.{name}")
        allowed = _ALLOWED[key]
        return _import(*key) if allowed is None else allowed

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not allowed")


def _arrays(node):
    if isinstance(node, np.ndarray):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _arrays(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _arrays(value)


def load(path: Path, refused_because: str = "only arrays, dicts, lists and strings are allowed"):
    """Unpickle `path` (latin1 for Python 2 era strings) with `RestrictedUnpickler`.

    Every array in the result must hold no more bytes than the file has and no Python
    objects: arrays are only ever filled from the file's own bytes."""
    try:
        size = Path(path).stat().st_size
        with open(path, "rb") as handle:
            result = RestrictedUnpickler(handle, encoding="latin1").load()
        for array in _arrays(result):
            if array.dtype.hasobject or array.nbytes > size or any(stride == 0 for stride in array.strides):
                raise Refused(f"an array of {array.dtype} {array.shape} that the file's bytes cannot hold")
        return result
    except Refused as refused:
        raise EnsdiagError(f"{path}: refused to unpickle {refused.what}: {refused_because}") from None
    except OSError as error:
        raise EnsdiagError(f"{path}: cannot read ({error.strerror or error})") from None
    except EOFError:
        raise EnsdiagError(f"{path}: not a complete pickle (empty or truncated)") from None
    except Exception as error:  # UnpicklingError, ValueError, MemoryError, ... from a corrupt file
        detail = str(error).splitlines()[0][:200] if str(error) else ""
        raise EnsdiagError(f"{path}: not a readable pickle ({type(error).__name__}{': ' + detail if detail else ''})") from None
