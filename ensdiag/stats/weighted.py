"""Every example-level statistic once, with example weights: the value, its resamples, the verdict.

    mean(split.nll)                           # a 0-d tensor: the value on the examples as measured
    mean(split.nll, w=counts)                 # counts [b, n]: one value per bootstrap resample, [b]
    ece(split.confidence, split.correct, w)   # the same function, whatever w is

`w` follows scikit-learn's `sample_weight`, batched: None (every example once), [n], or [b, n]
(b weightings at once; in a bootstrap resample w[r, i] is how often example i was drawn, and
the statistic of weights w is exactly the statistic of the examples repeated that often). Here
the means, the binned calibration errors and the OOD rankings; the statistics of the examples'
order (adaptive and debiased ECE, the risk–coverage areas, rank correlation) are ordered.py's.
The analyzers call these with w = None, their resamplers with blocks of counts
(`bootstrap.counts_of`), the verdict with the same draws: `tests/test_intervals.py` checks every
resampler against re-running its analyzer on the resampled examples, `tests/test_metrics.py`
each number against scikit-learn or a hand-computed case.
"""

import math
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from ..budget import over_budget
from ..errors import EnsdiagError
from .bootstrap import CACHED_ENTRIES
from .constructions import Folded
from .metrics import sortable_key

ECE_BINS = 15
DENSE_ENTRIES = 2**24  # up to this many examples × bins, the classwise bins in one product; more, class by class


class OverBudget(EnsdiagError):
    """A statistic whose working set for this weighting would pass the memory budget (budget.py): the
    interval pass gives that number no interval and keeps this as the reason."""


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


def nan_for(w, n: int) -> torch.Tensor:
    """NaN for each weighting in w (a 0-d tensor for None or [n]): a number not defined on these examples."""
    weights, single = rows(w, n)
    return _out(torch.full((len(weights),), math.nan, dtype=torch.float64), single)


def weighted_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """weights [b, n] @ values [n, …]. The counts of a clustered split (bootstrap.Draws: each input's count
    repeated in every block of `weights.inputs` examples) multiply the sum over the blocks of each input's
    values instead: the same sums (to float rounding) for a block's share of the work."""
    inputs = getattr(weights, "inputs", None)
    if inputs is None or inputs == weights.shape[1]:
        return weights @ values
    return weights[:, :inputs] @ values.reshape(-1, inputs, *values.shape[1:]).sum(0)


def total_weight(weights: torch.Tensor) -> torch.Tensor:
    """Σ w per weighting [b]; of a clustered split's counts, one block's sum times the blocks (whole counts:
    the same number, exactly)."""
    inputs = getattr(weights, "inputs", None)
    return weights.sum(1) if inputs is None else weights[:, :inputs].sum(1) * (weights.shape[1] // inputs)


def mean(values: torch.Tensor, w=None) -> torch.Tensor:
    """Σ w·v / Σ w over the examples (NaN where a value is NaN, whatever its weight)."""
    weights, single = rows(w, len(values))
    values = values.double()
    return _out(weighted_sum(weights, values) / total_weight(weights), single)


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
            return weighted_sum(weights, self.one_hot if values is None else
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
        return list(weighted_sum(weights, torch.cat(columns, 1)).split(self.groups, dim=1))

    def cumulative(self, weights: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
        """[b, n] -> [b, groups]: the same sums over the groups up to and including each."""
        if self.one_hot is not None:
            return torch.cumsum(self.sums(weights, values), 1)
        weighted = weights if values is None else weights * values.double()
        # (index_select: the same copies as indexing [:, order], twice as fast)
        return F.pad(torch.cumsum(weighted.index_select(1, self.order), 1), (1, 0)).index_select(1, self.ends)


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

    def folded(self) -> Folded:
        """The ECE as φ(bin means, bin masses), for ray inversion (constructions.py)."""
        means = torch.where(self.mass > 0, self.gap() / self.mass.clamp(min=1e-300), torch.zeros_like(self.mass))
        return Folded(means, self.mass / self.total[..., None], lambda means, mass: (mass * means.abs()).sum(-1))


def binned(index: torch.Tensor, confidence: torch.Tensor, target: torch.Tensor, bins: int, w=None) -> Bins:
    """`Bins` of examples placed in bins by `index` (any binning)."""
    weights, single = rows(w, len(index))
    found = (*Groups(index, bins).sums_of(weights, None, confidence, target), total_weight(weights))
    return Bins(*(_out(part, single) for part in found))


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
    reason = over_budget(3 * 8 * len(weights) * width,  # three [b, C'·B] float64 results held at once
                         f"the classwise ECE's bins of {len(weights):,} weightings × {len(present):,} classes")
    if reason is not None:
        raise OverBudget(reason)
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
    by_id, by_ood = Groups(group[:n_id], groups), Groups(group[n_id:], groups)
    step = max(1, CACHED_ENTRIES // max(groups, 1))  # (every row's numbers alike, whatever the chunks)
    chunks = [_ranked(by_id.cumulative(weights_id[start:start + step]), by_ood.cumulative(weights_ood[start:start + step]),
                      groups, only) for start in range(0, max(len(weights_id), 1), step)]
    return {key: _out(torch.cat([chunk[key] for chunk in chunks]), single) for key in only}


def _ranked(cum_id: torch.Tensor, cum_ood: torch.Tensor, groups: int, only) -> dict[str, torch.Tensor]:
    """`ood_metrics` of the weighted counts of ID and OOD examples with score ≤ each tie group's [b, groups]."""
    id_in = torch.diff(cum_id, dim=1, prepend=cum_id[:, :1] * 0)
    ood_in = torch.diff(cum_ood, dim=1, prepend=cum_ood[:, :1] * 0)
    total_id, total_ood = cum_id[:, -1:], cum_ood[:, -1:]
    tp_out = cache(lambda: total_ood - (cum_ood - ood_in))  # OOD with score ≥ each group's (made once, if read)
    fp_out = cache(lambda: total_id - (cum_id - id_in))  # ID with score ≥ each group's
    metrics = {
        "auroc": lambda: (ood_in * (cum_id - 0.5 * id_in)).sum(1) / (total_id * total_ood).squeeze(1),
        # average precision, in place: every temporary is one more [resamples, groups] array
        "aupr_out": lambda: (ood_in / total_ood).mul_(tp_out()).div_((tp_out() + fp_out()).clamp_(min=1e-300)).sum(1),
        "aupr_in": lambda: (id_in / total_id).mul_(cum_id).div_((cum_id + cum_ood).clamp_(min=1e-300)).sum(1),
        "fpr95_ood_as_id": lambda: (torch.gather(cum_ood, 1, (cum_id * 100 >= 95 * total_id).double().argmax(
            1, keepdim=True)) / total_ood).squeeze(1),  # the first group accepting ≥ 95 % of ID (integer-exact)
        "fpr95_id_as_ood": lambda: (torch.gather(fp_out(), 1, groups - 1 - (tp_out() * 100 >= 95 * total_ood).double()
                                                 .flip(1).argmax(1, keepdim=True)) / total_id).squeeze(1)}
    return {key: metrics[key]() for key in only}


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


# ------------------------------------------------------------------ ratios

def ratio_of_means(numerator: torch.Tensor, denominator: torch.Tensor, w=None) -> torch.Tensor:
    """Σ w·a / Σ w·b over the same examples (a ratio of two means, each weighting's own): +inf where
    Σ w·b = 0 < Σ w·a, NaN where both are 0 (a resample that drew none of the examples with b > 0)."""
    weights, single = rows(w, len(numerator))
    top, bottom = weighted_sum(weights, numerator.double()), weighted_sum(weights, denominator.double())
    ratio = torch.where(bottom > 0, top / bottom.clamp(min=1e-300),
                        torch.where(top > 0, top.new_tensor(math.inf), top.new_tensor(math.nan)))
    return _out(ratio, single)
