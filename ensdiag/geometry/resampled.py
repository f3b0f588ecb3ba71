"""Example-level intervals of member geometry: barriers and CKA over resampled examples.

The model analyzers read examples too, so their numbers carry the examples' sampling error.
Both are resampled with the draws every other analyzer uses on the same examples
(`bootstrap.draws`, seeded by the split and its size):

- a barrier is the maximum over path points of a mean over test examples (each example's rise
  above the line between the ends, `paths.excess`): the per-example values of every point and
  pair are kept, and a resample is a product with its counts. A maximum folds noise into an
  upward bias, so the interval is the ray inversion (`constructions.py`). A pair's barrier is the
  least over weight matching's restarts (geometry/least.py): each resample also draws the pair's
  restarts with replacement and takes the least over the alignments they reached, so the
  interval holds the alignment's variation too;
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

from ..stats import bootstrap as B
from ..stats import constructions as CI

CKA_INTERVAL_EXAMPLES = 500  # features kept per split for CKA's interval (Gram matrices m × m; the cost grows as m²)
CKA_RESAMPLES = 300  # each costs (k + k(k+1)/2) products of m × m by the block, per layer


def barrier_interval(curves: list[tuple[list, torch.Tensor]], split: str, of: int | None = None) -> dict:
    """The interval entry of a mean over pairs of barriers; `curves`: per pair (ts, excess [points, n])
    on the same n examples of `split` (one alignment per pair: `least_barrier_interval`)."""
    return least_barrier_interval([[(values, 1)] for _, values in curves], split, of)


def barrier_entry(resampled: tuple, n: int, of: int | None = None) -> dict:
    """The interval entry of a barrier from its (estimate, resamples) on n examples."""
    estimate, values = resampled
    return CI.interval(estimate, values, n, "ray", of=of)


RESTART_DRAWS_SEED = 0  # the restarts' draws in the resamples: fixed, as every draw here


def least_barrier_resamples(pairs: list[list[tuple[torch.Tensor, int]]], split: str) -> tuple[CI.Folded, CI.Folded]:
    """(the estimate, its resamples) of a mean over pairs of the least barrier over weight matching's
    restarts, as `Folded` statistics.

    `pairs`: per pair, per distinct alignment its (excess [points, n] on the same n examples of
    `split`, how many restarts reached it); an alignment walked only part of the way gives the
    rows of the points it evaluated (a lower bound of its barrier), and pairs may have evaluated
    different points (adaptive grids): each alignment's barrier is the maximum over its own rows
    and 0 (the excess at the ends).

    Each resample draws the examples (the shared draws) and, for each pair, as many restarts as
    it ran, with replacement: the least is over the alignments drawn, so the interval carries
    what other restarts as many would have found beside the examples' sampling error."""
    n = pairs[0][0][0].shape[1]
    width = max(len(pair) for pair in pairs)
    flat = torch.cat([values for pair in pairs for values, _ in pair])  # [rows, n]: every alignment's points
    slot = torch.cat([torch.full((len(values),), index * width + a) for index, pair in enumerate(pairs)
                      for a, (values, _) in enumerate(pair)])  # the (pair, alignment) of each row
    real = torch.tensor([[a < len(pair) for a in range(width)] for pair in pairs]).flatten()

    def combine(means, draws):  # draws [R, pairs·width]: how often a resample's restarts reached each alignment
        barriers = means.new_zeros((*means.shape[:-1], len(pairs) * width))  # t = 0's excess: every barrier is ≥ 0
        barriers = barriers.scatter_reduce(-1, slot.expand(means.shape), means, "amax")  # each alignment's barrier
        drawn = (draws > 0) & real
        return barriers.masked_fill(~drawn, math.inf).unflatten(-1, (len(pairs), width)).amin(-1).mean(-1)

    count = B.resamples_for(n)
    estimate = CI.Folded(flat.mean(1), real.double(), combine)
    means = torch.cat([B.counts_of(rows, n) @ flat.T / n for _, rows in B.blocks(split, n, count)])
    return estimate, CI.Folded(means, _restart_draws(pairs, width, count).flatten(1), combine)


def least_barrier_interval(pairs: list[list[tuple[torch.Tensor, int]]], split: str, of: int | None = None) -> dict:
    """The interval entry of a mean over pairs of the least barrier over weight matching's restarts
    (`least_barrier_resamples` says what each resample draws); the ray inversion (module docstring)
    turns both the examples' and the restarts' variation into an interval."""
    entry = barrier_entry(least_barrier_resamples(pairs, split), pairs[0][0][0].shape[1], of)
    runs = [sum(reached for _, reached in pair) for pair in pairs]
    if any(len(pair) > 1 for pair in pairs):
        entry["method"] += (f"; each pair's restarts of weight matching ({'/'.join(map(str, runs))}) drawn with "
                            "replacement in every resample, the least over the alignments drawn")
    return entry


def _restart_draws(pairs, width: int, count: int) -> torch.Tensor:
    """[count, pairs, width]: how often each pair's alignments were reached by `count` resamples of its
    restarts (as many as it ran, drawn with replacement; seeded)."""
    generator = torch.Generator().manual_seed(RESTART_DRAWS_SEED)
    out = torch.zeros(count, len(pairs), width, dtype=torch.float64)
    for index, pair in enumerate(pairs):
        reached = torch.tensor([times for _, times in pair])
        if len(pair) == 1:
            out[:, index, 0] = float(reached[0])
            continue
        owner = torch.repeat_interleave(torch.arange(len(pair)), reached)  # restart -> its alignment
        drawn = owner[torch.randint(0, len(owner), (count, len(owner)), generator=generator)]
        out[:, index, :len(pair)] = torch.nn.functional.one_hot(drawn, len(pair)).sum(1).double()
    return out


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
    entry = CI.interval(estimate, values, n, "basic", of=of, bounds=(0.0, 1.0))
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
