"""`uncertainty`: predictive entropy, expected entropy and JSD (means over samples)."""

from . import metrics as M
from .registry import SPLIT_TABLES, Column, empty_metric, metric, register_analyzer

DEFINITIONS = {
    "entropy": "mean over samples of H(p̄) = −Σ_c p̄_c log p̄_c (total uncertainty)",
    "expected_entropy": "mean over samples of (1/k) Σ_i H(p_i) (aleatoric)",
    "jsd": "mean over samples of H(p̄) − (1/k) Σ_i H(p_i) (Jensen–Shannon divergence = mutual information, epistemic)",
}


@register_analyzer("uncertainty", description="Predictive entropy H, expected entropy and JSD (mutual information) per split",
                   columns=[Column("H", ("splits", "{split}", "entropy", "value"), None, "predictive entropy H(p̄)",
                                   SPLIT_TABLES, 40),
                            Column("JSD", ("splits", "{split}", "jsd", "value"), None, "H(p̄) − mean_i H(p_i)",
                                   SPLIT_TABLES, 50)])
def uncertainty(predictions, weights=None):
    splits = {}
    for name, split in predictions.items():
        logits = split["logits"]
        single = logits.shape[0] == 1
        if logits.shape[1] == 0:  # means over no samples: undefined
            splits[name] = {**{key: empty_metric(definition) for key, definition in DEFINITIONS.items()}, "n": 0}
            continue
        splits[name] = {
            "entropy": metric(M.predictive_entropy(logits).mean().item(), DEFINITIONS["entropy"]),
            "expected_entropy": metric(M.expected_entropy(logits).mean().item(), DEFINITIONS["expected_entropy"]),
            "jsd": metric(None if single else M.jsd(logits).mean().item(),
                          DEFINITIONS["jsd"] + ("; N/A for k = 1" if single else "")),
            "n": logits.shape[1],
        }
    return {"splits": splits}
