"""The built-in analyzers' example-level columns over a block of bootstrap resamples at once.

The inspection core (`ensdiag/intervals.py`) can resample any analyzer by re-running it on
resampled predictions; for the built-ins that would cost a thousand runs. Here each column is
rewritten as a function of how often each example was drawn (`counts` [b, n] per split), so a
block of resamples is a few matrix products over per-example quantities computed once:

- means over examples (accuracy, NLL, entropy, JSD, disagreement, the ensemble-gain terms,
  over-confidence — a signed sum over bins is the mean gap): counts @ values / n;
- binned calibration errors (ECE, classwise, adaptive): per-bin sums from the counts, returned
  as a `bootstrap.Folded` (bin masses and mean gaps) for the bias-aware ray interval;
- AUROC, AUPR and FPR95: the tie groups of one sort, weighted by the counts;
- SmoothECE: every kernel sum weighted by the counts (smooth_ece.py's row form);
- AURC and AUGRC: tie groups of the confidence, with the sum of risks over a group's positions in closed
  form (harmonic numbers), so duplicated examples are exactly what re-running would see.

With counts of ones each function gives its analyzer's own value; `tests/test_intervals.py`
checks every one against re-running the analyzer on the same resamples. Ties in equal-mass
bins are broken by the examples' order, as the analyzer's stable sort does on unresampled data.
"""

import math

import torch
import torch.nn.functional as F

from ..bootstrap import Folded
from . import metrics as M
from .calibration import ECE_BINS
from .registry import register_resampler


def _mean(values: torch.Tensor):
    values = values.double()
    return lambda counts: counts @ values / values.new_tensor(counts.shape[1])


def _abs_sum(means, mass):
    return (mass * means.abs()).sum(-1)


def _equal_width(confidence: torch.Tensor, bins: int = ECE_BINS) -> torch.Tensor:
    """The bin of each confidence, as `metrics.bin_statistics` bins them."""
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    return torch.searchsorted(edges[1:-1], confidence.double().contiguous(), right=False)


ONE_HOT_GROUPS = 256  # up to this many groups (bins), a dense one-hot product; more (tie groups), a cumulative sum
ONE_HOT_ENTRIES = 2**24  # and only while the one-hot [n, groups] stays this small


class _Groups:
    """Examples in ordered groups (bins, tie groups): weighted sums per group for a block of
    resamples. Few groups: one matrix product with the one-hot membership; many: one permutation
    and one cumulative sum over the examples sorted by group (no scatter over the block)."""

    def __init__(self, group: torch.Tensor, groups: int):
        self.groups = groups
        if groups <= ONE_HOT_GROUPS and len(group) * groups <= ONE_HOT_ENTRIES:
            self.one_hot = F.one_hot(group, groups).double()
        else:
            self.one_hot = None
            self.order = torch.argsort(group, stable=True)
            self.ends = torch.searchsorted(group[self.order].contiguous(), torch.arange(groups), right=True)

    def sums(self, counts: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
        """[b, n] -> [b, groups]: Σ count × value over each group's examples (value 1 when None)."""
        if self.one_hot is not None:
            return counts @ (self.one_hot if values is None else self.one_hot * values.double()[:, None])
        return torch.diff(self.cumulative(counts, values), dim=1, prepend=counts.new_zeros(len(counts), 1))

    def cumulative(self, counts: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
        """[b, n] -> [b, groups]: the same sums over the groups up to and including each."""
        if self.one_hot is not None:
            return torch.cumsum(self.sums(counts, values), 1)
        weights = counts if values is None else counts * values.double()
        return F.pad(torch.cumsum(weights[:, self.order], 1), (1, 0))[:, self.ends]


def _binned(index: torch.Tensor, gap: torch.Tensor, width: int):
    """counts -> Folded of per-bin mean gaps and bin masses (mass × |mean| summed = Σ|gap sums|/n)."""
    gap, groups = gap.double(), _Groups(index, width)

    def of(counts):
        mass, total = groups.sums(counts), groups.sums(counts, gap)
        means = torch.where(mass > 0, total / mass.clamp(min=1e-300), torch.zeros_like(total))
        return Folded(means, mass / counts.shape[1], _abs_sum)
    return of


def _max_gap(index: torch.Tensor, gap: torch.Tensor, width: int):
    """counts -> [b] MCE: the largest |mean gap| over the bins the resample fills. A percentile
    interval, not the ray: the maximum rests on the sparsest bins, whose resampled gaps are the
    spread a reader should see (inverted along the ray it collapses to the noise floor)."""
    binned = _binned(index, gap, width)

    def of(counts):
        found = binned(counts)
        return torch.where(found.mass > 0, found.means.abs(), found.means.new_tensor(-math.inf)).amax(-1)
    return of


def _direction(index: torch.Tensor, gap: torch.Tensor, width: int):
    """counts -> over-confidence / ECE from the same bin sums (undefined where the ECE is 0)."""
    gap, groups = gap.double(), _Groups(index, width)

    def of(counts):
        totals = groups.sums(counts, gap)
        ece = totals.abs().sum(1)
        return torch.where(ece > 0, totals.sum(1) / ece.clamp(min=1e-300), ece.new_tensor(math.nan))
    return of


def _classwise(probs, labels, bins=ECE_BINS):
    """Classwise ECE: class c's examples binned by p̄_c, every class's bins side by side, the mean
    over classes (one product with all classes' memberships where it fits, else class by class)."""
    classes, n = probs.shape[1], len(labels)
    if n * classes * bins * 2 <= ONE_HOT_ENTRIES:
        index = torch.stack([_equal_width(probs[:, c], bins) + c * bins for c in range(classes)], 1)  # [n, C]
        member = torch.zeros(n, classes * bins, dtype=torch.float64).scatter_(1, index, 1.0)
        gap = torch.zeros(n, classes * bins, dtype=torch.float64).scatter_(1, index, probs.double() - F.one_hot(labels, classes).double())
        both = torch.cat([member, gap], 1)

        def of(counts):
            mass, total = (counts @ both).split(classes * bins, 1)
            means = torch.where(mass > 0, total / mass.clamp(min=1e-300), torch.zeros_like(total))
            return Folded(means, mass / (classes * n), _abs_sum)
        return of
    per_class = [_binned(_equal_width(probs[:, c], bins), probs[:, c] - (labels == c).double(), bins)
                 for c in range(classes)]

    def one_by_one(counts):
        found = [binned(counts) for binned in per_class]
        return Folded(torch.cat([f.means for f in found], 1), torch.cat([f.mass for f in found], 1) / classes, _abs_sum)
    return one_by_one


def _equal_mass(confidence, correct, bins=ECE_BINS, extra_first=False):
    """Adaptive ECE: the resample's sorted examples in bins of its positions; an example drawn w
    times occupies w consecutive positions and may straddle two bins."""
    order = torch.argsort(confidence.double(), stable=True)
    gap = (confidence.double() - correct.double())[order]

    def of(counts):
        counts = counts[:, order]
        b, n = counts.shape
        edges = torch.arange(bins + 1, dtype=torch.float64)
        starts = (edges * (n // bins) + edges.clamp(max=n % bins)) if extra_first else torch.floor(edges * n / bins)
        ends = torch.cumsum(counts, 1)  # example i covers positions [ends_i − counts_i, ends_i)
        cumulative = F.pad(torch.cumsum(counts * gap, 1), (1, 0))  # gap sum of the examples before i

        def upto(position):  # Σ gap over positions < position, [b, P]
            example = torch.searchsorted(ends, position.contiguous(), right=True).clamp(max=n - 1)
            before = torch.gather(F.pad(ends, (1, 0)), 1, example)
            partial = (position - before).clamp(min=0) * gap[example]
            return torch.gather(cumulative, 1, example) + torch.where(position >= ends[:, -1:], 0.0, partial)

        sums = upto(starts.expand(b, -1).contiguous())
        sums[:, -1] = cumulative[:, -1]
        mass = torch.diff(starts).expand(b, -1)
        totals = torch.diff(sums, dim=1)
        means = torch.where(mass > 0, totals / mass.clamp(min=1), torch.zeros_like(totals))
        return Folded(means, mass / n, _abs_sum)
    return of


@register_resampler("calibration")
def calibration(predictions, weights, result, wanted):
    parts = {}
    for name, split in predictions.items():
        if name not in result.get("splits", {}) or split["labels"] is None or len(split["labels"]) == 0:
            continue
        if not any(path[:2] == ("splits", name) for path in wanted):
            continue
        logits, labels = split["logits"], split["labels"]
        log_p = M.mean_log_probs(logits)
        confidence, predicted = log_p.exp().max(1)
        correct = (predicted == labels).double().masked_fill(log_p.isnan().any(-1), math.nan)
        parts[name] = {("accuracy",): lambda r=correct: _mean(r),  # built only where wanted (one-hots cost memory)
                       ("nll",): lambda log_p=log_p, labels=labels: _mean(-log_p.gather(1, labels[:, None]).squeeze(1)),
                       ("brier",): lambda log_p=log_p, labels=labels: _mean(
                           (log_p.exp() - F.one_hot(labels, log_p.shape[1]).double()).pow(2).sum(1)),
                       ("ece",): lambda c=confidence, r=correct: _binned(_equal_width(c), c - r, ECE_BINS),
                       ("overconfidence",): lambda c=confidence, r=correct: _mean(c - r),
                       ("mce",): lambda c=confidence, r=correct: _max_gap(_equal_width(c), c - r, ECE_BINS),
                       ("ece_direction",): lambda c=confidence, r=correct: _direction(_equal_width(c), c - r, ECE_BINS),
                       ("ece_adaptive",): lambda c=confidence, r=correct: _equal_mass(c, r),
                       ("ece_adaptive_tu",): lambda c=confidence, r=correct: _equal_mass(c, r, extra_first=True),
                       ("ece_classwise",): lambda log_p=log_p, labels=labels: _classwise(log_p.exp(), labels),
                       ("smooth_ece",): lambda c=confidence, r=correct: _smooth(c, r, "reflected"),
                       ("smooth_ece_tu",): lambda c=confidence, r=correct: _smooth(c, r, "logit")}
    return _per_split(parts, wanted, lazy=True)


def _smooth(confidence, correct, kernel: str):
    """SmoothECE of each resample: the examples weighted by their counts in every kernel sum (its
    bandwidth search run for all resamples at once, smooth_ece.py)."""
    from .smooth_ece import smooth_ece_resampled
    f, y = confidence.double().numpy(), correct.double().nan_to_num(0.0).numpy()
    return lambda counts: torch.from_numpy(smooth_ece_resampled(f, y, counts.double().numpy(), kernel))


def _per_split(parts, wanted, lazy=False):
    """{split: {key: f(counts)}} -> f({split: counts}) -> {("splits", split, *key, "value"): values}, the
    wanted ones; `lazy`: the values are factories of such functions, each called once, when wanted."""
    if lazy:
        parts = {split: {key: make() for key, make in functions.items() if ("splits", split, *key, "value") in wanted}
                 for split, functions in parts.items()}

    def resample(counts):
        return {path: fn(counts[split]) for split, functions in parts.items() if split in counts
                for key, fn in functions.items() if (path := ("splits", split, *key, "value")) in wanted}
    return resample


@register_resampler("uncertainty")
def uncertainty(predictions, weights, result, wanted):
    parts = {}
    for name, split in predictions.items():
        logits = split["logits"]
        if name not in result.get("splits", {}) or logits.shape[1] == 0:
            continue
        parts[name] = {("entropy",): _mean(M.predictive_entropy(logits)),
                       **({} if logits.shape[0] == 1 else {("jsd",): _mean(M.jsd(logits))})}
    return _per_split(parts, wanted)


@register_resampler("disagreement")
def disagreement(predictions, weights, result, wanted):
    parts = {}
    for name, split in predictions.items():
        logits = split["logits"]
        if name not in result.get("splits", {}) or logits.shape[1] == 0:
            continue
        k, n = logits.shape[:2]
        predicted = logits.argmax(-1)  # [k, n]
        agree = sum((predicted == predicted[i]).double().sum(0) for i in range(k))  # ordered pairs that agree, i = j too
        pairs = (k * k - agree) / (k * (k - 1))  # ordered pairs that disagree, per example
        pairs = pairs.masked_fill(M.undefined_predictions(logits).any(0), math.nan)
        parts[name] = {("mean",): _mean(pairs)}
    return _per_split(parts, wanted)


@register_resampler("ensemble-gain")
def ensemble_gain(predictions, weights, result, wanted):
    parts = {}
    for name, split in predictions.items():
        logits, labels = split["logits"], split["labels"]
        if name not in result.get("splits", {}):
            continue
        k = logits.shape[0]
        log_p = F.log_softmax(logits.double(), -1)
        member_log_y = log_p.gather(2, labels.expand(k, -1)[..., None]).squeeze(-1)
        log_mean = M.mean_log_probs(logits)
        log_z = torch.logsumexp(log_p.mean(0), -1)
        probs = log_p.exp()
        parts[name] = {("nll_gap",): _mean(-member_log_y.mean(0) + log_mean.gather(1, labels[:, None]).squeeze(1)),
                       ("kl_diversity",): _mean(-log_z),
                       ("brier_spread",): _mean((probs - log_mean.exp()).pow(2).sum(-1).mean(0)),
                       ("error_gibbs",): _mean((log_p.argmax(-1) != labels).double().mean(0)),
                       ("error_ensemble",): _mean((log_mean.argmax(-1) != labels).double())}
    return _per_split(parts, wanted)


def _aurc(confidence, errors):
    """counts -> (AURC, trapezoid AURC, AUGRC, trapezoid AUGRC) of the resampled risk–coverage
    curve, tie groups in closed form. The generalised risk at coverage j/n is E_j/n, E_j the
    errors accepted by then: a group adds size·E_before + wrong·(size + 1)/2 to Σ_j E_j."""
    if confidence.isnan().any():
        nan = lambda counts: torch.full((len(counts),), math.nan, dtype=torch.float64)  # noqa: E731
        return lambda counts: (nan(counts),) * 4
    keys = M.sortable_key(confidence)
    _, inverse = torch.unique(keys, sorted=True, return_inverse=True)
    groups = int(inverse.max()) + 1
    tied = _Groups(groups - 1 - inverse, groups)  # descending confidence: group 0 is accepted first
    errors = errors.double()

    def harmonic(x):
        return torch.special.digamma(x + 1) + 0.5772156649015329

    def of(counts):
        b, n = counts.shape
        upto, wrong_upto = tied.cumulative(counts), tied.cumulative(counts, errors)
        size, wrong = torch.diff(upto, dim=1, prepend=upto[:, :1] * 0), torch.diff(wrong_upto, dim=1, prepend=upto[:, :1] * 0)
        before, wrong_before = upto - size, wrong_upto - wrong  # positions (errors) before each group
        rate = torch.where(size > 0, wrong / size.clamp(min=1), torch.zeros_like(wrong))
        sums = (wrong_before - before * rate) * (harmonic(before + size) - harmonic(before)) + wrong  # Σ risk per group
        total = sums.sum(1)
        first = torch.gather(rate, 1, (size > 0).double().argmax(1, keepdim=True)).squeeze(1)  # risk at coverage 1/n
        last = wrong.sum(1) / n
        trapezoid = (total - (first + last) / 2) / (n - 1) if n > 1 else total
        accepted = (size * wrong_before + wrong * (size + 1) / 2).sum(1) / n  # Σ_j of the generalised risk E_j/n
        general = (accepted - (first + wrong.sum(1)) / n / 2) / (n - 1) if n > 1 else accepted
        return total / n, trapezoid, accepted / n, general
    return of


@register_resampler("selective")
def selective(predictions, weights, result, wanted):
    curves = {}
    for name, split in predictions.items():
        logits, labels = split["logits"], split["labels"]
        if name not in result.get("splits", {}):
            continue
        confidence, predicted = M.mean_probs(logits).max(dim=1)
        curves[name] = _aurc(confidence, predicted != labels)

    def resample(counts):
        found = {}
        for split, curve in curves.items():
            if split in counts:
                values = curve(counts[split])
                for key, value in zip(("aurc", "aurc_trapezoid", "augrc", "augrc_trapezoid"), values):
                    found[("splits", split, key, "value")] = value
        return found
    return resample


def _ood_scores(score_id, score_ood):
    """(counts id, counts ood) -> {metric: [b]}: `metrics.ood_metrics` with each example weighted by its count."""
    scores = torch.cat([score_id.double(), score_ood.double()])
    keys = M.sortable_key(scores)
    _, inverse = torch.unique(keys, sorted=True, return_inverse=True)  # ascending tie groups
    groups = int(inverse.max()) + 1
    n_id = len(score_id)
    ids, oods = _Groups(inverse[:n_id], groups), _Groups(inverse[n_id:], groups)

    def of(counts_id, counts_ood):
        cum_id, cum_ood = ids.cumulative(counts_id), oods.cumulative(counts_ood)
        id_in = torch.diff(cum_id, dim=1, prepend=cum_id[:, :1] * 0)
        ood_in = torch.diff(cum_ood, dim=1, prepend=cum_ood[:, :1] * 0)
        total_id, total_ood = cum_id[:, -1:], cum_ood[:, -1:]
        auroc = (ood_in * (cum_id - id_in + 0.5 * id_in)).sum(1) / (total_id * total_ood).squeeze(1)
        tp_out, fp_out = total_ood - (cum_ood - ood_in), total_id - (cum_id - id_in)
        aupr_out = (ood_in / total_ood * tp_out / (tp_out + fp_out).clamp(min=1e-300)).sum(1)
        first = (cum_id * 100 >= 95 * total_id).double().argmax(1, keepdim=True)
        flagged = (tp_out * 100 >= 95 * total_ood).double()
        last = groups - 1 - flagged.flip(1).argmax(1, keepdim=True)
        return {"auroc": auroc, "aupr_out": aupr_out,
                "fpr95_ood_as_id": (torch.gather(cum_ood, 1, first) / total_ood).squeeze(1),
                "fpr95_id_as_ood": (torch.gather(fp_out, 1, last) / total_id).squeeze(1)}
    return of


@register_resampler("ood")
def ood(predictions, weights, result, wanted):
    from .ood import SCORES
    scores = {}
    for name in result.get("scores", {}):
        if not any(path[:2] == ("scores", name) for path in wanted):
            continue
        score = SCORES[name][0]
        score_id, score_ood = score(predictions["id"]["logits"]), score(predictions["ood"]["logits"])
        if not (score_id.isnan().any() or score_ood.isnan().any()):
            scores[name] = _ood_scores(score_id, score_ood)

    def resample(counts):
        if "id" not in counts or "ood" not in counts:
            return {}
        return {("scores", name, key, "value"): values for name, of in scores.items()
                for key, values in of(counts["id"], counts["ood"]).items()}
    return resample


@register_resampler("temperature")
def temperature(predictions, weights, result, wanted):
    """Given the temperatures fitted on the validation split (which is not resampled): the ECE and
    NLL before and after scaling, over resampled test examples."""
    pooled_t = result["temperature_pooled"]["value"]
    member_t = result["temperature_members"]["value"]
    parts = {}
    for name in result["splits"]:
        z, labels = predictions[name]["logits"].double(), predictions[name]["labels"]
        scaled = {"before": z, "pool_then_calibrate": (M.mean_log_probs(z) / pooled_t)[None],
                  "calibrate_then_pool": z / torch.tensor(member_t, dtype=torch.float64)[:, None, None]}
        functions = {}
        for kind, logits in scaled.items():
            log_p = M.mean_log_probs(logits)
            confidence, predicted = log_p.exp().max(1)
            functions[(kind, "ece")] = _binned(_equal_width(confidence), confidence - (predicted == labels).double(), ECE_BINS)
            functions[(kind, "nll")] = _mean(-log_p.gather(1, labels[:, None]).squeeze(1))
        parts[name] = functions
    return _per_split(parts, wanted)
