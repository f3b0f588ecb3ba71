"""Intervals from bootstrap resamples (bootstrap.py's draws): the "interval" entry every
example-level number carries, and the constructions it is built with.

    interval(estimate, values_over_resamples, n) # {"low", "high", "level", "n", "method"}

**Three constructions**, each where the coverage suite (`benchmarks/interval_coverage.py`, on populations
whose values are known) and the simulations of `tests/test_coverage.py` show it covers:
- *percentile* (the default): the 2.5th and 97.5th percentiles of the resampled values; right for
  smooth statistics that are unbiased or nearly so (means such as NLL, accuracy, disagreement;
  AUROC, a U-statistic);
- *basic* (bias-corrected): 2θ̂ − the percentiles; for smooth statistics with an O(1/n) bias,
  which the percentiles would double (linear CKA);
- *ray inversion*, for statistics that fold noise into a bias (a sum of absolute bin gaps — the
  binned ECE —, a maximum — a barrier): φ(μ̂) of a vector of means is biased upward, by as much
  as the value itself for a well-calibrated model, and the percentile interval then misses the
  population's value most of the time (`tests/test_coverage.py`). Such a φ is positively
  homogeneous (φ(λμ) = λφ(μ) for λ ≥ 0), so the interval is inverted along the ray λ·μ̂: λ is
  kept when the observed φ(μ̂) lies between the 2.5th and 97.5th percentiles of φ(λμ̂ + e*)
  over the resamples' deviations e* = μ̂* − μ̂, and the interval is {λ·φ(μ̂)}.

Two more for statistics bounded by 0 and 1 whose population value can sit at the bound:
- *logit*: logit(θ̂) ± z·SD(logit θ*), mapped back (AUROC). Near 1 an AUROC's sampling
  distribution is skewed and rests on the few examples where ID and OOD overlap; the percentile
  interval then sits above the population's value in one test set of seven or eight
  (benchmarks/interval_coverage.py's easy OOD at N = 200–1,000), the logit-scale one covers.
  *logit-debiased* centres it on 2·logit(θ̂) − mean(logit θ*) (AUPR: average precision reads
  high near 1, and the resamples show by how much).
- *binomial*: the percentile interval widened to the exact (Clopper–Pearson) interval of the
  proportion at the point's threshold (FPR95: k of m examples past it). With a handful of such
  examples the resamples hardly move k, and at k = 0 every one of them reads 0.

The two bias-aware ones are hulled with the percentile interval and the value (`hulled`): a bias
correction that moves the interval off the printed value, or below a truly mis-calibrated model's
value (whose per-bin gaps share a sign, so the fold bias they correct is absent), would otherwise
print a value outside its own interval or miss.

BCa is not used: its acceleration needs a jackknife (n re-runs of an analyzer), and its bias
correction rests on the resamples' median, which a folded statistic's bias pushes up as well.

**A subsample of a known split.** When m of a split's N examples were measured (a budget), the
interval above is a confidence interval for the value on the population. The value the
whole split would give is known more closely: a subsample without replacement varies by the
finite-population factor √((N − m)/(N − 1)) less, so `full_split` shrinks the deviations from
the estimate by it (the rescaling bootstrap of Rao & Wu 1988).
"""

import math
from dataclasses import dataclass
from statistics import NormalDist

import torch

from .bootstrap import CACHED_ENTRIES

LEVEL = 0.95


@dataclass
class Folded:
    """A positively homogeneous statistic φ(μ) = combine(μ, mass) of a vector of means, for ray
    inversion: `means` [P] (the estimate) or [R, P] (each resample's), `mass` alike (bin masses
    that weight the means; ones where unused; or, per resample, whatever else `combine` reads, such
    as the restarts a resample drew) and `combine(means [..., R, P], mass [R, …]) -> [..., R]`."""

    means: torch.Tensor
    mass: torch.Tensor
    combine: callable

    def value(self) -> float:
        return float(self.combine(self.means[None], self.mass[None])[0])


def _quantiles(values: torch.Tensor, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    low, high = torch.quantile(values, torch.tensor([tail, 1 - tail], dtype=values.dtype))
    return float(low), float(high)


def percentile(estimate: float, values: torch.Tensor, level: float = LEVEL, shrink: float = 1.0):
    return _quantiles(estimate + shrink * (values - estimate), level)


def basic(estimate: float, values: torch.Tensor, level: float = LEVEL, shrink: float = 1.0):
    """2θ̂ − the percentiles: the resamples' bias taken off once more. Under the finite-population
    factor f the spread shrinks by f and an O(1/m) bias by f² (1/m − 1/N = f²/m, up to N/(N − 1))."""
    centre = float(values.mean())
    low, high = _quantiles(shrink * (values - centre), level)
    corrected = estimate - shrink**2 * (centre - estimate)
    return corrected - high, corrected - low


RAY = torch.cat([torch.linspace(0, 4, 41), torch.linspace(0.8, 1.2, 41)]).unique().double()  # λ, finer near 1
EDGE_STEPS = 24  # bisections that place each end of the kept range of λ (to 2⁻²⁴ of a grid step)
EDGE_LEVELS = 3  # bisection steps decided by one batched evaluation (2³ − 1 midpoints)
assert EDGE_STEPS % EDGE_LEVELS == 0


def _midpoints(inside: float, outside: float, levels: int) -> dict:
    """{(a, b): (a + b) / 2} for every bracket `levels` bisection steps from (inside, outside) may reach."""
    if levels == 0:
        return {}
    middle = (inside + outside) / 2
    return {(inside, outside): middle, **_midpoints(middle, outside, levels - 1), **_midpoints(inside, middle, levels - 1)}


def ray(estimate: Folded, resampled: Folded, level: float = LEVEL, shrink: float = 1.0):
    """The interval of φ inverted along λ·μ̂ (module docstring); `shrink` scales the deviations.
    λ is kept on a grid (step 0.1, 0.01 between 0.8 and 1.2), then each end of the kept range is
    placed by bisection against its rejected neighbour."""
    value = estimate.value()
    deviations = shrink * torch.nan_to_num(resampled.means - estimate.means[None])  # a bin a resample left empty: 0
    if value <= 0:  # the estimate sits where φ is 0: no ray to invert along; the resamples' spread above it
        return 0.0, _quantiles(resampled.combine((estimate.means[None] + deviations)[None], resampled.mass)[0], level)[1]
    tail = (1 - level) / 2

    def kept(lambdas):  # (the [L, R, P] shifted means a chunk of λ at a time, within the CPU's cache)
        spread = torch.cat([resampled.combine(chunk[:, None, None] * estimate.means[None, None] + deviations[None],
                                              resampled.mass)
                            for chunk in lambdas.split(max(1, CACHED_ENTRIES // deviations.numel()))])  # [L, R]
        low, high = torch.quantile(spread, torch.tensor([tail, 1 - tail], dtype=spread.dtype), dim=1)
        return (low <= value) & (value <= high)

    accepted = kept(RAY)
    if not accepted.any():  # smaller than even pure noise (λ = 0) typically gives: no signal to speak of,
        plain = resampled.combine((estimate.means[None] + deviations)[None], resampled.mass)[0]
        return 0.0, max(_quantiles(plain, level)[1], value)  # from 0 to where the resamples reach
    where = torch.nonzero(accepted).flatten()

    def edge(inside: float, outside: float | None) -> float:
        """Bisection between a kept and a rejected λ, `EDGE_LEVELS` steps per call of `kept`: every
        midpoint the next steps could visit is evaluated at once, then the steps walk them (the
        same midpoints, the same outcomes, as one step at a time)."""
        if outside is None:
            return inside
        for _ in range(EDGE_STEPS // EDGE_LEVELS):
            tree = _midpoints(inside, outside, EDGE_LEVELS)  # {(inside, outside): their midpoint}, every level
            found = dict(zip(tree, kept(torch.tensor(list(tree.values()), dtype=torch.float64)).tolist()))
            for _ in range(EDGE_LEVELS):
                middle = tree[inside, outside]
                inside, outside = (middle, outside) if found[inside, outside] else (inside, middle)
        return inside

    first, last = int(where[0]), int(where[-1])
    low = edge(float(RAY[first]), float(RAY[first - 1]) if first > 0 else None)
    high = edge(float(RAY[last]), float(RAY[last + 1]) if last + 1 < len(RAY) else None)
    return low * value, high * value


METHODS = {"percentile": "percentile bootstrap over the examples", "basic": "bootstrap over the examples: the hull of "
           "the bias-corrected (basic) and the percentile intervals", "ray": "bootstrap over the examples: the hull of "
           "the interval inverted along the ray λ·μ̂ (bias-aware, for a statistic of absolute values) and the percentile "
           "interval", "upper": "bootstrap over the examples: from 0 to the upper end of the hull of the bias-aware and "
           "the percentile intervals (a test set puts this unsigned error above 0 even where the population's is 0; "
           "the signed error says whether it may be)", "logit": "bootstrap over the examples on the logit scale: logit of "
           "the value ± 1.96 standard deviations of the resamples' logits (a value near 1 skews the percentiles)",
           "logit-debiased": "bootstrap over the examples on the logit scale: logit of the value, less the resamples' "
           "mean excess over it, ± 1.96 standard deviations of their logits, widened to hold the value",
           "binomial": "bootstrap over the examples: the hull of the percentile interval and the exact binomial "
           "(Clopper–Pearson) interval of the examples past the threshold (a small count the resamples hardly move)"}


def _plain(estimate, resampled) -> tuple[float, torch.Tensor]:
    """(the value, the statistic over the resamples) of a Tensor's or a `Folded`'s resamples."""
    if isinstance(resampled, Folded):
        return estimate.value(), resampled.combine(torch.nan_to_num(resampled.means)[None], resampled.mass)[0]
    return estimate, resampled


def clopper_pearson(hits: int, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact binomial interval for a proportion hits/trials (beta quantiles, through
    scipy.special: scipy.stats costs every run a slow import)."""
    from scipy.special import betaincinv
    tail = (1 - level) / 2
    low = 0.0 if hits == 0 else float(betaincinv(hits, trials - hits + 1, tail))
    high = 1.0 if hits == trials else float(betaincinv(hits + 1, trials - hits, 1 - tail))
    return low, high


def logit(floor: float, debiased: bool = False, trials: int | None = None):
    """logit(θ̂) ± z·SD(logit θ*), back through the logistic function, for a statistic in [0, 1]; θ
    is held within [floor, 1 − floor] (half a pair of a U-statistic of n₁·n₂ pairs) so a value at
    the bound keeps a finite logit. `debiased`: centred on 2·logit(θ̂) − mean(logit θ*), the bias the
    resamples show taken off once (average precision over-reads near 1), hulled with the value;
    else symmetric on the logit scale, so the value is always inside. A value at the bound (an
    AUROC of 1: every resample reads 1 too, a spread of 0) reaches as far as zero misordered
    examples among `trials` allow (the Clopper–Pearson bound of 0 of them), not [1, 1]."""
    def construction(estimate, values, level: float = LEVEL, shrink: float = 1.0):
        held = lambda x: min(max(x, floor), 1 - floor)  # noqa: E731
        centre = math.log(held(estimate) / (1 - held(estimate)))
        logits = torch.logit(values.double().clamp(floor, 1 - floor))
        spread = float(logits.std()) if len(values) > 1 else 0.0
        if debiased:
            centre -= shrink**2 * (float(logits.mean()) - centre)
        half = NormalDist().inv_cdf(0.5 + level / 2) * shrink * spread
        low, high = 1 / (1 + math.exp(-(centre - half))), 1 / (1 + math.exp(-(centre + half)))
        if trials and not floor < estimate < 1 - floor:  # at the bound: what no misordering among `trials` allows
            reach = clopper_pearson(0, trials, level)[1]
            low, high = (min(low, 1 - reach), high) if estimate >= 1 - floor else (low, max(high, reach))
        return min(low, estimate), max(high, estimate)
    return construction


def binomial(trials: int):
    """The percentile interval widened to the Clopper–Pearson interval of round(θ̂·trials) of
    `trials`: a proportion of examples past a threshold (FPR95) whose count is small. The binomial
    part is the subsample's own, not shrunk for a subsample of a known split (so wider there)."""
    def construction(estimate, values, level: float = LEVEL, shrink: float = 1.0):
        low, high = percentile(estimate, values, level, shrink)
        exact_low, exact_high = clopper_pearson(round(estimate * trials), trials, level)
        return min(low, exact_low), max(high, exact_high)
    return construction


def upper(build):
    """[0, the upper end of the hulled construction]: for an unsigned calibration error that a test set
    puts above 0 even where the population's is 0 (SmoothECE, the classwise ECE's sparse bins), so no
    two-sided interval covers a calibrated model; the signed error says whether it may be 0."""
    hull = hulled(build)

    def construction(estimate, resampled, level: float = LEVEL, shrink: float = 1.0):
        return 0.0, hull(estimate, resampled, level, shrink)[1]
    return construction


def hulled(build):
    """A bias-aware construction (basic, ray) widened to the percentile interval and to the value itself.
    The bias correction can move the interval off the plug-in value (a sum of absolute gaps over many
    sparse bins, CKA on few examples) and, under a real mis-calibration, below the population's value
    (the fold bias it corrects is absent there): the hull covers in both cases
    (benchmarks/interval_coverage.py) and always holds the number printed beside it."""
    def construction(estimate, resampled, level: float = LEVEL, shrink: float = 1.0):
        low, high = build(estimate, resampled, level, shrink)
        value, values = _plain(estimate, resampled)
        values = values[values.isfinite()]
        plain_low, plain_high = percentile(value, values, level, shrink)
        return min(low, plain_low, value), max(high, plain_high, value)
    return construction


def interval(estimate, resampled, n: int, kind: str = "percentile", *, level: float = LEVEL, of: int | None = None,
             strata: dict | None = None, bounds=(-math.inf, math.inf), min_finite: float = 0.9,
             trials: int | None = None) -> dict:
    """The "interval" entry of a metric: {"low", "high", "level", "n", "method"} (+ "strata" for
    a stratified resample, + "full_split" for a subsample of `of` examples). `resampled`: the
    statistic over the resamples, a Tensor [R] (percentile, basic) or a `Folded` (ray, with
    `estimate` a `Folded` too). Too few finite resampled values (a class missing from most
    resamples) or no finite estimate give low = high = None and a note. "binomial" needs `trials`,
    the examples the value is a fraction of (without it: the percentiles, and the method says so; on
    a clustered split they count rows, not inputs, so its exact part is the narrower — the
    percentile part of the hull resamples the inputs)."""
    value = estimate.value() if isinstance(estimate, Folded) else estimate
    count = len(resampled.means if isinstance(resampled, Folded) else resampled)
    kind = "percentile" if kind == "binomial" and not trials else kind  # no count known: the percentiles, named so
    entry = {"low": None, "high": None, "level": level, "n": n,
             "method": f"{METHODS[kind]}, {count:,} resamples" + (" per stratum, stratified" if strata else ""),
             **({"strata": strata} if strata else {})}
    if value is None or not math.isfinite(value):
        return {**entry, "note": "no finite value to put an interval around"}
    if isinstance(resampled, Folded):
        finite = torch.isfinite(resampled.combine(torch.nan_to_num(resampled.means)[None], resampled.mass)[0])
    else:
        finite = torch.isfinite(resampled)
        resampled = resampled[finite].double()
    if count == 0 or finite.double().mean() < min_finite:
        return {**entry, "note": f"only {int(finite.sum())} of {count} resamples gave a finite value"}
    pairs, fewest = (math.prod(strata.values()), min(strata.values())) if strata else (n * n, n)
    builders = {"percentile": lambda: percentile, "basic": lambda: hulled(basic), "ray": lambda: hulled(ray),
                "upper": lambda: upper(ray if isinstance(resampled, Folded) else basic),
                "logit": lambda: logit(0.5 / pairs, trials=fewest),
                "logit-debiased": lambda: logit(0.5 / pairs, debiased=True, trials=fewest),
                "binomial": lambda: binomial(trials)}
    build = builders[kind]()
    clamp = lambda pair: [min(max(pair[0], bounds[0]), bounds[1]), min(max(pair[1], bounds[0]), bounds[1])]  # noqa: E731
    entry["low"], entry["high"] = clamp(build(estimate, resampled, level))
    if kind == "upper" or (isinstance(resampled, Folded) and entry["low"] <= 0):
        entry["bound"] = "upper"  # an unsigned error whose lower end is 0: the data are consistent with none
    if of is not None and of > n:
        # √((N − n)/(N − 1)): how much less a subsample of n of N varies about the whole's value
        low, high = clamp(build(estimate, resampled, level, shrink=math.sqrt((of - n) / (of - 1))))
        entry["full_split"] = {"low": low, "high": high, "of": of}
    return entry


def percentile_columns(estimates: torch.Tensor, resampled: torch.Tensor, n: int, strata: dict | None = None) -> list:
    """`interval(estimates[j], resampled[:, j], n, strata=strata)` for every column j of [R, m]
    resamples at once: one quantile call for the columns whose values are all finite (the same
    numbers, the same arithmetic), `interval` itself for the others."""
    estimates, resampled = estimates.double(), resampled.double()
    clean = torch.isfinite(resampled).all(0) & torch.isfinite(estimates)
    tail = (1 - LEVEL) / 2
    shifted = estimates[clean] + (resampled[:, clean] - estimates[clean])  # percentile(): θ̂ + 1·(θ* − θ̂)
    bounds = torch.quantile(shifted, torch.tensor([tail, 1 - tail], dtype=torch.float64), dim=0).T.tolist() \
        if len(resampled) and bool(clean.any()) else []
    entry = {"level": LEVEL, "n": n, "method": f"{METHODS['percentile']}, {len(resampled):,} resamples"
             + (" per stratum, stratified" if strata else ""), **({"strata": strata} if strata else {})}
    found, done = [], iter(bounds)
    for column, ok in enumerate(clean.tolist()):
        if ok and bounds:
            low, high = next(done)
            found.append({"low": low, "high": high, **entry})
        else:
            found.append(interval(float(estimates[column]), resampled[:, column], n, strata=strata))
    return found


def half_width(entry: dict | None) -> float | None:
    """Half the width of an interval entry (None where there is none)."""
    if not isinstance(entry, dict) or entry.get("low") is None or entry.get("high") is None:
        return None
    return (entry["high"] - entry["low"]) / 2
