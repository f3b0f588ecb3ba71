"""`ensemble-gain` and `selective`: what the ensemble buys over its members, and how well its
confidence ranks its own mistakes.

- ensemble-gain: for NLL, Brier and 0-1 loss on every labelled split, the members' mean loss
  (Gibbs), the ensemble's loss and their difference, with each identity stated (metrics.py,
  `ensemble_gain`); and each member's accuracy, NLL and ECE.
- selective: risk–coverage of the ensemble (confidence max p̄) and of each member (its own max
  softmax), the area under it (AURC) and under the generalised risk (AUGRC); lower is better.
"""

import torch

from ..stats import metrics as M
from ..stats import weighted as W
from ..stats import ordered as O
from ..stats.examples import Examples
from .registry import Column, labelled, register_analyzer, register_resampler
from ..errors import Skip
from ..layout import SPLIT_TABLES, finite, metric
from ..stats.resampled import per_split, value

AUGRC = ("area under the generalised risk–coverage curve (Traub et al. 2024): mean over coverages j/N of (j/N)·risk_j, "
         "the fraction of all samples accepted and wrong (ties share their mean error)")
MAX_MEMBER_CURVES = 64  # members' risk–coverage curves are stored up to this k (their AURCs always)

GAIN_DEFINITIONS = {
    "nll_gibbs": "mean over members of each member's NLL, mean_i −log p_i(y) (the Gibbs loss)",
    "nll_ensemble": "NLL of the arithmetic mean p̄, −log p̄(y)",
    "nll_gap": "Gibbs NLL − ensemble NLL = mean [log p̄(y) − mean_i log p_i(y)] ≥ 0: Jensen's gap of the "
               "arithmetic mean (not a KL)",
    "nll_geometric": "NLL of the normalised geometric mean q̄ ∝ exp(mean_i log p_i)",
    "kl_diversity": "Gibbs NLL − geometric-mean NLL = mean_i KL(q̄ ‖ p_i) ≥ 0 (Wood et al.'s diversity for "
                    "cross-entropy with the geometric combiner)",
    "brier_gibbs": "mean over members of Σ_c (p_i,c − 1[y=c])²",
    "brier_ensemble": "Σ_c (p̄_c − 1[y=c])² of the arithmetic mean p̄",
    "brier_spread": "Gibbs Brier − ensemble Brier = mean_i ‖p_i − p̄‖² exactly (the members' spread)",
    "error_gibbs": "mean over members of each member's error rate",
    "error_ensemble": "error rate of argmax p̄",
    "error_gap": "mean member error − ensemble error: a difference of error rates, not a diversity "
                 "decomposition (none holds for 0-1 loss; it can be negative)",
    "member_error": "each member's error rate",
    "member_ece": "each member's 15-bin ECE of its own top-label confidence",
}


COMBINERS = {  # which ensemble each decomposition is of (Wood et al. 2023: the loss fixes the combiner it is exact for)
    "arithmetic": {"ensemble": "p̄ = mean_i p_i, the arithmetic mean of the members' probabilities (ensdiag's prediction)",
                   "terms": ["nll_ensemble", "nll_gap", "brier_ensemble", "brier_spread", "error_ensemble", "error_gap"],
                   "identities": "Gibbs NLL − NLL(p̄) = nll_gap, Jensen's gap, which depends on the label (no "
                                 "label-free diversity exists for cross-entropy with this combiner); Gibbs Brier − "
                                 "Brier(p̄) = brier_spread = mean_i ‖p_i − p̄‖² exactly, label-free"},
    "geometric": {"ensemble": "q̄ ∝ exp(mean_i log p_i), the normalised geometric mean of the members' probabilities",
                  "terms": ["nll_geometric", "kl_diversity"],
                  "identities": "Gibbs NLL − NLL(q̄) = kl_diversity = mean_i KL(q̄ ‖ p_i) exactly, label-free"},
}


@register_analyzer("ensemble-gain", description="Gibbs vs ensemble loss for NLL, Brier and 0-1 loss: what the "
                   "members' diversity buys", version=2,  # 2: the combiners named
                   columns=[
                       Column("NLL gap", ("splits", "id", "nll_gap", "value"), "up", GAIN_DEFINITIONS["nll_gap"],
                              ("gain",), 10, split="id"),
                       Column("KL diversity", ("splits", "id", "kl_diversity", "value"), "up",
                              GAIN_DEFINITIONS["kl_diversity"], ("gain",), 20, split="id"),
                       Column("Brier spread", ("splits", "id", "brier_spread", "value"), "up",
                              GAIN_DEFINITIONS["brier_spread"], ("gain",), 30, split="id"),
                       Column("member err", ("splits", "id", "error_gibbs", "value"), "down",
                              GAIN_DEFINITIONS["error_gibbs"], ("gain",), 40, split="id"),
                       Column("ensemble err", ("splits", "id", "error_ensemble", "value"), "down",
                              GAIN_DEFINITIONS["error_ensemble"], ("gain",), 50, split="id")])
def ensemble_gain(predictions, weights=None):
    splits = {}
    for name, split in labelled(predictions):
        if split.members < 2:
            raise Skip("one member: the ensemble is its member, there is no gain to decompose")
        gain = {key: value(statistic(split, None)) for key, statistic in GAIN.items()}
        gain["error_gap"] = gain["error_gibbs"] - gain["error_ensemble"]
        gain["member_error"] = split.member_errors.mean(1).tolist()
        if name in SPLIT_TABLES:  # each member's own calibration: where the report's tables read it
            gain["member_ece"] = [value(W.ece(member.confidence, member.correct)) for member in _members(split)]
        splits[name] = {key: metric(found, GAIN_DEFINITIONS[key]) for key, found in gain.items()}
    if not splits:
        raise Skip("no split has labels")
    return {"splits": splits, "combiners": COMBINERS}


def _members(split: Examples) -> list[Examples]:
    """Each member on its own, as a one-member ensemble of these examples."""
    return [Examples(member[None], split.labels) for member in split.logits]


GAIN = {key: (lambda split, w, key=key: W.mean(split.memo("gain", lambda: M.gain_terms(split))[key], w))
        for key in ("nll_gibbs", "nll_ensemble", "nll_geometric", "kl_diversity", "nll_gap", "brier_gibbs", "brier_ensemble",
                    "brier_spread", "error_gibbs", "error_ensemble")}
register_resampler("ensemble-gain")(per_split(GAIN))


@register_analyzer("selective", detail=True, description="Risk–coverage of the ensemble and of each member (in-distribution test set)",
                   version=4,  # 2: torch-uncertainty's trapezoid AURC beside ensdiag's; 3: AUGRC; 4: a table of its own
                   columns=[Column("AURC", ("splits", "id", "aurc", "value"), "down",
                                   "area under the risk–coverage curve of p̄ (samples accepted by decreasing max p̄)",
                                   ("selective",), 10, split="id", peer=("splits", "id", "aurc_trapezoid", "value"),
                                   peer_since=2),
                            Column("AUGRC", ("splits", "id", "augrc", "value"), "down", AUGRC,
                                   ("selective",), 20, split="id", since=3,
                                   peer=("splits", "id", "augrc_trapezoid", "value"), peer_since=3)])
def selective(predictions, weights=None, points=101):
    splits = {}
    for name, split in labelled(predictions, SPLIT_TABLES):  # the per-split tables' splits: not every corruption's
        members = _members(split)
        splits[name] = {**{key: metric(value(statistic(split, None)), SELECTIVE_DEFINITIONS[key])
                           for key, statistic in SELECTIVE.items()},
                        "member_aurc": metric([value(O.risk_coverage_areas(member.confidence, _errors(member))["aurc"])
                                               for member in members],
                                              "each member's AURC with its own max softmax as confidence")}
        if name == "id":  # the curves the report draws (thinned to `points` coverages)
            at = torch.linspace(1, split.size, min(points, split.size)).round().long() - 1
            member_curves = [M.risk_coverage(member.confidence, _errors(member))[at].tolist() for member in members] \
                if split.members <= MAX_MEMBER_CURVES else []
            splits[name]["curve"] = finite({"coverage": ((at + 1) / split.size).tolist(),
                                            "risk": M.risk_coverage(split.confidence, _errors(split))[at].tolist(),
                                            "member_risk": member_curves})
    if not splits:
        raise Skip("no split has labels")
    return {"splits": splits}


def _errors(split: Examples) -> torch.Tensor:
    return (split.predicted != split.labels).double()


SELECTIVE_DEFINITIONS = {
    "aurc": "mean over coverages j/N of the error rate among the j most confident samples (ties share their mean error)",
    "aurc_trapezoid": "torch-uncertainty's AURC: the trapezoid rule over the same risks at coverages 1/N..1, divided "
                      "by 1 − 1/N",
    "augrc": AUGRC,
    "augrc_trapezoid": "torch-uncertainty's AUGRC: the trapezoid rule over the generalised risks (j/N)·risk_j at "
                       "coverages 1/N..1, divided by 1 − 1/N"}
SELECTIVE = {key: (lambda split, w, key=key: split.per_weighting(
    "risk", w, lambda: O.risk_coverage_areas(split.confidence, _errors(split), w))[key]) for key in SELECTIVE_DEFINITIONS}
register_resampler("selective")(per_split(SELECTIVE))
