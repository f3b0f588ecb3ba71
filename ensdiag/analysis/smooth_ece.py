"""SmoothECE (Błasiok & Nakkiran 2023, "Smooth ECE: Principled Reliability Diagrams via Kernel
Smoothing"): the calibration error of a kernel-smoothed reliability curve, with no bins.

For confidences f_i ∈ [0, 1] and correctness y_i ∈ {0, 1}, with a Gaussian kernel K_σ reflected
at 0 and 1 (so that no mass leaks out of [0, 1]):

    r̂(t) = Σ_i K_σ(t, f_i)(f_i − y_i) / Σ_i K_σ(t, f_i),   δ̂(t) = (1/N) Σ_i K_σ(t, f_i),
    smECE_σ = ∫₀¹ |r̂(t)| δ̂(t) dt.

**Bandwidth.** smECE_σ falls as σ grows, so there is one σ* with smECE_σ* = σ*, the authors'
choice: the smoothing is as wide as the error it measures. It is found as their package
`relplot` does: σ = 1 if smECE_1 > 1, else ten bisection steps on [0, 1], keeping the smallest
σ tried with σ ≥ smECE_σ (so σ* to within 2⁻¹⁰; every σ below 0.001 counts as too small).

**Discretisation** (the authors' numerics, so that the values equal relplot's to float
rounding): each (f_i, w_i) is split linearly between the two nearest points of a grid of
max(2000, round(20/σ))//2 + 1 points on [0, 1]; the grid is reflected at both ends and
convolved with the Gaussian density; values between grid points are interpolated linearly; the
integral is the mean over a mesh of max(round(10/σ), 200) points, Σ |r̂| δ̂ / Σ δ̂, with 10⁻⁴
added to the kernel sum in δ̂ and in r̂'s denominator (against empty regions).

`kernel="logit"`: torch-uncertainty's default instead (and relplot's option): the Gaussian in
the log-odds of f (clipped to [0.001, 0.999]), its width σ measured on the log-odds range of
the data and the mesh mapped to [0, 1], not reflected, the density carried back by the
Jacobian 1/(t(1 − t)).
"""

import math

import numpy as np

MESH_POINTS = 200
SEARCH_STEPS = 10
SMALLEST_BANDWIDTH = 0.001
FLOOR = 1e-4  # added to the kernel sums (relplot's eps)
CURVE_POINTS = 101  # the stored reliability curve, t = 0, 0.01, …, 1


def _to_grid(positions, weights, points):
    """Each weight split linearly between the grid points i/(points − 1) on either side of it;
    `weights` [rows, n] -> [rows, points], every row in one sparse product."""
    from scipy.sparse import csr_matrix
    scaled = positions * (points - 1)
    index = np.clip(scaled.astype(int), 0, points - 2)
    fraction = scaled - index
    n = len(positions)
    split = csr_matrix((np.concatenate([1 - fraction, fraction]), (np.tile(np.arange(n), 2),
                                                                   np.concatenate([index, index + 1]))), shape=(n, points))
    return np.asarray(weights @ split)


def _gaussian(points, sigma):
    t = np.linspace(0, 1, points)
    return np.exp(-(t - 0.5) ** 2 / (2 * sigma ** 2)) / (math.sqrt(2 * math.pi) * sigma)


def _interpolate(t, values):
    """Linear interpolation of i/(len − 1) ↦ values[..., i] at t ∈ [0, 1]."""
    size = values.shape[-1]
    step = 1 / (size - 1)
    index = np.clip((t * (size - 1)).astype(int), 0, size - 2)
    weight = (t - index * step) / step
    return values[..., index] * (1 - weight) + values[..., index + 1] * weight


def _smoothed(positions, weights, t, sigma, reflect=True):
    """Σ_i w_i K_σ(t, f_i) on the grid, at the points t, for each row of `weights` [rows, n]."""
    from scipy.signal import fftconvolve  # here: importing scipy.signal costs every `import ensdiag.analysis`
    points = max(2000, round(20 / sigma)) // 2 + 1
    grid, kernel = _to_grid(positions, weights, points), _gaussian(points, sigma)[None]
    if reflect:
        extended = np.concatenate([grid[:, ::-1][:, :-1], grid, grid[:, ::-1][:, 1:]], 1)
        smoothed = fftconvolve(extended, kernel, mode="valid", axes=1)[:, points // 2:points // 2 + points]
    else:  # numpy's "same": the full convolution from (points − 1) // 2
        smoothed = fftconvolve(grid, kernel, mode="full", axes=1)[:, (points - 1) // 2:(points - 1) // 2 + points]
    return _interpolate(t, smoothed)


def _reflected(f, residual, t, sigma, weights):
    """(r̂(t), δ̂(t) up to a constant) per row of example weights, with the reflected kernel."""
    density = _smoothed(f, weights, t, sigma) + FLOOR
    return _smoothed(f, weights * residual, t, sigma) / density, density


def _logit(f, residual, t, sigma, weights):
    """(r̂(t), δ̂(t) up to a constant) with the Gaussian in log-odds space (torch-uncertainty's
    default). Its log-odds range is that of the examples a row weights, so rows are taken in
    groups of one range."""
    inner = t[1:-1]
    clipped = np.clip(f, 0.001, 0.999)
    logit_t, logit_f = np.log(inner / (1 - inner)), np.log(clipped / (1 - clipped))
    drawn = weights > 0
    low = np.minimum(np.where(drawn, logit_f, np.inf).min(1), logit_t.min())
    high = np.maximum(np.where(drawn, logit_f, -np.inf).max(1), logit_t.max())
    ratio, density = np.empty((len(weights), len(inner))), np.empty((len(weights), len(inner)))
    for lo, hi in np.unique(np.stack([low, high], 1), axis=0):
        rows = (low == lo) & (high == hi)
        at, of, width = (logit_t - lo) / (hi - lo), (logit_f - lo) / (hi - lo), sigma * 4 / (hi - lo)
        density[rows] = _smoothed(of, weights[rows], at, width, reflect=False) + FLOOR
        ratio[rows] = _smoothed(of, weights[rows] * residual, at, width, reflect=False) / density[rows]
    density = density / (inner * (1 - inner))
    density = density * len(f) * len(t) / density.sum(1, keepdims=True)
    return np.concatenate([ratio[:, :1], ratio, ratio[:, -1:]], 1), np.concatenate([density[:, :1], density,
                                                                                  density[:, -1:]], 1)


def _at(f, y, sigma: float, kernel: str, weights) -> np.ndarray:
    """smECE_σ of each row of example weights [rows, n] (a row of ones: the examples as given)."""
    t = np.linspace(0, 1, max(round(10 / sigma), MESH_POINTS))
    gap, density = (_reflected if kernel == "reflected" else _logit)(f, f - y, t, sigma, weights)
    return np.sum(np.abs(gap) * density, 1) / np.sum(density, 1)


def _bandwidths(f, y, kernel: str, weights) -> np.ndarray:
    """σ* of each row, by the authors' bisection; rows at the same σ in a step are computed together."""
    wide = _at(f, y, 1.0, kernel, weights) > 1.0  # σ = 1 is too small: σ* = 1
    low, high = np.zeros(len(weights)), np.ones(len(weights))
    for _ in range(SEARCH_STEPS):
        middle = (high + low) / 2
        small = np.zeros(len(weights), dtype=bool)
        for sigma in np.unique(middle[~wide]):
            rows = ~wide & (middle == sigma)
            small[rows] = True if sigma < SMALLEST_BANDWIDTH else sigma < _at(f, y, sigma, kernel, weights[rows])
        low, high = np.where(small, middle, low), np.where(small, high, middle)
    return np.where(wide, 1.0, high)


def smooth_ece_at(confidence, correct, sigma: float, kernel: str = "reflected") -> float:
    """smECE_σ at a fixed bandwidth σ (arrays or tensors of N confidences and 0/1 correctness)."""
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    return float(_at(f, y, sigma, kernel, np.ones((1, len(f))))[0])


def bandwidth(confidence, correct, kernel: str = "reflected") -> float:
    """σ*, the fixed point smECE_σ = σ, by the authors' bisection (module docstring)."""
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    return float(_bandwidths(f, y, kernel, np.ones((1, len(f))))[0])


def smooth_ece(confidence, correct, kernel: str = "reflected") -> dict:
    """{"value": smECE at σ*, "bandwidth": σ*}; NaN for no samples or an undefined confidence."""
    f = np.asarray(confidence, dtype=np.float64)
    if len(f) == 0 or not np.isfinite(f).all():
        return {"value": math.nan, "bandwidth": math.nan}
    sigma = bandwidth(f, correct, kernel)
    return {"value": smooth_ece_at(f, correct, sigma, kernel), "bandwidth": sigma}


def smooth_ece_resampled(confidence, correct, counts, kernel: str = "reflected") -> np.ndarray:
    """`smooth_ece(...)["value"]` of each bootstrap resample, from `counts` [b, n] (how often each
    example was drawn): a drawn example weighs its count in every kernel sum, which is what
    repeating it gives; NaN for a resample that draws an undefined confidence."""
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    weights = np.asarray(counts, dtype=np.float64)
    finite = np.isfinite(f)
    values = np.full(len(weights), math.nan)
    defined = ~(weights[:, ~finite] > 0).any(1) & (weights.sum(1) > 0)
    if not defined.any():
        return values
    f, y, weights = f[finite], y[finite], weights[defined][:, finite]
    sigma, found = _bandwidths(f, y, kernel, weights), np.empty(len(weights))
    for value in np.unique(sigma):
        rows = sigma == value
        found[rows] = _at(f, y, value, kernel, weights[rows])
    values[defined] = found
    return values


def smooth_reliability(confidence, correct, sigma: float, points: int = CURVE_POINTS) -> dict:
    """The smoothed reliability curve at bandwidth σ (reflected kernel) on t = 0, 1/(points−1), …, 1:
    the kernel regression of correctness on confidence, Σ K y / (Σ K + 10⁻⁴), and the density of
    the confidences δ̂(t) (integrating to about 1 over [0, 1])."""
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    t = np.linspace(0, 1, points)
    if len(f) == 0 or not np.isfinite(f).all() or not math.isfinite(sigma):
        return {"confidence": t.tolist(), "accuracy": [math.nan] * points, "density": [math.nan] * points}
    total = _smoothed(f, np.ones((1, len(f))), t, sigma)[0]
    return {"confidence": t.tolist(), "accuracy": (_smoothed(f, y[None], t, sigma)[0] / (total + FLOOR)).tolist(),
            "density": (total / len(f)).tolist()}
