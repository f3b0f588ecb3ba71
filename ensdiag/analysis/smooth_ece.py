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
    """Each weight split linearly between the grid points i/(points − 1) on either side of it."""
    scaled = positions * (points - 1)
    index = np.clip(scaled.astype(int), 0, points - 2)
    fraction = scaled - index
    grid = np.zeros(points)
    np.add.at(grid, index, (1 - fraction) * weights)
    np.add.at(grid, index + 1, fraction * weights)
    return grid


def _gaussian(points, sigma):
    t = np.linspace(0, 1, points)
    return np.exp(-(t - 0.5) ** 2 / (2 * sigma ** 2)) / (math.sqrt(2 * math.pi) * sigma)


def _interpolate(t, values):
    """Linear interpolation of i/(len − 1) ↦ values[i] at t ∈ [0, 1]."""
    step = 1 / (len(values) - 1)
    index = np.clip((t * (len(values) - 1)).astype(int), 0, len(values) - 2)
    weight = (t - index * step) / step
    return values[index] * (1 - weight) + values[index + 1] * weight


def _smoothed(positions, weights, t, sigma, reflect=True):
    """Σ_i w_i K_σ(t, f_i) on the grid, at the points t."""
    from scipy.signal import fftconvolve  # here: importing scipy.signal costs every `import ensdiag.analysis`
    points = max(2000, round(20 / sigma)) // 2 + 1
    grid, kernel = _to_grid(positions, weights, points), _gaussian(points, sigma)
    if reflect:
        extended = np.concatenate([grid[::-1][:-1], grid, grid[::-1][1:]])
        smoothed = fftconvolve(extended, kernel, mode="valid")[points // 2:points // 2 + points]
    else:  # numpy's "same": the full convolution from (points − 1) // 2
        smoothed = fftconvolve(grid, kernel, mode="full")[(points - 1) // 2:(points - 1) // 2 + points]
    return _interpolate(t, smoothed)


def _reflected(f, residual, t, sigma):
    """(r̂(t), δ̂(t) up to a constant) with the reflected kernel."""
    density = _smoothed(f, np.ones_like(f), t, sigma) + FLOOR
    return _smoothed(f, residual, t, sigma) / density, density


def _logit(f, residual, t, sigma):
    """(r̂(t), δ̂(t) up to a constant) with the Gaussian in log-odds space (torch-uncertainty's default)."""
    inner = t[1:-1]
    clipped = np.clip(f, 0.001, 0.999)
    logit_t, logit_f = np.log(inner / (1 - inner)), np.log(clipped / (1 - clipped))
    low, high = min(logit_f.min(), logit_t.min()), max(logit_f.max(), logit_t.max())
    logit_t, logit_f = (logit_t - low) / (high - low), (logit_f - low) / (high - low)
    width = sigma * 4 / (high - low)
    density = _smoothed(logit_f, np.ones_like(f), logit_t, width, reflect=False) + FLOOR
    ratio = _smoothed(logit_f, residual, logit_t, width, reflect=False) / density
    density = density / (inner * (1 - inner))
    density = density * len(f) * len(t) / density.sum()
    return np.concatenate([ratio[:1], ratio, ratio[-1:]]), np.concatenate([density[:1], density, density[-1:]])


def smooth_ece_at(confidence, correct, sigma: float, kernel: str = "reflected") -> float:
    """smECE_σ at a fixed bandwidth σ (arrays or tensors of N confidences and 0/1 correctness)."""
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    t = np.linspace(0, 1, max(round(10 / sigma), MESH_POINTS))
    gap, density = (_reflected if kernel == "reflected" else _logit)(f, f - y, t, sigma)
    return float(np.sum(np.abs(gap) * density) / np.sum(density))


def bandwidth(confidence, correct, kernel: str = "reflected") -> float:
    """σ*, the fixed point smECE_σ = σ, by the authors' bisection (module docstring)."""
    def too_small(sigma):
        return sigma < SMALLEST_BANDWIDTH or sigma < smooth_ece_at(confidence, correct, sigma, kernel)

    if too_small(1.0):
        return 1.0
    high, low = 1.0, 0.0
    for _ in range(SEARCH_STEPS):
        middle = (high + low) / 2
        if too_small(middle):
            low = middle
        else:
            high = middle
    return high


def smooth_ece(confidence, correct, kernel: str = "reflected") -> dict:
    """{"value": smECE at σ*, "bandwidth": σ*}; NaN for no samples or an undefined confidence."""
    f = np.asarray(confidence, dtype=np.float64)
    if len(f) == 0 or not np.isfinite(f).all():
        return {"value": math.nan, "bandwidth": math.nan}
    sigma = bandwidth(f, correct, kernel)
    return {"value": smooth_ece_at(f, correct, sigma, kernel), "bandwidth": sigma}


def smooth_reliability(confidence, correct, sigma: float, points: int = CURVE_POINTS) -> dict:
    """The smoothed reliability curve at bandwidth σ (reflected kernel) on t = 0, 1/(points−1), …, 1:
    the kernel regression of correctness on confidence, Σ K y / (Σ K + 10⁻⁴), and the density of
    the confidences δ̂(t) (integrating to about 1 over [0, 1])."""
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    t = np.linspace(0, 1, points)
    if len(f) == 0 or not np.isfinite(f).all() or not math.isfinite(sigma):
        return {"confidence": t.tolist(), "accuracy": [math.nan] * points, "density": [math.nan] * points}
    total = _smoothed(f, np.ones_like(f), t, sigma)
    return {"confidence": t.tolist(), "accuracy": (_smoothed(f, y, t, sigma) / (total + FLOOR)).tolist(),
            "density": (total / len(f)).tolist()}
