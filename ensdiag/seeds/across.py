"""Every statistic over a report's seeds, from one read of each run's predictions, as data that
report/ renders (it computes none of it).

    found = across_seeds(runs, groups)  # AcrossSeeds(verdict, reasons, effective_size, bvd, damaged)
    loaded, damaged = load_seeds(runs)  # {method: {seed: Seed}}, {method: {seed: why}}
    loaded["deep-ensemble"][1].id       # Examples of the test split (.nll, .brier, .log_probs, …)

Each run's predictions.safetensors is read and checked once (predictions.load_predictions, the
checks every predictions file gets) and handed, as `Examples` per split, to the verdict, the
effective size and the bias–variance decomposition alike. A file that is there but cannot be read,
fails the checks or has no labelled test split is left out of all three and named with its reason
(`damaged`, which the report shows); a run without a predictions file (LoRA adapters compared by
their weights) has nothing to read.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from ..stats.bootstrap import Draws
from ..stats.examples import Examples
from ..errors import EnsdiagError
from ..predictions import load_predictions
from .bvd import run_decompositions
from .effective_size import effective_sizes
from .verdict import verdict

PREDICTIONS = "predictions.safetensors"


@dataclass
class Seed:
    """One run's predictions: the labelled test split (`id`), the validation and OOD splits where the run
    has them, and the NLL under shift per example (`shift_nll`, None without shift). The shift splits are
    reduced to that when read, so a run's CIFAR-10-C logits are not held."""
    id: Examples
    val: Examples | None = None
    ood: Examples | None = None
    shift_nll: torch.Tensor | None = None


def read_seed(folder) -> Seed:
    """One run folder's predictions as a `Seed`; an EnsdiagError where they cannot be used."""
    splits = load_predictions(Path(folder) / PREDICTIONS)[0]  # checked, with the pooled shift
    if "id" not in splits or splits["id"]["labels"] is None:
        raise EnsdiagError(f"{Path(folder) / PREDICTIONS} holds no labelled in-distribution (id) split")
    found = {name: Examples(splits[name]["logits"], splits[name]["labels"]) if name in splits else None
             for name in ("id", "val", "ood")}
    if found["val"] is not None and (found["val"].labels is None or not found["val"].size):
        found["val"] = None  # nothing to fit a temperature on
    return Seed(**found, shift_nll=_shift_nll(splits))


def _shift_nll(splits: dict) -> torch.Tensor | None:
    """The NLL under shift per example: where every corruption split holds the same labelled images (the pooled
    split's `clusters`, predictions.with_pooled_shift), the mean over corruptions per image (the corruptions of one
    image are one sample, resampled together as the pooled split's interval resamples them); otherwise every
    shifted example on its own. None without labelled shift."""
    shift = splits.get("shift")
    if shift is None or shift["labels"] is None:
        return None
    nll, clusters = Examples(shift["logits"], shift["labels"]).nll, shift.get("clusters")
    return nll.view(-1, clusters).mean(0) if clusters else nll


def load_seeds(runs: dict) -> tuple[dict, dict]:
    """({method: {seed: Seed}} of every run whose predictions could be used, {method: {seed: why}} of those
    whose predictions file could not), each file read once (`runs`: {method: {seed: run | None}})."""
    loaded, damaged = {method: {} for method in runs}, {}
    for method, seeds in runs.items():
        for seed, run in seeds.items():
            if run is None or not (Path(run["folder"]) / PREDICTIONS).exists():
                continue
            try:
                loaded[method][seed] = read_seed(run["folder"])
            except EnsdiagError as error:  # named in the report, never dropped silently
                damaged.setdefault(method, {})[seed] = str(error)
    return loaded, damaged


@dataclass
class AcrossSeeds:
    verdict: dict  # {method: entry} (verdict.py)
    reasons: dict  # {method: why it has no verdict}
    effective_size: dict  # {method: entry} (effective_size.py)
    bvd: dict  # {method: decomposition | {"reason"}} (bvd.py)
    damaged: dict  # {method: {seed: why}}: runs whose predictions file could not be used


def across_seeds(runs: dict, groups=None) -> AcrossSeeds:
    """The verdict, effective sizes and bias–variance decompositions of `runs` ({method: {seed: run}},
    report/load.py); with `groups` (several folders, report/merge.py) the verdict and the sizes within
    each folder."""
    loaded, damaged = load_seeds(runs)
    draws, reasons = Draws(), {}  # the test examples' resamples, drawn once for the effective sizes and the verdict
    sizes = _by_folder(lambda part, _: effective_sizes(part, draws), loaded, groups, {})
    verdicts = _by_folder(lambda part, why: verdict(part, why, draws), loaded, groups, reasons)
    for method, entry in verdicts.items():  # (its overall line leads with the method's size)
        if sizes.get(method):
            entry["effective_size"] = sizes[method]
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
