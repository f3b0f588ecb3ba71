"""The range of every number a report reads back from a run folder. A value outside its range was
not written by ensdiag (a damaged, hand-edited or hostile file): the report names it as damage,
never averages it, prints it with hundreds of digits or marks it best.

    problem = out_of_range(metrics)     # None, or "analyzers.calibration.splits.id.accuracy.value is 1e+308, …"

Ranges are by the name of the quantity (the key holding {"value": …}), so every analyzer's
results are checked, a plug-in's too: names not listed here need only be finite numbers. No file
ensdiag writes holds NaN or infinity (JSON has neither), nor an integer beyond 64 bits.
"""

import math

TOLERANCE = 1e-6  # rounding at the ends of a range (a CKA of 1.0000000002)
PROBABILITY, COSINE, SIGNED_SHARE = (0.0, 1.0), (-1.0, 1.0), (-1.0, 1.0)
NON_NEGATIVE, BRIER = (0.0, math.inf), (0.0, 2.0)
RANGES = {
    **dict.fromkeys(("accuracy", "member_accuracy", "ece", "ece_adaptive", "ece_adaptive_tu", "ece_classwise",
                     "member_ece", "auroc", "aupr_in", "aupr_out", "fpr95", "fpr95_ood_as_id", "fpr95_id_as_ood",
                     "aurc", "aurc_trapezoid", "error_ensemble", "error_gibbs", "disagreement", "rank_one", "member_error"),
                    PROBABILITY),
    **dict.fromkeys(("overconfidence", "error_gap", "disagreement_gap"), SIGNED_SHARE),
    **dict.fromkeys(("brier", "brier_ensemble", "brier_gibbs", "brier_spread"), BRIER),
    **dict.fromkeys(("nll", "member_nll", "nll_ensemble", "nll_gibbs", "nll_geometric", "nll_gap", "entropy",
                     "expected_entropy", "jsd", "kl_diversity", "normalized", "temperature_pooled", "epkl", "rmi", "ratio"),
                    NON_NEGATIVE),
    **dict.fromkeys(("weight_cosine", "aligned_weight_cosine", "linear", "spearman_au_eu"), COSINE),
}
# a name whose range depends on the analyzer: a mean of disagreements, of cosines
BY_ANALYZER = {("disagreement", "mean"): PROBABILITY, ("disagreement", "matrix"): PROBABILITY,
               ("weight-similarity", "mean"): COSINE, ("weight-similarity", "matrix"): COSINE,
               ("weight-similarity", "initial"): COSINE, ("cka", "mean"): COSINE,
               ("refinement", "loss"): NON_NEGATIVE, ("refinement", "refinement"): NON_NEGATIVE,
               ("refinement", "temperatures"): NON_NEGATIVE}
INTEGER_LIMIT = 2**63
META = {"parameters": NON_NEGATIVE, "train_seconds": NON_NEGATIVE, "eval_seconds": NON_NEGATIVE,
        "epochs_run": NON_NEGATIVE, "weights_epoch": NON_NEGATIVE, "best_val_epoch": NON_NEGATIVE}


def shown(value) -> str:
    """A number as a person reads it, however large: 1e+308, not 309 digits."""
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def bad_number(value, bounds=None) -> str | None:
    """Why a number read back is damage (not finite, beyond 64 bits, outside `bounds`), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) >= INTEGER_LIMIT:
        return f"is {shown(value)}"
    if not math.isfinite(value):
        return f"is {value}"
    if bounds is not None and not bounds[0] - TOLERANCE <= value <= bounds[1] + TOLERANCE:
        return f"is {shown(value)}, outside [{bounds[0]:g}, {bounds[1]:g}]"
    return None


def _numbers(node, path):
    """(path, number) of every number in a value: a number, a list, a matrix (lists of lists)."""
    stack = [(node, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, list):
            stack.extend((entry, f"{where}[{index}]") for index, entry in enumerate(item))
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            yield where, item


def out_of_range(metrics: dict) -> str | None:
    """The first number of a metrics.json that is not what ensdiag writes, said in words, or None."""
    stack = [(metrics, "", None, None)]
    while stack:
        node, where, name, analyzer = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                inside = key if where == ".analyzers" else analyzer
                if key == "value" and name is not None:
                    bounds = BY_ANALYZER.get((analyzer, name), RANGES.get(name))
                    problem = next(((place, why) for place, number in _numbers(value, f"{where}.value")
                                    if (why := bad_number(number, bounds))), None)
                    if problem:
                        return f"{problem[0].lstrip('.')} {problem[1]}"
                    continue
                stack.append((value, f"{where}.{key}", key, inside))
        elif isinstance(node, list):
            stack.extend((entry, f"{where}[{index}]", name, analyzer) for index, entry in enumerate(node))
        elif (why := bad_number(node)) is not None:
            return f"{where.lstrip('.')} {why}"
    return None


def meta_out_of_range(meta: dict) -> str | None:
    """The first number of a meta.json the report reads that is damage, or None."""
    for key, bounds in META.items():  # (a Deep Ensemble's epochs: one per member)
        why = next((f"{where} {why}" for where, number in _numbers(meta.get(key), key)
                    if (why := bad_number(number, bounds))), None)
        if why:
            return why
    return None
