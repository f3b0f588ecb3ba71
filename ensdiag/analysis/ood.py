"""`ood`: OOD detection of the `ood` split against `id` by every uncertainty score.

Each score is higher on inputs that look more OOD; the report's tables use 1 − MSP unless
`ensdiag report --ood-score NAME` picks another. Every score is in metrics.json, each with
AUROC, AUPR-Out, AUPR-In and FPR95 in both directions.
"""

import torch

from . import metrics as M
from . import scores as S
from .registry import Column, Skip, metric, register_analyzer

DEFAULT_SCORE = "msp"
ENERGY_TEMPERATURE = 1.0
# name: (score of member logits [k, N, C] -> [N], description, ensemble only: absent for k = 1)
SCORES = {
    "msp": (lambda logits: 1 - M.max_softmax_probability(logits), "1 − max_c p̄_c (1 − MSP)", False),
    "entropy": (M.predictive_entropy, "predictive entropy H(p̄)", False),
    "jsd": (M.jsd, "JSD = H(p̄) − mean_i H(p_i), the mutual information between the prediction and the member", True),
    "expected_entropy": (M.expected_entropy, "mean member entropy mean_i H(p_i) (torch-uncertainty's 'entropy' "
                                             "criterion)", False),
    "energy": (S.energy, f"free energy −T·logsumexp_c(z̄_c/T) of the mean logits z̄ = mean_i z_i, T = "
                         f"{ENERGY_TEMPERATURE:g}", False),
    "max_logit": (S.max_logit, "−max_c z̄_c, the negated largest mean logit", False),
    "variation_ratio": (S.variation_ratio, "1 − (members voting for the modal class)/k", True),
}
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
                   version=2,  # 2: energy, max-logit, variation ratio, mean member entropy
                   columns=[Column("AUPR", ("scores", "msp", "aupr_out", "value"), "up", "AUPR-Out (OOD positive)", ("ood",), 10,
                                   examples=BOTH),
                            Column("AUROC", ("scores", "msp", "auroc", "value"), "up", "P(score_ood > score_id)", ("ood",), 20,
                                   examples=BOTH),
                            Column("FPR95 OOD→ID", ("scores", "msp", "fpr95_ood_as_id", "value"), "down",
                                   "fraction of OOD accepted as ID at the threshold keeping 95 % of ID", ("ood",), 30,
                                   examples=BOTH),
                            Column("FPR95 ID→OOD", ("scores", "msp", "fpr95_id_as_ood", "value"), "down",
                                   "fraction of ID flagged as OOD at the threshold catching 95 % of OOD", ("ood",), 35,
                                   examples=BOTH)])
def ood(predictions, weights=None):
    if "ood" not in predictions or "id" not in predictions:
        raise Skip("needs both an id and an ood split")
    id_logits, ood_logits = predictions["id"]["logits"], predictions["ood"]["logits"]
    empty = [name for name, logits in (("id", id_logits), ("ood", ood_logits)) if logits.shape[1] == 0]
    if empty:
        raise Skip(f"the {' and the '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty (N = 0): "
                   "AUROC, AUPR and FPR95 need samples of both")
    scores = {}
    for name, (score, description, ensemble_only) in SCORES.items():
        if ensemble_only and id_logits.shape[0] == 1:
            continue  # identically 0 for one member: not a score
        score_id, score_ood = score(id_logits), score(ood_logits)
        if torch.isnan(score_id).any() or torch.isnan(score_ood).any():  # NaN logits: the ranking is undefined
            values = dict.fromkeys(DEFINITIONS, float("nan"))
        else:
            values = M.ood_metrics(score_id, score_ood)
        scores[name] = {"score": description, **{key: metric(value, DEFINITIONS[key]) for key, value in values.items()}}
    return {"default_score": DEFAULT_SCORE, "scores": scores, "aliases": dict(ALIASES), "n_id": id_logits.shape[1],
            "n_ood": ood_logits.shape[1]}
