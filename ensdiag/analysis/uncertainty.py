"""`uncertainty`: predictive entropy, expected entropy and JSD (means over samples)."""

from . import weighted as W
from .examples import Examples
from .registry import SPLIT_TABLES, Column, empty_metric, metric, register_analyzer, register_resampler
from .resampled import per_split, value

DEFINITIONS = {
    "entropy": "mean over samples of H(p̄) = −Σ_c p̄_c log p̄_c (total uncertainty)",
    "expected_entropy": "mean over samples of (1/k) Σ_i H(p_i) (aleatoric)",
    "jsd": "mean over samples of H(p̄) − (1/k) Σ_i H(p_i) (Jensen–Shannon divergence = mutual information, epistemic)",
}
STATISTICS = {key: (lambda split, w, key=key: W.mean(getattr(split, key), w)) for key in DEFINITIONS}


@register_analyzer("uncertainty", description="Predictive entropy H, expected entropy and JSD (mutual information) per split",
                   columns=[Column("H", ("splits", "{split}", "entropy", "value"), None, "predictive entropy H(p̄)",
                                   SPLIT_TABLES, 40),
                            Column("JSD", ("splits", "{split}", "jsd", "value"), None, "H(p̄) − mean_i H(p_i)",
                                   SPLIT_TABLES, 50)])
def uncertainty(predictions, weights=None):
    splits = {}
    for name, split in predictions.items():
        split = Examples.of(split)
        single = split.members == 1
        if split.size == 0:  # means over no samples: undefined
            splits[name] = {**{key: empty_metric(definition) for key, definition in DEFINITIONS.items()}, "n": 0}
            continue
        splits[name] = {key: metric(value(statistic(split, None)), DEFINITIONS[key]) for key, statistic in STATISTICS.items()
                        if not (single and key == "jsd")}
        if single:  # one member: no spread between members to measure
            splits[name]["jsd"] = metric(None, DEFINITIONS["jsd"] + "; N/A for k = 1", note="one member (k = 1): "
                                         "nothing between members to measure")
        splits[name]["n"] = split.size
    return {"splits": splits}


register_resampler("uncertainty")(per_split(STATISTICS))
