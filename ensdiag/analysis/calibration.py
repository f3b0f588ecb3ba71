"""`calibration`: accuracy, NLL, ECE (with reliability bins), Brier, per-member accuracy/NLL."""

from . import metrics as M
from .registry import Skip, metric, register_analyzer

ECE_BINS = 15


@register_analyzer("calibration", description="Accuracy, NLL, ECE, Brier and per-member scores on every labelled split")
def calibration(predictions, weights=None):
    splits = {}
    for name, split in predictions.items():
        logits, labels = split["logits"], split["labels"]
        if labels is None:
            continue
        ece, bins = M.ece(logits, labels, ECE_BINS)
        splits[name] = {
            "accuracy": metric(M.accuracy(logits, labels), "fraction of samples whose argmax of p̄ (mean member probability) equals the label"),
            "nll": metric(M.nll(logits, labels), "mean of −log p̄(y|x), natural log, from member log-softmax (logsumexp − log k)"),
            "ece": metric(ece, f"Σ_b |B_b|/N·|acc_b − conf_b| over {ECE_BINS} equal-width bins of max p̄; first bin [0,1/{ECE_BINS}], then (lo,hi]; 1.0 in the last bin",
                          bins=bins),
            "brier": metric(M.brier(logits, labels), "mean over samples of Σ_c (p̄_c − 1[y=c])²"),
            "member_accuracy": metric(M.member_accuracy(logits, labels), "accuracy of each member's own argmax"),
            "member_nll": metric(M.member_nll(logits, labels), "mean −log p_i(y|x) of each member"),
            "n": len(labels),
        }
    if not splits:
        raise Skip("no split has labels")
    return {"splits": splits}
