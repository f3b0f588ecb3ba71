"""How many intra-op threads torch computes with: the CPUs this process may use, and the work.

Two PyTorch processes whose OpenMP threads spin take the cores from each other, and the MLP gains
nothing from a second thread (docs/performance.md, "Threads"). So the CLI, which owns its process,
waits passively (entry.py) and computes with `--threads`, else OMP_NUM_THREADS, else its own choice; the
Python API keeps the caller's count: nothing here changes it unless the CLI `own`s the process,
and `owned` gives it back when the command ends. Torch-free (a report read back loads no torch).
"""

import contextlib
import os
import sys
from pathlib import Path

_STATE: dict = {}  # the CLI's {"explicit", "small", "before", "origin"} while it owns the process


def cpus(root: Path = Path("/sys/fs/cgroup"), own_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """The whole CPUs this process may use: its affinity, within its cgroup's CPU quota (at least 1)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = cgroup_quota(root, own_cgroup)
    return max(1, count if quota is None else min(count, int(quota)))


def cgroup_quota(root: Path, own_cgroup: Path) -> float | None:
    """The CPUs the tightest quota on this process's cgroup or one above it pays for (v2 `cpu.max`,
    v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`); None without one (files missing or odd: none)."""
    folders = {root}
    for line in _read(own_cgroup).splitlines():  # "id:controllers:path"; v2's controllers are ""
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "" or "cpu" in controllers.split(","):  # (a container mounts its own at the base)
            for base in [root] if controllers == "" else [root / "cpu", root / controllers]:
                folder = base / path.strip("/")
                folders |= {base, folder, *(parent for parent in folder.parents if base in parent.parents)}
    limits = []
    for folder in folders:
        v2 = _read(folder / "cpu.max").split()
        for quota, period in [v2[:2] if len(v2) == 2 else ("", ""),
                              (_read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us"))]:
            if quota.strip().isdigit() and period.strip().isdigit() and int(quota) > 0 and int(period) > 0:
                limits.append(int(quota) / int(period))  # ("max" and v1's -1: no quota)
    return min(limits, default=None)


def _read(path: Path) -> str:
    try:
        with open(path, encoding="ascii") as file:
            return file.read(256)
    except (OSError, UnicodeDecodeError, ValueError):
        return ""


def own(explicit: int | None = None, small: bool | None = None) -> None:
    """The CLI's: compute with `explicit` (--threads), else OMP_NUM_THREADS, else ensdiag's choice: one thread
    for a network without convolutions (`small`), else (another: False; none: None) the CPUs this process may
    use, at most torch's own count; set now where torch is loaded, else by `apply` once the work needs it."""
    _STATE.update(explicit=explicit, small=small)
    apply()


def apply(load: bool = False) -> None:
    """The count the CLI asked for, set where torch is loaded (`load`: load it); nothing for the API."""
    if "small" not in _STATE:
        return
    if load:
        import torch  # noqa: F401
    torch = sys.modules.get("torch")
    if torch is None:
        return
    before = _STATE.setdefault("before", torch.get_num_threads())
    given = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # as torch reads it ("4,2": 4)
    given = int(given) if given.isdigit() and 0 < int(given) <= 1024 else None
    count, _STATE["origin"] = next((count, origin) for count, origin in (
        (_STATE["explicit"], "--threads"), (given, "OMP_NUM_THREADS"),
        (1 if _STATE["small"] else max(1, min(before, cpus())), "ensdiag"))
        if count is not None)
    torch.set_num_threads(count)


def origin() -> str:
    """Who chose torch's count: --threads, OMP_NUM_THREADS, ensdiag, or the caller (the Python API)."""
    return _STATE.get("origin", "caller")


@contextlib.contextmanager
def owned():
    """Around one CLI command: torch's count given back when it ends (a command run in-process, as the
    tests do, leaves the process as it found it)."""
    try:
        yield
    finally:
        before, torch = _STATE.get("before"), sys.modules.get("torch")
        _STATE.clear()
        if before is not None and torch is not None:
            torch.set_num_threads(before)
