"""Effective ensemble size: each method of a run folder as the number of Deep-Ensemble members that
would score as well (Ashukha et al., ICLR 2020, "deep ensemble equivalent"), read off the power law
of the Deep Ensemble's loss in its size (Lobacheva et al., NeurIPS 2020).

    found = effective_sizes(runs)          # {method: {"members", "cnll" | "brier" | "auroc": {"value", "interval", …}}}
    found["batch-ensemble"]["cnll"]        # {"value": 1.1, "interval": [1.0, 1.3], "extrapolated": False, …}

From predictions alone (every run's, as across.py reads them: trained here, or `ensdiag analyze`
predictions of an LLM's adapters saved as methods of one run folder):
1. each sub-ensemble of the Deep Ensemble (all subsets of each size n = 1…K, or `MAX_SUBSETS`
   drawn at random from a fixed generator where a size has more) and each method pool their
   members' probabilities, p̄ = mean_i p_i (`Examples.subset`: every per-example quantity as the
   tables define it);
2. the calibrated NLL: −log softmax(log p̄ / T)(y), T fitted by the one solver (stats/scaling.py)
   on the run's validation split; a run without one cross-fits T on the test set (Ashukha et al.'s
   test-time cross-validation: each fold scored with the T fitted on the other folds, as the
   refinement analyzer's, assignments averaged); a fit whose examples hold no error keeps T = 1, and
   the entry's `temperature_note` says how many did and how many ran to a bound; the Brier score and
   OOD AUROC (score 1 − max p̄) as the per-split tables measure them, unscaled;
3. per seed, the Deep Ensemble's mean over the sub-ensembles of each size, the power law fitted to
   it, and the size at which it reaches the method's value on the same seed (≥ 1: a method no
   better than one member is 1; beyond the K sizes measured the law is extrapolated, and said so);
4. the mean over seeds, with a 95 % interval that is the envelope of the Student-t interval over
   the per-seed sizes and the verdict's paired bootstrap (resampled seeds, `verdict.chosen_seeds`;
   test examples with the draws behind every cell, `bootstrap.Draws`, the first `RESAMPLES` of
   them; T is fitted once, on data not resampled).
A size is read only where the Deep Ensemble's mean curve improves with every member it adds.

The power law (`fit`, `size_at`, `solve`, `seed_interval`), fitted and read backwards:
    a, b, c = fit([[0.30, 0.22, 0.20, 0.19]])      # y(n) = a + b·n^(−c) through y(1) and y(K), per row
    size_at(0.21, a, b, c)                          # the n where the curve reaches 0.21 (≥ 1, inf past a)

Lobacheva et al. (NeurIPS 2020) found the (calibrated) NLL of a Deep Ensemble of n members follows
a + b·n^(−c) closely: a is the loss of infinitely many members, b how much one member loses beyond
it, c how fast members stop helping. The curve here passes through the two ends measured, y(1) (the
mean over the members alone) and y(K) (the whole ensemble): b = (y(1) − y(K)) / (1 − K^(−c)),
a = y(1) − b, so that the Deep Ensemble reads exactly K and a method no better than its average
member reads 1; c is the least-squares exponent over the sizes between, profiled over a log-spaced
grid on [`C_LOW`, `C_HIGH`] and refined by a golden-section search inside the best grid cell, every
row of a batch at once (the resamples of the bootstrap). With K = 2 nothing lies between: c is
fixed at 1, the exponent of the Brier score of exchangeable members (E‖p̄_n − y‖² = bias +
variance / n exactly) and the first-order term of their NLL. Beyond K the law extrapolates.
"""

import math
from itertools import combinations

import torch

from ..stats import bootstrap as B
from ..stats import weighted as W
from ..stats.bootstrap import BLOCK_ENTRIES
from ..stats.scaling import FOLDS, REPEATS, fit_betas, fit_notes, fitting_sets, folds, informative, padded
from ..budget import over_budget
from ..checks import test_set_difference
from .stats import envelope, percentiles, t_quantile
from .verdict import REFERENCE, chosen_seeds

C_LOW, C_HIGH = 0.05, 10.0  # the exponents searched
GRID, STEPS = 48, 32  # grid points over log c, golden-section steps inside the best cell (to ~1e-7 in log c)
FIXED_C = 1.0  # the exponent with only the two ends measured


def _through_ends(y: torch.Tensor, sizes: torch.Tensor, c: torch.Tensor):
    """(a, b) of the curve through (1, y[..., 0]) and (K, y[..., −1]) at exponent c [B] (or [B, G])."""
    b = (y[..., 0] - y[..., -1]) / (1 - sizes[-1] ** -c)
    return y[..., 0] - b, b


def _error(y, sizes, c):
    """The squared error over the sizes between the ends at exponent c [B] (or [B, G]: G exponents each)."""
    y = y[:, None] if c.dim() == 2 else y
    a, b = _through_ends(y, sizes, c)
    return ((y - a[..., None] - b[..., None] * sizes ** -c[..., None]) ** 2).sum(-1)


def fit(y, sizes=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, b, c), each [B]: the power law through the ends of each row of y [B, K] (a list or a
    tensor, at sizes 1…K or those given, the first 1) with the least-squares c between them."""
    y = torch.as_tensor(y, dtype=torch.float64)
    y = y[None] if y.dim() == 1 else y
    sizes = torch.arange(1, y.shape[-1] + 1, dtype=torch.float64) if sizes is None else torch.as_tensor(
        sizes, dtype=torch.float64)
    if y.shape[-1] < 2:
        raise ValueError("a power law in the ensemble size needs at least two sizes")
    if y.shape[-1] == 2:
        c = torch.full(y.shape[:1], FIXED_C, dtype=torch.float64)
        return (*_through_ends(y, sizes, c), c)
    grid = torch.linspace(math.log(C_LOW), math.log(C_HIGH), GRID, dtype=torch.float64)
    errors = _error(y, sizes, grid.exp().expand(len(y), -1))  # [B, GRID]
    best = errors.argmin(1)
    low, high = grid[(best - 1).clamp(min=0)], grid[(best + 1).clamp(max=GRID - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    left, right = high - ratio * (high - low), low + ratio * (high - low)
    f_left, f_right = _error(y, sizes, left.exp()), _error(y, sizes, right.exp())
    for _ in range(STEPS):  # golden section over log c in [low, high], each row on its own
        move_left = f_left <= f_right  # the minimum lies in [low, right]: right becomes the high end
        high, low = torch.where(move_left, right, high), torch.where(move_left, low, left)
        new_left = torch.where(move_left, high - ratio * (high - low), right)
        new_right = torch.where(move_left, left, low + ratio * (high - low))
        f_new = _error(y, sizes, torch.where(move_left, new_left, new_right).exp())
        f_left, f_right = torch.where(move_left, f_new, f_right), torch.where(move_left, f_left, f_new)
        left, right = new_left, new_right
    c = ((low + high) / 2).exp()
    return (*_through_ends(y, sizes, c), c)


def size_at(value, a, b, c) -> torch.Tensor:
    """The size n ≥ 1 at which the fitted curve reaches `value` (a loss, lower is better):
    n = ((value − a) / b)^(−1/c); 1 for a value no better than one member's (a + b), inf for one
    better than the curve's limit a, NaN where the curve does not fall (b ≤ 0, or not a number)."""
    value = torch.as_tensor(value, dtype=torch.float64)
    falls = b > 0
    ratio = (value - a) / torch.where(falls, b, torch.ones_like(b))
    size = torch.where(ratio > 0, ratio.clamp(min=1e-300) ** (-1 / c), torch.full_like(ratio, math.inf))
    size = torch.where(ratio >= 1, torch.ones_like(size), size)
    return torch.where(falls, size, torch.full_like(size, math.nan))


def solve(values, a, b, c, weights=None, steps: int = 100) -> torch.Tensor:
    """[B]: the size n ≥ 1 at which the weighted mean over seeds of the laws reaches the weighted
    mean of the values — Σ_s w_s (a_s + b_s·n^(−c_s)) = Σ_s w_s·y_s, everything [B, S] (`weights`:
    how often a resample drew each seed; all ones by default): 1 where the values are no better than
    the curves at one member, inf where they beat the curves' limit Σ w·a, NaN where a curve does not
    fall. In u = log n the gap between the mean curve and the mean value is convex and falling (each
    b_s·e^(−c_s·u) is), so Newton's method from u = 0 climbs to its root without passing it (each
    tangent lies below the curve): a few steps, to 10⁻¹³ of u (at most `steps`)."""
    values, a, b, c = (torch.as_tensor(x, dtype=torch.float64) for x in (values, a, b, c))
    weights = torch.ones_like(values) if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    weights = weights / weights.sum(-1, keepdim=True)
    falls = ~((weights > 0) & ~(b > 0)).any(-1)
    limit = (weights * (a - values)).sum(-1) >= 0  # the value beats every size: no root
    log_n = torch.zeros(len(values), dtype=torch.float64)
    for _ in range(steps):
        power = b * torch.exp(-c * log_n[:, None])
        gap = (weights * (a + power - values)).sum(-1)  # mean curve − mean value at n = exp(log_n)
        slope = -(weights * c * power).sum(-1)  # < 0 where every curve falls
        step = torch.where(falls & ~limit & (gap > 0), -gap / slope, 0.0)
        log_n = log_n + step
        if not bool((step > 1e-13 * log_n.clamp(min=1.0)).any()):
            break
    size = log_n.exp()  # (gap ≤ 0 at u = 0: the values are no better than one member; n stays 1)
    size = torch.where(limit, torch.full_like(size, math.inf), size)
    return torch.where(falls, size, torch.full_like(size, math.nan))


def seed_interval(values, a, b, c, t: float, largest: float = 1e4, points: int = 400) -> list[float] | None:
    """[low, high]: the sizes n ≥ 1 at which the paired t-test over seeds of y_s − (a_s + b_s·n^(−c_s))
    = 0 does not reject (mean² ≤ t²·s²/S; values and laws [S], `t` the quantile) — Fieller's
    construction with the curve in place of the denominator; its hull, from a log-spaced grid on
    [1, `largest`] refined by bisection at both ends; inf where it reaches `largest`. None for one
    seed. Where no size passes, the one the point estimate clamps to ([1, 1] or [inf, inf])."""
    values, a, b, c = (torch.as_tensor(x, dtype=torch.float64) for x in (values, a, b, c))
    seeds = len(values)
    if seeds < 2:
        return None

    def excess(log_n):  # > 0 where the test rejects, [G]
        gaps = values[None] - a[None] - b[None] * torch.exp(-c[None] * log_n[:, None])
        return gaps.mean(1) ** 2 - t ** 2 * gaps.var(1) / seeds

    grid = torch.linspace(0.0, math.log(largest), points, dtype=torch.float64)
    kept = (excess(grid) <= 0).nonzero().flatten()
    if not len(kept):
        point = solve(values[None], a[None], b[None], c[None])[0].item()
        return [point, point]

    def edge(inside, outside):  # bisection between a kept and a rejected grid point
        inside, outside = torch.tensor([inside]), torch.tensor([outside])
        for _ in range(50):
            middle = (inside + outside) / 2
            keep = excess(middle) <= 0
            inside, outside = torch.where(keep, middle, inside), torch.where(keep, outside, middle)
        return math.exp(inside.item())

    first, last = kept[0].item(), kept[-1].item()
    low = 1.0 if first == 0 else edge(grid[first].item(), grid[first - 1].item())
    high = math.inf if last == points - 1 else edge(grid[last].item(), grid[last + 1].item())
    return [low, high]


MAX_SUBSETS = 24  # sub-ensembles per size: all of them up to this many, else this many drawn at random
RESAMPLES = 250  # the first of the verdict's resamples: each refits every law and re-reads every size, so a
#                  quarter of them keeps the report's cost down (2.5th and 97.5th percentiles: the 7th from each end)
METRICS = {"cnll": "calibrated NLL", "brier": "Brier score", "auroc": "OOD AUROC"}


def subsets(k: int, limit: int = MAX_SUBSETS) -> list[tuple[int, ...]]:
    """The sub-ensembles of each size 1…k: every one where a size has at most `limit`, else `limit`
    distinct ones drawn from a fixed generator (so reports are reproducible)."""
    found, generator = [], torch.Generator().manual_seed(0)
    for n in range(1, k + 1):
        if math.comb(k, n) <= limit:
            found += list(combinations(range(k), n))
            continue
        chosen = set()
        while len(chosen) < limit:
            chosen.add(tuple(sorted(torch.randperm(k, generator=generator)[:n].tolist())))
        found += sorted(chosen)
    return found


def _pooled(split, chosen: list[tuple[int, ...]], *quantities) -> list[torch.Tensor]:
    """[S, …] each of the `Examples` quantities (log_mean, brier, confidence, …) of every chosen
    sub-ensemble of a split, one sub-ensemble at a time."""
    found = [[getattr(part, name) for name in quantities] for part in (split.subset(members) for members in chosen)]
    return [torch.stack(column) for column in zip(*found)]


def _calibrated_nll(pooled: torch.Tensor, labels: torch.Tensor, val_pooled, val_labels) -> tuple:
    """([S, N] −log softmax(log p̄ / T)(y) per example, the fitted β's, whether each fit had evidence): T fitted
    on the validation split or, without one, cross-fitted on the test set (scaling.py: each fold's T fitted on
    the other folds, `REPEATS` assignments averaged); a fit whose examples hold no error keeps T = 1."""
    picked = pooled.gather(2, labels.expand(len(pooled), -1)[..., None]).squeeze(-1)  # [S, N]: log p̄(y)
    if val_pooled is not None:
        y = val_labels.expand(len(val_pooled), -1)
        beta = fit_betas(val_pooled, y)
        return (torch.logsumexp(pooled * beta[:, None, None], 2) - picked * beta[:, None], beta,
                informative(val_pooled, y, torch.ones_like(y, dtype=torch.float64)))
    assignments = [folds("id", pooled.shape[1], 1, repeat) for repeat in range(REPEATS)]
    index, inside = padded([part for fold, place in assignments for part in fitting_sets(fold, place, len(labels))])
    betas, fitted = [], []
    for part in pooled.split(max(1, BLOCK_ENTRIES // inside.numel() // pooled.shape[2])):  # sub-ensembles at once
        z_fit, y_fit, mask = part[:, index].flatten(0, 1), labels[index].repeat(len(part), 1), inside.repeat(len(part), 1)
        betas.append(fit_betas(z_fit, y_fit, "nll", mask))
        fitted.append(informative(z_fit, y_fit, mask))
    betas = torch.cat(betas).view(len(pooled), -1)
    nll = sum(torch.logsumexp(pooled * t[..., None], 2) - picked * t
              for t in (betas[:, repeat * FOLDS + fold] for repeat, (fold, _) in enumerate(assignments))) / REPEATS
    return nll, betas.flatten(), torch.cat(fitted)


def per_example(run, chosen: list[tuple[int, ...]]) -> dict:
    """Each chosen sub-ensemble's per-example values on one run (across.Seed): {"cnll", "brier",
    "id_score": [S, N], "ood_score": [S, N_ood] (where the run has OOD data)}."""
    pooled, brier, confidence = _pooled(run.id, chosen, "log_mean", "brier", "confidence")
    val_pooled, val_labels = (_pooled(run.val, chosen, "log_mean")[0], run.val.labels) if run.val is not None else (None, None)
    cnll, beta, fitted = _calibrated_nll(pooled, run.id.labels, val_pooled, val_labels)
    out = {"cnll": cnll, "beta": beta, "fitted": fitted, "brier": brier, "id_score": 1 - confidence}
    if run.ood is not None:
        out["ood_score"] = 1 - _pooled(run.ood, chosen, "confidence")[0]
    return out


def _resampled(values: dict, w_id: torch.Tensor, w_ood) -> dict:
    """{metric: [1 + R, S]} each sub-ensemble's mean under the weightings (row 0: as measured), as
    losses (AUROC as 1 − AUROC: lower is better for every curve)."""
    found = {key: w_id @ values[key].T / w_id.sum(1, keepdim=True) for key in ("cnll", "brier")}
    if "ood_score" in values and w_ood is not None:
        found["auroc"] = 1 - torch.stack([W.auroc(i, o, w_id, w_ood) for i, o in zip(values["id_score"],
                                                                                     values["ood_score"])], dim=1)
    return found


def _read(values: torch.Tensor, fitted: dict, picked: torch.Tensor, k: int) -> dict:
    """One metric's size entry: the method's values [seeds, 1 + R] (row 0 of the second axis: as measured)
    read off the seeds' laws (`fitted`, each [seeds, 1 + R]), with the Deep Ensemble's curve: the size where
    the mean of the seeds' curves reaches the mean of the method's values (the verdict's ratio of means, here
    through the curve); its interval the envelope of the paired t-test's set over seeds
    (seed_interval) and the bootstrap over seeds and examples (`picked` [R, seeds]: the seeds each
    resample drew)."""
    shown = {"curve": fitted["curve"], "fit": fitted["fit"]}
    if "law" not in fitted:
        return {"value": None, "interval": None, "reason": fitted["reason"], **shown}
    a, b, c = fitted["law"]
    value = solve(values[:, 0][None], a[:, 0][None], b[:, 0][None], c[:, 0][None])[0].item()
    per_seed = size_at(values[:, 0], a[:, 0], b[:, 0], c[:, 0]).tolist()
    if math.isnan(value):
        return {"value": None, "interval": None, "per_seed": per_seed,
                "reason": "the Deep Ensemble's fitted curve does not fall on every seed", **shown}
    drawn = torch.nn.functional.one_hot(picked, values.shape[0]).sum(1).double()  # [R, seeds]: times drawn
    resampled = solve(values[:, 1:].T, a[:, 1:].T, b[:, 1:].T, c[:, 1:].T, drawn)
    over_seeds = seed_interval(values[:, 0], a[:, 0], b[:, 0], c[:, 0], t_quantile(values.shape[0])) \
        if values.shape[0] > 1 else None
    value = round(value, 9)  # the bisection's last digits are noise: a Deep Ensemble reads its k exactly
    interval = envelope(percentiles(resampled.tolist()), over_seeds, [value, value])  # (holding the estimate)
    interval = [round(bound, 9) if math.isfinite(bound) else bound for bound in interval]
    beyond = k * (1 + 1e-9)  # a size past the Deep Ensemble's own is read by extrapolating the law (∞: unbounded)
    return {"value": value, "interval": interval, "per_seed": per_seed, "reason": None,
            "extrapolated": value > beyond or (interval is not None and beyond < interval[1] < math.inf), **shown}


def _fitted(curves: torch.Tensor, metric: str) -> dict:
    """The Deep Ensemble's curve of one metric over seeds [seeds, 1 + R, K] fitted, every seed and
    weighting at once ({"law": (a, b, c) each [seeds, 1 + R]}), with what the report shows of it: the
    measured curve's mean over seeds, the law fitted to that mean, and why no size is read where the
    mean curve does not improve with every member it adds."""
    seeds, rows, k = curves.shape
    mean_curve = curves[:, 0].mean(0)
    a, b, c = fit(mean_curve[None])
    shown = {"curve": (1 - mean_curve if metric == "auroc" else mean_curve).tolist(),
             "fit": {"a": (1 - a if metric == "auroc" else a).item(), "b": b.item(), "c": c.item()}}
    if not bool((mean_curve.diff() < -1e-9 * mean_curve.abs().max()).all()):  # (beyond rounding: copies)
        return {**shown, "reason": f"the Deep Ensemble's {METRICS[metric]} does not improve with every member it adds"}
    return {**shown, "law": tuple(part.view(seeds, rows) for part in fit(curves.reshape(-1, k)))}


def effective_sizes(runs: dict, draws=None, resamples: int = RESAMPLES) -> dict:
    """{method: entry} for every method of `runs` ({method: {seed: across.Seed}}) beside a Deep Ensemble,
    the Deep Ensemble itself included (it reads K: the law passes through its value); {} without
    one. An entry: {"members": k, "reference_members": K, "seeds", "subsets", "temperature", and
    per metric {"value", "interval", "per_seed", "extrapolated", "reason", "curve", "fit"}} or
    {"reason"}; `draws` is the verdict's bootstrap.Draws (shared: the test-set sampling is the tables')."""
    if REFERENCE not in runs:
        return {}
    draws = draws if draws is not None else B.Draws()
    loaded = {method: {seed: run for seed, run in seeds.items() if run.id.size >= 2} for method, seeds in runs.items()}
    reference = loaded[REFERENCE]
    ks = {run.id.members for run in reference.values()}
    if len(ks) != 1 or min(ks) < 2:
        why = "the Deep Ensemble has one member" if ks == {1} else "the Deep Ensemble's seeds have different member counts"
        return {method: {"reason": why} for method in runs} if ks else {}
    k = ks.pop()
    chosen_subsets = subsets(k)
    by_size = torch.nn.functional.one_hot(torch.tensor([len(members) for members in chosen_subsets]) - 1, k).double()
    by_size = by_size / by_size.sum(0)  # [S, K]: the mean over each size's sub-ensembles
    fitted_for, found = {}, {}
    for method in runs:
        seeds = sorted(set(reference) & set(loaded[method]))
        if not seeds:
            continue
        n, difference = reference[seeds[0]].id.size, test_set_difference(
            [(group[seed].id.labels, group[seed].id.logits.shape[-1]) for group in (reference, loaded[method]) for seed in seeds])
        if difference is not None:
            found[method] = {"reason": f"its test set and the Deep Ensemble's differ ({difference})"}
            continue
        reason = over_budget(len(chosen_subsets) * n * reference[seeds[0]].id.logits.shape[-1] * 8 * 3,
                             "the Deep Ensemble's sub-ensembles")
        if reason:
            found[method] = {"reason": reason}
            continue
        ood = {group[seed].ood.size if group[seed].ood is not None else None
               for group in (reference, loaded[method]) for seed in seeds}
        n_ood = ood.pop() if len(ood) == 1 else None
        key = (tuple(seeds), n, n_ood)
        def counts(split, size):  # drawn as many as the verdict reads, so that they are drawn once
            return draws.counts(split, size, 0, max(resamples, B.RESAMPLES))[:resamples]
        w_id = torch.cat([torch.ones(1, n, dtype=torch.float64), counts("id", n)])
        w_ood = torch.cat([torch.ones(1, n_ood, dtype=torch.float64), counts("ood", n_ood)]) if n_ood else None
        if key not in fitted_for:  # the Deep Ensemble's laws serve every method with these seeds
            found_seeds = [per_example(reference[seed], chosen_subsets) for seed in seeds]
            per_seed = [_resampled(values, w_id, w_ood) for values in found_seeds]
            fitted_for[key] = {metric: _fitted(torch.stack([values[metric] @ by_size for values in per_seed]), metric)
                               for metric in per_seed[0]}
            fitted_for[key]["fits"] = [(values["beta"], values["fitted"]) for values in found_seeds]
        fitted = fitted_for[key]
        found_seeds = [per_example(loaded[method][seed], [tuple(range(loaded[method][seed].id.members))])
                       for seed in seeds]
        mine = [_resampled(values, w_id, w_ood) for values in found_seeds]
        validated = all(group[seed].val is not None for group in (reference, loaded[method]) for seed in seeds)
        fits = [*fitted["fits"], *((values["beta"], values["fitted"]) for values in found_seeds)]
        entry = {"members": loaded[method][seeds[0]].id.members, "reference_members": k, "seeds": len(seeds),
                 "reference": method == REFERENCE, "subsets": len(chosen_subsets), "resamples": resamples,
                 "temperature": "validation" if validated else "cross-validation",
                 "temperature_note": fit_notes(torch.cat([beta for beta, _ in fits]),
                                               torch.cat([mask for _, mask in fits]),
                                               "temperature fits (this method's and the Deep Ensemble's sub-ensembles')")}
        picked = chosen_seeds(len(seeds), resamples)
        for metric in METRICS:
            if metric in fitted and metric in mine[0]:
                entry[metric] = _read(torch.stack([values[metric][:, 0] for values in mine]), fitted[metric], picked, k)
        found[method] = entry
    return found
