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
resamples drawing seeds with replacement, the same for every method, and test examples with
replacement, the same for every method and seed, from a fixed generator, so reports are
reproducible). The bootstrap alone cannot leave the range of the observed seeds, which with 3 seeds
is far too narrow (Efron & Tibshirani 1993, §13); Fieller's carries the seed-to-seed variance, the
bootstrap the test-set sampling with one seed or agreeing seeds. An interval never holds values the
quantity cannot take (a diversity ratio is ≥ 0).

A share is not given when the Deep Ensemble's own gain is not positive beyond noise (its interval
reaches 0, or it is worse than the single model): there is no gain to take a share of. The
diversity ratio is not given when the Deep Ensemble's own diversity is at rounding level.
verdict_text.py turns the entries into the report's lines.
"""

import math

import torch

from ..analysis import metrics as M
from ..io import read_safetensors
from .stats import envelope, fieller, percentiles, settles, t_interval

BASELINE, REFERENCE = "single", "deep-ensemble"
RESAMPLES = 500
NO_GAIN = 1e-12  # a Deep Ensemble gain this small is none (float rounding of equal numbers)
NO_DIVERSITY = 1e-9  # nats: a Deep Ensemble KL diversity this small is rounding (float32 logits), not diversity
ECE_BINS = 15


class _Wanted:
    """The tensors the verdict reads: the id and ood splits, and every shift split."""

    def __contains__(self, name):
        return name in ("id/logits", "id/labels", "ood/logits") or name.startswith("shift")


def _per_example(path) -> dict | None:
    """What the verdict needs of one run's predictions, per example (id, ood and shift splits are read)."""
    try:
        tensors, _ = read_safetensors(path, "predictions file", only=_Wanted())
    except Exception:
        return None
    if "id/logits" not in tensors or "id/labels" not in tensors:
        return None
    logits, labels = tensors["id/logits"].double(), tensors["id/labels"].long()
    log_p = M.mean_log_probs(logits)
    confidence, predicted = log_p.exp().max(1)
    member_log_p = torch.log_softmax(logits, -1)
    out = {"nll": -log_p.gather(1, labels[:, None]).squeeze(1), "confidence": confidence,
           "correct": (predicted == labels).double(), "id_score": 1 - confidence,
           "kl": -torch.logsumexp(member_log_p.mean(0), -1),  # mean_i KL(q̄ ‖ p_i), q̄ the normalised geometric mean
           "gibbs": -member_log_p.gather(2, labels[None, :, None].expand(len(logits), -1, 1)).squeeze(2).mean(0)}
    if "ood/logits" in tensors:
        out["ood_score"] = 1 - M.mean_probs(tensors["ood/logits"].double()).max(1).values
    shift = _shift_nll(tensors)
    if shift is not None:
        out["shift_nll"] = shift
    return out


def _shift_nll(tensors) -> torch.Tensor | None:
    """The NLL under shift per test image: the corruptions of one image are one sample (they share
    it), so where every corruption split holds the same labelled images, the mean over corruptions
    per image (resampled by image); otherwise every shifted example on its own. None without shift."""
    names = sorted(name.removesuffix("/logits") for name in tensors
                   if name.startswith("shift/") and name.endswith("/logits") and f"{name[:-7]}/labels" in tensors)
    if not names and "shift/logits" in tensors and "shift/labels" in tensors:
        names = ["shift"]
    if not names:
        return None
    found = []
    for name in names:
        labels = tensors[f"{name}/labels"].long()
        found.append((-M.mean_log_probs(tensors[f"{name}/logits"].double()).gather(1, labels[:, None]).squeeze(1), labels))
    if len({len(labels) for _, labels in found}) == 1 and all(torch.equal(labels, found[0][1]) for _, labels in found):
        return torch.stack([nll for nll, _ in found]).mean(0)
    return torch.cat([nll for nll, _ in found])


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


def _metrics(run, examples, ood_examples, shift_examples=None):
    values = {"nll": run["nll"][examples].mean().item(), "ece": _ece(run["confidence"][examples], run["correct"][examples]),
              "kl": run["kl"][examples].mean().item(), "gibbs": run["gibbs"][examples].mean().item()}
    if "ood_score" in run:
        values["auroc"] = _auroc(run["id_score"][examples], run["ood_score"][ood_examples])
    if "shift_nll" in run:
        values["shift_nll"] = run["shift_nll"][slice(None) if shift_examples is None else shift_examples].mean().item()
    return values


def _averaged(runs, seeds, examples, ood_examples, shift_examples=None):
    per_seed = [_metrics(runs[seed], examples, ood_examples, shift_examples) for seed in seeds]
    return {key: sum(values[key] for values in per_seed) / len(per_seed) for key in per_seed[0]}


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
            out[key] = _where(abs(gain) > NO_GAIN, mine / _nonzero(gain), math.nan)
            out[f"mine_{key}"], out[f"gain_{key}"] = mine, gain
    out["diversity"] = _where(reference["kl"] > 0, method["kl"] / _nonzero(reference["kl"]), math.nan)
    out["method_kl"], out["reference_kl"] = method["kl"], reference["kl"]
    out["method_gibbs"], out["reference_gibbs"] = method["gibbs"], reference["gibbs"]
    out["method_geometric"], out["reference_geometric"] = method["gibbs"] - method["kl"], reference["gibbs"] - reference["kl"]
    out["gibbs_difference"] = method["gibbs"] - reference["gibbs"]
    out["geometric_difference"] = out["method_geometric"] - out["reference_geometric"]
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


def _shift_counts(n_shift: int) -> torch.Tensor | None:
    """[R, n_shift]: how often each shifted test image was drawn per resample, from a generator of
    its own (the id draws stay what they were)."""
    if not n_shift:
        return None
    generator = torch.Generator().manual_seed(1)
    return _counts(torch.stack([torch.randint(0, n_shift, (n_shift,), generator=generator) for _ in range(RESAMPLES)]),
                   n_shift)


def _counts(draws: torch.Tensor, size: int) -> torch.Tensor:
    """[R, size]: how often each example was drawn in each resample (float64)."""
    rows = torch.arange(len(draws)).unsqueeze(1) * size
    return torch.bincount((rows + draws).flatten(), minlength=len(draws) * size).view(len(draws), size).double()


def _bootstrap(group, seeds, chosen, examples, ood_examples, weights=None) -> dict:
    """The `_averaged` metrics of every resample at once ({key: [R]}): each seed's metrics from the
    resampled examples' counts (no Python loop over resamples), then the mean over the chosen seeds.
    Equal to the loop up to float rounding (a test keeps the loop as the reference). `weights`:
    the examples' and OOD examples' counts, when the caller has them already."""
    weights, ood_weights, *shift = weights or _example_counts(examples, ood_examples)
    per_seed = [_weighted_metrics(group[seed], weights, ood_weights, *shift) for seed in seeds]  # S × {key: [R]}
    out = {}
    for key in per_seed[0]:
        stacked = torch.stack([metrics[key] for metrics in per_seed], dim=1)  # [R, S]
        out[key] = stacked.gather(1, chosen).mean(1)
    return out


def _example_counts(examples, ood_examples):
    """([R, n], [R, n_ood] or None): how often each test and OOD example was drawn per resample."""
    return (_counts(examples, examples.shape[1]),
            _counts(ood_examples, ood_examples.shape[1]) if ood_examples.shape[1] else None)


def _weighted_metrics(run, weights, ood_weights, shift_weights=None) -> dict:
    """NLL, ECE, KL diversity (AUROC, NLL under shift) of one run for every resample, from example counts."""
    n = weights.shape[1]
    out = {"nll": weights @ run["nll"] / n, "kl": weights @ run["kl"] / n, "gibbs": weights @ run["gibbs"] / n}
    bins = torch.searchsorted(torch.linspace(0, 1, ECE_BINS + 1, dtype=torch.float64)[1:-1],
                              run["confidence"].double().contiguous(), right=False)  # as bin_statistics bins
    one_hot = torch.nn.functional.one_hot(bins, ECE_BINS).double()  # [n, B]
    confidence = weights @ (one_hot * run["confidence"].double()[:, None])
    correct = weights @ (one_hot * run["correct"].double()[:, None])
    out["ece"] = (confidence - correct).abs().sum(1) / n
    if "ood_score" in run and ood_weights is not None:
        out["auroc"] = _weighted_auroc(run["id_score"], run["ood_score"], weights, ood_weights)
    if "shift_nll" in run and shift_weights is not None and shift_weights.shape[1] == len(run["shift_nll"]):
        out["shift_nll"] = shift_weights @ run["shift_nll"] / shift_weights.shape[1]
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
    """{method: {"nll" | "ece" | "auroc" | "diversity": {"value", "interval", "answer", …}, "seeds": n}}."""
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
        n_shift = len(trio[0][seeds[0]].get("shift_nll", []))
        if any(len(group[seed]["nll"]) != n for group in trio for seed in seeds):
            continue  # seeds measured on different test sets cannot be paired
        if any(len(group[seed].get("shift_nll", [])) != n_shift for group in trio for seed in seeds):
            trio = [{seed: {key: value for key, value in run.items() if key != "shift_nll"} for seed, run in group.items()}
                    for group in trio]  # different shift sets: no shift question
            n_shift = 0
        everything, all_ood = torch.arange(n), torch.arange(n_ood)
        point = _shares(*(_averaged(group, seeds, everything, all_ood) for group in trio))
        size = (len(seeds), n, n_ood, n_shift)
        if size not in draws_for:
            chosen, examples, ood_examples = _resamples(*size[:3])
            draws_for[size] = (chosen, examples, ood_examples,
                               (*_example_counts(examples, ood_examples), _shift_counts(n_shift)))
        chosen, examples, ood_examples, counts = draws_for[size]
        resampled = []
        for name, group in zip((BASELINE, REFERENCE, method), trio):
            key = (name, tuple(seeds), size)
            if key not in resampled_for:
                resampled_for[key] = _bootstrap(group, seeds, chosen, examples, ood_examples, counts)
            resampled.append(resampled_for[key])
        draws = {key: value.tolist() for key, value in _shares(*resampled).items()}  # every entry over the resamples
        per_seed = [_shares(*(_metrics(group[seed], everything, all_ood) for group in trio)) for seed in seeds]
        result[method] = _entry(point, _intervals(point, draws, per_seed), len(seeds))
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
RATIOS = {"nll": ("mine_nll", "gain_nll"), "ece": ("mine_ece", "gain_ece"), "auroc": ("mine_auroc", "gain_auroc"),
          "shift_nll": ("mine_shift_nll", "gain_shift_nll"),
          "diversity": ("method_kl", "reference_kl")}
NONNEGATIVE = {"diversity"}  # KL diversities are ≥ 0, so is their ratio
DRIVERS = (("member_nll", "method_gibbs"), ("reference_member_nll", "reference_gibbs"),
           ("member_nll_difference", "gibbs_difference"), ("geometric_nll", "method_geometric"),
           ("reference_geometric_nll", "reference_geometric"), ("geometric_nll_difference", "geometric_difference"))
