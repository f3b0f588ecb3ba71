"""`calibration`: accuracy, NLL, ECE (with reliability bins), MCE, SmoothECE (with its smoothed
reliability curve), the direction of miscalibration, Brier, per-member accuracy/NLL."""

from . import metrics as M
from . import smooth_ece as SE
from .registry import Column, Skip, empty_metric, metric, register_analyzer

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
    "mce": f"maximum calibration error: max over the non-empty ones of the ECE's {ECE_BINS} bins of |acc_b − conf_b|",
    "ece_direction": "over-confidence / ECE, in [−1, 1]: +1 every bin over-confident (conf > acc), −1 every bin "
                     "under-confident, between: both; N/A when ECE = 0",
    "smooth_ece": "SmoothECE (Błasiok & Nakkiran 2023): ∫|r̂(t)|δ̂(t)dt with r̂ the kernel regression of conf − correct "
                  "on conf and δ̂ the density of conf, Gaussian kernel reflected at 0 and 1, bandwidth σ* the fixed "
                  "point smECE_σ = σ (bisection, 2⁻¹⁰; relplot's numerics); `curve`: the smoothed accuracy at σ*",
    "smooth_ece_tu": "SmoothECE as torch-uncertainty computes it by default: the Gaussian kernel in log-odds space "
                     "(its fixed-point bandwidth the same way)",
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
                                   DEFINITIONS["ece_classwise"], ("calibration",), 20, split="id", since=2),
                            Column("over-confidence", ("splits", "id", "overconfidence", "value"), None,
                                   DEFINITIONS["overconfidence"], ("calibration",), 30, split="id", since=2),
                            Column("ECE direction", ("splits", "id", "ece_direction", "value"), None,
                                   DEFINITIONS["ece_direction"], ("calibration",), 35, split="id", since=4),
                            Column("MCE", ("splits", "id", "mce", "value"), "down", DEFINITIONS["mce"], ("calibration",), 40,
                                   split="id", since=4),
                            Column("SmoothECE", ("splits", "id", "smooth_ece", "value"), "down", DEFINITIONS["smooth_ece"],
                                   ("calibration",), 50, split="id", since=4,
                                   peer=("splits", "id", "smooth_ece_tu", "value"), peer_since=4)])
def calibration(predictions, weights=None):
    splits = {}
    for name, split in predictions.items():
        logits, labels = split["logits"], split["labels"]
        if labels is None:
            continue
        ece, bins = M.ece(logits, labels, ECE_BINS)  # an empty split still has its (empty) bins
        if len(labels) == 0:  # every metric is a mean over no samples: undefined
            splits[name] = {key: empty_metric(definition, **({"bins": bins} if key == "ece" else {}))
                            for key, definition in DEFINITIONS.items()}
            splits[name]["n"] = 0
            continue
        over = M.overconfidence(logits, labels, ECE_BINS)
        splits[name] = {
            "accuracy": metric(M.accuracy(logits, labels), DEFINITIONS["accuracy"]),
            "nll": metric(M.nll(logits, labels), DEFINITIONS["nll"]),
            "ece": metric(ece, DEFINITIONS["ece"], bins=bins),
            "brier": metric(M.brier(logits, labels), DEFINITIONS["brier"]),
            "member_accuracy": metric(M.member_accuracy(logits, labels), DEFINITIONS["member_accuracy"]),
            "member_nll": metric(M.member_nll(logits, labels), DEFINITIONS["member_nll"]),
            "ece_adaptive": metric(M.adaptive_ece(logits, labels, ECE_BINS), DEFINITIONS["ece_adaptive"]),
            "ece_adaptive_tu": metric(M.adaptive_ece(logits, labels, ECE_BINS, extra_first=True),
                                      DEFINITIONS["ece_adaptive_tu"]),
            "ece_classwise": metric(M.classwise_ece(logits, labels, ECE_BINS), DEFINITIONS["ece_classwise"]),
            "overconfidence": metric(over, DEFINITIONS["overconfidence"]),
            "n": len(labels),
            **_new_in_version_4(logits, labels, ece, over),
        }
    if not splits:
        raise Skip("no split has labels")
    return {"splits": splits}


def _new_in_version_4(logits, labels, ece, overconfidence) -> dict:
    """MCE, the ECE's direction and SmoothECE (ensdiag's and torch-uncertainty's), with its curve."""
    confidence, predicted = M.mean_probs(logits).max(dim=1)
    correct = (predicted == labels).double()
    smooth = SE.smooth_ece(confidence, correct)
    curve = SE.smooth_reliability(confidence, correct, smooth["bandwidth"])
    return {"mce": metric(M.max_calibration_error(logits, labels, ECE_BINS), DEFINITIONS["mce"]),
            "ece_direction": metric(None if ece == 0 else overconfidence / ece, DEFINITIONS["ece_direction"]),
            "smooth_ece": metric(smooth["value"], DEFINITIONS["smooth_ece"], bandwidth=smooth["bandwidth"], curve=curve),
            "smooth_ece_tu": metric(SE.smooth_ece(confidence, correct, kernel="logit")["value"],
                                    DEFINITIONS["smooth_ece_tu"])}
