"""File I/O: atomic writes, JSON and safetensors reading with one-line errors, the run-folder lock,
and the rules for files and folders from anywhere.

Atomic writes go to a temporary file in the same folder, fsync, then rename into place: a
crash or Ctrl-C at any moment leaves either the old file or the new one, never half.
safetensors files are written byte-for-byte reproducibly (`safetensors_bytes_deterministic`).

Files are read as untrusted: only regular files are opened (a FIFO or a device would block or
never end), JSON is bounded in size and nesting (`read_json`, `parse_json`: one error for all),
and every folder ensdiag writes below the one it was given is a real folder there, never a
link that leads elsewhere (`inner_folder`).
"""

import fcntl
import json
import math
import os
import re
import stat
import struct
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .budget import require
from .errors import EnsdiagError

TEMPORARY_SUFFIX = ".tmp"  # atomic writes go to ".<name>.<random>.tmp" next to the target


def is_path(value: str) -> bool:
    """Whether an --ood/--shift/--data value names files rather than a registered dataset."""
    return value.endswith((".npz", ".npy")) or "/" in value or "\\" in value or Path(value).is_dir()


def cache_dir() -> Path:
    """Where ensdiag keeps what it made to use again (`$ENSDIAG_CACHE`, else ~/.cache/ensdiag)."""
    return Path(os.environ.get("ENSDIAG_CACHE") or Path.home() / ".cache" / "ensdiag")


def atomic_write_bytes(path, data: bytes) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    except OSError as error:
        raise EnsdiagError(f"cannot write {path}: {error.strerror or error}") from None
    try:
        umask = os.umask(0)  # (read by setting it: there is no getter)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:  # a folder in the file's place, a full disk: one line naming it, not the temporary
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise EnsdiagError(f"cannot write {path}: {error.strerror or type(error).__name__}") from None
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, data) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


# ------------------------------------------------------------------ reading files from anywhere

MAX_JSON_BYTES = 64 << 20  # a shard index of a 400B model is a few MiB; ensdiag's own files far less
MAX_JSON_DEPTH = 64  # ensdiag's files and PEFT's configs nest a few levels; deeper is damage or malice


RECORDED: set | None = None  # while report/cached.py builds a report: every file read through this module


def plain_file(path) -> bool:
    """Whether `path` is a regular file itself, not a link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def regular_file(path, what="file", follow: bool = True) -> Path:
    """`path`, if it is a regular file (links followed, or refused with `follow=False`). A folder, FIFO,
    device or socket is refused before anything opens it: opening a FIFO waits for a writer for ever."""
    path = Path(path)
    try:
        mode = (os.stat if follow else os.lstat)(path).st_mode
    except FileNotFoundError:
        raise EnsdiagError(f"{what} {path} does not exist") from None
    except OSError as error:
        raise EnsdiagError(f"cannot read {what} {path}: {error.strerror or error}") from None
    if stat.S_ISDIR(mode):
        raise EnsdiagError(f"{what} {path} is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise EnsdiagError(f"{what} {path} is not a regular file (a link, pipe, device or socket): ensdiag reads files only")
    if RECORDED is not None:
        RECORDED.add(path)
    return path


def open_regular(path, what="file", follow: bool = True):
    """A binary file object of the regular file `path` (`follow=False`: never a link's): opened without waiting
    (O_NONBLOCK: a FIFO put in its place after `regular_file` looked does not block) and checked again once open."""
    regular_file(path, what, follow)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | (0 if follow else os.O_NOFOLLOW))
    except OSError as error:
        raise EnsdiagError(f"cannot read {what} {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EnsdiagError(f"{what} {path} is not a regular file (a pipe, device or socket): ensdiag reads files only")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path, what="file", limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; a longer one is refused after reading
    `limit` + 1 (its stated size is not trusted: files in /proc state 0)."""
    with open_regular(path, what) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as error:
            raise EnsdiagError(f"cannot read {what} {path}: {error.strerror or error}") from None
    if len(data) > limit:
        raise UnreadableJson(f"{what} {path}", f"larger than {limit:,} bytes")
    return data


class UnreadableJson(EnsdiagError):
    """A JSON file or text that is not JSON ensdiag reads: "<where> is not readable JSON (<reason>)"."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where} is not readable JSON ({reason})")
        self.where, self.reason = where, reason


def _depth(value) -> int:
    """How deeply arrays and objects nest in a parsed value (iteratively: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_JSON_DEPTH:
                stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def parse_json(text, where: str):
    """JSON text (str or UTF-8 bytes) parsed, nested at most `MAX_JSON_DEPTH` levels; anything
    else is one `UnreadableJson` line naming `where`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise UnreadableJson(where, f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise UnreadableJson(where, "not UTF-8 text") from None
    except ValueError as error:  # JSONDecodeError, or an integer of thousands of digits
        reason = getattr(error, "msg", None) or str(error).splitlines()[0]
        at = f" at line {error.lineno} column {error.colno}" if hasattr(error, "colno") else ""
        raise UnreadableJson(where, f"{reason[:80]}{at}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise UnreadableJson(where, f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_json(path, what="file", limit: int = MAX_JSON_BYTES):
    """A JSON file from anywhere: a regular file of at most `limit` bytes, nested at most
    `MAX_JSON_DEPTH` levels, or one line naming it."""
    return parse_json(read_bounded(path, what, limit), f"{what} {path}")


def text_lines(path, what: str, max_lines: int, max_line_bytes: int, unit: str):
    """(number, text) of every non-blank line of a text file from anywhere: a regular file (never a
    FIFO waited on), at most `max_lines` lines of at most `max_line_bytes` bytes, strict UTF-8, a
    byte-order mark on line 1 skipped; anything else one line "<path>, line N: …" (`unit` says what a
    line holds, e.g. "one question per line")."""
    def fail(number, message):
        raise EnsdiagError(f"{path}, line {number}: {message}")

    with open_regular(path, what) as handle:
        number = 0
        while raw := handle.readline(max_line_bytes + 1):
            number += 1
            if number > max_lines:
                fail(number, f"more than {max_lines:,} lines ({unit})")
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                fail(number, f"longer than {max_line_bytes:,} bytes ({unit})")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                fail(number, f"not UTF-8 text (byte {error.start + 1} of the line)")
            text = text.removeprefix("\ufeff") if number == 1 else text  # a byte-order mark some editors write
            if text.strip():
                yield number, text


# ------------------------------------------------------------------ members given as files or folders

def identity(path):
    """What a file or folder is, whatever it was called: its device and inode (a link, a hard link or
    another spelling of the path gives the same), or its resolved path where it cannot be looked at."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        return ("path", os.path.realpath(path))
    return ("inode", found.st_dev, found.st_ino)


def distinct_members(paths, what: str = "member") -> list[Path]:
    """`paths`, each one member of an ensemble, refused in one line when two of them are the same file or
    folder (after links): one member given twice would count twice, with a disagreement of 0 between them."""
    seen = {}
    for path in map(Path, paths):
        key = identity(path)
        if key in seen:
            which = f"{path} is given twice" if str(seen[key]) == str(path) else \
                f"{seen[key]} and {path} are the same file or folder (after links)"
            raise EnsdiagError(f"{which}: one {what} would count as two members; give each {what} once")
        seen[key] = path
    return [Path(path) for path in paths]


# ------------------------------------------------------------------ writing inside a folder

def inner_folder(root, *parts, what="folder", create=True) -> Path:
    """`root/part/…`, created as needed (unless not `create`: only checked), every folder below
    `root` a real folder inside it: an existing link (or file) on the way is refused in one line,
    so nothing is ever written through a link to somewhere else. `root` itself is the user's
    choice and may be anything that is a folder."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise EnsdiagError(f"{root} exists and is not a directory")
    folder = root
    for part in parts:
        folder = folder / part
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            kind = "a link" if folder.is_symlink() else "a file"
            raise EnsdiagError(f"{folder} is {kind}, not a folder of {root}: ensdiag writes {what}s only inside the "
                               "folder it is given and never through a link; remove it or choose another folder")
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise EnsdiagError(f"cannot create {folder}: {error.strerror or error}") from None
    return folder


def remove_stale_temporaries(folder, names, subfolders=()) -> list[Path]:
    """Delete the hidden temporaries that a process killed mid-write left for the files `names`
    in `folder` and in each of the glob patterns `subfolders` below it (never deeper, never
    any other file, never through a link). Call it only while holding the folder's lock (`locked_folder`)."""
    pattern = re.compile(rf"\.({'|'.join(map(re.escape, names))})\.[A-Za-z0-9_]+{re.escape(TEMPORARY_SUFFIX)}")
    removed = []
    folder = Path(folder)
    folders = [folder, *(sub for glob in subfolders for sub in folder.glob(glob)
                         if sub.is_dir() and not _through_link(folder, sub))]
    for place in folders:
        for path in place.iterdir():
            if pattern.fullmatch(path.name) and plain_file(path):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def _through_link(folder: Path, below: Path) -> bool:
    """Whether the path `below` (inside `folder`) passes through a link on the way."""
    parts = below.relative_to(folder).parts
    return any(folder.joinpath(*parts[:end]).is_symlink() for end in range(1, len(parts) + 1))


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


# bytes per element of safetensors' dtypes (its header names them)
SAFETENSORS_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                     "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def read_safetensors(path, what="file", only=None, shapes: dict | None = None) -> tuple[dict, dict[str, str]]:
    """The tensors (all, or those of `only` that the file has) and the metadata of a safetensors
    file, or one clear EnsdiagError. `only` spares reading what a caller does not need (a CIFAR-10-C
    predictions file is mostly shift logits); `shapes` receives every tensor's shape from the header."""
    from safetensors import SafetensorError, safe_open

    path = regular_file(path, what)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            names = [name for name in handle.keys() if only is None or name in only]
            if shapes is not None:
                shapes.update({name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()})
            # the memory budget (budget.py) against what reading `names` allocates, from the header's shapes and
            # dtypes: a sparse file (or one whose size is no reason to trust it) is refused before it is read
            require(sum(math.prod(found.get_shape()) * SAFETENSORS_BYTES.get(str(found.get_dtype()).upper(), 8)
                        for found in map(handle.get_slice, names)), f"{what} {path}: reading its tensors")
            tensors = {name: handle.get_tensor(name) for name in names}
    except EnsdiagError:
        raise  # already one line for the user
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise EnsdiagError(f"{path} is not a readable safetensors file ({reason})") from None
    return tensors, metadata
