"""Member pairs' and the debiased ECE's example-level columns over a block of bootstrap resamples
(the rest of the built-ins are in resampled.py, whose docstring says how a resampler works).

- KL, JSD, double-fault and ambiguity: the mean over pairs of a mean over examples is the mean
  over examples of a per-example mean over pairs, so counts @ that per-example vector / n;
- error correlation and Yule's Q: each pair's 2×2 table of right/wrong from the counts' sums
  Σ w e_i and Σ w e_i e_j, then the mean over the pairs where the statistic is defined (up to
  `TABLE_MEMBERS` members; above, re-running the analyzer resamples them);
- debiased ℓ2 ECE: each resample's equal-mass edges from its own order statistics (an example
  drawn w times fills w consecutive positions), then per-bin sums of the counts.
"""

import math

import torch
import torch.nn.functional as F

from . import metrics as M
from .debiased_ece import BINS
from .metrics import entropy
from .pairwise import errors
from .registry import register_resampler
from .resampled import _mean  # one weighted mean for every resampler

TABLE_MEMBERS = 16  # the pair tables cost b·n·k² per block of b resamples


def _per_example(logits) -> dict:
    """{key: [n]} the per-example means over ordered pairs i ≠ j (ambiguity: over members)."""
    k = logits.shape[0]
    log_p = F.log_softmax(logits.double(), dim=-1)
    p = log_p.exp()
    own = torch.special.xlogy(p, p).sum(-1)  # [k, n]
    kl = (k * own.sum(0) - (p.sum(0) * log_p.sum(0)).sum(-1)) / (k * (k - 1))
    own_entropy = entropy(p)  # [k, n]
    mixed = sum(entropy((p[i] + p) / 2).sum(0) - entropy(p[i]) for i in range(k))  # Σ_{i≠j} H((p_i + p_j)/2)
    jsd = (mixed - (k - 1) * own_entropy.sum(0)) / (k * (k - 1))
    ambiguity = (p - p.mean(0)).pow(2).sum(-1).mean(0)
    return {"kl": kl.clamp(min=0), "jsd": jsd, "ambiguity": ambiguity}


def _tables(e: torch.Tensor):
    """counts -> {"error_correlation", "yule_q"}: [b] means over the pairs where each is defined."""
    k = e.shape[0]
    upper = torch.triu_indices(k, k, 1)

    def mean_defined(values):
        defined = ~values.isnan()
        total = torch.where(defined, values, torch.zeros_like(values)).sum(1)
        return torch.where(defined.any(1), total / defined.sum(1).clamp(min=1), values.new_tensor(math.nan))

    def of(counts):
        n = counts.shape[1]
        wrong = counts @ e.T  # [b, k]: Σ w e_i
        both = torch.stack([(counts * e[i]) @ e.T for i in range(k)], 1)  # [b, k, k]: Σ w e_i e_j
        i, j = upper
        wi, wj, ww = wrong[:, i], wrong[:, j], both[:, i, j]
        covariance = ww / n - wi * wj / n**2
        variance = wrong / n - (wrong / n) ** 2
        correlation = (covariance / (variance[:, i] * variance[:, j]).sqrt()).clamp(-1, 1)
        both_right, only_i, only_j = n - wi - wj + ww, wj - ww, wi - ww
        agree, differ = both_right * ww, only_i * only_j
        return {"error_correlation": mean_defined(correlation), "yule_q": mean_defined((agree - differ) / (agree + differ))}
    return of


@register_resampler("member-pairs")
def member_pairs(predictions, weights, result, wanted):
    split = predictions.get("id")
    if split is None or "id" not in result.get("splits", {}):
        return lambda counts: {}
    logits, labels = split["logits"], split["labels"]
    undefined = bool(M.undefined_predictions(logits).any())
    nan = lambda counts: torch.full((len(counts),), math.nan, dtype=torch.float64)  # noqa: E731
    means = {} if undefined else {key: _mean(values) for key, values in _per_example(logits).items()}
    tables = None
    if labels is not None and not undefined:
        e = errors(logits, labels)
        k = e.shape[0]
        means["double_fault"] = _mean((e.sum(0) ** 2 - e.sum(0)) / (k * (k - 1)))  # Σ_{i≠j} e_i e_j of 0/1 errors
        tables = _tables(e) if k <= TABLE_MEMBERS else None

    def path(key):
        return ("splits", "id", key, *(() if key == "ambiguity" else ("mean",)), "value")

    def resample(counts):
        if "id" not in counts:
            return {}
        c = counts["id"]
        if undefined:  # as the analyzer: no mean over "the defined pairs" once a prediction is undefined
            return {path(key): nan(c) for key in ("kl", "jsd", "ambiguity", "double_fault", "error_correlation", "yule_q")
                    if path(key) in wanted}
        found = {path(key): fn(c) for key, fn in means.items() if path(key) in wanted}
        if tables is not None and {path("error_correlation"), path("yule_q")} & set(wanted):
            found.update({path(key): values for key, values in tables(c).items() if path(key) in wanted})
        return found
    return resample


def _debiased(confidence: torch.Tensor, correct: torch.Tensor, bins: int = BINS):
    """counts -> [b] debiased ℓ2 ECE of each resample (debiased_ece.debiased_l2 of the resampled examples)."""
    order = torch.argsort(confidence.double(), stable=True)
    value, right = confidence.double()[order], correct.double()[order]

    def of(counts):
        c = counts[:, order]
        b, n = c.shape
        parts = min(bins, n)
        sizes = torch.full((parts,), n // parts, dtype=torch.float64)
        sizes[:n % parts] += 1  # tensor_split's sizes: the first parts one longer
        last = torch.cumsum(sizes, 0)[:-1]  # the position (1-based) ending each part but the last
        ends = torch.cumsum(c, 1)
        at = lambda position: torch.searchsorted(ends, position.expand(b, -1).contiguous()).clamp(max=n - 1)  # noqa: E731
        edges = torch.cat([(value[at(last)] + value[at(last + 1)]) / 2, value.new_ones(b, 1)], 1)
        which = torch.searchsorted(edges, value.expand(b, -1).contiguous(), side="left")
        count = torch.zeros(b, parts, dtype=torch.float64).scatter_add_(1, which, c)
        conf = torch.zeros(b, parts, dtype=torch.float64).scatter_add_(1, which, c * value)
        acc = torch.zeros(b, parts, dtype=torch.float64).scatter_add_(1, which, c * right)
        used = count > 0
        conf, acc = conf / count.clamp(min=1e-300), acc / count.clamp(min=1e-300)
        gap = (conf - acc) ** 2
        noise = torch.where(count > 1, acc * (1 - acc) / (count - 1).clamp(min=1), torch.zeros_like(acc))
        squared = torch.where(used & (count > 1), gap - noise, torch.zeros_like(gap))
        return (count / n * squared).sum(1).clamp(min=0).sqrt()
    return of


@register_resampler("debiased-ece")
def debiased_ece(predictions, weights, result, wanted):
    functions = {}
    for name, split in predictions.items():
        path = ("splits", name, "debiased_l2", "value")
        if path not in wanted or split["labels"] is None:
            continue
        confidence, predicted = M.mean_probs(split["logits"]).max(dim=1)
        if confidence.isnan().any():
            functions[name] = lambda counts: torch.full((len(counts),), math.nan, dtype=torch.float64)
        else:
            functions[name] = _debiased(confidence, (predicted == split["labels"]).double())
    return lambda counts: {("splits", name, "debiased_l2", "value"): fn(counts[name])
                           for name, fn in functions.items() if name in counts}
