"""The memory budget: how much a file from anywhere may make ensdiag allocate.

Every surface that reads arrays (predictions, data files, archives) checks what it is about to
allocate against one absolute budget before allocating, and refuses with the number: half the
machine's memory by default, or `ENSDIAG_MEMORY_BUDGET` (bytes, or with a K/M/G/T suffix) for
a larger legitimate file. Torch-free.
"""

import os
import re
from fractions import Fraction

from .errors import EnsdiagError

VARIABLE = "ENSDIAG_MEMORY_BUDGET"
MAX_BUDGET = 2**63 - 1  # 8 EiB: what a size in bytes can mean on any machine


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): a conservative 8 GiB
        return 8 * 2**30


_SHARE = 1  # the processes the budget is shared by: a forked worker of N holds 1/N of it (forked.py)


def share(processes: int) -> None:
    """This process holds 1/`processes` of the budget from now on (a forked worker of that many)."""
    global _SHARE
    _SHARE = max(1, processes)


def memory_budget() -> int:
    """Bytes a file may make ensdiag allocate: `ENSDIAG_MEMORY_BUDGET`, else half the memory (this
    process's share of it in a forked worker)."""
    given = os.environ.get(VARIABLE, "").strip()
    if not given:
        return physical_memory() // 2 // _SHARE
    # ASCII digits only (a bare \d also matches "٣" and "²"), and few enough of them to mean a size
    match = re.fullmatch(r"([0-9]{1,20}(?:\.[0-9]{1,20})?)\s*([KMGT]?)i?B?", given, flags=re.IGNORECASE | re.ASCII)
    if not match:
        raise EnsdiagError(f"{VARIABLE}={given[:40]!r} is not a size (e.g. 16G, 500M or a number of bytes)")
    power = "KMGT".find(match.group(2).upper()) + 1 if match.group(2) else 0
    size = int(Fraction(match.group(1)) * 1024 ** power)
    if size > MAX_BUDGET:
        raise EnsdiagError(f"{VARIABLE}={given[:40]!r} is more than any machine's memory (at most {MAX_BUDGET:,} bytes)")
    return size // _SHARE


def human(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:,.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024


def over_budget(size: int, what: str) -> str | None:
    """Why `what` (`size` bytes) cannot be allocated, or None when it fits the budget: the sentence a
    refusal says, or that a step skipped for memory keeps as its reason ("needs about 36.0 GiB, more
    than the memory budget of 8.0 GiB (…)")."""
    budget = memory_budget()
    if size <= budget:
        return None
    origin = f"{VARIABLE}" if os.environ.get(VARIABLE, "").strip() else "half this machine's memory"
    if _SHARE > 1:
        origin += f", shared by {_SHARE} worker processes"
    return (f"{what} needs about {human(size)}, more than the memory budget of {human(budget)} "
            f"({origin}; set {VARIABLE}=SIZE to allow more)")


def require(size: int, what: str) -> None:
    """Refuse (one line, with the numbers) when `what` would need more than the budget."""
    reason = over_budget(size, what)
    if reason is not None:
        raise EnsdiagError(reason)
