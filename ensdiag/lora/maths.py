"""The weight-space maths of LoRA ensembles, on the factors alone: no ΔW = s·B·A is ever formed
where it would be larger than its factors.

Member i of a layer is the update ΔW_i = s_i·B_i·A_i (B_i [m, r], A_i [r, n], s_i PEFT's scale).
Every function takes float64 tensors and returns tensors or plain numbers; nothing here reads a
file. The definitions are in docs/conventions.md ("LoRA ensembles").

Scale invariance: the factors are normalised first (`unit_factors`), each update carried as a
unit-size direction and the logarithm of its size, and sums over layers are held relative to the
largest size seen (`ScaledGram`). A cosine, an overlap or an effective rank never depends on
the scale s = α/r or on how large the factors' entries are, and here it never meets a product of
scales either: α = 1e308 or 5e-324 gives the cosine of α = 8, where s² would overflow to inf or
underflow to 0 first.
"""

import math
from itertools import combinations, combinations_with_replacement

import torch

from ..budget import require

FLOAT = torch.float64
BYTES = 8  # float64


def layer_bytes(k: int, m: int, n: int, rank: int) -> int:
    """What one adapted layer's maths holds at once, for the budget: the k members' factors (read and
    normalised), their singular bases, and the Gram matrix's largest intermediate (`unit_gram`)."""
    factors = 2 * k * rank * (m + n)
    bases = k * (m + n) * min(rank, m, n)
    return BYTES * (factors + bases + 3 * k * min(rank * rank, m * n))


def _peak_and_norm(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max |x_i|, ‖x_i / max |x_i|‖_F) per member of x [k, …]: the Frobenius norm is their product,
    computed without squaring entries that could overflow or underflow."""
    peak = x.abs().flatten(1).amax(dim=1)
    scaled = x / torch.where(peak > 0, peak, 1).reshape(-1, *[1] * (x.dim() - 1))
    return peak, torch.linalg.vector_norm(scaled.flatten(1), dim=1)


def unit_factors(A: torch.Tensor, B: torch.Tensor, log_scales: torch.Tensor):
    """(Ã, B̃, log size) for A [k, r, n], B [k, m, r] and log |s_i|: |s_i|·B_i·A_i = e^{log size_i}·B̃_i·Ã_i
    with ‖Ã_i‖_F = ‖B̃_i‖_F = 1 (zero factors stay zero, their log size −inf). The sign of s_i is the
    caller's (`signs` below)."""
    peak_a, norm_a = _peak_and_norm(A)
    peak_b, norm_b = _peak_and_norm(B)
    zero = (peak_a == 0) | (peak_b == 0)
    one = torch.ones_like(peak_a)
    unit_a = A / torch.where(zero, one, peak_a)[:, None, None] / torch.where(zero, one, norm_a)[:, None, None]
    unit_b = B / torch.where(zero, one, peak_b)[:, None, None] / torch.where(zero, one, norm_b)[:, None, None]
    logs = log_scales + sum(torch.log(torch.where(zero, one, value)) for value in (peak_a, norm_a, peak_b, norm_b))
    unit_a[zero], unit_b[zero] = 0, 0
    return unit_a, unit_b, torch.where(zero, -math.inf, logs)


def unit_gram(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """G[i, j] = ⟨B_iA_i, B_jA_j⟩ for A [k, r, n], B [k, m, r], by whichever exact way holds less:
    tr((B_iᵀB_j)(A_jA_iᵀ)) one row of G at a time (k r×r blocks, O(k²r²(m+n)) work), or the k products
    B_iA_i themselves (k·m·n numbers) when they are smaller than r×r (a rank above the layer's size).
    Never the [k, k, r, r] block of every pair; its size is checked against the memory budget."""
    k, m, rank = B.shape
    n = A.shape[2]
    if m * n <= rank * rank:
        require(BYTES * 2 * k * m * n, f"the LoRA updates of a {m}×{n} layer (k = {k})")
        flat = torch.bmm(B, A).reshape(k, m * n)
        return flat @ flat.T
    require(BYTES * 3 * k * rank * rank, f"the LoRA Gram blocks of rank {rank} (k = {k})")
    gram = torch.empty(k, k, dtype=FLOAT)
    for i in range(k):
        left = torch.einsum("mr,jms->jrs", B[i], B)   # B_iᵀ B_j
        right = torch.einsum("rn,jsn->jrs", A[i], A)  # A_i A_jᵀ, so the sum below is tr((B_iᵀB_j)(A_jA_iᵀ))
        gram[i] = (left * right).sum((1, 2))
    return gram


def _ratio(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """e^{a − b}, 0 where a = −inf (then b, a maximum over a, may be −inf too)."""
    return torch.where(torch.isneginf(log_a), 0.0, torch.exp(log_a - torch.where(torch.isneginf(log_b), 0.0, log_b)))


class ScaledGram:
    """A Gram matrix of vectors v_0…v_{d−1} summed over layers, Σ_l ⟨v_il, v_jl⟩, held as
    e^{M_i + M_j}·T_ij with M_i the largest log size of v_i seen: no product of sizes is ever
    formed. `add(unit, log_size)` adds one layer whose vectors are e^{log_size_i}·u_i with
    unit[i, j] = ⟨u_i, u_j⟩."""

    def __init__(self, size: int):
        self.total = torch.zeros(size, size, dtype=FLOAT)
        self.log_scale = torch.full((size,), -math.inf, dtype=FLOAT)

    def add(self, unit: torch.Tensor, log_size: torch.Tensor):
        scale = torch.maximum(self.log_scale, log_size)
        keep, take = _ratio(self.log_scale, scale), _ratio(log_size, scale)
        self.total = self.total * torch.outer(keep, keep) + unit * torch.outer(take, take)
        self.log_scale = scale

    def norms(self) -> list[float | None]:
        """‖v_i‖ over all layers; None where it is beyond float64 (a scale near 1e308)."""
        return [_exp(float(log) + 0.5 * math.log(float(square))) if square > 0 else 0.0
                for log, square in zip(self.log_scale, torch.diagonal(self.total))]


def _exp(log: float) -> float | None:
    try:
        return math.exp(log)
    except OverflowError:
        return None


def cosines(gram: torch.Tensor) -> list[list[float | None]]:
    """gram[i, j] / √(gram[i, i] gram[j, j]); None where a vector is zero (an update still at PEFT's B = 0).
    The same for any rescaling D·gram·D, so a `ScaledGram`'s total gives its cosines."""
    norms = torch.sqrt(torch.clamp(torch.diagonal(gram), min=0))
    k = gram.shape[0]
    return [[float(torch.clamp(gram[i, j] / norms[i] / norms[j], -1, 1)) if norms[i] > 0 and norms[j] > 0 else None
             for j in range(k)] for i in range(k)]


def null_cosines(delta: ScaledGram, null: ScaledGram) -> list[float | None]:
    """Over member pairs i < j: √(Σ_l ‖ΔW_il‖²‖ΔW_jl‖²/(m_l n_l)) / (‖ΔW_i‖‖ΔW_j‖), the RMS cosine of
    updates with independent random singular vectors; `null` sums the numerator's terms, with log
    sizes twice the updates'."""
    gram, diagonal = null.total, torch.diagonal(delta.total)
    found = []
    for i, j in combinations(range(gram.shape[0]), 2):
        if diagonal[i] > 0 and diagonal[j] > 0 and gram[i, j] > 0:
            log = 0.5 * float(null.log_scale[i] + null.log_scale[j]) - float(delta.log_scale[i] + delta.log_scale[j])
            found.append(_exp(log + 0.5 * math.log(float(gram[i, j] / diagonal[i] / diagonal[j]))))
        else:
            found.append(None)
    return found


def base_products(row_chunks, A: torch.Tensor, B: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(log ‖W‖, [⟨W/‖W‖, B_iA_i⟩]) from W streamed as (first row, rows [c, n]) chunks: ⟨W, B_iA_i⟩ =
    tr(B_iᵀ W A_iᵀ) adds up over row blocks, so only one block of W is ever held. Each block is
    divided by its largest entry and the sums kept relative to the largest so far, so no square of
    an entry (a float64 base of 1e200) overflows. log ‖W‖ = −inf for W = 0."""
    log_peak, squares, inner = -math.inf, 0.0, torch.zeros(A.shape[0], dtype=FLOAT)
    for start, rows in row_chunks:
        peak = float(rows.abs().max()) if rows.numel() else 0.0
        if peak == 0:
            continue
        scaled = rows / peak
        flat = scaled.reshape(-1)
        block_squares = float(torch.dot(flat, flat))  # no temporary the size of the block
        projected = torch.einsum("cn,irn->icr", scaled, A)  # W_rows A_iᵀ
        block_inner = (B[:, start:start + rows.shape[0], :] * projected).sum((1, 2))
        log = math.log(peak)
        if log > log_peak:  # the running sums move to the new, larger unit
            shrink = math.exp(log_peak - log) if log_peak > -math.inf else 0.0
            squares, inner, log_peak = squares * shrink * shrink, inner * shrink, log
        grow = math.exp(log - log_peak)
        squares, inner = squares + block_squares * grow * grow, inner + block_inner * grow
    if squares <= 0:
        return -math.inf, inner * 0
    return log_peak + 0.5 * math.log(squares), inner / math.sqrt(squares)


def with_base(joint: ScaledGram) -> tuple[torch.Tensor, torch.Tensor]:
    """(effective, orthogonal) Gram matrices of the members, each rescaled (cosines unchanged), from
    a `ScaledGram` of [W, ΔW_1, …, ΔW_k]: effective ⟨W+ΔW_i, W+ΔW_j⟩ = ‖W‖² + ⟨W,ΔW_i⟩ + ⟨W,ΔW_j⟩ +
    ⟨ΔW_i,ΔW_j⟩; orthogonal: what it would be if every update were orthogonal to W and to the other
    updates (‖W‖² off the diagonal, ‖W‖² + ‖ΔW_i‖² on it). Row i is divided by e^{max(M_W, M_i)}."""
    total, log = joint.total, joint.log_scale
    unit = torch.maximum(log[0], log[1:])
    w, d = _ratio(log[0].expand_as(unit), unit), _ratio(log[1:], unit)  # e^{M_W − μ_i}, e^{M_i − μ_i}
    cross = total[0, 1:]
    effective = (total[0, 0] * torch.outer(w, w) + torch.outer(w, d) * cross[None, :] + torch.outer(d, w) * cross[:, None]
                 + torch.outer(d, d) * total[1:, 1:])
    orthogonal = total[0, 0] * torch.outer(w, w) + torch.diag(d * d * torch.diagonal(total)[1:])
    return effective, orthogonal


def relative_norms(joint: ScaledGram) -> list[float | None]:
    """‖ΔW_i‖/‖W‖ from a `ScaledGram` of [W, ΔW_1, …]; None for W = 0 or beyond float64."""
    total, log = joint.total, joint.log_scale
    if not total[0, 0] > 0:
        return [None] * (total.shape[0] - 1)
    return [_exp(float(log[i] - log[0]) + 0.5 * math.log(float(total[i, i] / total[0, 0]))) if total[i, i] > 0 else 0.0
            for i in range(1, total.shape[0])]


def factored_svd(B: torch.Tensor, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U [m, ρ], σ [ρ], V [n, ρ]) with B·A = U diag(σ) Vᵀ and ρ its numerical rank: QR of B and of
    Aᵀ leaves a small core R_B R_Aᵀ whose SVD rotates the two orthonormal bases into singular vectors.
    Pass unit factors (`unit_factors`) and the rank and bases never depend on the entries' size."""
    q_left, r_left = torch.linalg.qr(B)
    q_right, r_right = torch.linalg.qr(A.T)
    u, sigma, vh = torch.linalg.svd(r_left @ r_right.T)
    tolerance = (sigma.max() if sigma.numel() else 0.0) * max(B.shape[0], A.shape[1]) * torch.finfo(FLOAT).eps
    rank = int((sigma > tolerance).sum()) if sigma.numel() and sigma.max() > 0 else 0
    return q_left @ u[:, :rank], sigma[:rank], q_right @ vh[:rank].T


def principal_cosines(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Cosines of the principal angles between the spans of two orthonormal bases, largest first."""
    return torch.clamp(torch.linalg.svdvals(first.T @ second), max=1.0)


def overlap(first: torch.Tensor, second: torch.Tensor) -> float | None:
    """Mean cos² of the principal angles: ‖Q_iᵀQ_j‖²_F / min(ρ_i, ρ_j) (1: one span holds the other;
    None for an empty span)."""
    smaller = min(first.shape[1], second.shape[1])
    return float((first.T @ second).square().sum()) / smaller if smaller else None


def overlap_null(rank_i: int, rank_j: int, dimension: int) -> float | None:
    """E[mean cos²] of independent uniformly random subspaces of R^dimension of these ranks:
    E‖P_iP_j‖²_F = ρ_iρ_j/dimension, divided by min(ρ_i, ρ_j)."""
    return max(rank_i, rank_j) / dimension if min(rank_i, rank_j) else None


def effective_rank(sigma: torch.Tensor) -> float | None:
    """exp of the entropy of σ/‖σ‖₁ (Roy & Vetterli 2007): 1 for one direction, ρ for ρ equal ones.
    σ is divided by its largest value first, so its size does not matter."""
    if not sigma.numel() or not sigma.max() > 0 or not torch.isfinite(sigma).all():
        return None
    scaled = sigma / sigma.max()
    p = scaled[scaled > 0] / scaled.sum()
    return math.exp(float(-(p * p.log()).sum()))


def mean(values) -> float | None:
    """The mean of the defined values; None when none is."""
    found = [value for value in values if value is not None]
    return sum(found) / len(found) if found else None


def off_diagonal(matrix) -> list:
    """The values above the diagonal of a k×k matrix (each pair once)."""
    return [matrix[i][j] for i, j in combinations(range(len(matrix)), 2)]


def pair_matrix(k: int, value_of) -> list[list[float | None]]:
    """The symmetric k×k matrix of value_of(i, j), the diagonal included."""
    matrix = [[None] * k for _ in range(k)]
    for i, j in combinations_with_replacement(range(k), 2):
        matrix[i][j] = matrix[j][i] = value_of(i, j)
    return matrix
