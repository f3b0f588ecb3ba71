"""`disagreement` and `member-pairs` (function space) and `weight-similarity` (parameter space) of members.

The means are statistics of the examples (resampled.py): the mean over member pairs of a mean over
examples is the mean over examples of a per-example mean over pairs, so each is one weighted mean
(weighted.py) whatever the weighting; error correlation and Yule's Q come from each pair's 2×2 table
of right/wrong, weighted the same way. The k×k matrices beside them are what the report draws.
"""

import torch

from ..stats import metrics as M
from ..stats import pairwise as P
from ..stats import weighted as W
from ..stats.examples import Examples, entropy
from .registry import Column, register_analyzer, register_resampler
from ..errors import Skip
from ..layout import SPLIT_TABLES, empty_metric, finite, metric
from ..stats.resampled import Refused, per_split, value

MAX_STORED_MATRIX = 256  # members up to which the k×k disagreement matrices are stored (metrics.json stays small)
MATRIX = "D[i,j] = fraction of samples where members i and j predict different labels"
MEAN = "mean of the off-diagonal entries of D"
NORMALIZED = ("mean disagreement divided by the ensemble's error rate 1 − accuracy (Fort et al.); "
              "N/A when the ensemble makes no error")


DISAGREEMENT = {"mean": lambda split, w: W.mean(split.pair_disagreement, w)}


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
        split = Examples.of(split)
        labelled = split.labels is not None
        if split.size == 0:  # no samples: D is a mean over nothing
            splits[name] = {"matrix": empty_metric(MATRIX), "mean": empty_metric(MEAN),
                            **({"normalized": empty_metric(NORMALIZED)} if labelled else {})}
            continue
        matrix = M.disagreement_matrix(split.logits) if store else None
        mean = value(DISAGREEMENT["mean"](split, None))
        entry = {"matrix": metric(matrix.tolist(), MATRIX) if store else metric(None, MATRIX, status="omitted", note=note),
                 "mean": metric(mean, MEAN)}
        if labelled:
            error = 1 - value(W.mean(split.correct))
            entry["normalized"] = metric(None if error == 0 else mean / error, NORMALIZED)  # NaN accuracy: NaN
        splits[name] = entry
    return {"splits": splits, **({"note": note} if note else {})}


MAX_PAIR_MEMBERS = 64  # the pair matrices cost k²·N·C; above this many members only the disagreement is computed
PAIRS = {  # key: (matrix function, needs labels, definition of the matrix)
    "kl": (P.kl_matrix, False, "K[i,j] = mean over samples of KL(p_i ‖ p_j) (natural log): row i against column j, so "
                               "K and its transpose are the two directions"),
    "jsd": (P.jsd_matrix, False, "J[i,j] = mean over samples of JS(p_i, p_j) = H((p_i+p_j)/2) − (H(p_i)+H(p_j))/2, "
                                 "in [0, log 2]"),
    "double_fault": (P.double_fault, True, "DF[i,j] = fraction of samples both members i and j get wrong (Giacinto & "
                                           "Roli); DF[i,i] = member i's error rate"),
    "error_correlation": (P.error_correlation, True, "ρ[i,j] = Pearson correlation over samples of the error indicators "
                                                     "1[argmax p_i ≠ y] and 1[argmax p_j ≠ y]; null where a member's "
                                                     "errors do not vary"),
    "yule_q": (P.yule_q, True, "Q[i,j] = (N¹¹N⁰⁰ − N¹⁰N⁰¹)/(N¹¹N⁰⁰ + N¹⁰N⁰¹) over samples members i, j get right (1) "
                               "or wrong (0) (Yule's Q; Kuncheva & Whitaker 2003): 1 never wrong apart, −1 never wrong "
                               "together; null where the denominator is 0"),
}
PAIR_MEAN = "mean of the off-diagonal entries (over the pairs where it is defined)"
AMBIGUITY = ("Krogh–Vedelsby ambiguity: the mean over samples of mean_i ‖p_i − p̄‖², what averaging the probabilities "
             "removes from the members' mean Brier score, whatever the label")


@register_analyzer("member-pairs", detail=True, description="Member pairs (mean off-diagonal of the k×k matrices on the "
                   "in-distribution test set; the id, shift and ood matrices in metrics.json)", version=2,  # 2: those splits only
                   columns=[
                       Column(f"{label} (id)", ("splits", "id", key, *(("mean",) if key in PAIRS else ()), "value"),
                              direction, definition, ("pairs",), 10 * index, "id")
                       for index, (label, key, direction, definition) in enumerate([
                           ("KL", "kl", None, "mean over pairs i ≠ j of mean_x KL(p_i ‖ p_j)"),
                           ("JSD", "jsd", None, "mean over pairs of mean_x JS(p_i, p_j)"),
                           ("ambiguity", "ambiguity", None, AMBIGUITY),
                           ("double-fault", "double_fault", "down", "mean over pairs of the fraction both get wrong"),
                           ("error corr", "error_correlation", None, "mean over pairs of the correlation of errors"),
                           ("Yule's Q", "yule_q", None, "mean over pairs of Yule's Q of right/wrong")], start=1)])
def member_pairs(predictions, weights=None):
    k = next(iter(predictions.values()))["logits"].shape[0]
    if k < 2:
        raise Skip("needs at least two members (k = 1)")
    if k > MAX_PAIR_MEMBERS:
        raise Skip(f"k = {k} > {MAX_PAIR_MEMBERS}: the pair matrices cost k²·N·C (the disagreement analyzer still runs)")
    splits = {}
    for name, split in predictions.items():
        if name not in SPLIT_TABLES:  # the per-split tables' splits: not every corruption's or the validation split's
            continue
        split = Examples.of(split)
        logits, labels = split.logits, split.labels
        chosen = {key: entry for key, entry in PAIRS.items() if labels is not None or not entry[1]}
        if split.size == 0:
            splits[name] = {**{key: {"matrix": empty_metric(definition), "mean": empty_metric(PAIR_MEAN)}
                               for key, (_, _, definition) in chosen.items()}, "ambiguity": empty_metric(AMBIGUITY)}
            continue
        statistics = PAIR_STATISTICS if labels is not None else {key: PAIR_STATISTICS[key] for key in LABEL_FREE_PAIRS}
        means = {key: value(statistic(split, None)) for key, statistic in statistics.items()}
        entry = {key: {"matrix": metric((function(logits, labels) if labelled else function(logits)).tolist(), definition),
                       "mean": metric(means[key], PAIR_MEAN)}
                 for key, (function, labelled, definition) in chosen.items()}
        entry["ambiguity"] = metric(means["ambiguity"], AMBIGUITY)
        splits[name] = entry
    return {"splits": splits}


def _pair_terms(split: Examples) -> dict:
    """{key: [n]}: each example's mean over ordered member pairs i ≠ j (ambiguity: over members)."""
    k, log_p = split.members, split.log_probs
    p = log_p.exp()
    own = torch.special.xlogy(p, p).sum(-1)  # [k, n]
    kl = (k * own.sum(0) - (p.sum(0) * log_p.sum(0)).sum(-1)) / (k * (k - 1))
    own_entropy = -own
    mixed = sum(entropy((p[i] + p) / 2).sum(0) - entropy(p[i]) for i in range(k))  # Σ_{i≠j} H((p_i + p_j)/2)
    terms = {"kl": kl.clamp(min=0), "jsd": (mixed - (k - 1) * own_entropy.sum(0)) / (k * (k - 1)),
             "ambiguity": (p - split.mean).pow(2).sum(-1).mean(0)}
    if split.labels is not None:
        e = split.member_errors.nan_to_num(0.0)
        terms["double_fault"] = (e.sum(0) ** 2 - e.sum(0)) / (k * (k - 1))  # Σ_{i≠j} e_i e_j of 0/1 errors
    return terms


def _pair_mean(key):
    def statistic(split, w):
        if split.undefined.any():  # no mean over "the defined pairs" once a prediction is undefined
            return W.nan_for(w, split.size)
        return W.mean(split.memo("pairs", lambda: _pair_terms(split))[key], w)
    return statistic


TABLE_MEMBERS = 16  # the 2×2 tables cost b·n·k² per block of b resamples: above, resampling re-runs the analyzer


def _pair_tables(split: Examples, w) -> dict:
    """{"error_correlation", "yule_q"}: the mean over the pairs where each is defined of the statistic of
    each pair's weighted 2×2 table of right/wrong (Σ w e_i, Σ w e_i e_j)."""
    weights, single = W.rows(w, split.size)
    if split.undefined.any():
        return {key: W.nan_for(w, split.size) for key in ("error_correlation", "yule_q")}
    e, k = split.member_errors, split.members
    n = weights.sum(1, keepdim=True)
    wrong = weights @ e.T  # [b, k]
    both = torch.stack([(weights * e[i]) @ e.T for i in range(k)], 1)  # [b, k, k]
    i, j = torch.triu_indices(k, k, 1)
    wi, wj, ww = wrong[:, i], wrong[:, j], both[:, i, j]
    covariance = ww / n - wi * wj / n**2
    variance = wrong / n - (wrong / n) ** 2
    correlation = (covariance / (variance[:, i] * variance[:, j]).sqrt()).clamp(-1, 1)
    both_right, only_i, only_j = n - wi - wj + ww, wj - ww, wi - ww
    agree, differ = both_right * ww, only_i * only_j
    # the means over the pairs where each is defined (NaN where none is)
    return {key: W._out(values.nanmean(1), single)
            for key, values in (("error_correlation", correlation), ("yule_q", (agree - differ) / (agree + differ)))}


def _table(key):
    def statistic(split, w):
        if w is not None and w.dim() == 2 and split.members > TABLE_MEMBERS:
            return None  # left to re-running the analyzer
        return _pair_tables(split, w)[key]
    return statistic


LABEL_FREE_PAIRS = ("kl", "jsd", "ambiguity")
PAIR_STATISTICS = {**{key: _pair_mean(key) for key in (*LABEL_FREE_PAIRS, "double_fault")},
                   "error_correlation": _table("error_correlation"), "yule_q": _table("yule_q")}


FEWEST_DISCORDANT = 5  # below this many examples one member of a pair gets right and the other wrong: no interval
FEW_DISCORDANT = ("a member pair's errors differ on fewer than {least} examples one way round (N¹⁰ or N⁰¹ = {found}): "
                  "{what} is then ±1 or next to it on almost every resample, and no bootstrap interval covers the "
                  "population's value (docs/conventions.md, coverage); the double fault says how often both err")


def _pairs_resampler(predictions, weights, result, wanted):
    """member-pairs' id means ("splits", "id", key, "mean", "value"; ambiguity without "mean"); Yule's Q
    and the error correlation refused where a pair's discordant count is below `FEWEST_DISCORDANT`."""
    split = predictions.get("id")
    if split is None or "id" not in result.get("splits", {}) or split["logits"].shape[0] > MAX_PAIR_MEMBERS:
        return lambda counts: {}
    split = Examples.of(split)
    statistics = PAIR_STATISTICS if split.labels is not None else {key: PAIR_STATISTICS[key] for key in LABEL_FREE_PAIRS}
    paths = {key: ("splits", "id", key, *(() if key == "ambiguity" else ("mean",)), "value") for key in statistics}
    tables = [key for key in ("yule_q", "error_correlation") if key in paths and paths[key] in wanted]
    if tables and not split.undefined.any():
        e = split.member_errors  # the smallest count, over member pairs and both directions, of examples one member
        only = e @ (1 - e).T  # gets wrong and the other right (N¹⁰, N⁰¹ of the pair's 2×2 table): [k, k]
        fewest = int(only[~torch.eye(split.members, dtype=torch.bool)].min().round())
        if fewest < FEWEST_DISCORDANT:
            for key, what in (("yule_q", "Yule's Q"), ("error_correlation", "the correlation")):
                refused = Refused(FEW_DISCORDANT.format(least=FEWEST_DISCORDANT, found=fewest, what=what))
                statistics = {**statistics, key: lambda split, w, refused=refused: refused}

    def resample(counts):
        if "id" not in counts:
            return {}
        found = {paths[key]: statistic(split, counts["id"]) for key, statistic in statistics.items() if paths[key] in wanted}
        return {path: values for path, values in found.items() if values is not None}
    return resample


register_resampler("member-pairs")(_pairs_resampler)
register_resampler("disagreement")(per_split(DISAGREEMENT))


INITIAL = ("mean off-diagonal cosine of the members' weights at initialisation, before any training step: what the "
           "trained cosine is read against (BatchEnsemble's members share one W and start far above 0, "
           "independent members near 0)")


@register_analyzer("weight-similarity", description="k×k cosine similarity of members' effective weights, overall and per layer",
                   reads_data=False, version=2,  # 2: the cosine at initialisation
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
                         metric(None, INITIAL, note="not known: no spec to rebuild the members from, and none given (diagnose(context=Context(initial=…)))"))
    if scope:
        result["scope"] = scope
    return result if store else {**result, "note": note}
