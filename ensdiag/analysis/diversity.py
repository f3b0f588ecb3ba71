"""`disagreement` (function space) and `weight-similarity` (parameter space) of members."""

from . import metrics as M
from .registry import Column, Skip, empty_metric, finite, metric, register_analyzer

MAX_STORED_MATRIX = 256  # members up to which the k×k disagreement matrices are stored (metrics.json stays small)
MATRIX = "D[i,j] = fraction of samples where members i and j predict different labels"
MEAN = "mean of the off-diagonal entries of D"
NORMALIZED = ("mean disagreement divided by the ensemble's error rate 1 − accuracy (Fort et al.); "
              "N/A when the ensemble makes no error")


@register_analyzer("disagreement", description="k×k pairwise prediction disagreement per split, its mean and (1−acc)-normalised mean",
                   columns=[Column(f"disagreement ({split})", ("splits", split, "mean", "value"), None,
                                   f"mean off-diagonal pairwise disagreement on {split}", ("diversity",), 10 + index, split)
                            for index, split in enumerate(("id", "shift", "ood"))])
def disagreement(predictions, weights=None):
    k = next(iter(predictions.values()))["logits"].shape[0]
    if k < 2:
        raise Skip("needs at least two members (k = 1)")
    store = k <= MAX_STORED_MATRIX
    note = None if store else (f"k = {k} > {MAX_STORED_MATRIX}: the k×k matrices are not stored (value null, "
                               "status 'omitted'), only their means")
    splits = {}
    for name, split in predictions.items():
        labelled = split["labels"] is not None
        if split["logits"].shape[1] == 0:  # no samples: D is a mean over nothing
            splits[name] = {"matrix": empty_metric(MATRIX), "mean": empty_metric(MEAN),
                            **({"normalized": empty_metric(NORMALIZED)} if labelled else {})}
            continue
        matrix = M.disagreement_matrix(split["logits"])
        mean = M.mean_off_diagonal(matrix)
        entry = {"matrix": metric(matrix.tolist(), MATRIX) if store else metric(None, MATRIX, status="omitted", note=note),
                 "mean": metric(mean, MEAN)}
        if labelled:
            error = 1 - M.accuracy(split["logits"], split["labels"])
            entry["normalized"] = metric(None if error == 0 else mean / error, NORMALIZED)  # NaN accuracy: NaN
        splits[name] = entry
    return {"splits": splits, **({"note": note} if note else {})}


INITIAL = ("mean off-diagonal cosine of the members' weights at initialisation, before any training step: what the "
           "trained cosine is read against (BatchEnsemble's members share one W and start far above 0, "
           "independent members near 0)")


@register_analyzer("weight-similarity", description="k×k cosine similarity of members' effective weights, overall and per layer",
                   version=2,  # 2: the cosine at initialisation
                   columns=[Column("weight cosine", ("mean", "value"), None, "mean off-diagonal cosine of members' weights",
                                   ("diversity",), 20),
                            Column("weight cosine at init", ("initial", "value"), None, INITIAL, ("diversity",), 20,
                                   since=2)])
def weight_similarity(predictions, weights=None):
    if isinstance(weights, Skip):  # the ensemble said why it has no member weights
        raise weights
    if weights is None:
        raise Skip("needs the model's member weights (a model file, not only predictions)")
    if len(weights) < 2:
        raise Skip("one weight set shared by all members (single model / MC Dropout): cosine is N/A")
    overall, per_layer = M.weight_cosine(weights)
    definition = ("C[i,j] = ⟨θ_i,θ_j⟩/(‖θ_i‖‖θ_j‖), θ_i = member i's effective conv and linear weights and biases "
                  "(BatchEnsemble: W ∘ r_i s_iᵀ), flattened and concatenated")
    scope = getattr(weights, "scope", None)  # members that share part of the network: what is compared
    if scope:
        definition += f"; compared on the {scope}"
    k = len(weights)
    store = k <= MAX_STORED_MATRIX  # as for disagreement: the means always, the k×k matrices up to 256 members
    note = None if store else f"k = {k} > {MAX_STORED_MATRIX}: the k×k matrices are not stored, only their means"
    result = {"matrix": metric(overall.tolist(), definition) if store else metric(None, definition, status="omitted", note=note),
              "mean": metric(M.mean_off_diagonal(overall), "mean off-diagonal cosine"),
              "layers": {layer: finite({"matrix": matrix.tolist() if store else None, "mean": M.mean_off_diagonal(matrix)})
                         for layer, matrix in per_layer.items()}}  # NaN weights: null
    initial = getattr(weights, "initial", None)
    result["initial"] = (metric(initial["mean"], INITIAL, source=initial["source"]) if initial is not None else
                         metric(None, INITIAL, note="no spec to rebuild the members from"))
    if scope:
        result["scope"] = scope
    return result if store else {**result, "note": note}
