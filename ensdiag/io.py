"""File I/O: atomic writes, JSON and safetensors reading with one-line errors, the run-folder lock.

Atomic writes go to a temporary file in the same folder, fsync, then rename into place: a
crash or Ctrl-C at any moment leaves either the old file or the new one, never half.
safetensors files are written byte-for-byte reproducibly (`safetensors_bytes_deterministic`).
"""

import fcntl
import json
import os
import re
import struct
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import EnsdiagError

TEMPORARY_SUFFIX = ".tmp"  # atomic writes go to ".<name>.<random>.tmp" next to the target


def atomic_write_bytes(path, data: bytes) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    except OSError as error:
        raise EnsdiagError(f"cannot write {path}: {error.strerror or error}") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, data) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


def read_json(path, what="file"):
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EnsdiagError(f"{what} {path} does not exist") from None
    except EnsdiagError:
        raise  # already one line for the user
    except (OSError, ValueError) as error:
        raise EnsdiagError(f"{what} {path} is not readable JSON ({error})") from None


def remove_stale_temporaries(folder, names, subfolders=()) -> list[Path]:
    """Delete the hidden temporaries that a process killed mid-write left for the files `names`
    in `folder` and in each of the glob patterns `subfolders` below it (never deeper, never
    any other file). Call it only while holding the folder's lock (`locked_folder`)."""
    pattern = re.compile(rf"\.({'|'.join(map(re.escape, names))})\.[A-Za-z0-9_]+{re.escape(TEMPORARY_SUFFIX)}")
    removed = []
    folders = [Path(folder), *(sub for glob in subfolders for sub in Path(folder).glob(glob) if sub.is_dir())]
    for place in folders:
        for path in place.iterdir():
            if pattern.fullmatch(path.name) and path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


@contextmanager
def locked_folder(folder, what="folder"):
    """Hold an exclusive lock on a folder (flock on the directory itself, released on exit or
    when the process dies), or fail at once with one line if another process holds it."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        raise EnsdiagError(f"cannot open {what} {folder}: {error.strerror or error}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EnsdiagError(f"another ensdiag process is writing to {what} {folder}; wait for it to finish "
                               "or choose another folder") from None
        except OSError as error:  # a network file system without flock
            raise EnsdiagError(f"cannot lock {what} {folder} ({error.strerror or error}): its file system "
                               "does not support file locks; use a local or lock-capable one") from None
        yield Path(folder)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


# ------------------------------------------------------------------ safetensors (imported on first use)

def safetensors_bytes_deterministic(tensors: dict, metadata: dict[str, str] | None = None) -> bytes:
    """`safetensors.torch.save`, with its JSON header rewritten so equal inputs give equal bytes.

    safetensors emits the `__metadata__` map in a random order (a Rust HashMap seeded per
    process). The layout is: u64 little-endian header length N, N bytes of UTF-8 JSON padded
    with spaces to a multiple of 8, then the tensor data. The header is re-serialised with
    sorted keys and compact separators and re-padded; the data section is kept as it is (its
    `data_offsets` are relative to the data section, so they stay valid).
    """
    from safetensors.torch import save as safetensors_bytes

    raw = safetensors_bytes(tensors, metadata=metadata)
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length].decode("utf-8"))
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + raw[8 + length:]


def read_safetensors(path, what="file", only=None) -> tuple[dict, dict[str, str]]:
    """The tensors (all, or those of `only` that the file has) and the metadata of a safetensors
    file, or one clear EnsdiagError. `only` spares reading what a caller does not need (a CIFAR-10-C
    predictions file is mostly shift logits)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if path.is_dir():
        raise EnsdiagError(f"{what} {path} is a directory, not a .safetensors file")
    if not path.exists():
        raise EnsdiagError(f"{what} {path} does not exist")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys() if only is None or name in only}
    except EnsdiagError:
        raise  # already one line for the user
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise EnsdiagError(f"{path} is not a readable safetensors file ({reason})") from None
    return tensors, metadata
