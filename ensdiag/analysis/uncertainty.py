"""`uncertainty`: predictive entropy, expected entropy and JSD (means over samples)."""

from . import metrics as M
from .registry import metric, register_analyzer


@register_analyzer("uncertainty", description="Predictive entropy H, expected entropy and JSD (mutual information) per split")
def uncertainty(predictions, weights=None):
    splits = {}
    for name, split in predictions.items():
        logits = split["logits"]
        single = logits.shape[0] == 1
        splits[name] = {
            "entropy": metric(M.predictive_entropy(logits).mean().item(), "mean over samples of H(p̄) = −Σ_c p̄_c log p̄_c (total uncertainty)"),
            "expected_entropy": metric(M.expected_entropy(logits).mean().item(), "mean over samples of (1/k) Σ_i H(p_i) (aleatoric)"),
            "jsd": metric(None if single else M.jsd(logits).mean().item(),
                          "mean over samples of H(p̄) − (1/k) Σ_i H(p_i) (Jensen–Shannon divergence = mutual information, epistemic)"
                          + ("; N/A for k = 1" if single else "")),
            "n": logits.shape[1],
        }
    return {"splits": splits}
