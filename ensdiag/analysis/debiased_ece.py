"""`debiased-ece`: a calibration error whose binned estimate is not biased upward at small n.

The binned ECE of a finite test set overstates the calibration error: a bin's accuracy carries
sampling noise, and |noise| only adds (Kumar et al. 2019, "Verified Uncertainty Calibration";
Roelofs et al. 2022). Kumar et al.'s debiased estimator of the squared ℓ2 calibration error of the
top-label confidence subtracts each bin's share of that noise:

    CE²_debiased = Σ_b (n_b / n) · [ (conf_b − acc_b)² − acc_b (1 − acc_b) / (n_b − 1) ]

over equal-mass bins (bins of one example add nothing), and reports sqrt(max(CE², 0)) — an ℓ2
calibration error, comparable with itself across test-set sizes, not with the ℓ1 ECE. The plug-in
ℓ2 error of the same bins (`plugin_l2`) is stored beside it: their gap is the bias removed.

Bins as the authors' package `uncertainty-calibration` makes them (`get_equal_bins`, 15 bins): the
sorted confidences cut into near-equal consecutive groups (numpy's array_split sizes), each edge
midway between neighbouring groups, the last at 1; an example goes into the first bin whose
edge is ≥ its confidence.
"""

import torch

from . import metrics as M
from .registry import Column, Skip, metric, register_analyzer

BINS = 15
DEFINITION = (f"Kumar et al.'s debiased ℓ2 calibration error of max p̄ over {BINS} equal-mass bins: "
              "sqrt(max(Σ_b n_b/n·[(conf_b − acc_b)² − acc_b(1 − acc_b)/(n_b − 1)], 0)); unbiased for the squared "
              "error, where the binned ECE grows as the test set shrinks")


def equal_mass_edges(confidence: torch.Tensor, bins: int = BINS) -> torch.Tensor:
    """The upper edges of `bins` equal-mass bins of `confidence` (fewer where confidences tie)."""
    ordered = confidence.double().sort().values
    parts = torch.tensor_split(ordered, min(bins, len(ordered)))  # numpy array_split's sizes
    edges = [(left[-1] + right[0]) / 2 for left, right in zip(parts, parts[1:])]
    return torch.unique(torch.stack([*edges, torch.tensor(1.0, dtype=torch.float64)]))


def debiased_l2(confidence: torch.Tensor, correct: torch.Tensor, bins: int = BINS) -> dict:
    """{"debiased_l2", "plugin_l2", "bins"} of top-label confidences and 0/1 correctness."""
    confidence, correct = confidence.double(), correct.double()
    n = len(confidence)
    which = torch.searchsorted(equal_mass_edges(confidence, bins), confidence, side="left")
    count = torch.bincount(which).double()
    used = count > 0
    conf = torch.bincount(which, weights=confidence)[used] / count[used]
    acc = torch.bincount(which, weights=correct)[used] / count[used]
    count = count[used]
    gap = (conf - acc) ** 2
    noise = torch.where(count > 1, acc * (1 - acc) / (count - 1).clamp(min=1), torch.zeros_like(acc))
    squared = torch.where(count > 1, gap - noise, torch.zeros_like(gap))
    return {"debiased_l2": float((count / n * squared).sum().clamp(min=0).sqrt()),
            "plugin_l2": float((count / n * gap).sum().sqrt()), "bins": int(used.sum())}


@register_analyzer("debiased-ece", description="Kumar et al.'s debiased ℓ2 calibration error beside the binned ECE",
                   columns=[Column("debiased ℓ2 CE", ("splits", "id", "debiased_l2", "value"), "down", DEFINITION,
                                   ("calibration",), 40, split="id")])
def debiased_ece(predictions, weights=None):
    splits = {}
    for name, split in predictions.items():
        logits, labels = split["logits"], split["labels"]
        if labels is None or len(labels) == 0:
            continue
        confidence, predicted = M.mean_probs(logits).max(dim=1)
        found = debiased_l2(confidence, (predicted == labels).double())
        splits[name] = {"debiased_l2": metric(found["debiased_l2"], DEFINITION),
                        "plugin_l2": metric(found["plugin_l2"], f"plug-in ℓ2 calibration error of the same {BINS} "
                                                               "equal-mass bins (biased upward)"),
                        "bins": found["bins"]}
    if not splits:
        raise Skip("no split has labels")
    return {"splits": splits}
