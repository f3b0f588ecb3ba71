"""The interval arithmetic reports share: the Student-t interval of a mean over seeds, Fieller's
interval of a ratio of paired means, and the one rule that says what an interval of a ratio answers.

    mean_ci([0.91, 0.93, 0.92])                 # {"mean", "ci" (half-width), "n", "values"}
    fieller([a_1, …, a_n], [b_1, …, b_n])       # [low, high] for mean(a) / mean(b), or None (unbounded)
    settles([0.07, 0.08])                       # "single": wholly below the 25 % line

Fieller (1954): for paired values (a_s, b_s) and ρ = mean(a) / mean(b), the set of ρ for which the
paired t-test of mean(a − ρ·b) = 0 does not reject at level α is
    {ρ : (ā − ρ b̄)² ≤ t² (s_aa − 2ρ s_ab + ρ² s_bb) / n},   t = t_{1−α/2, n−1},
a quadratic inequality in ρ. It is a bounded interval exactly when b̄ itself differs from 0 by the
same t-test (b̄² > t² s_bb / n); otherwise the set is unbounded and no interval is given. It is an
interval for the ratio of means — the estimate printed — not for the mean of per-seed ratios.
"""

import math

import numpy as np
from scipy.special import chdtri, nctdtr, stdtrit  # scipy.stats's own, without importing all of scipy.stats

LEVEL = 0.95
BASELINE, REFERENCE = "single", "deep-ensemble"  # the runs every other method is compared with
ENSEMBLE_LIKE, SINGLE_LIKE = 0.5, 0.25  # a ratio whose whole interval lies above / below these answers


def t_quantile(n: int, level: float = LEVEL) -> float:
    """t_{(1+level)/2, n−1}."""
    return float(stdtrit(n - 1, 0.5 + level / 2))


def mean_ci(values: list[float]) -> dict:
    """Mean and the half-width of its Student-t interval (None below two values)."""
    n = len(values)
    if n == 0:
        return {"mean": None, "ci": None, "n": 0, "values": []}
    mean = sum(values) / n
    if n == 1:
        return {"mean": mean, "ci": None, "n": 1, "values": values}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return {"mean": mean, "ci": t_quantile(n) * sd / math.sqrt(n), "n": n, "values": values}


def t_interval(values: list[float]) -> list[float] | None:
    """[mean − half, mean + half] over the finite values; None for fewer than two."""
    found = mean_ci([value for value in values if math.isfinite(value)])
    return None if found["ci"] is None else [found["mean"] - found["ci"], found["mean"] + found["ci"]]


def fieller(numerators: list[float], denominators: list[float], level: float = LEVEL) -> list[float] | None:
    """Fieller's interval for mean(numerators) / mean(denominators) from paired values; None with
    fewer than two pairs or when the set is unbounded (the denominator's mean is not told from 0)."""
    pairs = [(a, b) for a, b in zip(numerators, denominators) if math.isfinite(a) and math.isfinite(b)]
    n = len(pairs)
    if n < 2:
        return None
    a_bar, b_bar = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
    s_aa = sum((a - a_bar) ** 2 for a, _ in pairs) / (n - 1)
    s_bb = sum((b - b_bar) ** 2 for _, b in pairs) / (n - 1)
    s_ab = sum((a - a_bar) * (b - b_bar) for a, b in pairs) / (n - 1)
    q = t_quantile(n, level) ** 2 / n
    quadratic, half_linear, constant = b_bar ** 2 - q * s_bb, a_bar * b_bar - q * s_ab, a_bar ** 2 - q * s_aa
    if quadratic <= 0:
        return None
    root = math.sqrt(max(half_linear ** 2 - quadratic * constant, 0.0))  # ≥ 0 up to rounding: ā/b̄ is inside
    return [(half_linear - root) / quadratic, (half_linear + root) / quadratic]


def envelope(*intervals) -> list[float] | None:
    """The smallest interval holding every given one (None where none is given)."""
    given = [interval for interval in intervals if interval is not None]
    return [min(low for low, _ in given), max(high for _, high in given)] if given else None


def percentiles(values, level: float = LEVEL) -> list[float] | None:
    """The (1−level)/2 and (1+level)/2 percentiles of bootstrap draws, NaN left out and infinite ones kept (a
    size past a curve's limit); None without draws."""
    values = sorted(value for value in values if not math.isnan(value))
    if not values:
        return None
    tail = (1 - level) / 2
    return [values[int(tail * (len(values) - 1))], values[int(math.ceil((1 - tail) * (len(values) - 1)))]]


def settles(interval) -> str:
    """What a ratio's interval (a share of the Deep Ensemble's gain, or a multiple of its diversity)
    answers — one rule for every ratio the verdict prints:
    "ensemble" (wholly at or above 50 %), "single" (wholly at or below 25 %), "between" (wholly
    between them) or "unsettled": too wide to say (an unbounded or missing interval included)."""
    if interval is None or not all(math.isfinite(bound) for bound in interval):
        return "unsettled"
    low, high = interval
    if low >= ENSEMBLE_LIKE:
        return "ensemble"
    if high <= SINGLE_LIKE:
        return "single"
    if low >= SINGLE_LIKE and high <= ENSEMBLE_LIKE:
        return "between"
    return "unsettled"


POWER = 0.8  # the chance, at the seeds needed, that the interval clears the line
MOST_SEEDS = 1000  # seeds needed beyond this are "more than 1,000"


def seeds_needed(per_seed: list[float], distance: float, floor: float = 0.0, power: float = POWER) -> dict:
    """How many seeds would make a 95 % interval over seeds clear a line `distance` away from the
    estimate, with probability `power`, if the seeds vary as these do: {"seeds": n or None, "why",
    "range": [low, high]}.

    `per_seed`: each seed's value whose mean is the estimate, or for a ratio of means ā/b̄ its
    values (a_s − L·b_s)/b̄ at the line L (Fieller's interval excludes L exactly when their t-test rejects).
    With S seeds, the interval mean ± t_{S−1}·s/√S clears the line when the one-sided t-test of
    distance·√S/σ rejects, so its chance is the power of that test: 1 − F(t_{0.975,S−1}; S − 1,
    δ = distance·√S/s), F the noncentral t distribution (σ taken as the seeds' s). The smallest S
    with that chance ≥ `power` is returned (more than the seeds there are). `floor`: the half-width the test
    set's own sampling adds however many seeds there are (it does not shrink with seeds); the seeds'
    part must fit in √(distance² − floor²), and no number of seeds does where floor ≥ distance.
    "range": the counts at the ends of σ's own 95 % interval, s·√((S−1)/χ²) (from S seeds, s is a rough
    guess of σ: three seeds put σ anywhere from 0.52 to 6.3 times s), None at an end past `MOST_SEEDS`.
    why: "test set" (floor ≥ distance), "one seed" (no spread to project from), "no spread" (the seeds
    agree exactly: more of them change nothing), "too many" (more than `MOST_SEEDS`)."""
    values = [value for value in per_seed if math.isfinite(value)]
    if floor >= distance:
        return {"seeds": None, "why": "test set"}
    if len(values) < 2:
        return {"seeds": None, "why": "one seed"}
    spread = math.sqrt(sum((v - sum(values) / len(values)) ** 2 for v in values) / (len(values) - 1))
    if spread == 0:
        return {"seeds": None, "why": "no spread"}
    room, freedom = math.sqrt(distance ** 2 - floor ** 2), len(values) - 1
    tail = (1 - LEVEL) / 2
    low, high = (spread * math.sqrt(freedom / chdtri(freedom, p)) for p in (tail, 1 - tail))
    found = [_smallest(room, sigma, len(values), power) for sigma in (spread, low, high)]
    return {"seeds": found[0], "why": None if found[0] else "too many", "range": found[1:]}


def _smallest(room: float, sigma: float, seeds: int, power: float) -> int | None:
    """The fewest seeds (more than `seeds`, at most `MOST_SEEDS`) whose interval clears a line `room`
    away with probability `power` when seeds vary by `sigma`; None beyond (every count at once)."""
    counts = np.arange(seeds + 1, MOST_SEEDS + 1)  # more than there are: these left it open
    chance = 1 - nctdtr(counts - 1, room * np.sqrt(counts) / sigma, stdtrit(counts - 1, 0.5 + LEVEL / 2))
    enough = np.flatnonzero(chance >= power)
    return int(counts[enough[0]]) if len(enough) else None
