"""A run folder's predictions, read once for every statistic over seeds.

    loaded, damaged = load_seeds(runs)  # runs: {method: {seed: run}} (report/load.py)
    loaded["deep-ensemble"][1].id       # Examples of the test split (.nll, .brier, .log_probs, …)
    damaged                             # {method: {seed: why}}: predictions that could not be used

Each run's predictions.safetensors is read and checked once (predictions.load_predictions, the
checks every predictions file gets) and handed, as `Examples` per split, to the verdict, the
effective size and the bias–variance decomposition alike. A file that is there but cannot be read,
fails the checks or has no labelled test split is left out of all three and named with its reason
(the report shows it); a run without a predictions file (LoRA adapters compared by their weights)
has nothing to read.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from ..analysis.examples import Examples
from ..errors import EnsdiagError
from ..predictions import load_predictions

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


def read_predictions(folder) -> dict:
    """A run folder's predictions {split: {"logits", "labels"}}, checked (the stored splits and the pooled
    shift); an EnsdiagError naming the file and what is wrong with it."""
    return load_predictions(Path(folder) / PREDICTIONS)[0]


def read_seed(folder) -> Seed:
    """One run folder's predictions as a `Seed`; an EnsdiagError where they cannot be used."""
    splits = read_predictions(folder)
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
