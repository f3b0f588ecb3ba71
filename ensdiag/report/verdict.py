"""The verdict: how much of a Deep Ensemble's gain over the single model another method delivers.

For every other ensemble method in a run that also holds `single` and `deep-ensemble`:
- share of the gain, for NLL and ECE on the in-distribution test set (lower is better) and
  for OOD AUROC with the score 1 − max p̄ (higher is better):
      share = (single − method) / (single − deep ensemble)   [AUROC: (method − single) / (deep − single)]
  1 means the method buys what the Deep Ensemble buys, 0 that it buys nothing, < 0 that it is
  worse than the single model;
- the diversity term: the method's KL diversity (mean_i KL(q̄ ‖ p_i), analysis/gain.py) over
  the Deep Ensemble's, on the in-distribution test set.
Point estimates average every seed the three methods share. The 95 % intervals are paired
bootstrap percentiles over seeds and test examples: each of `RESAMPLES` resamples draws seeds
with replacement (the same seeds for every method) and test examples with replacement (the
same examples for every method and seed), from a fixed generator, so reports are reproducible.
"""

import math

import torch

from ..analysis import metrics as M
from ..io import read_safetensors

BASELINE, REFERENCE = "single", "deep-ensemble"
RESAMPLES = 500
NO_GAIN = 1e-12  # a Deep Ensemble gain this small is none (float rounding of equal numbers)
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
    """Each share, and the Deep Ensemble's own gain it is a share of (`gain_<key>`)."""
    out = {}
    for key, higher_is_better in (("nll", False), ("ece", False), ("auroc", True)):
        if key in method and key in baseline and key in reference:
            gain = reference[key] - baseline[key] if higher_is_better else baseline[key] - reference[key]
            mine = method[key] - baseline[key] if higher_is_better else baseline[key] - method[key]
            out[key] = mine / gain if abs(gain) > NO_GAIN else math.nan
            out[f"gain_{key}"] = gain
    out["diversity"] = method["kl"] / reference["kl"] if reference["kl"] > 0 else math.nan
    return out


def verdict(run_dir, runs: dict) -> dict:
    """{method: {"nll" | "ece" | "auroc" | "diversity": {"value", "interval"}, "seeds": n, "sentence"}}."""
    if BASELINE not in runs or REFERENCE not in runs:
        return {}
    loaded = {method: {seed: data for seed, run in seeds.items() if run is not None
                       and (data := _per_example(run["folder"] / "predictions.safetensors")) is not None}
              for method, seeds in runs.items()}
    result = {}
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
        generator = torch.Generator().manual_seed(0)
        draws = {key: [] for key in point}
        for _ in range(RESAMPLES):
            chosen = [seeds[i] for i in torch.randint(0, len(seeds), (len(seeds),), generator=generator)]
            examples = torch.randint(0, n, (n,), generator=generator)
            ood_examples = torch.randint(0, max(n_ood, 1), (n_ood,), generator=generator)
            shares = _shares(*(_averaged(group, chosen, examples, ood_examples) for group in trio))
            for key, value in shares.items():
                if math.isfinite(value):
                    draws[key].append(value)
        entry = {"seeds": len(seeds)}
        intervals = {key: _percentiles(draws[key]) for key in point}
        for key, value in point.items():
            if key.startswith("gain_"):
                continue
            gain = intervals.get(f"gain_{key}")
            if f"gain_{key}" in point and (abs(point[f"gain_{key}"]) <= NO_GAIN or gain is not None and gain[0] <= 0 <= gain[1]):
                # the Deep Ensemble's own gain is within noise: a share of it would mean nothing
                entry[key] = {"value": None, "interval": None, "reference_gain": point[f"gain_{key}"],
                              "reference_gain_interval": gain}
                continue
            entry[key] = {"value": value if math.isfinite(value) else None, "interval": intervals[key]}
        result[method] = entry
    return result


def _percentiles(values):
    """The 2.5th and 97.5th percentiles of the bootstrap draws (None without finite draws)."""
    values = sorted(values)
    if not values:
        return None
    return [values[int(0.025 * (len(values) - 1))], values[int(math.ceil(0.975 * (len(values) - 1)))]]


def _percent(entry):
    if entry["value"] is None:
        return None
    low, high = entry["interval"] or (None, None)
    bounds = f" [{low * 100:.0f} %, {high * 100:.0f} %]" if low is not None else ""
    return f"{entry['value'] * 100:.0f} %{bounds}"


def _join(items):
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def sentence(label: str, entry: dict) -> str:
    """One sentence per method, generated from the numbers."""
    shares = [(name, _percent(entry[key])) for key, name in (("nll", "NLL"), ("ece", "ECE"), ("auroc", "OOD AUROC"))
              if key in entry]
    given = [f"{share} of the Deep Ensemble's {name} gain" for name, share in shares if share is not None]
    noise = [name for name, share in shares if share is None]
    text = f"{label} delivers {_join(given)}" if given else f"{label}: no share of the Deep Ensemble's gains can be given"
    if noise:
        text += f"{'; ' if given else ' — '}the Deep Ensemble's own {_join(noise)} gain over the single model is within noise here"
    diversity = entry["diversity"]
    if diversity["value"] is not None:
        low, high = diversity["interval"] or (None, None)
        bounds = f" [{low:.2f}, {high:.2f}]" if low is not None else ""
        text += f"; its diversity term is {diversity['value']:.2f}×{bounds} the Deep Ensemble's"
    return text + f" ({entry['seeds']} seed{'s' if entry['seeds'] != 1 else ''}, 95 % paired bootstrap)."
