"""Every example-level statistic once, with example weights: the value, its resamples, the verdict.

    mean(split.nll)                           # a 0-d tensor: the value on the examples as measured
    mean(split.nll, w=counts)                 # counts [b, n]: one value per bootstrap resample, [b]
    ece(split.confidence, split.correct, w)   # the same function, whatever w is

`w` follows scikit-learn's `sample_weight`, batched: None (every example once), [n], or [b, n]
(b weightings at once; in a bootstrap resample w[r, i] is how often example i was drawn, and
the statistic of weights w is exactly the statistic of the examples repeated that often).
Functions that rank or bin by position (adaptive ECE, the risk–coverage areas) take counts
whose rows sum to n, as a resample's do. The analyzers call these with w = None, their
resamplers with blocks of counts (`bootstrap.counts_of`), the verdict with the same draws:
`tests/test_weighted.py` checks each against re-running on the resampled examples and against
scikit-learn or a hand-computed case.
"""

import math
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from ..budget import over_budget
from ..errors import EnsdiagError
from .constructions import Folded
from .metrics import sortable_key

ECE_BINS = 15
DENSE_ENTRIES = 2**24  # up to this many examples × bins, the classwise bins in one product; more, class by class


class OverBudget(EnsdiagError):
    """A statistic whose working set for this weighting would pass the memory budget (budget.py): the
    interval pass gives that number no interval and keeps this as the reason."""


def check_room(rows: int, width: int, what: str, copies: int = 3) -> None:
    """Refuse (`OverBudget`) a block of `rows` weightings whose result is `rows × width` float64 numbers,
    `copies` of them held at once, where that passes the memory budget."""
    reason = over_budget(rows * width * 8 * copies, what)
    if reason is not None:
        raise OverBudget(reason)


def rows(w, n: int) -> tuple[torch.Tensor, bool]:
    """(w as [b, n] float64, whether one row was asked for: w None or [n])."""
    if w is None:
        return torch.ones(1, n, dtype=torch.float64), True
    w = torch.as_tensor(w).double()
    if w.dim() == 1:
        return w[None], True
    if w.dim() != 2 or w.shape[1] != n:
        raise ValueError(f"example weights of shape {tuple(w.shape)} for {n} examples (expected None, [n] or [b, n])")
    return w, False


def _out(values: torch.Tensor, single: bool) -> torch.Tensor:
    return values[0] if single else values


def mean(values: torch.Tensor, w=None) -> torch.Tensor:
    """Σ w·v / Σ w over the examples (NaN where a value is NaN, whatever its weight)."""
    weights, single = rows(w, len(values))
    values = values.double()
    return _out(weights @ values / weights.sum(1), single)


class Groups:
    """Examples in ordered groups (bins, tie groups): weighted sums per group for b weightings.
    Few groups: one product with the one-hot membership; many: one sort and one cumulative sum."""

    ONE_HOT_GROUPS, ONE_HOT_ENTRIES = 256, 2**24
    STACKED_ROWS = 64  # weightings from which `sums_of` reads them once for several quantities

    def __init__(self, group: torch.Tensor, groups: int):
        self.groups = groups
        if groups <= self.ONE_HOT_GROUPS and len(group) * groups <= self.ONE_HOT_ENTRIES:
            self.one_hot = F.one_hot(group, groups).double()
        else:
            self.one_hot = None
            self.order = torch.argsort(group, stable=True)
            self.ends = torch.searchsorted(group[self.order].contiguous(), torch.arange(groups), right=True)

    def sums(self, weights: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
        """[b, n] -> [b, groups]: Σ w·v over each group's examples (v = 1 when None)."""
        if self.one_hot is not None:  # a NaN value stays in its own group (0 · NaN would spread it)
            return weights @ (self.one_hot if values is None else
                              torch.where(self.one_hot > 0, values.double()[:, None], self.one_hot.new_zeros(())))
        return torch.diff(self.cumulative(weights, values), dim=1, prepend=weights.new_zeros(len(weights), 1))

    def sums_of(self, weights: torch.Tensor, *values) -> list[torch.Tensor]:
        """`sums` of each of `values` (None: the weights alone), with one pass over the weights where
        the membership is one-hot and the weightings many (a [b, n] weighting read once, not once per
        quantity; for a few rows of a large split the stacked [n, groups] columns cost more to build)."""
        if self.one_hot is None or len(values) < 2 or len(weights) < self.STACKED_ROWS:
            return [self.sums(weights, v) for v in values]
        columns = [self.one_hot if v is None else torch.where(self.one_hot > 0, v.double()[:, None], self.one_hot.new_zeros(()))
                   for v in values]
        return list((weights @ torch.cat(columns, 1)).split(self.groups, dim=1))

    def cumulative(self, weights: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
        """[b, n] -> [b, groups]: the same sums over the groups up to and including each."""
        if self.one_hot is not None:
            return torch.cumsum(self.sums(weights, values), 1)
        weighted = weights if values is None else weights * values.double()
        return F.pad(torch.cumsum(weighted[:, self.order], 1), (1, 0))[:, self.ends]


def tie_groups(scores: torch.Tensor, descending: bool = False) -> tuple[torch.Tensor, int]:
    """(the tie group of each score [n], the number of groups), groups in ascending score order
    (descending: group 0 holds the largest); exact on the floats' bits (`sortable_key`)."""
    _, inverse = torch.unique(sortable_key(scores), sorted=True, return_inverse=True)
    groups = int(inverse.max()) + 1 if len(inverse) else 0
    return (groups - 1 - inverse if descending else inverse), groups


# ------------------------------------------------------------------ calibration over bins

def equal_width_bins(confidence: torch.Tensor, bins: int = ECE_BINS) -> torch.Tensor:
    """The bin of each confidence: equal-width on [0, 1], the first [0, 1/B], then (lo, hi]; 1.0 in the last."""
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    return torch.searchsorted(edges[1:-1], confidence.double().contiguous(), right=False)


@dataclass
class Bins:
    """Per-bin weighted sums [.., B] of one binning: mass Σw, confidence Σw·conf, target Σw·y; and
    every binned calibration number of them (the ECE, its signed form, MCE, direction, the folded
    form for a bias-aware interval). Shapes [B] for one weighting, [b, B] for b."""

    mass: torch.Tensor
    confidence: torch.Tensor
    target: torch.Tensor
    total: torch.Tensor  # Σw over all examples, [] or [b]

    def gap(self) -> torch.Tensor:
        return self.confidence - self.target

    def ece(self) -> torch.Tensor:
        """Σ_b |B_b|/N·|conf_b − acc_b| = Σ_b |Σ w(conf − y)| / Σ w."""
        return self.gap().abs().sum(-1) / self.total

    def signed(self) -> torch.Tensor:
        """Σ_b |B_b|/N·(conf_b − acc_b): > 0 over-confident (the mean gap)."""
        return self.gap().sum(-1) / self.total

    def mce(self) -> torch.Tensor:
        """max over the filled bins of |conf_b − acc_b| (NaN when no bin is filled)."""
        gaps = torch.where(self.mass > 0, self.gap().abs() / self.mass.clamp(min=1e-300), self.mass.new_tensor(-math.inf))
        top = gaps.amax(-1)
        return torch.where(torch.isinf(top), top.new_tensor(math.nan), top)

    def direction(self) -> torch.Tensor:
        """signed / ECE in [−1, 1]; NaN where the ECE is 0."""
        ece = self.ece()
        return torch.where(ece > 0, self.signed() / ece.clamp(min=1e-300), ece.new_tensor(math.nan))

    def mean_gaps(self) -> torch.Tensor:
        return torch.where(self.mass > 0, self.gap() / self.mass.clamp(min=1e-300), torch.zeros_like(self.mass))

    def folded(self) -> Folded:
        """The ECE as φ(bin means, bin masses), for ray inversion (constructions.py)."""
        return Folded(self.mean_gaps(), self.mass / self.total[..., None], absolute_sum)


def absolute_sum(means: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Σ mass·|mean|: a folded calibration error of per-bin mean gaps."""
    return (mass * means.abs()).sum(-1)


def binned(index: torch.Tensor, confidence: torch.Tensor, target: torch.Tensor, bins: int, w=None) -> Bins:
    """`Bins` of examples placed in bins by `index` (any binning)."""
    weights, single = rows(w, len(index))
    groups = Groups(index, bins)
    found = Bins(*groups.sums_of(weights, None, confidence, target), weights.sum(1))
    return Bins(*(_out(part, single) for part in (found.mass, found.confidence, found.target, found.total)))


def calibration_bins(confidence: torch.Tensor, correct: torch.Tensor, w=None, bins: int = ECE_BINS) -> Bins:
    """The ECE's equal-width bins of top-label confidences and their 0/1 correctness."""
    return binned(equal_width_bins(confidence, bins), confidence, correct, bins, w)


def ece(confidence: torch.Tensor, correct: torch.Tensor, w=None, bins: int = ECE_BINS) -> torch.Tensor:
    """Expected calibration error over `bins` equal-width bins (`calibration_bins`)."""
    return calibration_bins(confidence, correct, w, bins).ece()


def classwise_bins(probs: torch.Tensor, labels: torch.Tensor, w=None, bins: int = ECE_BINS) -> Bins:
    """Every present class's equal-width bins of p̄_c against 1[y = c], side by side [.., C'·B], with
    the total mass counted once per class: `ece()` of them is the mean over the present classes of
    each class's ECE. A class is present where it is some example's label or has p̄_c > 0 somewhere
    (a padded choice, `PAD_LOGIT`, is neither: padding leaves the number as it was). Few examples ×
    bins: one product; many (ImageNet's thousand classes): class by class, in memory [.., B] each."""
    present = ((probs > 0).any(0) | (torch.bincount(labels, minlength=probs.shape[1]) > 0)).nonzero().flatten().tolist()
    n, width = len(labels), len(present) * bins
    weights, single = rows(w, n)
    check_room(len(weights), width, f"the classwise ECE's bins of {len(weights):,} weightings × {len(present):,} classes")
    total = weights.sum(1) * len(present)  # Σ over classes of Σw: the mean over classes of each class's ECE
    if n * width <= DENSE_ENTRIES:
        index = torch.stack([equal_width_bins(probs[:, c], bins) + i * bins for i, c in enumerate(present)], 1)
        member = torch.zeros(n, width, dtype=torch.float64).scatter_(1, index, 1.0)
        conf = torch.zeros(n, width, dtype=torch.float64).scatter_(1, index, probs[:, present].double())
        target = torch.zeros(n, width, dtype=torch.float64).scatter_(1, index, F.one_hot(labels, probs.shape[1])[:, present].double())
        found = [weights @ part for part in (member, conf, target)]
    else:
        parts = [binned(equal_width_bins(probs[:, c], bins), probs[:, c], (labels == c).double(), bins, weights)
                 for c in present]
        found = [torch.cat([getattr(part, key) for part in parts], 1) for key in ("mass", "confidence", "target")]
    return Bins(*(_out(part, single) for part in (*found, total)))


def classwise_ece(probs: torch.Tensor, labels: torch.Tensor, w=None, bins: int = ECE_BINS) -> torch.Tensor:
    """Mean over the present classes c of Σ_b |B_b|/N·|freq(y = c) − mean p̄_c| over bins of p̄_c."""
    return classwise_bins(probs, labels, w, bins).ece()


def _counts_of_a_resample(weights: torch.Tensor, what: str) -> None:
    n = weights.shape[1]
    if not torch.all((weights.sum(1) - n).abs() < 1e-6) or not torch.equal(weights, weights.round()):
        raise ValueError(f"{what} takes counts of a resample (whole numbers summing to n), not general weights")


def equal_mass_bins(confidence: torch.Tensor, correct: torch.Tensor, w=None, bins: int = ECE_BINS,
                    extra_first: bool = False) -> Bins:
    """Adaptive ECE's bins: the examples sorted by confidence (stable), bin b holding positions
    ⌊bN/B⌋..⌊(b+1)N/B⌋−1 (`extra_first`: torch-uncertainty's, ⌊N/B⌋ each and the N mod B extra in
    the first bins). An example drawn w times fills w consecutive positions and may straddle two
    bins (its mass split between them). w: None or counts of a resample."""
    n = len(confidence)
    weights, single = rows(w, n)
    if w is not None:
        _counts_of_a_resample(weights, "the adaptive ECE")
    order = torch.argsort(confidence.double(), stable=True)
    conf, gap_target = confidence.double()[order], correct.double()[order]
    counts = weights[:, order]
    b = len(counts)
    edges = torch.arange(bins + 1, dtype=torch.float64)
    starts = (edges * (n // bins) + edges.clamp(max=n % bins)) if extra_first else torch.floor(edges * n / bins)
    ends = torch.cumsum(counts, 1)  # example i covers positions [ends_i − counts_i, ends_i)

    def upto(values):  # Σ value over positions < each start, [b, B + 1]
        cumulative = F.pad(torch.cumsum(counts * values, 1), (1, 0))
        position = starts.expand(b, -1).contiguous()
        example = torch.searchsorted(ends, position, right=True).clamp(max=n - 1)
        before = torch.gather(F.pad(ends, (1, 0)), 1, example)
        partial = (position - before).clamp(min=0) * values[example]
        found = torch.gather(cumulative, 1, example) + torch.where(position >= ends[:, -1:], 0.0, partial)
        found[:, -1] = cumulative[:, -1]
        return torch.diff(found, dim=1)

    mass = torch.diff(starts).expand(b, -1)
    found = Bins(mass, upto(conf), upto(gap_target), weights.sum(1))
    return Bins(*(_out(part, single) for part in (found.mass, found.confidence, found.target, found.total)))


def adaptive_ece(confidence: torch.Tensor, correct: torch.Tensor, w=None, bins: int = ECE_BINS,
                 extra_first: bool = False) -> torch.Tensor:
    """ECE over equal-mass bins of the confidence (`equal_mass_bins`)."""
    return equal_mass_bins(confidence, correct, w, bins, extra_first).ece()


def debiased_l2(confidence: torch.Tensor, correct: torch.Tensor, w=None, bins: int = ECE_BINS) -> dict:
    """Kumar et al.'s debiased ℓ2 calibration error and its plug-in twin over the authors' equal-mass
    bins (`get_equal_bins`: the sorted confidences cut into numpy array_split's near-equal groups,
    each edge midway between neighbouring groups, the last at 1; an example goes into the first bin
    whose edge is ≥ its confidence). Each resample's edges come from its own order statistics.
    {"debiased_l2", "plugin_l2", "bins"}; w: None or counts of a resample."""
    n = len(confidence)
    weights, single = rows(w, n)
    if w is not None:
        _counts_of_a_resample(weights, "the debiased ECE")
    if confidence.isnan().any():  # undefined predictions: no order to bin them by
        nan = torch.full((len(weights),), math.nan, dtype=torch.float64)
        return {key: _out(nan, single) for key in ("debiased_l2", "plugin_l2", "bins")}
    order = torch.argsort(confidence.double(), stable=True)
    value, right = confidence.double()[order], correct.double()[order]
    counts = weights[:, order]
    b = len(counts)
    parts = min(bins, n)
    sizes = torch.full((parts,), n // parts, dtype=torch.float64)
    sizes[:n % parts] += 1  # array_split's sizes: the first parts one longer
    last = torch.cumsum(sizes, 0)[:-1]  # the position (1-based) ending each part but the last
    ends = torch.cumsum(counts, 1)
    at = lambda position: torch.searchsorted(ends, position.expand(b, -1).contiguous()).clamp(max=n - 1)  # noqa: E731
    edges = torch.cat([(value[at(last)] + value[at(last + 1)]) / 2, value.new_ones(b, 1)], 1)
    which = torch.searchsorted(edges, value.expand(b, -1).contiguous(), side="left")
    count = torch.zeros(b, parts, dtype=torch.float64).scatter_add_(1, which, counts)
    conf = torch.zeros(b, parts, dtype=torch.float64).scatter_add_(1, which, counts * value)
    acc = torch.zeros(b, parts, dtype=torch.float64).scatter_add_(1, which, counts * right)
    used = count > 0
    conf, acc = conf / count.clamp(min=1e-300), acc / count.clamp(min=1e-300)
    gap = torch.where(used, (conf - acc) ** 2, torch.zeros_like(conf))
    noise = torch.where(count > 1, acc * (1 - acc) / (count - 1).clamp(min=1), torch.zeros_like(acc))
    squared = torch.where(used & (count > 1), gap - noise, torch.zeros_like(gap))
    return {"debiased_l2": _out((count / n * squared).sum(1).clamp(min=0).sqrt(), single),
            "plugin_l2": _out((count / n * gap).sum(1).sqrt(), single), "bins": _out(used.sum(1), single)}


# ------------------------------------------------------------------ rankings

OOD_METRICS = ("auroc", "aupr_out", "aupr_in", "fpr95_ood_as_id", "fpr95_id_as_ood")


def ood_metrics(score_id: torch.Tensor, score_ood: torch.Tensor, w_id=None, w_ood=None,
                only=OOD_METRICS) -> dict[str, torch.Tensor]:
    """AUROC, AUPR-Out, AUPR-In and FPR95 (both directions) of uncertainty scores (higher = more
    OOD; OOD is the positive class), exact with ties, from the tie groups of one sort (`only`: those
    wanted, e.g. the verdict's AUROC alone):
    - AUROC = P(score_ood > score_id) + ½ P(equal);
    - AUPR-Out / AUPR-In: average precision (step sum, scikit-learn's definition) with OOD resp.
      ID as positive (ID ranked by the negated score);
    - `fpr95_ood_as_id`: the fraction of OOD accepted as ID (score ≤ τ) at the smallest τ that
      accepts ≥ 95 % of ID, ties at τ accepted (the reference paper's text);
      `fpr95_id_as_ood`: the fraction of ID flagged as OOD (score ≥ τ) at the largest τ that flags
      ≥ 95 % of OOD, ties at τ flagged (scikit-learn's ROC point, torch-uncertainty, the paper's code).
    ID and OOD weightings must have as many rows (a stratified resample draws both)."""
    if tuple(only) == ("auroc",) and bool(score_id.isfinite().all()) and bool(score_ood.isfinite().all()):
        return {"auroc": auroc(score_id, score_ood, w_id, w_ood)}  # the same number from one sort, a fifth of the cost
    n_id = len(score_id)
    weights_id, single = rows(w_id, n_id)
    weights_ood, _ = rows(w_ood, len(score_ood))
    scores = torch.cat([score_id.flatten().double(), score_ood.flatten().double()])
    group, groups = tie_groups(scores)  # ascending
    cum_id = Groups(group[:n_id], groups).cumulative(weights_id)  # ID with score ≤ each group's
    cum_ood = Groups(group[n_id:], groups).cumulative(weights_ood)
    id_in = torch.diff(cum_id, dim=1, prepend=cum_id[:, :1] * 0)
    ood_in = torch.diff(cum_ood, dim=1, prepend=cum_ood[:, :1] * 0)
    total_id, total_ood = cum_id[:, -1:], cum_ood[:, -1:]
    tp_out = cache(lambda: total_ood - (cum_ood - ood_in))  # OOD with score ≥ each group's (made once, if read)
    fp_out = cache(lambda: total_id - (cum_id - id_in))  # ID with score ≥ each group's
    metrics = {
        "auroc": lambda: (ood_in * (cum_id - 0.5 * id_in)).sum(1) / (total_id * total_ood).squeeze(1),
        "aupr_out": lambda: (ood_in / total_ood * tp_out() / (tp_out() + fp_out()).clamp(min=1e-300)).sum(1),
        "aupr_in": lambda: (id_in / total_id * cum_id / (cum_id + cum_ood).clamp(min=1e-300)).sum(1),
        "fpr95_ood_as_id": lambda: (torch.gather(cum_ood, 1, (cum_id * 100 >= 95 * total_id).double().argmax(
            1, keepdim=True)) / total_ood).squeeze(1),  # the first group accepting ≥ 95 % of ID (integer-exact)
        "fpr95_id_as_ood": lambda: (torch.gather(fp_out(), 1, groups - 1 - (tp_out() * 100 >= 95 * total_ood).double()
                                                 .flip(1).argmax(1, keepdim=True)) / total_id).squeeze(1)}
    return {key: _out(metrics[key](), single) for key in only}


def auroc(score_id: torch.Tensor, score_ood: torch.Tensor, w_id=None, w_ood=None) -> torch.Tensor:
    """`ood_metrics`' AUROC alone, P(score_ood > score_id) + ½ P(equal), from one sort of the ID
    scores: each OOD example's weighted count of ID scores below it (and half of those equal) by
    binary search, for many weightings at once at a fraction of the cost (the effective ensemble
    size reads it for every sub-ensemble)."""
    weights_id, single = rows(w_id, len(score_id))
    weights_ood, _ = rows(w_ood, len(score_ood))
    ordered, order = score_id.double().sort()
    b = len(weights_id)
    below = torch.nn.functional.pad(weights_id.gather(1, order.expand(b, -1)).cumsum(1), (1, 0))  # [b, n + 1]: first j
    ood = score_ood.double()
    ends = torch.cat([torch.searchsorted(ordered, ood, right=False), torch.searchsorted(ordered, ood, right=True)])
    counted = below.gather(1, ends.expand(b, -1)).view(b, 2, -1).sum(1)  # ID below + ID at or below, per OOD example
    area = (counted * weights_ood).sum(1) / (2 * weights_id.sum(1) * weights_ood.sum(1))
    return _out(area, single)


def risk_coverage_areas(confidence: torch.Tensor, errors: torch.Tensor, w=None) -> dict[str, torch.Tensor]:
    """{"aurc", "aurc_trapezoid", "augrc", "augrc_trapezoid"} of the risk–coverage curve: examples
    accepted by decreasing confidence, tied ones each counting their group's mean error (the
    expectation over tie orders). The risk at coverage j/N is the error rate of the j accepted;
    AURC its mean over j (AUGRC: of the generalised risk (j/N)·risk_j, Traub et al. 2024); the
    trapezoid twins are torch-uncertainty's (the trapezoid rule over coverages 1/N..1, divided
    by 1 − 1/N). Tie groups in closed form (a group adds its mean error at each of its positions,
    summed with harmonic numbers), so an example drawn w times is w examples. w: None or counts."""
    n = len(confidence)
    weights, single = rows(w, n)
    if w is not None:
        _counts_of_a_resample(weights, "the risk–coverage areas")
    if n == 0 or confidence.isnan().any():  # no examples, or undefined predictions: no ranking
        nan = torch.full((len(weights),), math.nan, dtype=torch.float64)
        return {key: _out(nan, single) for key in ("aurc", "aurc_trapezoid", "augrc", "augrc_trapezoid")}
    group, groups = tie_groups(confidence, descending=True)  # group 0 is accepted first
    tied = Groups(group, groups)
    upto, wrong_upto = tied.cumulative(weights), tied.cumulative(weights, errors.double())
    size = torch.diff(upto, dim=1, prepend=upto[:, :1] * 0)
    wrong = torch.diff(wrong_upto, dim=1, prepend=upto[:, :1] * 0)
    before, wrong_before = upto - size, wrong_upto - wrong  # positions and errors before each group
    rate = torch.where(size > 0, wrong / size.clamp(min=1), torch.zeros_like(wrong))
    harmonic = lambda x: torch.special.digamma(x + 1) + 0.5772156649015329  # noqa: E731
    risks = (wrong_before - before * rate) * (harmonic(before + size) - harmonic(before)) + wrong  # Σ risk_j per group
    total = risks.sum(1)
    first = torch.gather(rate, 1, (size > 0).double().argmax(1, keepdim=True)).squeeze(1)  # the risk at coverage 1/N
    errors_total = wrong.sum(1)
    accepted = (size * wrong_before + wrong * (size + 1) / 2).sum(1)  # Σ_j E_j, the errors accepted by position j
    found = {"aurc": total / n, "augrc": accepted / n / n,
             "aurc_trapezoid": (total - (first + errors_total / n) / 2) / (n - 1) if n > 1 else total,
             "augrc_trapezoid": (accepted / n - (first + errors_total) / n / 2) / (n - 1) if n > 1 else accepted / n}
    return {key: _out(value, single) for key, value in found.items()}


# ------------------------------------------------------------------ ratios and rank correlations

def ratio_of_means(numerator: torch.Tensor, denominator: torch.Tensor, w=None) -> torch.Tensor:
    """Σ w·a / Σ w·b over the same examples (a ratio of two means, each weighting's own): +inf where
    Σ w·b = 0 < Σ w·a, NaN where both are 0 (a resample that drew none of the examples with b > 0)."""
    weights, single = rows(w, len(numerator))
    top, bottom = weights @ numerator.double(), weights @ denominator.double()
    ratio = torch.where(bottom > 0, top / bottom.clamp(min=1e-300),
                        torch.where(top > 0, top.new_tensor(math.inf), top.new_tensor(math.nan)))
    return _out(ratio, single)


def average_ranks(values: torch.Tensor, w=None) -> torch.Tensor:
    """[b, n]: each example's rank (1-based) among the examples repeated as often as weighted, ties
    sharing their mean rank (scipy's `rankdata(method="average")` of the repeated sample): an
    example's group of equal values starts after the weight of the smaller ones."""
    weights, _ = rows(w, len(values))
    group, groups = tie_groups(values)
    upto = Groups(group, groups).cumulative(weights)  # Σ w over the groups up to and including each
    size = torch.diff(upto, dim=1, prepend=upto[:, :1] * 0)
    return (upto - size + (size + 1) / 2)[:, group]


def rank_correlation(x: torch.Tensor, y: torch.Tensor, w=None) -> torch.Tensor:
    """Spearman's ρ of x and y over the examples repeated as weighted: Pearson's correlation of their
    average ranks (`average_ranks`), weighted; NaN where either has one value only (no ranking) or
    holds a NaN (undefined predictions have no rank)."""
    weights, single = rows(w, len(x))
    if torch.isnan(x).any() or torch.isnan(y).any():
        return _out(weights.new_full((len(weights),), math.nan), single)
    rank_x, rank_y = average_ranks(x, weights), average_ranks(y, weights)
    total = weights.sum(1, keepdim=True)
    dx = rank_x - (weights * rank_x).sum(1, keepdim=True) / total
    dy = rank_y - (weights * rank_y).sum(1, keepdim=True) / total
    xx, yy, xy = (weights * dx * dx).sum(1), (weights * dy * dy).sum(1), (weights * dx * dy).sum(1)
    spread = (xx * yy).sqrt()
    rho = torch.where(spread > 0, xy / spread.clamp(min=1e-300), spread.new_tensor(math.nan))
    return _out(rho.clamp(-1, 1), single)


__all__ = ["OOD_METRICS", "OverBudget", "Bins", "ECE_BINS", "Groups", "absolute_sum", "adaptive_ece", "average_ranks", "binned", "calibration_bins", "classwise_bins",
           "classwise_ece", "debiased_l2", "ece", "equal_mass_bins", "equal_width_bins", "mean", "ood_metrics",
           "rank_correlation", "ratio_of_means", "risk_coverage_areas", "rows", "tie_groups"]
