"""A run folder's report kept beside it for the next `ensdiag report` (`report-cache.json`).

    key = fingerprint(run_dir, options)       # what the report would be built from
    report = read_cached(run_dir, key)        # the report built from exactly that, or None
    write_cached(run_dir, key, report)        # after building it and drawing its figures

Building a report needs torch (the verdict's bootstrap, the effective size, OOD histograms);
reading one back does not, so a report asked for again (another `--format`, or `ensdiag report`
after `ensdiag train`, which writes the report as its last step) answers in well under a second.

The fingerprint covers ensdiag's own code (every module's bytes, so an edited install never
reads an older report), the plug-ins installed, the options, the memory budget and the versions
of Python and the libraries that compute and draw the report, and the path and bytes of every
file of the run folder except the report's own outputs and the models' weights (which no report
reads). A run folder holding a link (whose target could change unseen), or one it cannot read
through, is not cached. A report is read back only where its fingerprint is the folder's now and
its figures are on disk. The file is signed (HMAC-SHA256) with a key this user keeps in ensdiag's
cache folder (owned by them and readable by them alone, or no key), so a run folder from anywhere
else, or a cache written by hand, is never believed: it is ignored and the report built again, as
it is for a damaged, foreign or stale file. Where the cache folder cannot hold the key, nothing is
cached.
"""

import hashlib
import hmac
import json
import os
import stat
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path

from ..io import atomic_write_bytes, cache_dir, read_bounded

CACHE_FILE = "report-cache.json"
FORMAT = "ensdiag.report-cache/1"
OUTPUTS = {"report.md", "report.html", CACHE_FILE}  # what a report writes (figures/ too)
NOT_READ = {"model.safetensors", "training-state.pt"}  # weights no report reads (and may be large)
MAX_BYTES = 64 << 20
PLUGIN_GROUP = "ensdiag.analyzers"
LIBRARIES = ("torch", "numpy", "scipy", "matplotlib", "safetensors")


def _code_digest() -> bytes:
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.digest()


def fingerprint(run_dir, options: dict) -> bytes | None:
    """A digest of everything a report of `run_dir` with `options` is built from, or None where the
    folder cannot be fingerprinted (not a run folder, a link inside it, whose target may change
    unseen, a file it cannot read): then nothing is cached."""
    run_dir = Path(run_dir)
    if not (run_dir / "experiment.json").is_file():
        return None
    try:
        from ..budget import memory_budget
        digest = hashlib.sha256(_code_digest())
        plugins = sorted(f"{point.name}={point.value} {getattr(point.dist, 'version', None)}"
                         for point in entry_points(group=PLUGIN_GROUP))
        # what else a report depends on: the memory budget (a refusal names it), the libraries that compute and draw it
        environment = [memory_budget(), sys.version, *(_version(name) for name in LIBRARIES)]
        digest.update(json.dumps([options, plugins, environment], sort_keys=True, default=str).encode())
        for path in sorted(run_dir.rglob("*")):
            relative = path.relative_to(run_dir)
            if path.is_symlink():
                return None
            if relative.parts[0] == "figures" or path.name in OUTPUTS or path.name in NOT_READ \
                    or path.name.startswith(".") or not stat.S_ISREG(path.lstat().st_mode):  # (hidden: temporaries)
                continue
            content = hashlib.sha256()
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    content.update(chunk)
            digest.update(os.fsencode(relative) + b"\0" + content.digest())
    except Exception:  # a cache is an optimisation: a folder it cannot see through is reported as before
        return None
    return digest.digest()


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


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
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            made = path.with_name(f".{path.name}.{os.getpid()}")
            with os.fdopen(os.open(made, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
                handle.write(os.urandom(32))
            os.replace(made, path)  # (two processes at once: one key wins; the other's first cache is not believed)
        found = path.read_bytes()
        owned = path.stat()
        if owned.st_uid != os.geteuid() or owned.st_mode & 0o077:  # a key others could have planted or read
            return None
    except (OSError, RuntimeError):  # (RuntimeError: no home folder to find the cache folder in)
        return None
    return found if len(found) == 32 else None


def _signature(secret: bytes, key: bytes, body: bytes) -> str:
    return hmac.new(secret, key + body, hashlib.sha256).hexdigest()


def read_cached(run_dir, key: bytes) -> dict | None:
    """The report kept for exactly this fingerprint, signed with this user's key; else None."""
    path = Path(run_dir) / CACHE_FILE
    secret = _secret() if path.is_file() and not path.is_symlink() and not registered_here() else None
    if secret is None:
        return None
    try:
        signature, _, body = read_bounded(path, "report cache", MAX_BYTES).partition(b"\n")
        if not hmac.compare_digest(signature.decode("ascii"), _signature(secret, key, body)):
            return None
        found = json.loads(body)
    except Exception:  # unreadable, damaged, not ours: build it again
        return None
    if not isinstance(found, dict) or found.get("format") != FORMAT or not isinstance(found.get("report"), dict):
        return None
    return found["report"]


def write_cached(run_dir, key: bytes, report: dict) -> None:
    """Keep `report` for the next report of the same files and options (skipped where it cannot be)."""
    secret = None if registered_here() else _secret()
    if secret is None:
        return
    try:
        body = json.dumps({"format": FORMAT, "report": report}).encode()
        atomic_write_bytes(Path(run_dir) / CACHE_FILE, _signature(secret, key, body).encode() + b"\n" + body)
    except Exception:  # a cache is an optimisation: a folder that refuses it loses nothing
        return
