"""How many intra-op threads torch computes with: the CPUs this process may use, and the work.

OpenMP's waiting threads spin, so two PyTorch processes that each start a thread per core take
cores from each other and crawl; a small network gains nothing from a second thread even on an
idle machine (docs/performance.md, "Threads"). So the CLI, which owns its process, waits passively
(entry.py) and computes with `choose`: one thread for a network without convolutions, else the
CPUs the process may use (its affinity, within its cgroup's CPU quota) and no more than torch's
own default. `--threads N` or OMP_NUM_THREADS wins. The Python API computes with whatever the
caller's process has: nothing here changes it unless the CLI `own`s the process, and `owned`
gives the count back when the command ends. Torch-free: `report` reads a report back without it.
"""

import contextlib
import os
import sys
from pathlib import Path

MOST = 1024  # more threads than this is a typo, not a machine
_STATE: dict = {}  # the CLI's: {"explicit", "small", "before", "origin"} while it owns the process


def cpus(root: Path = Path("/sys/fs/cgroup"), own_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """The whole CPUs this process may use: its affinity, within its cgroup's CPU quota (at least 1)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = cgroup_quota(root, own_cgroup)
    return max(1, count if quota is None else min(count, int(quota)))


def cgroup_quota(root: Path, own_cgroup: Path) -> float | None:
    """The CPUs the tightest CPU quota on this process's cgroup or any above it pays for (cgroup v2
    `cpu.max` "QUOTA PERIOD", v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`); None without one. Files
    that are missing, unreadable or odd count as no quota."""
    limits = []
    for folder in _cgroup_folders(root, own_cgroup):
        v2 = _read(folder / "cpu.max").split()
        for quota, period in ([v2] if len(v2) == 2 else []) + [(_read(folder / "cpu.cfs_quota_us"),
                                                                 _read(folder / "cpu.cfs_period_us"))]:
            with contextlib.suppress(ValueError):
                if int(quota) > 0 and int(period) > 0:  # "max" and v1's -1: no quota
                    limits.append(int(quota) / int(period))
    return min(limits, default=None)


def _cgroup_folders(root: Path, own_cgroup: Path) -> list[Path]:
    """The folders of this process's CPU cgroup and those above it, for v2 and v1 (in a container the
    cgroup's own path may not exist where its files are mounted at the root)."""
    folders = {root}
    for line in _read(own_cgroup).splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            bases = [root]
        elif "cpu" in controllers.split(","):
            bases = [root / "cpu", root / controllers]
        else:
            continue
        for base in bases:
            folder = base / path.strip("/")
            folders |= {base, folder, *(parent for parent in folder.parents if base in parent.parents)}
    return sorted(folders)


def _read(path: Path) -> str:
    try:
        with open(path, encoding="ascii") as file:
            return file.read(256)
    except (OSError, UnicodeDecodeError, ValueError):
        return ""


def _from_environment() -> int | None:
    """OMP_NUM_THREADS as torch reads it (the first level of "4,2"), where it is a usable count."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and 1 <= int(value) <= MOST else None


def choose(small: bool | None, default: int) -> int:
    """ensdiag's threads for work on a network without convolutions (`small`), or another (False), or
    none (None): `default` is torch's own count, never exceeded."""
    return 1 if small else max(1, min(default, cpus()))


def own(explicit: int | None = None, small: bool | None = None) -> None:
    """The CLI's: compute with `explicit` threads (--threads), else OMP_NUM_THREADS, else `choose(small)`;
    set now where torch is loaded, else by `apply` once it is."""
    _STATE.update(explicit=explicit, small=small)
    apply()


def apply(load: bool = False) -> None:
    """Set the count the CLI asked for where torch is loaded (`load`: load it: the work needs it now);
    nothing for the Python API."""
    if "small" not in _STATE:
        return
    if load:
        import torch  # noqa: F401
    torch = sys.modules.get("torch")
    if torch is None:
        return
    before = _STATE.setdefault("before", torch.get_num_threads())
    explicit, origin = _STATE["explicit"], "--threads"
    if explicit is None:
        explicit, origin = _from_environment(), "OMP_NUM_THREADS"
    if explicit is None:
        explicit, origin = choose(_STATE["small"], before), "ensdiag"
    _STATE["origin"] = origin
    torch.set_num_threads(explicit)


def origin() -> str:
    """Who chose the count torch computes with: --threads, OMP_NUM_THREADS, ensdiag, or the caller (the
    Python API, which keeps the calling process's)."""
    return _STATE.get("origin", "caller")


@contextlib.contextmanager
def owned():
    """Around one CLI command: whatever it set, torch's count is given back when it ends (a command run
    in-process, as the tests do, leaves the process as it found it)."""
    try:
        yield
    finally:
        before, torch = _STATE.get("before"), sys.modules.get("torch")
        _STATE.clear()
        if before is not None and torch is not None:
            torch.set_num_threads(before)


__all__ = ["apply", "cgroup_quota", "choose", "cpus", "origin", "own", "owned"]
