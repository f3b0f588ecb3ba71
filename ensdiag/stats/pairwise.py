"""k×k matrices over pairs of members (pure functions over member logits [k, N, C], labels [N]).

Divergences between the members' predictive distributions p_i (label-free, any split), and
statistics of their errors e_i(x) = 1[argmax p_i(x) ≠ y] (labelled splits; Kuncheva & Whitaker
2003). Each is a mean over samples, in float64; a member whose prediction is undefined on some
sample (NaN logits) gets NaN in its row and column, off the diagonal.
"""

import math

import torch
import torch.nn.functional as F

from .examples import Examples, entropy

CHUNK_BYTES = 64 * 2**20  # bound on the [k, n, C] working tensor of the JSD matrix


def mark_undefined(matrix, logits, diagonal):
    """The k×k matrix with NaN off the diagonal in the rows and columns of members whose prediction is
    undefined on some sample (`Examples.undefined`), and `diagonal` on it."""
    undefined = Examples(logits, None).undefined.any(1)
    if undefined.any():
        matrix = matrix.masked_fill(undefined[:, None] | undefined[None, :], math.nan)
    return matrix.fill_diagonal_(diagonal)


def kl_matrix(logits) -> torch.Tensor:
    """K[i, j] = mean_x KL(p_i ‖ p_j) = mean_x Σ_c p_i,c (log p_i,c − log p_j,c); row i is member i
    measured against every other, so K and Kᵀ are the two directions. One matrix product:
    the cross terms Σ_x,c p_i log p_j for every pair at once. Clamped at 0 against rounding."""
    k, n = logits.shape[:2]
    log_p = F.log_softmax(logits.double(), dim=-1).reshape(k, -1)
    p = log_p.exp()
    own = torch.special.xlogy(p, p).sum(1)  # Σ p_i log p_i, with 0 log 0 = 0
    cross = p @ log_p.T
    return mark_undefined(((own[:, None] - cross) / n).clamp(min=0), logits, 0.0)


def jsd_matrix(logits) -> torch.Tensor:
    """J[i, j] = mean_x JS(p_i, p_j) = mean_x [H(m) − (H(p_i) + H(p_j))/2], m = (p_i + p_j)/2:
    symmetric, in [0, log 2], 0 on the diagonal. Clamped at 0 against rounding."""
    k, n, classes = logits.shape
    p = F.softmax(logits.double(), dim=-1)
    own = entropy(p).sum(1)  # Σ_x H(p_i)
    total = torch.zeros(k, k, dtype=torch.float64)
    step = max(1, CHUNK_BYTES // (8 * k * classes))
    for i in range(k):
        for start in range(0, n, step):
            part = p[:, start:start + step]
            total[i] += entropy((part[i] + part) / 2).sum(1)
    matrix = (total - (own[:, None] + own[None, :]) / 2) / n
    return mark_undefined(matrix.clamp(min=0), logits, 0.0)


def double_fault(logits, labels) -> torch.Tensor:
    """DF[i, j] = fraction of samples that members i and j both get wrong; DF[i, i] is member i's error
    (e [k, N]: 1 where member i's argmax is not the label, NaN where it is undefined)."""
    e = Examples(logits, labels).member_errors
    return e @ e.T / e.shape[1]


def error_correlation(logits, labels) -> torch.Tensor:
    """ρ[i, j] = Pearson correlation over samples of e_i and e_j; NaN where a member's errors do not
    vary (always right or always wrong: no correlation is defined); 1 on the diagonal."""
    e = Examples(logits, labels).member_errors
    centred = e - e.mean(1, keepdim=True)
    covariance = centred @ centred.T
    scale = covariance.diagonal().sqrt()
    return (covariance / (scale[:, None] * scale[None, :])).clamp(-1, 1).fill_diagonal_(1.0)


def yule_q(logits, labels) -> torch.Tensor:
    """Q[i, j] = (N¹¹N⁰⁰ − N¹⁰N⁰¹) / (N¹¹N⁰⁰ + N¹⁰N⁰¹), N^ab = samples where member i is right (a = 1)
    or wrong (0) and member j right (b = 1) or wrong (0) (Yule 1900; Kuncheva & Whitaker 2003):
    1 when they never err apart, −1 when they never err together; NaN where the denominator is 0;
    1 on the diagonal."""
    e = Examples(logits, labels).member_errors
    right = 1 - e
    both_right, both_wrong, only_i = right @ right.T, e @ e.T, right @ e.T  # only_i: i right, j wrong
    agree, differ = both_right * both_wrong, only_i * only_i.T
    return ((agree - differ) / (agree + differ)).fill_diagonal_(1.0)


def ambiguity(logits) -> float:
    """Krogh–Vedelsby ambiguity of the probability vectors: mean_x mean_i ‖p_i − p̄‖², the part of the
    members' mean Brier score that the arithmetic mean p̄ removes (mean_i ‖p_i − y‖² − ‖p̄ − y‖², for
    any y); equal to mean_x (1/2k²) Σ_i,j ‖p_i − p_j‖². Label-free."""
    p = F.softmax(logits.double(), dim=-1)
    return (p - p.mean(0)).pow(2).sum(-1).mean().item()
