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

Bias, variance and diversity over seeds (`run_decompositions`; Wood et al., JMLR 2023, "A unified theory
of diversity in ensemble learning"), for every ensemble method of a run with at least two seeds.

With members q_{s,i} (seed s of S, member i of k) on the in-distribution test set, averaged over
test examples:
- squared loss (Brier), arithmetic-mean ensemble q̄_s = mean_i q_{s,i}, central model
  q° = mean_{s,i} q_{s,i}:
      mean_s ‖y − q̄_s‖² = ‖y − q°‖²  +  mean_{s,i} ‖q_{s,i} − q°‖²  −  mean_{s,i} ‖q_{s,i} − q̄_s‖²
                          (bias)        (variance)                     (diversity)
- cross-entropy, normalised-geometric-mean ensemble q̄_s ∝ exp(mean_i log q_{s,i}), central
  model q° ∝ exp(mean_{s,i} log q_{s,i}):
      mean_s −log q̄_s(y) = −log q°(y)  +  mean_{s,i} KL(q° ‖ q_{s,i})  −  mean_{s,i} KL(q̄_s ‖ q_{s,i})
- cross-entropy, arithmetic-mean ensemble p̄_s = mean_i q_{s,i} (the ensemble ensdiag predicts
  with), the same central model, bias and variance (they describe the members, not how they are
  combined):
      mean_s −log p̄_s(y) = −log q°(y)  +  mean_{s,i} KL(q° ‖ q_{s,i})  −  [mean_{s,i} −log q_{s,i}(y) − mean_s −log p̄_s(y)]
  Here the diversity is the members' mean loss minus the ensemble's (Jensen's gap, ≥ 0): it
  depends on the label, as Wood et al. show it must for a combiner that is not the loss's own
  (for cross-entropy that is the normalised geometric mean).
All three hold exactly with the expectations over seeds taken as means over the run's seeds; the
bias includes the label noise, which labels alone cannot separate. Variance is what more
seeds of the same method would average away; diversity is what the members already do.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..stats.bootstrap import Draws
from ..stats.examples import Examples
from ..checks import test_set_difference
from ..errors import EnsdiagError
from ..predictions import load_predictions
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


COMBINERS = {"squared": "arithmetic mean of the members' probabilities",
             "cross_entropy": "normalised geometric mean of the members' probabilities",
             "cross_entropy_arithmetic": "arithmetic mean of the members' probabilities"}


def decompose(splits: list) -> dict[str, float]:
    """Each seed's test split (`Examples`, one test set) -> the three decompositions, each with its combiner
    named; the NLLs of p̄_s and of the members are the splits' own (Examples.nll, member_log_likelihood)."""
    log_q, labels = torch.stack([split.log_probs for split in splits]), splits[0].labels  # [S, k, N, C]
    q = log_q.exp()
    onehot = F.one_hot(labels, q.shape[-1]).double()
    central = q.mean(dim=(0, 1))  # [N, C]
    ensemble = q.mean(dim=1)  # [S, N, C]
    squared = {"loss": (onehot - ensemble).pow(2).sum(-1).mean().item(),
               "bias": (onehot - central).pow(2).sum(-1).mean().item(),
               "variance": (q - central).pow(2).sum(-1).mean().item(),
               "diversity": (q - ensemble[:, None]).pow(2).sum(-1).mean().item()}
    log_central = log_q.mean(dim=(0, 1))
    log_central = log_central - torch.logsumexp(log_central, -1, keepdim=True)
    log_ensemble = log_q.mean(dim=1)
    log_ensemble = log_ensemble - torch.logsumexp(log_ensemble, -1, keepdim=True)  # [S, N, C]
    central_q = log_central.exp()

    def kl(log_p, p, log_r):  # KL(p ‖ r) over the last axis
        return (p * (log_p - log_r)).sum(-1)

    cross_entropy = {"loss": -log_ensemble.gather(-1, labels.expand(log_ensemble.shape[0], -1)[..., None]).mean().item(),
                     "bias": -log_central.gather(-1, labels[:, None]).mean().item(),
                     "variance": kl(log_central, central_q, log_q).mean().item(),
                     "diversity": kl(log_ensemble[:, None], log_ensemble.exp()[:, None], log_q).mean().item()}
    member_loss = -torch.stack([split.member_log_likelihood for split in splits]).mean().item()
    arithmetic_loss = torch.stack([split.nll for split in splits]).mean().item()
    arithmetic = {"loss": arithmetic_loss, "bias": cross_entropy["bias"], "variance": cross_entropy["variance"],
                  "diversity": member_loss - arithmetic_loss}
    decompositions = {"squared": squared, "cross_entropy": cross_entropy, "cross_entropy_arithmetic": arithmetic}
    return {name: {**parts, "combiner": COMBINERS[name]} for name, parts in decompositions.items()}


def run_decompositions(runs: dict) -> dict:
    """{method: decomposition} for every method with ≥ 2 seeds and ≥ 2 members on one test set ({method:
    {seed: across.Seed}}); {"reason"} for one whose seeds were measured on different test sets."""
    found = {}
    for method, seeds in runs.items():
        splits = [run.id for run in seeds.values()]
        test_sets = [(split.labels, split.logits.shape[-1]) for split in splits]
        if test_sets and (difference := test_set_difference(test_sets)) is not None:
            found[method] = {"reason": f"its seeds were measured on different test sets ({difference})"}
        elif len(splits) >= 2 and splits[0].members >= 2 and len({split.logits.shape for split in splits}) == 1:
            found[method] = {**decompose(splits), "seeds": len(splits)}
    return found


@dataclass
class AcrossSeeds:
    verdict: dict  # {method: entry} (verdict.py)
    reasons: dict  # {method: why it has no verdict}
    effective_size: dict  # {method: entry} (effective_size.py)
    bvd: dict  # {method: decomposition | {"reason"}} (run_decompositions)
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
