"""`disagreement` (function space) and `weight-similarity` (parameter space) of members."""

from . import metrics as M
from .registry import Skip, metric, register_analyzer


@register_analyzer("disagreement", description="k×k pairwise prediction disagreement per split, its mean and (1−acc)-normalised mean")
def disagreement(predictions, weights=None):
    k = next(iter(predictions.values()))["logits"].shape[0]
    if k < 2:
        raise Skip("needs at least two members (k = 1)")
    splits = {}
    for name, split in predictions.items():
        matrix = M.disagreement_matrix(split["logits"])
        mean = M.mean_off_diagonal(matrix)
        entry = {"matrix": metric(matrix.tolist(), "D[i,j] = fraction of samples where members i and j predict different labels"),
                 "mean": metric(mean, "mean of the off-diagonal entries of D")}
        if split["labels"] is not None:
            error = 1 - M.accuracy(split["logits"], split["labels"])
            entry["normalized"] = metric(mean / error if error > 0 else float("nan"),
                                         "mean disagreement divided by the ensemble's error rate 1 − accuracy (Fort et al.)")
        splits[name] = entry
    return {"splits": splits}


@register_analyzer("weight-similarity", description="k×k cosine similarity of members' effective weights, overall and per layer")
def weight_similarity(predictions, weights=None):
    if weights is None:
        raise Skip("needs the model's member weights (a model file, not only predictions)")
    if len(weights) < 2:
        raise Skip("one weight set shared by all members (single model / MC Dropout): cosine is N/A")
    overall, per_layer = M.weight_cosine(weights)
    definition = ("C[i,j] = ⟨θ_i,θ_j⟩/(‖θ_i‖‖θ_j‖), θ_i = member i's effective conv and linear weights and biases "
                  "(BatchEnsemble: W ∘ r_i s_iᵀ), flattened and concatenated")
    return {"matrix": metric(overall.tolist(), definition), "mean": metric(M.mean_off_diagonal(overall), "mean off-diagonal cosine"),
            "layers": {layer: {"matrix": matrix.tolist(), "mean": M.mean_off_diagonal(matrix)} for layer, matrix in per_layer.items()}}
