"""`calibration`: accuracy, NLL, ECE (with reliability bins), Brier and per-member scores on every
labelled split; on the in-distribution test set also the detail catalogue: adaptive, classwise
and torch-uncertainty's ECE, MCE, the direction of miscalibration, SmoothECE (with its curve).

Each number is a statistic of the split's examples and their weights (weighted.py), so its value
and its bootstrap interval come from the same function (resampled.py).
"""

import torch

from ..stats import metrics as M
from ..stats import smooth_ece as SE
from ..stats import weighted as W
from ..stats import ordered as O
from ..stats.examples import Examples
from .registry import CATALOGUE_LEFT_OUT, Column, register_analyzer, register_resampler
from ..errors import Skip
from ..layout import SPLIT_TABLES, empty_metric, finite, metric
from ..stats.resampled import Refused, per_split, value

ECE_BINS = 15
DEFINITIONS = {
    "accuracy": "fraction of samples whose argmax of p̄ (mean member probability) equals the label",
    "nll": "mean of −log p̄(y|x), natural log, from member log-softmax (logsumexp − log k)",
    "ece": f"Σ_b |B_b|/N·|acc_b − conf_b| over {ECE_BINS} equal-width bins of max p̄; first bin [0,1/{ECE_BINS}], then (lo,hi]; 1.0 in the last bin",
    "brier": "mean over samples of Σ_c (p̄_c − 1[y=c])²",
    "member_accuracy": "accuracy of each member's own argmax",
    "member_nll": "mean −log p_i(y|x) of each member",
    "ece_adaptive": f"ECE over {ECE_BINS} equal-mass bins of max p̄ (N/{ECE_BINS} samples each)",
    "ece_adaptive_tu": f"adaptive ECE with torch-uncertainty's bins: ⌊N/{ECE_BINS}⌋ samples each, the N mod {ECE_BINS} "
                       "extra ones in the first bins",
    "ece_classwise": f"mean over the classes c that occur (a label, or p̄_c > 0) of Σ_b |B_b|/N·|freq(y=c) − mean p̄_c| over {ECE_BINS} equal-width bins of p̄_c",
    "overconfidence": "Σ_b |B_b|/N·(conf_b − acc_b) over the ECE's bins: > 0 over-confident, < 0 under-confident",
    "mce": f"maximum calibration error: max over the non-empty ones of the ECE's {ECE_BINS} bins of |acc_b − conf_b|; it "
           "reads high on a test set (the worst of noisy, often sparse bins: on known populations several times the "
           "population's MCE, docs/conventions.md)",
    "ece_direction": "over-confidence / ECE, in [−1, 1]: +1 every bin over-confident (conf > acc), −1 every bin "
                     "under-confident, between: both; N/A when ECE = 0",
    "smooth_ece": "SmoothECE (Błasiok & Nakkiran 2023): ∫|r̂(t)|δ̂(t)dt with r̂ the kernel regression of conf − correct "
                  "on conf and δ̂ the density of conf, Gaussian kernel reflected at 0 and 1, bandwidth σ* the fixed "
                  "point smECE_σ = σ (bisection, 2⁻¹⁰; relplot's numerics); `curve`: the smoothed accuracy at σ*",
    "smooth_ece_tu": "SmoothECE as torch-uncertainty computes it by default: the Gaussian kernel in log-odds space "
                     "(its fixed-point bandwidth the same way)",
}


def bins(split: Examples, w) -> W.Bins:
    """The ECE's bins of this weighting, made once for every number read off them."""
    return split.per_weighting("ece-bins", w, lambda: W.calibration_bins(split.confidence, split.correct, w, ECE_BINS))


HEADLINE = {  # every labelled split: the per-split tables
    "accuracy": lambda split, w: W.mean(split.correct, w),
    "nll": lambda split, w: W.mean(split.nll, w),
    "ece": lambda split, w: bins(split, w).folded(),
    "brier": lambda split, w: W.mean(split.brier, w),
}
DETAIL = {  # the in-distribution test set only: the calibration table
    "overconfidence": lambda split, w: bins(split, w).signed(),
    "ece_direction": lambda split, w: bins(split, w).direction(),
    "mce": lambda split, w: bins(split, w).mce(),
    "ece_adaptive": lambda split, w: O.equal_mass_bins(split.confidence, split.correct, w, ECE_BINS).folded(),
    "ece_adaptive_tu": lambda split, w: O.equal_mass_bins(split.confidence, split.correct, w, ECE_BINS,
                                                          extra_first=True).folded(),
    "ece_classwise": lambda split, w: W.classwise_bins(split.mean, split.labels, w, ECE_BINS).folded(),
    "smooth_ece": lambda split, w: SE.smooth_ece(split.confidence, split.correct, w),
    "smooth_ece_tu": lambda split, w: SE.smooth_ece(split.confidence, split.correct, w, kernel="logit"),
}


@register_analyzer("calibration", description="Accuracy, NLL, ECE, Brier and per-member scores on every labelled split",
                   version=4,  # 2: adaptive and classwise ECE, over-confidence; 3: torch-uncertainty's adaptive bins;
                   # 4: MCE, ECE direction, SmoothECE (and torch-uncertainty's) with its curve
                   columns=[Column("Acc", ("splits", "{split}", "accuracy", "value"), "up", "accuracy of p̄", ("id", "shift"), 10),
                            Column("NLL", ("splits", "{split}", "nll", "value"), "down", "−log p̄(y|x)", ("id", "shift"), 20),
                            Column("ECE", ("splits", "{split}", "ece", "value"), "down", "15-bin expected calibration error",
                                   ("id", "shift"), 30),
                            Column("Brier", ("splits", "{split}", "brier", "value"), "down", "Σ_c (p̄_c − 1[y=c])², mean "
                                   "over samples", ("id", "shift"), 32),
                            Column("adaptive ECE", ("splits", "id", "ece_adaptive", "value"), "down",
                                   DEFINITIONS["ece_adaptive"], ("calibration",), 10, split="id", since=2,
                                   peer=("splits", "id", "ece_adaptive_tu", "value"), peer_since=3),
                            Column("classwise ECE", ("splits", "id", "ece_classwise", "value"), "down",
                                   DEFINITIONS["ece_classwise"], ("calibration",), 20, split="id", since=2,
                                   interval="upper"),  # 15 sparse bins per class: the ray misses a calibrated model's 0
                            Column("over-confidence", ("splits", "id", "overconfidence", "value"), None,
                                   DEFINITIONS["overconfidence"], ("calibration",), 30, split="id", since=2),
                            Column("ECE direction", ("splits", "id", "ece_direction", "value"), None,
                                   DEFINITIONS["ece_direction"], ("calibration",), 35, split="id", since=4),
                            Column("MCE (reads high)", ("splits", "id", "mce", "value"), "down", DEFINITIONS["mce"],
                                   ("calibration",), 40, split="id", since=4),
                            Column("SmoothECE", ("splits", "id", "smooth_ece", "value"), "down", DEFINITIONS["smooth_ece"],
                                   ("calibration",), 50, split="id", since=4,
                                   peer=("splits", "id", "smooth_ece_tu", "value"), peer_since=4,
                                   interval="upper")])  # always > 0 on a test set: [0, …] covers a calibrated model
def calibration(predictions, weights=None, catalogue: bool = True):
    splits = {}
    for name, split in predictions.items():
        if split["labels"] is None:
            continue
        split = Examples.of(split)
        if split.size == 0:  # every metric is a mean over no samples: undefined (its bins are empty)
            splits[name] = {key: empty_metric(definition, **({"bins": finite(reliability(bins(split, None)))} if key == "ece" else {}))
                            for key, definition in DEFINITIONS.items() if key in HEADLINE or name == "id"}
            splits[name]["n"] = 0
            continue
        entry = {key: metric(value(statistic(split, None)), DEFINITIONS[key]) for key, statistic in HEADLINE.items()}
        if name in SPLIT_TABLES:  # the reliability bins of the per-split tables' splits (not of every corruption)
            entry["ece"]["bins"] = finite(reliability(bins(split, None)))
        entry["member_accuracy"] = metric(M.member_accuracy(split), DEFINITIONS["member_accuracy"])
        entry["member_nll"] = metric(M.member_nll(split), DEFINITIONS["member_nll"])
        if name == "id" and not catalogue:  # the calibration table left out: N/A, saying why
            entry.update({key: metric(None, DEFINITIONS[key], note=CATALOGUE_LEFT_OUT) for key in DETAIL})
        elif name == "id":  # the detail catalogue: the report shows it for the in-distribution test set
            entry.update({key: metric(value(statistic(split, None)), DEFINITIONS[key]) for key, statistic in DETAIL.items()})
            if entry["ece_direction"]["status"] == "nan":  # ECE = 0: no direction to speak of
                entry["ece_direction"] = metric(None, DEFINITIONS["ece_direction"])
            smooth = SE.bandwidth(split.confidence, split.correct)
            entry["smooth_ece"]["bandwidth"] = finite(smooth)
            entry["smooth_ece"]["curve"] = finite(SE.smooth_reliability(split.confidence, split.correct, smooth))
        splits[name] = {**entry, "n": split.size}
    if not splits:
        raise Skip("no split has labels")
    return {"splits": splits}


def reliability(found: W.Bins) -> dict:
    """The reliability diagram's bins: edges, counts, accuracy and mean confidence per bin."""
    edges = torch.linspace(0, 1, ECE_BINS + 1, dtype=torch.float64)
    safe = found.mass.clamp(min=1)
    return {"lower": edges[:-1].tolist(), "upper": edges[1:].tolist(), "count": found.mass.long().tolist(),
            "accuracy": (found.target / safe).tolist(), "confidence": (found.confidence / safe).tolist()}


MCE_NO_INTERVAL = ("the MCE is the gap of whichever filled bin is worst, usually the sparsest, so its value on a test "
                   "set is far above the population's, and no two-sided bootstrap interval covers the population's MCE "
                   "(docs/conventions.md, coverage; only [0, the resamples' 97.5th percentile] does, which says "
                   "nothing the ECE does not); the bins' own gaps are in the reliability diagram")
DIRECTION_NO_INTERVAL = ("the direction is over-confidence / ECE, and the ECE's fold bias pulls it toward 0 on a test set "
                         "while every uniformly mis-calibrated population's direction is exactly ±1: no bootstrap interval "
                         "covers it on a few hundred examples (docs/conventions.md, coverage); over-confidence's own "
                         "interval says which way the model errs")
# every statistic resampled with the function that gave its value; the MCE and the direction not at all (why: above)
register_resampler("calibration")(per_split({**HEADLINE, **DETAIL, "mce": lambda split, w: Refused(MCE_NO_INTERVAL),
                                             "ece_direction": lambda split, w: Refused(DIRECTION_NO_INTERVAL)}))
