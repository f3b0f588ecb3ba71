"""`ood`: OOD detection of the `ood` split against `id` by every uncertainty score.

Each score is higher on inputs that look more OOD; the report's tables use 1 − MSP unless
`ensdiag report --ood-score NAME` picks another. Every score is in metrics.json, each with
AUROC, AUPR-Out, AUPR-In and FPR95 in both directions.
"""

import torch

from ..errors import Skip
from ..layout import DEFAULT_SCORE, metric  # (the score reports show unless asked)
from ..stats import scores as S
from ..stats import weighted as W
from ..stats.examples import Examples
from .registry import Column, register_analyzer, register_resampler
from ..stats.resampled import value

ENERGY_TEMPERATURE = 1.0
# name: (score of a split's Examples -> [N], description, ensemble only: absent for k = 1)
SCORES = {
    "msp": (lambda split: 1 - split.confidence, "1 − max_c p̄_c (1 − MSP)", False),
    "entropy": (lambda split: split.entropy, "predictive entropy H(p̄)", False),
    "jsd": (lambda split: split.jsd, "JSD = H(p̄) − mean_i H(p_i), the mutual information between the prediction and "
                                     "the member", True),
    "expected_entropy": (lambda split: split.expected_entropy, "mean member entropy mean_i H(p_i) (torch-uncertainty's "
                                                               "'entropy' criterion)", False),
    "energy": (lambda split: S.energy(split.logits, ENERGY_TEMPERATURE), f"free energy −T·logsumexp_c(z̄_c/T) of the mean "
               f"logits z̄ = mean_i z_i, T = {ENERGY_TEMPERATURE:g}", False),
    "max_logit": (lambda split: S.max_logit(split.logits), "−max_c z̄_c, the negated largest mean logit", False),
    "variation_ratio": (lambda split: S.variation_ratio(split.logits), "1 − (members voting for the modal class)/k", True),
}


def score_of(name: str, logits: torch.Tensor) -> torch.Tensor:
    """The OOD score `name` of member logits [k, N, C], per example [N]."""
    return SCORES[name][0](Examples(logits, None))
ALIASES = {"mutual_information": "jsd", "mi": "jsd", "1-msp": "msp"}  # other names --ood-score accepts
DEFINITIONS = {
    "auroc": "P(score(OOD) > score(ID)) + ½ P(tie); OOD is the positive class",
    "aupr_out": "average precision (step sum, scikit-learn's definition) with OOD positive",
    "aupr_in": "average precision (step sum) with ID positive, ranked by the negated score",
    "fpr95_ood_as_id": "fraction of OOD accepted as ID (score ≤ τ) at the smallest τ accepting ≥ 95 % of ID; "
                       "ties at τ accepted (the reference paper's text)",
    "fpr95_id_as_ood": "fraction of ID flagged as OOD (score ≥ τ) at the largest τ flagging ≥ 95 % of OOD; "
                       "ties at τ flagged (scikit-learn's ROC, torch-uncertainty and the reference paper's code)",
}
BOTH = ("id", "ood")  # each number is a statistic of both samples: its interval resamples them separately


@register_analyzer("ood", description="AUROC, AUPR-Out, AUPR-In and FPR95 of the ood split vs id, for every "
                   "uncertainty score (1−MSP, entropy, mutual information, mean member entropy, energy, max-logit, "
                   "variation ratio)",
                   version=3,  # 2: energy, max-logit, variation ratio, mean member entropy; 3: logit/binomial intervals
                   columns=[Column("AUPR", ("scores", "msp", "aupr_out", "value"), "up", "AUPR-Out (OOD positive)", ("ood",), 10,
                                   examples=BOTH, interval="logit-debiased"),
                            Column("AUROC", ("scores", "msp", "auroc", "value"), "up", "P(score_ood > score_id)", ("ood",), 20,
                                   examples=BOTH, interval="logit"),
                            Column("FPR95 OOD→ID", ("scores", "msp", "fpr95_ood_as_id", "value"), "down",
                                   "fraction of OOD accepted as ID at the threshold keeping 95 % of ID", ("ood",), 30,
                                   examples=BOTH, interval="binomial:ood"),
                            Column("FPR95 ID→OOD", ("scores", "msp", "fpr95_id_as_ood", "value"), "down",
                                   "fraction of ID flagged as OOD at the threshold catching 95 % of OOD", ("ood",), 35,
                                   examples=BOTH, interval="binomial:id")])
def ood(predictions, weights=None):
    if "ood" not in predictions or "id" not in predictions:
        raise Skip("needs both an id and an ood split")
    id_split, ood_split = Examples.of(predictions["id"]), Examples.of(predictions["ood"])
    empty = [name for name, split in (("id", id_split), ("ood", ood_split)) if split.size == 0]
    if empty:
        raise Skip(f"the {' and the '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty (N = 0): "
                   "AUROC, AUPR and FPR95 need samples of both")
    scores = {}
    for name, (_, description, ensemble_only) in SCORES.items():
        if ensemble_only and id_split.members == 1:
            continue  # identically 0 for one member: not a score
        found = detection(name, id_split, ood_split)
        scores[name] = {"score": description, **{key: metric(value(found[key]), DEFINITIONS[key]) for key in DEFINITIONS}}
    return {"default_score": DEFAULT_SCORE, "scores": scores, "aliases": dict(ALIASES), "n_id": id_split.size,
            "n_ood": ood_split.size}


def detection(name: str, id_split: Examples, ood_split: Examples, w_id=None, w_ood=None,
              only=tuple(DEFINITIONS)) -> dict:
    """{metric: value} of score `name` separating the OOD split from the ID split under example weights
    (weighted.ood_metrics; `only`: those metrics); NaN throughout where a score is NaN (NaN logits: the
    ranking is undefined)."""
    score = SCORES[name][0]
    score_id, score_ood = score(id_split), score(ood_split)
    if torch.isnan(score_id).any() or torch.isnan(score_ood).any():
        return dict.fromkeys(DEFINITIONS, W.nan_for(w_id, id_split.size))
    return W.ood_metrics(score_id, score_ood, w_id, w_ood, only)


@register_resampler("ood")
def _resampler(predictions, weights, result, wanted):
    keys = {name: [key for key in DEFINITIONS if ("scores", name, key, "value") in wanted]  # only those wanted
            for name in result.get("scores", {})}
    id_split, ood_split = Examples.of(predictions["id"]), Examples.of(predictions["ood"])

    def resample(counts):
        if "id" not in counts or "ood" not in counts:
            return {}
        return {("scores", name, key, "value"): values for name, only in keys.items() if only
                for key, values in detection(name, id_split, ood_split, counts["id"], counts["ood"], only).items()}
    return resample
