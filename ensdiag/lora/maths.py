"""The weight-space maths of LoRA ensembles, on the factors alone: no ΔW = s·B·A is ever formed.

Member i of a layer is the update ΔW_i = s_i·B_i·A_i (B_i [m, r], A_i [r, n], s_i PEFT's scale).
Every function takes float64 tensors and returns tensors or plain numbers; nothing here reads a
file. The definitions are in docs/conventions.md ("LoRA ensembles").
"""

import math

import torch

FLOAT = torch.float64


def update_gram(A: torch.Tensor, B: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """G[i, j] = ⟨ΔW_i, ΔW_j⟩ for A [k, r, n], B [k, m, r]: s_i s_j tr((B_iᵀB_j)(A_jA_iᵀ)), which costs
    O(k²r²(m+n)) instead of the O(k²mn) of comparing the updates themselves."""
    left = torch.einsum("imr,jms->ijrs", B, B)   # B_iᵀ B_j
    right = torch.einsum("irn,jsn->ijrs", A, A)  # A_i A_jᵀ, so the sum below is tr((B_iᵀB_j)(A_jA_iᵀ))
    return (left * right).sum((2, 3)) * torch.outer(scales, scales)


def base_products(row_chunks, A: torch.Tensor, B: torch.Tensor, scales: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(‖W‖², [⟨W, ΔW_i⟩]) from W streamed as (first row, rows [c, n]) chunks: ⟨W, B_iA_i⟩ = tr(B_iᵀ W A_iᵀ)
    adds up over row blocks, so only one block of W is ever held."""
    squared, inner = 0.0, torch.zeros(A.shape[0], dtype=FLOAT)
    for start, rows in row_chunks:
        flat = rows.reshape(-1)
        squared += float(torch.dot(flat, flat))  # no temporary the size of the block
        projected = torch.einsum("cn,irn->icr", rows, A)  # W_rows A_iᵀ
        inner += (B[:, start:start + rows.shape[0], :] * projected).sum((1, 2))
    return squared, inner * scales


def effective_gram(base_squared: float, base_inner: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """⟨W+ΔW_i, W+ΔW_j⟩ = ‖W‖² + ⟨W,ΔW_i⟩ + ⟨W,ΔW_j⟩ + ⟨ΔW_i,ΔW_j⟩."""
    return base_squared + base_inner[:, None] + base_inner[None, :] + gram


def orthogonal_gram(base_squared: float, gram: torch.Tensor) -> torch.Tensor:
    """The effective-weight Gram matrix the members would have if every update were orthogonal to W
    and to the other updates: ‖W‖² off the diagonal, ‖W‖² + ‖ΔW_i‖² on it."""
    return base_squared + torch.diag(torch.diagonal(gram))


def cosines(gram: torch.Tensor) -> list[list[float | None]]:
    """gram[i, j] / √(gram[i, i] gram[j, j]); None where a vector is zero (an update still at PEFT's B = 0)."""
    norms = torch.sqrt(torch.clamp(torch.diagonal(gram), min=0))
    k = gram.shape[0]
    return [[float(torch.clamp(gram[i, j] / (norms[i] * norms[j]), -1, 1)) if norms[i] > 0 and norms[j] > 0 else None
             for j in range(k)] for i in range(k)]


def cosine_null_rms(m: int, n: int) -> float:
    """RMS cosine between an [m, n] matrix and an independent one whose singular vectors are uniformly
    random (any singular values): their second moment is δδ/(mn), so E[cos²] = 1/(mn), E[cos] = 0."""
    return 1 / math.sqrt(m * n)


def factored_svd(B: torch.Tensor, A: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U [m, ρ], σ [ρ], V [n, ρ]) with s·B·A = U diag(σ) Vᵀ and ρ its numerical rank: QR of B and of
    Aᵀ leaves a small core R_B R_Aᵀ whose SVD rotates the two orthonormal bases into singular vectors."""
    q_left, r_left = torch.linalg.qr(B)
    q_right, r_right = torch.linalg.qr(A.T)
    u, sigma, vh = torch.linalg.svd(scale * r_left @ r_right.T)
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
    """exp of the entropy of σ/‖σ‖₁ (Roy & Vetterli 2007): 1 for one direction, ρ for ρ equal ones."""
    total = float(sigma.sum())
    if total <= 0:
        return None
    p = sigma[sigma > 0] / total
    return math.exp(float(-(p * p.log()).sum()))


def mean(values) -> float | None:
    """The mean of the defined values; None when none is."""
    found = [value for value in values if value is not None]
    return sum(found) / len(found) if found else None


def off_diagonal(matrix) -> list:
    """The values above the diagonal of a k×k matrix (each pair once)."""
    return [matrix[i][j] for i in range(len(matrix)) for j in range(i + 1, len(matrix))]


def pair_matrix(k: int, value_of) -> list[list[float | None]]:
    """The symmetric k×k matrix of value_of(i, j), the diagonal included."""
    matrix = [[None] * k for _ in range(k)]
    for i in range(k):
        for j in range(i, k):
            matrix[i][j] = matrix[j][i] = value_of(i, j)
    return matrix
