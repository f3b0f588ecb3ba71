"""`uncertainty`: the ensemble's uncertainty per split and how it splits (means over samples).

Total uncertainty H(p̄) = aleatoric (1/k) Σ_i H(p_i) + epistemic, the mutual information (JSD)
(1/k) Σ_i KL(p_i ‖ p̄); beside them Malinin & Gales' (2020) expected pairwise KL (EPKL),
(1/k²) Σ_{i,j} KL(p_i ‖ p_j), and reverse mutual information (RMI), (1/k) Σ_i KL(p̄ ‖ p_i), with
EPKL = MI + RMI ≥ MI for every example; and Spearman's ρ between each example's aleatoric and
epistemic parts: where they rank the examples alike (Mucsányi et al. 2024 find this common) the
split into two sources says little, and the result's note says so in words.
"""

from ..stats import weighted as W
from ..stats import ordered as O
from ..stats.examples import Examples
from .registry import Column, register_analyzer, register_resampler
from ..layout import SPLIT_TABLES, empty_metric, metric
from ..stats.resampled import per_split, value

NOT_SEPARATED = 0.8  # |ρ(AU, EU)| at or above this: the two parts rank a split's examples alike
DEFINITIONS = {
    "entropy": "mean over samples of H(p̄) = −Σ_c p̄_c log p̄_c (total uncertainty)",
    "expected_entropy": "mean over samples of (1/k) Σ_i H(p_i) (aleatoric)",
    "jsd": "mean over samples of H(p̄) − (1/k) Σ_i H(p_i) (Jensen–Shannon divergence = mutual information, epistemic)",
    "epkl": "mean over samples of (1/k²) Σ_{i,j} KL(p_i ‖ p_j) = −Σ_c p̄_c mean_i log p_i,c − (1/k) Σ_i H(p_i) "
            "(expected pairwise KL, Malinin & Gales 2020); = MI + RMI ≥ MI",
    "rmi": "mean over samples of (1/k) Σ_i KL(p̄ ‖ p_i) = −Σ_c p̄_c mean_i log p_i,c − H(p̄) (reverse mutual "
           "information, Malinin & Gales 2020); = EPKL − MI ≥ 0",
    "spearman_au_eu": "Spearman's rank correlation over the samples of the aleatoric part (1/k) Σ_i H(p_i) and the "
                      "epistemic part H(p̄) − (1/k) Σ_i H(p_i), ties at their mean rank (Mucsányi et al. 2024: "
                      f"|ρ| ≥ {NOT_SEPARATED} — the two rank the samples alike and do not separate two sources)",
}
MEMBERS = ("jsd", "epkl", "rmi", "spearman_au_eu")  # N/A for one member: nothing between members
DETAIL = ("epkl", "rmi", "spearman_au_eu")  # on the per-split tables' splits (id, shift, ood): where reports read them


def parts(split: Examples) -> dict:
    """{"epkl", "rmi"} per example [N], each ≥ 0 (clamped against rounding; exactly 0 where every
    member gives the same distribution, as the JSD)."""
    cross = -(split.mean * split.log_probs.mean(0)).sum(-1)  # −Σ_c p̄_c mean_i log p_i,c
    identical = (split.log_probs == split.log_probs[:1]).all(dim=2).all(dim=0)
    return {"epkl": (cross - split.expected_entropy).clamp(min=0).masked_fill(identical, 0.0),
            "rmi": (cross - split.entropy).clamp(min=0).masked_fill(identical, 0.0)}


def _part(key):
    return lambda split, w: W.mean(split.memo("uncertainty", lambda: parts(split))[key], w)


STATISTICS = {**{key: (lambda split, w, key=key: W.mean(getattr(split, key), w))
                 for key in ("entropy", "expected_entropy", "jsd")},
              "epkl": _part("epkl"), "rmi": _part("rmi"),
              "spearman_au_eu": lambda split, w: O.rank_correlation(split.expected_entropy, split.jsd, w)}

DETAIL_TABLE = "uncertainty"


@register_analyzer("uncertainty", description="Uncertainty per split: predictive entropy H, expected entropy, JSD "
                   "(mutual information), EPKL and reverse mutual information, and how alike the aleatoric and "
                   "epistemic parts rank the samples", version=2,  # 2: EPKL, RMI, ρ(AU, EU)
                   columns=[Column("H", ("splits", "{split}", "entropy", "value"), None, "predictive entropy H(p̄)",
                                   SPLIT_TABLES, 40),
                            Column("JSD", ("splits", "{split}", "jsd", "value"), None, "H(p̄) − mean_i H(p_i)",
                                   SPLIT_TABLES, 50),
                            *[Column(f"{label} ({split})", ("splits", split, key, "value"), None, DEFINITIONS[key],
                                     (DETAIL_TABLE,), 10 * index + offset, split=split, since=2)
                              for index, split in enumerate(SPLIT_TABLES)
                              for offset, (label, key) in enumerate((("EPKL", "epkl"), ("RMI", "rmi"),
                                                                     ("ρ(AU, EU)", "spearman_au_eu")))]])
def uncertainty(predictions, weights=None):
    splits = {}
    for name, split in predictions.items():
        split = Examples.of(split)
        single = split.members == 1
        if split.size == 0:  # means over no samples: undefined
            splits[name] = {**{key: empty_metric(definition) for key, definition in DEFINITIONS.items()}, "n": 0}
            continue
        keys = [key for key in STATISTICS if name in SPLIT_TABLES or key not in DETAIL]
        splits[name] = {key: metric(value(STATISTICS[key](split, None)), DEFINITIONS[key]) for key in keys
                        if not (single and key in MEMBERS)}
        if single:  # one member: no spread between members to measure
            splits[name].update({key: metric(None, DEFINITIONS[key] + "; N/A for k = 1", note="one member (k = 1): "
                                             "nothing between members to measure") for key in MEMBERS if key in keys})
        elif "spearman_au_eu" in keys and splits[name]["spearman_au_eu"]["value"] is None:
            splits[name]["spearman_au_eu"] = metric(None, DEFINITIONS["spearman_au_eu"], note=(
                "the aleatoric or the epistemic part takes one value on every sample (identical members: no "
                "epistemic part at all): no ranking to correlate"))
        splits[name]["n"] = split.size
    together = [name for name, entry in splits.items()
                if isinstance(rho := entry.get("spearman_au_eu", {}).get("value"), float) and abs(rho) >= NOT_SEPARATED]
    result = {"splits": splits, "identities": "H(p̄) = (1/k) Σ_i H(p_i) + MI; EPKL = MI + RMI, so EPKL ≥ MI"}
    if together:  # where the aleatoric and epistemic parts rank the samples alike, in words
        found = ", ".join(f"{name} ρ = {splits[name]['spearman_au_eu']['value']:.2f}" for name in together)
        result["note"] = (f"aleatoric and epistemic uncertainty do not separate ({found}; |ρ| ≥ {NOT_SEPARATED}): either "
                          "part ranks the samples nearly as the other does (in reverse where ρ < 0), so the split of "
                          "H(p̄) into two sources says little about which source a sample's uncertainty comes from")
    return result


register_resampler("uncertainty")(per_split(STATISTICS))
