"""The verdict: how much of a Deep Ensemble's gain over the single model another method delivers.

For every other ensemble method in a run that also holds `single` and `deep-ensemble`:
- share of the gain, for NLL and ECE on the in-distribution test set (lower is better) and
  for OOD AUROC with the score 1 − max p̄ (higher is better):
      share = (single − method) / (single − deep ensemble)   [AUROC: (method − single) / (deep − single)]
  1 means the method buys what the Deep Ensemble buys, 0 that it buys nothing, < 0 that it is
  worse than the single model, > 1 that it gains more than the Deep Ensemble;
- the diversity term: the method's KL diversity (mean_i KL(q̄ ‖ p_i), analysis/gain.py) over
  the Deep Ensemble's, on the in-distribution test set.
Point estimates average every seed the three methods share. Each 95 % interval is the wider
envelope of two: the Student-t interval over the per-seed values (mean ± t_{0.975,n−1}·s/√n,
the report's own convention for seeds), and a paired bootstrap over seeds and test examples
(`RESAMPLES` resamples drawing seeds with replacement, the same for every method, and test
examples with replacement, the same for every method and seed, from a fixed generator, so
reports are reproducible). The bootstrap alone cannot leave the range of the observed seeds,
which with 3 seeds is far too narrow (Efron & Tibshirani, *An Introduction to the Bootstrap*,
1993, §13: percentile intervals undercover for small samples); the t interval carries the
seed-to-seed variance, the bootstrap the test-set sampling with one seed or agreeing seeds.

`answer` turns the numbers into one line per method: like an ensemble when every settled
interval lies above 50 % of the Deep Ensemble's, like a single model when every one lies below
25 %, in between (or unsettled) otherwise.

A share is "not determined by these seeds" instead of a number when the Deep Ensemble's own
gain is not positive beyond noise (its interval reaches 0, or it is worse than the single
model), or when the share's interval is wider than the whole 0–100 % range it is about. The
diversity ratio is not given when the Deep Ensemble's own diversity is at rounding level.
"""

import math

import torch

from ..analysis import metrics as M
from ..io import read_safetensors

BASELINE, REFERENCE = "single", "deep-ensemble"
RESAMPLES = 500
NO_GAIN = 1e-12  # a Deep Ensemble gain this small is none (float rounding of equal numbers)
NO_DIVERSITY = 1e-9  # nats: a Deep Ensemble KL diversity this small is rounding (float32 logits), not diversity
ECE_BINS = 15


def _per_example(path) -> dict | None:
    """What the verdict needs of one run's predictions, per example (id and ood only are read)."""
    try:
        tensors, _ = read_safetensors(path, "predictions file", only=("id/logits", "id/labels", "ood/logits"))
    except Exception:
        return None
    if "id/logits" not in tensors or "id/labels" not in tensors:
        return None
    logits, labels = tensors["id/logits"].double(), tensors["id/labels"].long()
    log_p = M.mean_log_probs(logits)
    confidence, predicted = log_p.exp().max(1)
    out = {"nll": -log_p.gather(1, labels[:, None]).squeeze(1), "confidence": confidence,
           "correct": (predicted == labels).double(), "id_score": 1 - confidence,
           "kl": -torch.logsumexp(torch.log_softmax(logits, -1).mean(0), -1)}
    if "ood/logits" in tensors:
        out["ood_score"] = 1 - M.mean_probs(tensors["ood/logits"].double()).max(1).values
    return out


def _ece(confidence, correct):
    stats = M.bin_statistics(confidence, correct, ECE_BINS)
    return ((stats["confidence"] - stats["target"]).abs().sum() / len(correct)).item()


def _auroc(id_score, ood_score):
    """P(ood > id) + ½ P(tie), from midranks."""
    scores = torch.cat([id_score, ood_score])
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    _, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    summed = torch.zeros(len(counts), dtype=scores.dtype).index_add_(0, inverse, ranks)
    ranks = (summed / counts)[inverse]  # ties share their mean rank
    n_id, n_ood = len(id_score), len(ood_score)
    return ((ranks[n_id:].sum() - n_ood * (n_ood + 1) / 2) / (n_id * n_ood)).item()


def _metrics(run, examples, ood_examples):
    values = {"nll": run["nll"][examples].mean().item(), "ece": _ece(run["confidence"][examples], run["correct"][examples]),
              "kl": run["kl"][examples].mean().item()}
    if "ood_score" in run:
        values["auroc"] = _auroc(run["id_score"][examples], run["ood_score"][ood_examples])
    return values


def _averaged(runs, seeds, examples, ood_examples):
    per_seed = [_metrics(runs[seed], examples, ood_examples) for seed in seeds]
    return {key: sum(values[key] for values in per_seed) / len(per_seed) for key in per_seed[0]}


def _shares(baseline, reference, method):
    """Each share, and the Deep Ensemble's own gain it is a share of (`gain_<key>`); the values
    may be floats (one estimate) or tensors (one per bootstrap resample)."""
    out = {}
    for key, higher_is_better in (("nll", False), ("ece", False), ("auroc", True)):
        if key in method and key in baseline and key in reference:
            gain = reference[key] - baseline[key] if higher_is_better else baseline[key] - reference[key]
            mine = method[key] - baseline[key] if higher_is_better else baseline[key] - method[key]
            out[key] = _where(abs(gain) > NO_GAIN, mine / _nonzero(gain), math.nan)
            out[f"gain_{key}"] = gain
    out["diversity"] = _where(reference["kl"] > 0, method["kl"] / _nonzero(reference["kl"]), math.nan)
    out["reference_kl"] = reference["kl"]
    return out


def _nonzero(value):
    """The value, with exact zeros replaced by 1 where `_where` discards the quotient anyway."""
    if isinstance(value, torch.Tensor):
        return torch.where(value == 0, torch.ones_like(value), value)
    return value if value != 0 else 1.0


def _where(condition, value, otherwise):
    if isinstance(condition, torch.Tensor):
        return torch.where(condition, value, torch.full_like(value, otherwise))
    return value if condition else otherwise


def _resamples(num_seeds: int, n: int, n_ood: int):
    """The bootstrap's draws, [R, S] seeds, [R, n] test examples and [R, n_ood] OOD examples, from
    one fixed generator in the order the resamples are taken (so reports are reproducible)."""
    generator = torch.Generator().manual_seed(0)
    chosen, examples, ood_examples = [], [], []
    for _ in range(RESAMPLES):
        chosen.append(torch.randint(0, num_seeds, (num_seeds,), generator=generator))
        examples.append(torch.randint(0, n, (n,), generator=generator))
        ood_examples.append(torch.randint(0, max(n_ood, 1), (n_ood,), generator=generator))
    return torch.stack(chosen), torch.stack(examples), torch.stack(ood_examples)


def _counts(draws: torch.Tensor, size: int) -> torch.Tensor:
    """[R, size]: how often each example was drawn in each resample (float64)."""
    rows = torch.arange(len(draws)).unsqueeze(1) * size
    return torch.bincount((rows + draws).flatten(), minlength=len(draws) * size).view(len(draws), size).double()


def _bootstrap(group, seeds, chosen, examples, ood_examples, weights=None) -> dict:
    """The `_averaged` metrics of every resample at once ({key: [R]}): each seed's metrics from the
    resampled examples' counts (no Python loop over resamples), then the mean over the chosen seeds.
    Equal to the loop up to float rounding (a test keeps the loop as the reference). `weights`:
    the examples' and OOD examples' counts, when the caller has them already."""
    weights, ood_weights = weights or _example_counts(examples, ood_examples)
    per_seed = [_weighted_metrics(group[seed], weights, ood_weights) for seed in seeds]  # S × {key: [R]}
    out = {}
    for key in per_seed[0]:
        stacked = torch.stack([metrics[key] for metrics in per_seed], dim=1)  # [R, S]
        out[key] = stacked.gather(1, chosen).mean(1)
    return out


def _example_counts(examples, ood_examples):
    """([R, n], [R, n_ood] or None): how often each test and OOD example was drawn per resample."""
    return (_counts(examples, examples.shape[1]),
            _counts(ood_examples, ood_examples.shape[1]) if ood_examples.shape[1] else None)


def _weighted_metrics(run, weights, ood_weights) -> dict:
    """NLL, ECE, KL diversity (and AUROC) of one run for every resample, from example counts."""
    n = weights.shape[1]
    out = {"nll": weights @ run["nll"] / n, "kl": weights @ run["kl"] / n}
    bins = torch.searchsorted(torch.linspace(0, 1, ECE_BINS + 1, dtype=torch.float64)[1:-1],
                              run["confidence"].double().contiguous(), right=False)  # as bin_statistics bins
    one_hot = torch.nn.functional.one_hot(bins, ECE_BINS).double()  # [n, B]
    confidence = weights @ (one_hot * run["confidence"].double()[:, None])
    correct = weights @ (one_hot * run["correct"].double()[:, None])
    out["ece"] = (confidence - correct).abs().sum(1) / n
    if "ood_score" in run and ood_weights is not None:
        out["auroc"] = _weighted_auroc(run["id_score"], run["ood_score"], weights, ood_weights)
    return out


def _weighted_auroc(id_score, ood_score, weights, ood_weights) -> torch.Tensor:
    """P(ood > id) + ½ P(tie) for every resample: the id scores sorted once, each OOD example's
    count of smaller and equal id scores read from the resample's cumulative counts."""
    order = torch.argsort(id_score)
    ranked = id_score[order]
    cumulative = torch.nn.functional.pad(weights[:, order].cumsum(1), (1, 0))  # [R, n + 1]
    below = torch.searchsorted(ranked, ood_score, right=False)  # id scores < each OOD score
    upto = torch.searchsorted(ranked, ood_score, right=True)  # id scores <= it
    wins = cumulative[:, below] + 0.5 * (cumulative[:, upto] - cumulative[:, below])  # [R, n_ood]
    n, n_ood = weights.shape[1], ood_weights.shape[1]
    return (wins * ood_weights).sum(1) / (n * n_ood)


def verdict(run_dir, runs: dict) -> dict:
    """{method: {"nll" | "ece" | "auroc" | "diversity": {"value", "interval"}, "seeds": n, "sentence"}}."""
    if BASELINE not in runs or REFERENCE not in runs:
        return {}
    loaded = {method: {seed: data for seed, run in seeds.items() if run is not None
                       and (data := _per_example(run["folder"] / "predictions.safetensors")) is not None}
              for method, seeds in runs.items()}
    result = {}
    # The single model's and the Deep Ensemble's resampled metrics serve every other method that
    # shares their seeds: the draws depend only on (seeds, n, n_ood), from one fixed generator.
    draws_for, resampled_for = {}, {}
    for method in runs:
        if method in (BASELINE, REFERENCE):
            continue
        seeds = sorted(set(loaded[BASELINE]) & set(loaded[REFERENCE]) & set(loaded[method]))
        if not seeds:
            continue
        trio = [loaded[BASELINE], loaded[REFERENCE], loaded[method]]
        n = len(trio[0][seeds[0]]["nll"])
        n_ood = len(trio[0][seeds[0]].get("ood_score", []))
        if any(len(group[seed]["nll"]) != n for group in trio for seed in seeds):
            continue  # seeds measured on different test sets cannot be paired
        everything, all_ood = torch.arange(n), torch.arange(n_ood)
        point = _shares(*(_averaged(group, seeds, everything, all_ood) for group in trio))
        size = (len(seeds), n, n_ood)
        if size not in draws_for:
            chosen, examples, ood_examples = _resamples(*size)
            draws_for[size] = (chosen, examples, ood_examples, _example_counts(examples, ood_examples))
        chosen, examples, ood_examples, counts = draws_for[size]
        resampled = []
        for name, group in zip((BASELINE, REFERENCE, method), trio):
            key = (name, tuple(seeds), size)
            if key not in resampled_for:
                resampled_for[key] = _bootstrap(group, seeds, chosen, examples, ood_examples, counts)
            resampled.append(resampled_for[key])
        shares = _shares(*resampled)  # every entry a tensor over the resamples
        draws = {key: [value for value in shares[key].tolist() if math.isfinite(value)] if key in shares else []
                 for key in point}
        per_seed = [_shares(*(_metrics(group[seed], everything, all_ood) for group in trio)) for seed in seeds]
        intervals = {key: _envelope(_percentiles(draws[key]), _t_interval([shares[key] for shares in per_seed]))
                     for key in point}
        result[method] = _entry(point, intervals, len(seeds))
    return result


def _entry(point, intervals, seeds) -> dict:
    """What the report shows of one method: each share or why it is not determined."""
    entry = {"seeds": seeds}
    for key in ("nll", "ece", "auroc"):
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
        elif interval is None or interval[1] - interval[0] > 1:
            found["undetermined"] = "wide"
        if found["undetermined"]:
            found["value"] = None
        entry[key] = found
    reference_kl = intervals["reference_kl"]
    rounding = point["reference_kl"] <= NO_DIVERSITY
    entry["diversity"] = {"value": None if rounding or not math.isfinite(point["diversity"]) else point["diversity"],
                          "interval": None if rounding else intervals["diversity"],
                          "reference_diversity": point["reference_kl"], "reference_diversity_interval": reference_kl,
                          "undetermined": "rounding" if rounding else None}
    return entry


def _t_interval(values):
    """mean ± t_{0.975,n−1}·s/√n over the finite per-seed values (the report's `mean_ci`); None for fewer than two."""
    from .stats import mean_ci
    found = mean_ci([value for value in values if math.isfinite(value)])
    return None if found["ci"] is None else [found["mean"] - found["ci"], found["mean"] + found["ci"]]


def _envelope(*intervals):
    """The smallest interval holding every given one (None where none is given)."""
    given = [interval for interval in intervals if interval is not None]
    return [min(low for low, _ in given), max(high for _, high in given)] if given else None


def _percentiles(values):
    """The 2.5th and 97.5th percentiles of the bootstrap draws (None without finite draws)."""
    values = sorted(values)
    if not values:
        return None
    return [values[int(0.025 * (len(values) - 1))], values[int(math.ceil(0.975 * (len(values) - 1)))]]


def _bounds(interval) -> str:
    return f"[{interval[0] * 100:.0f} %, {interval[1] * 100:.0f} %]"


def _percent(entry) -> str:
    return f"{entry['value'] * 100:.0f} %" + (f" {_bounds(entry['interval'])}" if entry["interval"] else "")


def _gain(entry) -> str:
    low, high = entry["reference_gain_interval"] or (None, None)
    bounds = f" [{low:.3g}, {high:.3g}]" if low is not None else ""
    return f"{entry['reference_gain']:.3g}{bounds}"


def _join(items):
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


WHY = {"no gain": "the Deep Ensemble gains nothing over the single model",
       "worse": "the Deep Ensemble is worse than the single model",
       "noise": "the Deep Ensemble's own gain is within noise"}


ENSEMBLE_LIKE, SINGLE_LIKE = 0.5, 0.25  # shares whose whole interval lies above / below these settle the answer


def answer(label: str, entry: dict) -> str:
    """The one-line answer: does the method behave like an ensemble or like a single model?

    The evidence is every share the seeds determine and the diversity ratio, each with its 95 %
    interval. Like an ensemble: every interval lies above 50 % of the Deep Ensemble's. Like a
    single model: every interval lies below 25 %. In between otherwise; not determined when the
    seeds settle none of them."""
    evidence = [(name, entry[key]) for key, name in (("nll", "NLL"), ("ece", "ECE"), ("auroc", "OOD AUROC"),
                                                     ("diversity", "diversity")) if key in entry
                and entry[key].get("value") is not None and entry[key].get("interval")]
    if not evidence:
        return f"{label}: not determined by these seeds (no share or diversity ratio they settle)."
    on = _join([name for name, _ in evidence])
    above, below = f"{ENSEMBLE_LIKE * 100:.0f} %", f"{SINGLE_LIKE * 100:.0f} %"
    if all(found["interval"][0] >= ENSEMBLE_LIKE for _, found in evidence):
        return f"{label}: behaves like an ensemble (95 % interval above {above} of the Deep Ensemble on {on})."
    if all(found["interval"][1] <= SINGLE_LIKE for _, found in evidence):
        return f"{label}: behaves like a single model (95 % interval below {below} of the Deep Ensemble on {on})."
    intervals = "interval is" if len(evidence) == 1 else "intervals are"
    return (f"{label}: between a single model and an ensemble, or not settled by these seeds (on {on}, the 95 % "
            f"{intervals} neither all above {above} nor all below {below} of the Deep Ensemble).")


def sentence(label: str, entry: dict) -> str:
    """One sentence per method, generated from the numbers: each share with the Deep Ensemble's
    own gain it is a share of, what a share outside 0–100 % means, and why a share is not given."""
    given, open_, unmeasured = [], [], {}
    for key, name in (("nll", "NLL"), ("ece", "ECE"), ("auroc", "OOD AUROC")):
        if key not in entry:
            continue
        share = entry[key]
        why = share["undetermined"]
        if why == "wide":
            open_.append(f"its share of the {name} gain is not determined by these seeds (its interval "
                         f"{_bounds(share['interval'])} is wider than the whole 0–100 % range)")
        elif why:
            unmeasured.setdefault(why, []).append((name, _gain(share)))
        else:
            printed = [share["value"], *(share["interval"] or [])]
            notes = [*(["below 0 % is worse than the single model"] if min(printed) < 0 else []),
                     *(["above 100 % is more than the Deep Ensemble gains"] if max(printed) > 1 else []),
                     f"the Deep Ensemble's gain: {_gain(share)}"]
            given.append(f"{_percent(share)} of the Deep Ensemble's {name} gain ({'; '.join(notes)})")
    for why, gains in unmeasured.items():  # one clause per reason, every gain it concerns
        plural = len(gains) > 1
        open_.append(f"its share{'s' if plural else ''} of the {_join([name for name, _ in gains])} gain"
                     f"{'s are' if plural else ' is'} not determined by these seeds ({WHY[why]}: "
                     f"{', '.join(f'{name} {gain}' for name, gain in gains)})")
    text = f"{label} delivers {_join(given)}" if given else f"{label}:"
    if open_:
        text += f"{'; ' if given else ' '}{_join(open_)}"
    diversity = entry["diversity"]
    if diversity["value"] is not None:
        low, high = diversity["interval"] or (None, None)
        bounds = f" [{low:.2f}, {high:.2f}]" if low is not None else ""
        text += f"; its diversity term is {diversity['value']:.2f}×{bounds} the Deep Ensemble's"
    elif diversity["undetermined"] == "rounding":
        text += "; its diversity cannot be compared: the Deep Ensemble's own diversity is at rounding level"
    seeds = entry["seeds"]
    how = "Student-t over seeds widened by a paired bootstrap" if seeds > 1 else "paired bootstrap over test examples only"
    return text + f" ({seeds} seed{'s' if seeds != 1 else ''}; 95 % intervals: {how})."
