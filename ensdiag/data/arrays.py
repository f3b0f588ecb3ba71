"""Numeric arrays from files anyone may have written: `.npy` and `.npz`, never a pickle.

    array = read_array("scores.npy")          # one array, its header checked before it is read
    arrays = read_npz("predictions.npz")      # every array of an archive, each header checked

A header is checked against the file's (or the archive entry's) size and the memory budget
before anything is allocated; object arrays (pickles) and sparse files are refused; a damaged
file is one error line naming it. Predictions (foreign/predictions.py) and your data
(data/files.py) are read through these.
"""

import zipfile
from pathlib import Path

import numpy as np

from ..budget import require
from ..errors import EnsdiagError

MAX_ARRAYS = 1024  # arrays in one .npz (a few per split): far above any real file

PICKLE = "holds Python objects (a pickle), which ensdiag never loads; save plain numeric arrays"


def _declared_bytes(handle, where) -> int:
    """The bytes an .npy header says follow it; object arrays (pickles) are refused here."""
    try:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(handle)
    except (ValueError, OSError, EOFError) as error:
        raise EnsdiagError(f"{where} is not a readable .npy array ({str(error).splitlines()[0][:120]})") from None
    if dtype.hasobject:
        raise EnsdiagError(f"{where} {PICKLE}")
    return int(np.prod(shape, dtype=object)) * dtype.itemsize


def _refuse_unless(ok, where, what):
    if not ok:
        raise EnsdiagError(f"{where} {what}")


def read_array(path) -> np.ndarray:
    """One array from a .npy file, without pickles, its header checked against the file's size
    before anything is allocated; a damaged file is one clear error."""
    path = Path(path)
    _refuse_unless(path.is_file(), path, "does not exist" if not path.exists() else "is not a file")
    if zipfile.is_zipfile(path):
        raise EnsdiagError(f"{path} is an .npz archive, not one .npy array: pass it alone (splits by key)")
    with open(path, "rb") as handle:
        claimed = _declared_bytes(handle, path)
        _refuse_unless(claimed <= path.stat().st_size, path,
                       f"claims {claimed:,} bytes of data in a {path.stat().st_size:,}-byte file (damaged or hostile)")
    # a sparse file (holes instead of data) can match an 8 GB header with a few blocks on disk: the data it claims
    blocks = getattr(path.stat(), "st_blocks", None)  # must really be stored
    if blocks is not None and claimed > 2**20 and blocks * 512 < claimed // 2:
        raise EnsdiagError(f"{path} claims {claimed:,} bytes but stores {blocks * 512:,} on disk (a sparse file): "
                           "refused; copy it without holes if it is real")
    require(claimed, f"{path} ({claimed:,} bytes of array data)")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise EnsdiagError(f"{path} is not a readable .npy file ({str(error).splitlines()[0]})"[:300]) from None
    _refuse_unless(isinstance(array, np.ndarray), path, "is not a .npy array")
    return array


def read_npz(path) -> dict[str, np.ndarray]:
    """Every array of an .npz archive, each entry's header and the archive's total size checked first."""
    path = Path(path)
    _refuse_unless(path.is_file(), path, "does not exist" if not path.exists() else "is not a file")
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            _refuse_unless(len(entries) <= MAX_ARRAYS, path, f"holds {len(entries)} arrays (at most {MAX_ARRAYS})")
            total = sum(entry.file_size for entry in entries)  # what the archive says it decompresses to
            require(total, f"{path} (decompressing to {total:,} bytes from {path.stat().st_size:,})")
            for entry in entries:
                where = f"{path}: {entry.filename}"
                _refuse_unless(entry.filename.endswith(".npy"), where, "is not an .npy array")
                with archive.open(entry) as handle:
                    claimed = _declared_bytes(handle, where)
                _refuse_unless(claimed <= entry.file_size, where, f"claims {claimed:,} bytes in a {entry.file_size:,}-byte entry")
        with np.load(path, allow_pickle=False) as loaded:
            _refuse_unless(isinstance(loaded, np.lib.npyio.NpzFile), path, "is not an .npz archive")
            return {name: loaded[name] for name in loaded.files}
    except zipfile.BadZipFile:
        raise EnsdiagError(f"{path} is not a readable .npz file (not a zip archive; a single array is a .npy)") from None
    except EnsdiagError:
        raise  # already one line for the user
    except (ValueError, OSError, EOFError, KeyError) as error:
        raise EnsdiagError(f"{path} is not a readable .npz file ({type(error).__name__})") from None
