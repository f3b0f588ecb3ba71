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


def _interpolate(t, values):
    """Linear interpolation of i/(len − 1) ↦ values[..., i] at t ∈ [0, 1]."""
    size = values.shape[-1]
    step = 1 / (size - 1)
    index = np.clip((t * (size - 1)).astype(int), 0, size - 2)
    weight = (t - index * step) / step
    return values[..., index] * (1 - weight) + values[..., index + 1] * weight


class _Smoother:
    """Gaussian smoothing of rows of grid weights, many widths at once, as scipy's fftconvolve
    computes it (reflected: "valid" on the grid reflected at both ends; else numpy's "same"):
    each grid size's row spectra are computed once and each distinct width's kernel spectrum
    once, so a bisection over widths costs one inverse transform per row and step. `grids`:
    (positions, weights [rows, n]), whose grids are made per size."""

    def __init__(self, grids, reflect: bool = True):
        self.grids, self.reflect, self.spectra = grids, reflect, {}

    def _spectrum(self, points):
        from scipy import fft
        from scipy.sparse import csr_matrix
        if points not in self.spectra:
            # each weight split linearly between the grid points i/(points − 1) on either side of it: weights
            positions, weights = self.grids  # [rows, n] -> [rows, points], every row in one sparse product
            scaled = positions * (points - 1)
            index = np.clip(scaled.astype(int), 0, points - 2)
            fraction = scaled - index
            n = len(positions)
            split = csr_matrix((np.concatenate([1 - fraction, fraction]),
                                (np.tile(np.arange(n), 2), np.concatenate([index, index + 1]))), shape=(n, points))
            grid = np.asarray(weights @ split)
            signal = np.concatenate([grid[:, ::-1][:, :-1], grid, grid[:, ::-1][:, 1:]], 1) if self.reflect else grid
            size = fft.next_fast_len(signal.shape[1] + points - 1, True)
            self.spectra[points] = fft.rfft(signal, size, axis=1), size
        return self.spectra[points]

    def sums(self, rows, widths):
        """Yields (positions in `rows`, [len, points] smoothed grid) per grid size."""
        from scipy import fft
        sizes = np.array([max(2000, round(20 / width)) // 2 + 1 for width in widths])  # grid points (module docstring)
        for points in np.unique(sizes):
            chosen = np.flatnonzero(sizes == points)
            spectrum, size = self._spectrum(points)
            distinct, which = np.unique(widths[chosen], return_inverse=True)
            t, width = np.linspace(0, 1, points)[None], distinct[:, None]
            kernels = fft.rfft(np.exp(-(t - 0.5) ** 2 / (2 * width ** 2)) / (math.sqrt(2 * math.pi) * width), size, axis=1)
            full = fft.irfft(spectrum[rows[chosen]] * kernels[which.reshape(-1)], size, axis=1)
            start = points - 1 + points // 2 if self.reflect else (points - 1) // 2  # "valid", then the centre
            yield chosen, full[:, start:start + points]


def _kernel_sums(smoother: _Smoother, rows, count: int, widths):
    """Yields (positions in `rows`, Σ_i w_i K, Σ_i w_i r_i K) from a smoother over the stacked
    weights [w; w·r] of `count` rows."""
    stacked = np.concatenate([rows, rows + count])
    for chosen, smoothed in smoother.sums(stacked, np.concatenate([widths, widths])):
        half = chosen < len(rows)
        yield chosen[half], smoothed[half], smoothed[~half]


def _logit_mesh(points):
    inner = np.linspace(0, 1, points)[1:-1]
    return inner, np.log(inner / (1 - inner))


class _Rows:
    """smECE of rows of example weights [rows, n] (a row of ones: the examples as given), each at
    its own σ. Reflected: the Gaussian on [0, 1], reflected at both ends. Logit: the Gaussian in
    log-odds, its width σ·4 over the log-odds range of the examples a row weights (rows are taken
    in groups of one range) and the mesh's, not reflected, the density carried back by the
    Jacobian 1/(t(1 − t)). The weighted grids' spectra are kept between calls (the bisection)."""

    def __init__(self, f, y, kernel: str, weights):
        self.f, self.kernel, self.weights = f, kernel, weights
        self.stacked = np.concatenate([weights, weights * (f - y)])
        self.smoother = _Smoother((f, self.stacked)) if kernel == "reflected" else None

    def at(self, rows, sigmas) -> np.ndarray:
        meshes = np.array([max(round(10 / sigma), MESH_POINTS) for sigma in sigmas])
        values = np.empty(len(rows))
        if self.kernel == "reflected":
            for chosen, density_sum, residual_sum in _kernel_sums(self.smoother, rows, len(self.weights), sigmas):
                for points in np.unique(meshes[chosen]):
                    part = meshes[chosen] == points
                    t = np.linspace(0, 1, points)
                    density = _interpolate(t, density_sum[part]) + FLOOR
                    gap = _interpolate(t, residual_sum[part]) / density
                    values[chosen[part]] = np.sum(np.abs(gap) * density, 1) / np.sum(density, 1)
            return values
        clipped = np.clip(self.f, 0.001, 0.999)
        logit_f = np.log(clipped / (1 - clipped))
        drawn = self.weights[rows] > 0
        low, high = np.where(drawn, logit_f, np.inf).min(1), np.where(drawn, logit_f, -np.inf).max(1)
        for points in np.unique(meshes):
            _, logit_t = _logit_mesh(points)
            chosen = meshes == points
            low[chosen], high[chosen] = np.minimum(low[chosen], logit_t.min()), np.maximum(high[chosen], logit_t.max())
        widths = sigmas * 4 / (high - low)
        count = len(self.weights)
        for lo, hi in np.unique(np.stack([low, high], 1), axis=0):
            group = np.flatnonzero((low == lo) & (high == hi))
            picked = np.concatenate([rows[group], rows[group] + count])
            smoother = _Smoother(((logit_f - lo) / (hi - lo), self.stacked[picked]), reflect=False)
            for local, density_sum, residual_sum in _kernel_sums(smoother, np.arange(len(group)), len(group), widths[group]):
                chosen = group[local]
                for points in np.unique(meshes[chosen]):
                    part = meshes[chosen] == points
                    inner, logit_t = _logit_mesh(points)
                    at = (logit_t - lo) / (hi - lo)
                    density = _interpolate(at, density_sum[part]) + FLOOR
                    ratio = _interpolate(at, residual_sum[part]) / density
                    density = density / (inner * (1 - inner))
                    density = density * len(self.f) * points / density.sum(1, keepdims=True)
                    ratio = np.concatenate([ratio[:, :1], ratio, ratio[:, -1:]], 1)
                    density = np.concatenate([density[:, :1], density, density[:, -1:]], 1)
                    values[chosen[part]] = np.sum(np.abs(ratio) * density, 1) / np.sum(density, 1)
        return values


def _bandwidths(f, y, kernel: str, weights, rows: _Rows | None = None) -> np.ndarray:
    """σ* of each row, by the authors' bisection, every row's step in one pass."""
    rows = rows or _Rows(f, y, kernel, weights)
    every = np.arange(len(weights))
    wide = rows.at(every, np.ones(len(weights))) > 1.0  # σ = 1 is too small: σ* = 1
    low, high = np.zeros(len(weights)), np.ones(len(weights))
    for _ in range(SEARCH_STEPS):
        middle = (high + low) / 2
        small = ~wide & (middle < SMALLEST_BANDWIDTH)
        checked = ~wide & ~small
        small[checked] = middle[checked] < rows.at(every[checked], middle[checked])
        low, high = np.where(small, middle, low), np.where(small, high, middle)
    return np.where(wide, 1.0, high)


def smooth_ece_at(confidence, correct, sigma: float, kernel: str = "reflected") -> float:
    """smECE_σ at a fixed bandwidth σ (arrays or tensors of N confidences and 0/1 correctness)."""
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    return float(_Rows(f, y, kernel, np.ones((1, len(f)))).at(np.arange(1), np.array([sigma], dtype=np.float64))[0])


def bandwidth(confidence, correct, kernel: str = "reflected") -> float:
    """σ*, the fixed point smECE_σ = σ, by the authors' bisection (module docstring); NaN for no
    samples or an undefined confidence."""
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    if len(f) == 0 or not np.isfinite(f).all():
        return math.nan
    return float(_bandwidths(f, y, kernel, np.ones((1, len(f))))[0])


def smooth_ece(confidence, correct, w=None, kernel: str = "reflected"):
    """smECE at σ* of the examples under weights w (weighted.py: None, [n] or counts [b, n]): a
    0-d tensor, or [b]. A weighted example weighs w in every kernel sum, which is what repeating it
    w times gives; NaN for no examples or a weighting that gives an undefined confidence weight."""
    import torch
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    single = w is None or np.ndim(w) == 1
    weights = np.ones((1, len(f))) if w is None else np.asarray(w, dtype=np.float64).reshape(-1, len(f))
    values = np.full(len(weights), math.nan)
    finite = np.isfinite(f)
    defined = ~(weights[:, ~finite] > 0).any(1) & (weights.sum(1) > 0)
    if defined.any():
        f, y, kept = f[finite], np.nan_to_num(y[finite]), weights[defined][:, finite]
        if len(kept) == 1:  # (np.unique over rows makes a structured type of n fields: slow for one row of many)
            distinct, inverse = kept, np.zeros(1, dtype=np.int64)
        else:
            distinct, inverse = np.unique(kept, axis=0, return_inverse=True)  # few examples: resamples repeat
        rows = _Rows(f, y, kernel, distinct)
        values[defined] = rows.at(np.arange(len(distinct)), _bandwidths(f, y, kernel, distinct, rows))[inverse.reshape(-1)]
    found = torch.from_numpy(values)
    return found[0] if single else found


def smooth_reliability(confidence, correct, sigma: float, points: int = CURVE_POINTS) -> dict:
    """The smoothed reliability curve at bandwidth σ (reflected kernel) on t = 0, 1/(points−1), …, 1:
    the kernel regression of correctness on confidence, Σ K y / (Σ K + 10⁻⁴), and the density of
    the confidences δ̂(t) (integrating to about 1 over [0, 1])."""
    f, y = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    t = np.linspace(0, 1, points)
    if len(f) == 0 or not np.isfinite(f).all() or not math.isfinite(sigma):
        return {"confidence": t.tolist(), "accuracy": [math.nan] * points, "density": [math.nan] * points}
    sums = _Smoother((f, np.stack([np.ones_like(f), y]))).sums(np.arange(2), np.array([sigma, sigma], dtype=np.float64))
    smoothed = next(sums)[1]  # both rows at σ
    total, hits = _interpolate(t, smoothed)
    return {"confidence": t.tolist(), "accuracy": (hits / (total + FLOOR)).tolist(),
            "density": (total / len(f)).tolist()}
