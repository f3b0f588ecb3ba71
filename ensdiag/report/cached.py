"""A run folder's report kept beside it for the next `ensdiag report` (`report-cache.json`).

    report = kept_report(run_dir, options, build, usable)   # read back where it can be, else build() and kept

Building a report needs torch (the verdict's bootstrap, the effective size, OOD histograms);
reading one back does not, so a report asked for again (another `--format`, or `ensdiag report`
after `ensdiag train`, which writes the report as its last step) answers in well under a second.

A report is kept under a key of the code of ensdiag and of every installed plug-in (each module's
bytes: an edited install or a plug-in being written never reads an older report), the options, the
memory budget, the versions of Python and the libraries behind the report, and the names of the run
folder's files; beside it, the hash of every file the build read (io.RECORDED), kept only where no file
of the folder changed while it was built (size, times and inode), so what was hashed is what was read.
Reading it back hashes those files again and no other: a large file no report reads costs a look at
its name. A folder holding a link (whose target could change unseen), or one it cannot read through,
is not cached; a report is read back only where its figures are on disk. The file is signed
(HMAC-SHA256) with a key this user keeps in ensdiag's cache folder (a regular file of theirs, mode
0600, of its exact length, looked at before it is read), so a cache from anywhere else or written by
hand is never believed: it is ignored and the report built again, as for a damaged or stale one.
Where the cache folder cannot hold the key, nothing is cached.
"""

import contextlib
import hashlib
import hmac
import json
import os
import stat
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from importlib.util import find_spec
from pathlib import Path

from ..budget import memory_budget
from ..errors import EnsdiagError
from .. import io
from ..io import atomic_write_bytes, cache_dir, open_regular, plain_file, read_bounded
from ..runs import CACHE_FILE, REPORT_FILES

FORMAT = "ensdiag.report-cache/2"
MAX_BYTES = 64 << 20
KEY_BYTES = 32
PLUGIN_GROUP = "ensdiag.analyzers"
LIBRARIES = ("torch", "numpy", "scipy", "matplotlib", "safetensors")


def _code_digest() -> bytes:
    """ensdiag's modules and every plug-in's (the package of each `ensdiag.analyzers` entry point, found
    without importing it), by name and bytes."""
    digest, roots = hashlib.sha256(), [Path(__file__).resolve().parents[1]]
    for point in sorted(entry_points(group=PLUGIN_GROUP), key=lambda point: (point.name, point.value)):
        digest.update(f"{point.name}={point.value} {getattr(point.dist, 'version', None)}\0".encode())
        try:
            spec = find_spec(point.value.partition(":")[0].split(".")[0].strip())
        except (ImportError, ValueError):
            spec = None
        roots += [Path(place) for place in (spec.submodule_search_locations or [spec.origin or ""])] if spec else []
    for root in roots:
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            digest.update(os.fsencode(path.relative_to(root.parent)) + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.digest()


def _output(name: str) -> bool:
    """Whether a path of the run folder is the report's own output or a hidden temporary."""
    parts = Path(name).parts
    return parts[0] == "figures" or parts[-1] in REPORT_FILES or parts[-1].startswith(".")


def _state(run_dir: Path, options: dict) -> tuple[bytes, dict] | None:
    """(the key: code, options, environment and the folder's file names; {file: its size, times and
    inode}), or None where the folder cannot be cached (not a run folder, a link in it, unreadable)."""
    if not (run_dir / "experiment.json").is_file():
        return None
    try:
        files = {}
        for path in run_dir.rglob("*"):
            name = os.fsdecode(path.relative_to(run_dir))
            found = path.lstat()
            if stat.S_ISLNK(found.st_mode):
                return None
            if not _output(name):
                files[name] = (stat.S_IFMT(found.st_mode), found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino)
        environment = [memory_budget(), sys.version, *(_version(name) for name in LIBRARIES)]
        names = sorted((name, found[0]) for name, found in files.items())
        key = hashlib.sha256(_code_digest() + json.dumps([options, environment, names], default=str).encode())
    except Exception:  # a cache is an optimisation: a folder it cannot see through is reported as before
        return None
    return key.digest(), files


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _digest(path) -> str:
    content = hashlib.sha256()
    with open_regular(path, "file", follow=False) as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            content.update(chunk)
    return content.hexdigest()


def registered_here() -> bool:
    """Whether this process registered analyzers or methods of its own (from Python, not through an
    entry point): they change what a report shows, and no fingerprint of files sees them, so such a
    process neither reads nor writes the cache. (Where the registries were never imported, nothing
    was registered.)"""
    plugins = {point.value.partition(":")[0] for point in entry_points(group=PLUGIN_GROUP)}

    def foreign(module) -> bool:
        return not str(module).startswith("ensdiag.") and module not in plugins

    analyzers = getattr(sys.modules.get("ensdiag.analysis.registry"), "ANALYZERS", {})
    methods = getattr(sys.modules.get("ensdiag.nn.kit"), "METHODS", {})
    return any(foreign(getattr(analyzer.function, "__module__", None)) for analyzer in analyzers.values()) or \
        any(foreign(getattr(kit, "__module__", None)) for kit in methods.values())


def _secret() -> bytes | None:
    """This user's signing key (made once, readable by them alone), or None where it cannot be kept."""
    path = cache_dir() / "report-cache.key"
    try:
        if not os.path.lexists(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            made = path.with_name(f".{path.name}.{os.getpid()}")
            with os.fdopen(os.open(made, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
                handle.write(os.urandom(KEY_BYTES))
            os.replace(made, path)  # (two processes at once: one key wins; the other's first cache is not believed)
        found = os.lstat(path)  # before reading: a link (to a huge file), a key others could have planted or read
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid() or stat.S_IMODE(found.st_mode) != 0o600 \
                or found.st_size != KEY_BYTES:
            return None
        with open_regular(path, "key", follow=False) as handle:
            secret = handle.read(KEY_BYTES + 1)
    except (OSError, RuntimeError, EnsdiagError):  # (RuntimeError: no home folder to find the cache folder in)
        return None
    return secret if len(secret) == KEY_BYTES else None


def _signature(secret: bytes, key: bytes, body: bytes) -> str:
    return hmac.new(secret, key + body, hashlib.sha256).hexdigest()


def _read(run_dir: Path, key: bytes, secret: bytes) -> dict | None:
    """The report kept for exactly this key and the very bytes it read, signed with this user's key; else None."""
    path = run_dir / CACHE_FILE
    try:
        if not plain_file(path):
            return None
        signature, _, body = read_bounded(path, "report cache", MAX_BYTES).partition(b"\n")
        if not hmac.compare_digest(signature.decode("ascii"), _signature(secret, key, body)):
            return None
        found = json.loads(body)
        if found.get("format") != FORMAT or not isinstance(found.get("report"), dict) or any(
                _digest(run_dir / name) != digest for name, digest in found["read"].items()):
            return None
    except Exception:  # unreadable, damaged, not ours, a file it read is gone: build it again
        return None
    return found["report"]


def kept_report(run_dir: Path, options: dict, build, usable) -> dict:
    """The report kept for this folder and `options` where `usable(report)` (its figures on disk), else
    `build()`'s, kept for the next report where nothing in the folder changed while it was built."""
    before = _state(run_dir, options)
    secret = _secret() if before is not None and not registered_here() else None
    report = _read(run_dir, before[0], secret) if secret is not None else None
    if report is not None and usable(report):
        return report
    with contextlib.suppress(OSError):  # the figures about to be drawn are another report's than the one kept
        (run_dir / CACHE_FILE).unlink(missing_ok=True)
    io.RECORDED = read = set()
    try:
        report = build()
    finally:
        io.RECORDED = None
    if secret is None or registered_here():
        return report
    with contextlib.suppress(Exception):  # a cache is an optimisation: a folder that refuses it loses nothing
        names = {os.fsdecode(path.relative_to(run_dir) if path.is_relative_to(run_dir) else path.absolute()) for path in read}
        hashes = {name: _digest(run_dir / name) for name in names if not _output(name)}
        if _state(run_dir, options) == before:  # else a file changed as it was read: which bytes were read is unknown
            body = json.dumps({"format": FORMAT, "read": hashes, "report": report}).encode()
            atomic_write_bytes(run_dir / CACHE_FILE, _signature(secret, before[0], body).encode() + b"\n" + body)
    return report
