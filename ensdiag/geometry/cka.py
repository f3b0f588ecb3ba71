"""Centered kernel alignment (CKA) between members' representations, streamed in batches.

Linear CKA (Kornblith et al. 2019) of representations X [n, d] and Y [n, d'] with features
centred over the n examples:

    CKA(X, Y) = ‖YᵀX‖²_F / (‖XᵀX‖_F · ‖YᵀY‖_F)

The debiased estimator replaces each HSIC by the unbiased one (Song et al. 2012) on the Gram
matrices K = XXᵀ and L = YYᵀ with their diagonals zeroed (K̃, L̃):

    HSIC_u(K, L) = [tr(K̃L̃) + 1ᵀK̃1·1ᵀL̃1 / ((n−1)(n−2)) − 2/(n−2)·1ᵀK̃L̃1] / (n(n−3))
    CKA_u(X, Y) = HSIC_u(K, L) / √(HSIC_u(K, K) · HSIC_u(L, L))

Neither needs the n×n Gram matrices: every term is a sum over examples of feature products,
so `Moments` accumulates, batch by batch and for all k members at once, ZᵀZ, Zᵀq, qᵀq and Zᵀ1
(Z = the members' features side by side, q = each member's squared feature norms per
example). Memory is O((k·d)²) whatever the number of examples. Both estimators are invariant
to shifting the features, so the first batch's mean is taken off every batch before the sums
(features far from 0 would otherwise cancel in them), and a constant feature adds exactly 0.

    moments = Moments(); moments.add([features_member_0, features_member_1, ...])   # per batch
    linear, debiased = moments.cka()                                               # [k, k] each
"""

from itertools import accumulate

import torch


class Moments:
    """Streaming sums of k members' features [b, d_i] over examples, in float64, on the features'
    device (a GPU's float64 matmuls beat a copy of every batch to the host)."""

    def __init__(self):
        self.n, self.widths = 0, None
        self.gram = self.norms_cross = self.norms_gram = self.total = self.shift = None

    def add(self, features: list[torch.Tensor]) -> None:
        z = torch.cat([f.flatten(1).double() for f in features], dim=1)  # [b, D]
        if self.shift is None:  # the first batch's mean, taken off every batch: both estimators are
            self.shift = z.mean(0)  # shift-invariant, and sums of centred-ish values do not cancel
        z = z - self.shift
        widths = [f.flatten(1).shape[1] for f in features]
        q = torch.stack([block.square().sum(1) for block in z.split(widths, dim=1)], dim=1)  # [b, k]
        if self.widths is None:
            self.widths = widths
            width = z.shape[1]
            self.gram = z.new_zeros(width, width)
            self.norms_cross, self.norms_gram, self.total = z.new_zeros(width, len(features)), z.new_zeros(len(features), len(features)), z.new_zeros(width)
        self.gram += z.T @ z
        self.norms_cross += z.T @ q
        self.norms_gram += q.T @ q
        self.total += z.sum(0)
        self.n += z.shape[0]

    def _blocks(self):
        edges = [0, *accumulate(self.widths)]
        return [slice(a, b) for a, b in zip(edges, edges[1:])]

    def cka(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(linear CKA [k, k], debiased CKA [k, k]); the debiased one is NaN for n < 4."""
        blocks, n = self._blocks(), self.n
        k = len(blocks)
        hsic, unbiased = torch.zeros(k, k, dtype=torch.float64), torch.zeros(k, k, dtype=torch.float64)  # on the CPU
        for a, rows in enumerate(blocks):
            for b, cols in enumerate(blocks):
                if b < a:
                    continue
                cross = self.gram[rows, cols] - torch.outer(self.total[rows], self.total[cols]) / n
                hsic[a, b] = hsic[b, a] = cross.square().sum()
                unbiased[a, b] = unbiased[b, a] = self._hsic_unbiased(a, b, rows, cols)
        linear = hsic / torch.sqrt(torch.outer(hsic.diagonal(), hsic.diagonal()))
        debiased = unbiased / torch.sqrt(torch.outer(unbiased.diagonal(), unbiased.diagonal()))
        return linear, debiased

    def _hsic_unbiased(self, a, b, rows, cols) -> float:
        n = self.n
        if n < 4:
            return float("nan")
        both_norms = self.norms_gram[a, b]  # Σ_j q_a[j] q_b[j]
        trace_kl = self.gram[rows, cols].square().sum() - both_norms  # tr(K̃L̃)
        sum_a, sum_b = self.total[rows], self.total[cols]
        sum_k = sum_a.square().sum() - self.gram[rows, rows].diagonal().sum()  # 1ᵀK̃1
        sum_l = sum_b.square().sum() - self.gram[cols, cols].diagonal().sum()
        # 1ᵀK̃L̃1 = Σ_j (x_j·s_x − q_x[j])(y_j·s_y − q_y[j])
        product = (sum_a @ self.gram[rows, cols] @ sum_b - sum_a @ self.norms_cross[rows, b]
                   - sum_b @ self.norms_cross[cols, a] + both_norms)
        return float((trace_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2 / (n - 2) * product) / (n * (n - 3)))
