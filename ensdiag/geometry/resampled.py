"""Example-level intervals of member geometry: barriers and CKA over resampled examples.

The model analyzers read examples too, so their numbers carry the examples' sampling error.
Both are resampled with the draws every other analyzer uses on the same examples
(`bootstrap.draws`, seeded by the split and its size):

- a barrier is the maximum over path points of a mean over test examples (each example's rise
  above the line between the ends, `paths.excess`): the per-example values of every point and
  pair are kept, and a resample is a product with its counts. A maximum folds noise into an
  upward bias, so the interval is the ray inversion (`bootstrap.py`);
- linear CKA of members a and b on examples drawn with counts w (Σw = n), from the Gram matrices
  K = XXᵀ, L = YYᵀ of the kept features (Kornblith et al.'s HSIC with weighted centring):

      HSIC(w) = wᵀ(K∘L)w − (2/n)·Σ_i w_i (Kw)_i (Lw)_i + (wᵀKw)(wᵀLw)/n²

  (the same as ‖Σ_i w_i (x_i − x̄_w)(y_i − ȳ_w)ᵀ‖²_F; a test checks it against resampled data),
  so each block of resamples costs a few matrix products of size m × m × b. Linear CKA is biased
  upward at small n (by O(1/n)), so the interval is the bias-corrected (basic) bootstrap. Its
  features are kept for at most `CKA_INTERVAL_EXAMPLES` examples; where CKA read more, the
  interval is computed on the first of them and its bias and spread scaled to the n read
  (bias ∝ 1/n, spread ∝ 1/√n), which the method says.
"""

import math

import torch

from ..analysis import bootstrap as B

CKA_INTERVAL_EXAMPLES = 500  # features kept per split for CKA's interval (Gram matrices m × m; the cost grows as m²)
CKA_RESAMPLES = 300  # each costs (k + k(k+1)/2) products of m × m by the block, per layer


def barrier_interval(curves: list[tuple[list, torch.Tensor]], split: str, of: int | None = None) -> dict:
    """The interval entry of a mean over pairs of barriers; `curves`: per pair (ts, excess [points, n])
    on the same n examples of `split`."""
    return barrier_entry(barrier_resamples(curves, split), curves[0][1].shape[1], of)


def barrier_entry(resampled: tuple, n: int, of: int | None = None) -> dict:
    """The interval entry of a barrier from `barrier_resamples`' (estimate, resamples) on n examples."""
    estimate, values = resampled
    return B.interval(estimate, values, n, "ray", of=of)


def barrier_resamples(curves: list[tuple[list, torch.Tensor]], split: str) -> tuple[B.Folded, B.Folded]:
    """(the estimate, its resamples) of a mean over pairs of barriers as `Folded` statistics: the
    per-point mean excesses and their maximum per pair, averaged over the pairs."""
    n = curves[0][1].shape[1]
    points = max(len(ts) for ts, _ in curves)
    # pairs may have evaluated different points (adaptive grids): pad with 0, the excess at t = 0
    table = torch.stack([torch.cat([values, values.new_zeros(points - len(values), n)]) for _, values in curves])  # [p, t, n]
    flat = table.flatten(0, 1)  # [pairs·points, n]
    pairs = len(curves)

    def combine(means, mass):
        return means.unflatten(-1, (pairs, points)).amax(-1).mean(-1)

    estimate = B.Folded(flat.mean(1), torch.ones(len(flat), dtype=torch.float64), combine)
    count = B.resamples_for(n)
    means = torch.cat([B.counts_of(rows, n) @ flat.T / n for _, rows in B.blocks(split, n, count)])
    return estimate, B.Folded(means, torch.ones_like(means), combine)


def weighted_hsic(grams: list[torch.Tensor], counts: torch.Tensor) -> torch.Tensor:
    """[b, k, k]: HSIC (unnormalised, weighted centring) of every pair of members for each resample."""
    k, n = len(grams), counts.shape[1]
    w = counts.T  # [m, b]
    products = [gram @ w for gram in grams]  # K_a w, [m, b]
    quadratic = [(w * product).sum(0) for product in products]  # wᵀ K_a w, [b]
    out = torch.empty(counts.shape[0], k, k, dtype=torch.float64)
    for a in range(k):
        for b in range(a, k):
            first = (w * ((grams[a] * grams[b]) @ w)).sum(0)
            second = (w * products[a] * products[b]).sum(0)
            out[:, a, b] = out[:, b, a] = first - 2 / n * second + quadratic[a] * quadratic[b] / n**2
    return out


def resampled_cka(features: dict, counts: torch.Tensor) -> torch.Tensor:
    """[b]: the mean over layers of the mean off-diagonal linear CKA, for each resample;
    `features`: {layer: [k tensors [m, d]]}."""
    per_layer = []
    for members in features.values():
        grams = []
        for x in members:
            x = x.double()
            x = x - x.mean(0)  # HSIC is shift-invariant; centring first keeps its three terms from cancelling
            grams.append(x @ x.T)
        hsic = weighted_hsic(grams, counts)
        diagonal = torch.diagonal(hsic, dim1=1, dim2=2)
        cka = hsic / torch.sqrt(diagonal[:, :, None] * diagonal[:, None, :])
        k = cka.shape[1]
        per_layer.append((cka.sum((1, 2)) - torch.diagonal(cka, dim1=1, dim2=2).sum(1)) / (k * (k - 1)))
    stacked = torch.stack(per_layer, 1)  # [b, layers]; a layer that is NaN in a resample is left out of its mean
    return torch.nanmean(stacked, 1)


def cka_interval(features: dict, n: int, split: str, estimate: float | None, of: int | None = None) -> dict:
    """The interval entry of CKA's mean over layers on `split`, from features of its first m ≤ n examples."""
    return cka_entry(cka_resamples(features, n, split, estimate), n, len(next(iter(features.values()))[0]), of)


def cka_entry(resampled: tuple, n: int, m: int, of: int | None = None) -> dict:
    """The interval entry of CKA's mean from `cka_resamples`' (estimate, resamples [R]), m of n examples kept."""
    estimate, values = resampled
    entry = B.interval(estimate, values, n, "basic", of=of, bounds=(0.0, 1.0))
    if m < n:
        entry["method"] += f" on the first {m:,} of the {n:,} examples, bias and spread scaled to {n:,}"
    return entry


def cka_resamples(features: dict, n: int, split: str, estimate: float | None) -> tuple[float | None, torch.Tensor]:
    """(the estimate, its resamples [R]) of CKA's mean over layers on n examples of `split`, from the
    features of its first m ≤ n (`features`: {layer: [k tensors [m, d]]}); where m < n, the first m's
    resamples with their bias scaled by m/n and their spread by √(m/n) about `estimate`."""
    m = len(next(iter(features.values()))[0])
    count = min(CKA_RESAMPLES, B.resamples_for(m))
    block = max(1, B.BLOCK_ENTRIES // (m * m))  # the [m, m] @ [m, b] products' working set
    values = []
    generator = torch.Generator().manual_seed(B.seed_of(split, m))
    for start in range(0, count, block):
        rows = torch.randint(0, m, (min(block, count - start), m), generator=generator)
        values.append(resampled_cka(features, B.counts_of(rows, m)))
    values = torch.cat(values)
    ones = resampled_cka(features, torch.ones(1, m, dtype=torch.float64))[0].item()
    if m < n and estimate is not None and math.isfinite(ones):
        finite = values[torch.isfinite(values)]
        centre = finite.mean()
        bias = (centre - ones) * m / n  # bias ∝ 1/n, spread ∝ 1/√n: the first m's resamples scaled to n
        values = estimate + bias + (values - centre) * math.sqrt(m / n)
    return (estimate if m < n else ones), values
