"""The power law of an ensemble's loss in its size, fitted and read backwards (effective_size.py).

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

import torch

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
