"""The structure of members' weights: is W_i ⊘ W_j rank 1, as BatchEnsemble's construction says?

A BatchEnsemble member's weight is W ∘ r_i s_iᵀ, so the elementwise ratio of two members'
weights is (r_i/r_j)(s_i/s_j)ᵀ: rank 1 whatever W is. For a convolution, the ratio as a
matrix [out, in·kh·kw] is rank 1 for channel-wise fast weights; kernel-wise ones make each
kernel's kh×kw ratio rank 1 instead. Independently trained members give a full-rank ratio.
So the singular values of the ratio check the reconstruction and tell rank-1 members from
richer variants in any checkpoint.

Entries where either weight is 0, or below 0.1 % of its layer's median magnitude (weights
decayed to nothing, whose ratios of 10³⁰ would swamp the singular values), have no ratio. The
singular values need a full matrix, so rows and columns are dropped until every kept entry has a
ratio: greedily, always the row or column with the largest share of entries without one, then
any dropped line that fits the kept block is taken back (`defined_block`). Scattered dead inputs
of an MNIST input layer cost their own columns, not every row. `entries_used` says how much of
the layer the block kept. A layer where no entry keeps a ratio has no rank
(`rank` and `max_rank` null, with a note). A ratio with one row or column is rank 1 whatever
it holds, so such layers (`max_rank` < 2) tell nothing and are not counted.

Over the pairs (0, j), a layer reports `rank` and `max_rank` as maxima over pairs (so rank ≤
max_rank always), `pair_ranks` as the min, median and max of the pairs' ranks, and
`entries_used` as the least over pairs.
"""

import numpy as np
import torch

ROUNDINGS = 4  # relative error of one ratio entry, in the weights' unit roundoffs (below)
SHOWN = 4  # singular values stored per layer (divided by the largest)
TOLERANCE_RULE = ("a singular value counts when it exceeds δ·‖R‖_F + max(m, n)·ε₆₄·σ₁, the most float rounding "
                  "can add to a rank-deficient ratio R (Weyl): each entry of R = W_i ⊘ W_j carries a relative error "
                  "of at most δ = 4u, u the unit roundoff of the weights' dtype (a rebuilt member weight W ∘ r sᵀ is "
                  "rounded twice, the two in a ratio four times; the ratio itself is taken in float64), so the "
                  "perturbation is at most δ‖R‖_F in spectral norm; the second term is the SVD's own rounding")


def rounding(dtype) -> float:
    """δ: the largest relative error float rounding leaves in one entry of a ratio of two weights of `dtype`."""
    return ROUNDINGS * torch.finfo(dtype).eps / 2


def rank_threshold(singular_values: torch.Tensor, delta: float) -> torch.Tensor:
    """The singular value below which float rounding alone can explain it (`TOLERANCE_RULE`), [..., 1] for
    each row of singular values [..., m] (largest first)."""
    frobenius = singular_values.pow(2).sum(-1, keepdim=True).sqrt()
    return delta * frobenius + singular_values.shape[-1] * torch.finfo(torch.float64).eps * singular_values[..., :1]


NEGLIGIBLE = 1e-3  # below this fraction of the layer's median |weight|, an entry counts as 0


def _not_negligible(w: torch.Tensor) -> torch.Tensor:
    """Entries that carry a ratio: weights decayed to ~0 (1e-30 after weight decay) would give
    ratios of 1e30 that swamp the singular values and make any matrix look rank 1."""
    magnitude = w.abs()
    nonzero = magnitude[magnitude > 0]
    floor = NEGLIGIBLE * nonzero.median() if nonzero.numel() else 0.0
    return magnitude > floor


def defined_block(defined: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) boolean masks of a block of `defined` (2-D, bool) that is True everywhere.

    Greedy: drop the row or column whose share of False entries among the kept lines is largest,
    until none is left; each step updates the other side's counts in O(m + n) and there are at
    most as many steps as False entries. Then a dropped line all True on the kept block is taken
    back, so the block is maximal: no dropped row or column could be added to it."""
    missing = ~defined.numpy()
    m, n = missing.shape
    rows, cols = np.ones(m, bool), np.ones(n, bool)
    row_missing, col_missing = missing.sum(1).astype(np.int64), missing.sum(0).astype(np.int64)
    while True:
        kept_rows, kept_cols = rows.sum(), cols.sum()
        if kept_rows == 0 or kept_cols == 0:
            break
        row_share = np.where(rows, row_missing / kept_cols, -1.0)
        col_share = np.where(cols, col_missing / kept_rows, -1.0)
        i, j = int(row_share.argmax()), int(col_share.argmax())
        if max(row_share[i], col_share[j]) <= 0:
            break
        if row_share[i] >= col_share[j]:
            rows[i] = False
            col_missing -= missing[i]
        else:
            cols[j] = False
            row_missing -= missing[:, j]
    if rows.any() and cols.any():
        for i in np.flatnonzero(~rows):
            if not missing[i, cols].any():
                rows[i] = True
        for j in np.flatnonzero(~cols):
            if not missing[rows, j].any():
                cols[j] = True
    else:
        rows[:], cols[:] = False, False
    return torch.from_numpy(rows), torch.from_numpy(cols)


def layer_structure(w_i: torch.Tensor, w_j: torch.Tensor) -> dict:
    """Rank and leading singular values of the ratio of one layer's weights (2-D and up)."""
    if not (torch.isfinite(w_i).all() and torch.isfinite(w_j).all()):
        return {"rank": None, "max_rank": None, "singular_values": [], "entries_used": 0.0,
                "note": "non-finite weights: no ratio"}
    a, b = w_i.detach().double().flatten(1).cpu(), w_j.detach().double().flatten(1).cpu()
    rows, cols = defined_block(_not_negligible(a) & _not_negligible(b))
    ratio = a[rows][:, cols] / b[rows][:, cols]  # W_i ⊘ W_j as [out, rest] over the entries with a ratio
    if ratio.numel() == 0:
        return {"rank": None, "max_rank": None, "singular_values": [], "entries_used": 0.0,
                "note": "no entry carries a ratio (zero or negligible weights)"}
    delta = rounding(w_i.dtype if w_i.is_floating_point() else torch.float32)
    values = torch.linalg.svdvals(ratio)
    result = {"rank": int((values > rank_threshold(values, delta)).sum()), "max_rank": min(ratio.shape),
              "singular_values": (values[:SHOWN] / values[0]).tolist() if values[0] > 0 else [],
              "tolerance": float(rank_threshold(values, delta)) / float(values[0]) if values[0] > 0 else None,
              "entries_used": ratio.numel() / max(a.numel(), 1)}
    if w_i.dim() == 4:  # kernel by kernel (a 1×1 kernel is rank 1 whatever it holds), those with every ratio defined
        a, b = w_i.detach().double().cpu().flatten(0, 1), w_j.detach().double().cpu().flatten(0, 1)  # [out·in, kh, kw]
        whole = (_not_negligible(a) & _not_negligible(b)).flatten(1).all(1)
        if whole.any():
            per_kernel = torch.linalg.svdvals(a[whole] / b[whole])  # [kernels, min(kh, kw)]
            result["kernel_rank"] = int((per_kernel > rank_threshold(per_kernel, delta)).sum(1).max())
    return result


def rank_structure(member_weights: list[dict], max_pairs: int = 8) -> dict:
    """Per layer (weights of 2 and more dimensions), the ratio's rank for the pairs (0, j)."""
    pairs = list(range(1, min(len(member_weights), max_pairs + 1)))
    layers = {}
    for key, tensor in member_weights[0].items():
        if tensor.dim() < 2 or not key.endswith("weight"):
            continue
        found = [layer_structure(member_weights[j][key], tensor) for j in pairs]
        if any(f["rank"] is None for f in found):
            layers[key.rpartition(".")[0]] = next(f for f in found if f["rank"] is None)
            continue
        ranks = sorted(f["rank"] for f in found)
        entry = {"rank": ranks[-1], "max_rank": max(f["max_rank"] for f in found),
                 "pair_ranks": {"min": ranks[0], "median": ranks[(len(ranks) - 1) // 2], "max": ranks[-1]},
                 "singular_values": found[0]["singular_values"], "tolerance": found[0]["tolerance"],
                 "entries_used": min(f["entries_used"] for f in found)}
        if all("kernel_rank" in f for f in found):
            entry["kernel_rank"] = max(f["kernel_rank"] for f in found)
        layers[key.rpartition(".")[0]] = entry
    return {"pairs": [[j, 0] for j in pairs], "layers": layers}
