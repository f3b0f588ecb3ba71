"""Statistics of the examples in their order, with the counts of a resample: adaptive ECE's
equal-mass bins, the debiased ℓ2 calibration error, the risk–coverage areas, rank correlation.

    adaptive_ece(split.confidence, split.correct)           # the examples as measured
    adaptive_ece(split.confidence, split.correct, counts)   # counts [b, n]: one value per resample

They sort or rank the examples and place them by position, so a weighting is a resample's counts
(whole numbers summing to n: an example drawn w times fills w consecutive positions), except rank
correlation, which takes any weights (weighted.py's convention, as every other statistic).
"""

import math

import torch
import torch.nn.functional as F

from .weighted import ECE_BINS, Bins, Groups, _out, nan_for, rows, tie_groups


def _resample_rows(w, n: int, what: str) -> tuple[torch.Tensor, bool]:
    """`rows(w, n)` where w must be None or counts of a resample (whole numbers summing to n)."""
    weights, single = rows(w, n)
    if w is not None and (not torch.all((weights.sum(1) - n).abs() < 1e-6)
                          or not torch.equal(weights, weights.round())):
        raise ValueError(f"{what} takes counts of a resample (whole numbers summing to n), not general weights")
    return weights, single


def equal_mass_bins(confidence: torch.Tensor, correct: torch.Tensor, w=None, bins: int = ECE_BINS,
                    extra_first: bool = False) -> Bins:
    """Adaptive ECE's bins: the examples sorted by confidence (stable), bin b holding positions
    ⌊bN/B⌋..⌊(b+1)N/B⌋−1 (`extra_first`: torch-uncertainty's, ⌊N/B⌋ each and the N mod B extra in
    the first bins). An example drawn w times fills w consecutive positions and may straddle two
    bins (its mass split between them). w: None or counts of a resample."""
    n = len(confidence)
    weights, single = _resample_rows(w, n, "the adaptive ECE")
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
    return Bins(*(_out(part, single) for part in (mass, upto(conf), upto(gap_target), weights.sum(1))))


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
    weights, single = _resample_rows(w, n, "the debiased ECE")
    if confidence.isnan().any():  # undefined predictions: no order to bin them by
        return dict.fromkeys(("debiased_l2", "plugin_l2", "bins"), nan_for(w, n))
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


def risk_coverage_areas(confidence: torch.Tensor, errors: torch.Tensor, w=None) -> dict[str, torch.Tensor]:
    """{"aurc", "aurc_trapezoid", "augrc", "augrc_trapezoid"} of the risk–coverage curve: examples
    accepted by decreasing confidence, tied ones each counting their group's mean error (the
    expectation over tie orders). The risk at coverage j/N is the error rate of the j accepted;
    AURC its mean over j (AUGRC: of the generalised risk (j/N)·risk_j, Traub et al. 2024); the
    trapezoid twins are torch-uncertainty's (the trapezoid rule over coverages 1/N..1, divided
    by 1 − 1/N). Tie groups in closed form (a group adds its mean error at each of its positions,
    summed with harmonic numbers), so an example drawn w times is w examples. w: None or counts."""
    n = len(confidence)
    weights, single = _resample_rows(w, n, "the risk–coverage areas")
    if n == 0 or confidence.isnan().any():  # no examples, or undefined predictions: no ranking
        return dict.fromkeys(("aurc", "aurc_trapezoid", "augrc", "augrc_trapezoid"), nan_for(w, n))
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


# ------------------------------------------------------------------ rank correlations

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
