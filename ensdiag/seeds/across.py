"""Every statistic over a report's seeds, from one read of the runs' predictions (loaded.py).

    found = across_seeds(runs, groups)   # AcrossSeeds(verdict, reasons, effective_size, bvd, damaged)

report/aggregate.py renders what this returns and computes nothing of it.
"""

from dataclasses import dataclass

from ..analysis.bootstrap import Draws
from .bvd import run_decompositions
from .effective_size import effective_sizes
from .loaded import load_seeds
from .verdict import verdict


@dataclass
class AcrossSeeds:
    verdict: dict  # {method: entry} (verdict.py)
    reasons: dict  # {method: why it has no verdict}
    effective_size: dict  # {method: entry} (effective_size.py)
    bvd: dict  # {method: decomposition | {"reason"}} (bvd.py)
    damaged: dict  # {method: {seed: why}}: runs whose predictions file could not be used (loaded.py)


def across_seeds(runs: dict, groups=None) -> AcrossSeeds:
    """The verdict, effective sizes and bias–variance decompositions of `runs` ({method: {seed: run}},
    report/load.py); with `groups` (several folders, report/merge.py) the verdict and the sizes within
    each folder."""
    loaded, damaged = load_seeds(runs)
    draws, reasons = Draws(), {}  # the test examples' resamples, drawn once for the effective sizes and the verdict
    sizes = _by_folder(lambda part, _: effective_sizes(part, draws), loaded, groups, {})
    verdicts = _by_folder(lambda part, why: verdict(part, why, draws), loaded, groups, reasons)
    return AcrossSeeds(verdicts, reasons, sizes, run_decompositions(loaded), damaged)


def _by_folder(compute, runs: dict, groups, reasons: dict) -> dict:
    """compute(runs, reasons) of all the runs, or with `groups` of each folder's methods on their own (folders
    whose single model or Deep Ensemble are kept apart, report/merge.py), under their merged names; a method
    found in several folders keeps the entry of the most seeds."""
    if not groups:
        return compute(runs, reasons)
    found = {}
    for group in groups:
        named, why = {original: name for name, original in group.items()}, {}
        for method, entry in compute({original: runs[name] for name, original in group.items()}, why).items():
            if named[method] not in found or entry.get("seeds", 0) > found[named[method]].get("seeds", 0):
                found[named[method]] = entry
        reasons.update({named[method]: reason for method, reason in why.items()})
    return found
