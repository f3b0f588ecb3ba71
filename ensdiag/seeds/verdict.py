"""The verdict: which questions a run's seeds settle about each efficient method, and the answers.

For every other ensemble method in a run that also holds `single` and `deep-ensemble`, four
questions, each a ratio to the Deep Ensemble (the same rule answers all of them, stats.py):
- the share of the Deep Ensemble's gain over the single model, for NLL and ECE on the
  in-distribution test set (lower is better) and for OOD AUROC with the score 1 − max p̄
  (higher is better):
      share = (single − method) / (single − deep ensemble)   [AUROC: (method − single) / (deep − single)]
  1 means the method buys what the Deep Ensemble buys, 0 that it buys nothing, < 0 that it is
  worse than the single model, > 1 that it gains more than the Deep Ensemble;
- the diversity term: the method's KL diversity (mean_i KL(q̄ ‖ p_i), analysis/gain.py) over the
  Deep Ensemble's, on the in-distribution test set. By its identity KL diversity = the members'
  mean NLL − the NLL of their normalised geometric mean, so the verdict also carries both sides
  (`drivers`): a diversity above the Deep Ensemble's can come from weaker members.
Every point estimate is a ratio of means over the seeds the three methods share. Its 95 % interval
is the envelope of two: Fieller's interval for that ratio of means over the paired per-seed values
(inverting the paired t-test; none, and the question unsettled, when the set is unbounded), and
a paired bootstrap of the same ratio of means over seeds and test examples (`RESAMPLES`
resamples drawing seeds with replacement from a fixed generator, the same for every method, and
test examples with the very draws behind every cell's interval — `bootstrap.Draws`, the same for
every method and seed —, each statistic computed by the function behind the cell, weighted.py;
so reports are reproducible and the verdict's test-set sampling is the tables'). The bootstrap alone cannot leave the range of the observed seeds, which with 3 seeds
is far too narrow (Efron & Tibshirani 1993, §13); Fieller's carries the seed-to-seed variance, the
bootstrap the test-set sampling with one seed or agreeing seeds. An interval never holds values the
quantity cannot take (a diversity ratio is ≥ 0).

A share is not given when the Deep Ensemble's own gain is not positive beyond noise (its interval
reaches 0, or it is worse than the single model): there is no gain to take a share of. The
diversity ratio is not given when the Deep Ensemble's own diversity is at rounding level.
report/verdict_text.py turns the entries into the report's lines.
"""

import math

import torch

from ..stats import bootstrap as B
from ..stats import weighted as W
from ..stats.metrics import gain_terms
from ..checks import test_set_difference
from .stats import BASELINE, ENSEMBLE_LIKE, REFERENCE, SINGLE_LIKE, envelope, fieller, percentiles, seeds_needed, settles, t_interval

RESAMPLES = B.RESAMPLES  # the first rows of the draws behind the cells' intervals
NO_GAIN = 1e-12  # a Deep Ensemble gain this small is none (float rounding of equal numbers)
NO_DIVERSITY = 1e-9  # nats: a Deep Ensemble KL diversity this small is rounding (float32 logits), not diversity


def _per_example(seed) -> dict:
    """What the verdict reads of one run's predictions (across.Seed), per example."""
    split = seed.id
    terms = gain_terms(split)
    out = {"labels": split.labels, "classes": split.logits.shape[-1],  # (which test set)
           "nll": split.nll, "confidence": split.confidence, "correct": split.correct, "id_score": 1 - split.confidence,
           "kl": terms["kl_diversity"],  # mean_i KL(q̄ ‖ p_i), q̄ the normalised geometric mean
           "gibbs": terms["nll_gibbs"]}
    if seed.ood is not None:
        out["ood_score"] = 1 - seed.ood.confidence
    if seed.shift_nll is not None:
        out["shift_nll"] = seed.shift_nll
    return out


def _metrics(run, w=None, w_ood=None, w_shift=None) -> dict:
    """NLL, ECE, KL diversity, the members' NLL (AUROC, NLL under shift) of one run under example
    weights (None: as measured; counts [R, n]: each resample), by the functions behind the cells."""
    values = {"nll": W.mean(run["nll"], w), "ece": W.ece(run["confidence"], run["correct"], w),
              "kl": W.mean(run["kl"], w), "gibbs": W.mean(run["gibbs"], w)}
    if "ood_score" in run:
        values["auroc"] = W.ood_metrics(run["id_score"], run["ood_score"], w, w_ood, only=("auroc",))["auroc"]
    if "shift_nll" in run:
        values["shift_nll"] = W.mean(run["shift_nll"], w_shift)
    return {key: value if value.dim() else value.item() for key, value in values.items()}


def _shares(baseline, reference, method):
    """Each share, its numerator (the method's own gain, `mine_<key>`) and the Deep Ensemble's gain
    it is a share of (`gain_<key>`); the diversity ratio, its numerator and denominator, and both
    sides of the KL-diversity identity (members' mean NLL, geometric-mean NLL) for the method and
    the Deep Ensemble. The values may be floats (one estimate) or tensors (one per resample)."""
    out = {}
    for key, higher_is_better in (("nll", False), ("ece", False), ("auroc", True), ("shift_nll", False)):
        if key in method and key in baseline and key in reference:
            gain = reference[key] - baseline[key] if higher_is_better else baseline[key] - reference[key]
            mine = method[key] - baseline[key] if higher_is_better else baseline[key] - method[key]
            out[key] = _ratio(mine, gain, abs(gain) > NO_GAIN)
            out[f"mine_{key}"], out[f"gain_{key}"] = mine, gain
    out["diversity"] = _ratio(method["kl"], reference["kl"], reference["kl"] > 0)
    out["method_kl"], out["reference_kl"] = method["kl"], reference["kl"]
    out["method_gibbs"], out["reference_gibbs"] = method["gibbs"], reference["gibbs"]
    out["method_geometric"], out["reference_geometric"] = method["gibbs"] - method["kl"], reference["gibbs"] - reference["kl"]
    out["gibbs_difference"] = method["gibbs"] - reference["gibbs"]
    out["geometric_difference"] = out["method_geometric"] - out["reference_geometric"]
    return out


def _ratio(numerator, denominator, defined):
    """numerator / denominator where `defined`, else NaN: floats (one estimate) or tensors (one per resample)."""
    if isinstance(defined, torch.Tensor):  # (an exact 0 divides by 1: its quotient is discarded anyway)
        return torch.where(defined, numerator / torch.where(denominator == 0, 1.0, denominator), math.nan)
    return numerator / denominator if defined else math.nan


def chosen_seeds(num_seeds: int, resamples: int = RESAMPLES) -> torch.Tensor:
    """[R, S]: the seeds each resample draws (with replacement), from a fixed generator, the same for
    every method (paired), so reports are reproducible."""
    return torch.randint(0, num_seeds, (resamples, num_seeds), generator=torch.Generator().manual_seed(0))


def example_counts(run, draws: B.Draws, resamples: int = RESAMPLES) -> tuple:
    """(id, OOD, shift counts [R, n]): the test examples' resamples, the draws behind the cells' intervals."""
    return tuple(draws.counts(split, len(run[key]), 0, resamples) if key in run else None
                 for split, key in (("id", "nll"), ("ood", "ood_score"), ("shift", "shift_nll")))


def _per_seed_resampled(group, seeds, counts) -> dict:
    """{key: [R, S]}: each seed's metrics on every resample of the examples (weighted by their counts)."""
    per_seed = [_metrics(group[seed], *counts) for seed in seeds]  # S × {key: [R]}
    return {key: torch.stack([metrics[key] for metrics in per_seed], dim=1) for key in per_seed[0]}


def _bootstrap(stacked: dict, chosen) -> dict:
    """The seed-averaged metrics of every resample at once ({key: [R]}): each seed's metrics on the
    resampled examples (`stacked`, _per_seed_resampled), then the mean over the seeds each resample chose."""
    return {key: values.gather(1, chosen).mean(1) for key, values in stacked.items()}


def _averaged(group, seeds) -> dict:
    per_seed = [_metrics(group[seed]) for seed in seeds]
    return {key: sum(values[key] for values in per_seed) / len(per_seed) for key in per_seed[0]}


def verdict(runs: dict, reasons: dict | None = None, draws: B.Draws | None = None) -> dict:
    """{method: {"nll" | "ece" | "auroc" | "diversity": {"value", "interval", "answer", "seeds_needed",
    …}, "seeds": n}} of the loaded runs ({method: {seed: across.Seed}}); `reasons` ({method: why}) receives,
    for every other method, why no verdict could be formed; `draws`: the bootstrap draws to share (the
    effective size's, effective_size.py)."""
    reasons = {} if reasons is None else reasons
    if BASELINE not in runs or REFERENCE not in runs:
        missing = " and ".join(f"`{name}`" for name in (BASELINE, REFERENCE) if name not in runs)
        reasons.update({method: f"no {missing} run beside it to compare with" for method in runs
                        if method not in (BASELINE, REFERENCE)})
        return {}
    loaded = {method: {seed: _per_example(run) for seed, run in seeds.items()} for method, seeds in runs.items()}
    result, draws, resampled_for = {}, draws if draws is not None else B.Draws(), {}
    for method in runs:
        if method in (BASELINE, REFERENCE):
            continue
        seeds = sorted(set(loaded[BASELINE]) & set(loaded[REFERENCE]) & set(loaded[method]))
        if not seeds:
            reasons[method] = (f"it shares no finished seed with `{BASELINE}` and `{REFERENCE}` (with their predictions "
                               "files)")
            continue
        trio = [loaded[BASELINE], loaded[REFERENCE], loaded[method]]
        first = trio[0][seeds[0]]
        difference = test_set_difference([(group[seed]["labels"], group[seed]["classes"]) for group in trio for seed in seeds])
        if difference is not None:  # runs measured on different test sets cannot be paired
            reasons[method] = f"its runs and those it is compared with were measured on different test sets ({difference})"
            continue
        for key in ("ood_score", "shift_nll"):  # different OOD or shift sets: no OOD or shift question
            if any(len(group[seed].get(key, [])) != len(first.get(key, [])) for group in trio for seed in seeds):
                trio = [{seed: {name: value for name, value in run.items() if name != key}
                         for seed, run in group.items()} for group in trio]
        point = _shares(*(_averaged(group, seeds) for group in trio))
        counts, chosen = example_counts(trio[0][seeds[0]], draws), chosen_seeds(len(seeds))
        resampled, stacks = [], []
        for name, group in zip((BASELINE, REFERENCE, method), trio):
            key = (name, tuple(seeds), tuple(len(c) if c is not None else 0 for c in counts), tuple(sorted(group[seeds[0]])))
            if key not in resampled_for:  # the single model's and the Deep Ensemble's serve every other method
                resampled_for[key] = _per_seed_resampled(group, seeds, counts)
            stacks.append(resampled_for[key])
            resampled.append(_bootstrap(resampled_for[key], chosen))
        resampled_shares = {key: value.tolist() for key, value in _shares(*resampled).items()}
        per_seed = [_shares(*(_metrics(group[seed]) for group in trio)) for seed in seeds]
        result[method] = _entry(point, _intervals(point, resampled_shares, per_seed), len(seeds))
        each_seed = [_shares(*({key: values[:, index] for key, values in stack.items()} for stack in stacks))
                     for index in range(len(seeds))]  # every seed's shares on every resample of the examples
        _add_seeds_needed(result[method], point, per_seed, each_seed)
    return result


def _intervals(point, draws, per_seed) -> dict:
    """Each ratio's interval (Fieller over seeds ∪ the bootstrap; None when Fieller's set is unbounded),
    each difference's (Student-t over seeds ∪ the bootstrap)."""
    seeds, found = per_seed, {}
    for key in point:
        if key in RATIOS:
            numerator, denominator = RATIOS[key]
            exact = fieller([values[numerator] for values in seeds], [values[denominator] for values in seeds])
            if exact is None and len(seeds) >= 2:
                found[key] = None  # unbounded: no interval holds what the seeds allow
                continue
            interval = envelope(percentiles(draws[key]), exact)
            if interval is not None and key in NONNEGATIVE:
                interval = [max(interval[0], 0.0), max(interval[1], 0.0)]
            found[key] = interval
        else:
            found[key] = envelope(percentiles(draws[key]), t_interval([values[key] for values in seeds]))
    return found


ANSWERED = ("nll", "ece", "auroc", "shift_nll")


def _entry(point, intervals, seeds) -> dict:
    """What the report shows of one method: each share and what it answers, or why it is not given;
    the diversity ratio, what it answers, and the two sides of its identity."""
    entry = {"seeds": seeds}
    for key in ANSWERED:
        if key not in point:
            continue
        gain, gain_interval = point[f"gain_{key}"], intervals[f"gain_{key}"]
        value, interval = point[key], intervals[key]
        found = {"value": value if math.isfinite(value) else None, "interval": interval,
                 "reference_gain": gain, "reference_gain_interval": gain_interval, "undetermined": None}
        if abs(gain) <= NO_GAIN:
            found["undetermined"] = "no gain"
        elif gain_interval is not None and gain_interval[1] < 0:
            found["undetermined"] = "worse"
        elif gain_interval is None or gain_interval[0] <= 0:
            found["undetermined"] = "noise"
        if found["undetermined"]:
            found["value"], found["interval"] = None, None
        found["answer"] = None if found["undetermined"] else settles(found["interval"])
        entry[key] = found
    rounding = point["reference_kl"] <= NO_DIVERSITY
    value = None if rounding or not math.isfinite(point["diversity"]) else point["diversity"]
    interval = None if value is None else intervals["diversity"]
    entry["diversity"] = {"value": value, "interval": interval,
                          "reference_diversity": point["reference_kl"],
                          "reference_diversity_interval": intervals["reference_kl"],
                          "undetermined": "rounding" if rounding else None,
                          "answer": None if rounding else settles(interval),
                          "drivers": {name: {"value": point[key], "interval": intervals[key]} for name, key in DRIVERS}}
    return entry


# ratio: (its per-seed numerator, its per-seed denominator), as `_shares` names them
RATIOS = {**{key: (f"mine_{key}", f"gain_{key}") for key in ANSWERED}, "diversity": ("method_kl", "reference_kl")}
NONNEGATIVE = {"diversity"}  # KL diversities are ≥ 0, so is their ratio
DRIVERS = (("member_nll", "method_gibbs"), ("reference_member_nll", "reference_gibbs"),
           ("member_nll_difference", "gibbs_difference"), ("geometric_nll", "method_geometric"),
           ("reference_geometric_nll", "reference_geometric"), ("geometric_nll_difference", "geometric_difference"))


def _add_seeds_needed(entry: dict, point: dict, per_seed: list[dict], each_seed: list[dict]) -> None:
    """Beside each question the seeds leave open, how many seeds would settle it (stats.seeds_needed):
    for an unsettled ratio, its interval clearing the line L nearer its estimate (25 % or 50 %): Fieller's
    interval excludes L exactly when the paired t-test of a_s − L·b_s = 0 rejects, so the per-seed
    values are (a_s − L·b_s)/b̄, whose mean is ρ̂ − L; for a share not given because the Deep Ensemble's gain is
    within noise, that gain's interval clearing 0. More seeds average away the seeds' own errors on
    the test examples but not the error they share; its 95 % half-width (`_shared_floor`, from
    `each_seed`: every seed's values on every resample of the examples) is the floor."""
    for key in (*ANSWERED, "diversity"):
        found = entry.get(key)
        if not found:
            continue
        if found.get("answer") == "unsettled" and found.get("value") is not None:
            numerator, denominator = RATIOS[key]
            mean_denominator = sum(values[denominator] for values in per_seed) / len(per_seed)

            line = min((ENSEMBLE_LIKE, SINGLE_LIKE), key=lambda threshold: abs(point[key] - threshold))

            def linear(values, line=line):
                return (values[numerator] - line * values[denominator]) / mean_denominator
            found["seeds_needed"] = seeds_needed([linear(values) for values in per_seed], abs(point[key] - line),
                                                 _shared_floor([linear(values) for values in each_seed]))
        elif found.get("undetermined") == "noise":
            gain = f"gain_{key}"
            found["seeds_needed"] = seeds_needed([values[gain] for values in per_seed], abs(point[gain]),
                                                 _shared_floor([values[gain] for values in each_seed]))


def _shared_floor(resampled: list) -> float:
    """1.96 × the standard deviation, over resamples of the test examples, of the error the seeds
    share: the mean covariance between two different seeds' values ([R] each); with one seed, its
    whole variance. A mean over S seeds has example-level variance diag/S + (1 − 1/S)·shared, so
    the shared part is what stays as seeds are added."""
    values = torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in resampled], dim=1)  # [R, S]
    values = values[torch.isfinite(values).all(1)]
    if len(values) < 2:
        return 0.0
    covariance = torch.cov(values.T).reshape(values.shape[1], values.shape[1])
    seeds = values.shape[1]
    shared = covariance.diagonal().mean() if seeds == 1 else (covariance.sum() - covariance.trace()) / (seeds * (seeds - 1))
    return 1.959963984540054 * math.sqrt(max(shared.item(), 0.0))
