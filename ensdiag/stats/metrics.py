"""Per-example quantities and member matrices over member logits. Natural log throughout.

Shapes: member logits [k, N, C] (members first), labels int64 [N]. p̄ is the mean of the
members' softmax probabilities. The per-example quantities are `Examples`' (examples.py: each
computed once per split); the statistics over examples — accuracy, NLL, ECE and its variants,
OOD AUROC, risk–coverage areas — are weighted functions in weighted.py, each written once for
the value, its bootstrap resamples and the verdict. Everything here is tested against
scikit-learn, a hand-computed case, or a dense re-implementation.
"""

import math

import torch
import torch.nn.functional as F

from .examples import Examples
from .pairwise import mark_undefined


def member_accuracy(examples: Examples) -> list[float]:
    """Accuracy of each member's argmax; NaN for a member whose prediction is undefined on some sample."""
    return (1 - examples.member_errors).mean(1).tolist()


def member_nll(examples: Examples) -> list[float]:
    return (-examples.member_log_likelihood.mean(1)).tolist()


def sortable_key(scores: torch.Tensor) -> torch.Tensor:
    """Integers that sort exactly as the float scores do (IEEE-754 bits, negatives flipped).

    Sorting these is an order of magnitude faster than sorting floats on CPU (radix sort),
    and equal scores get equal keys, so ties stay ties. -0.0 is folded into +0.0."""
    if torch.isnan(scores).any():
        raise ValueError("OOD scores contain NaN")
    as_int = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}
    bits = (scores + 0.0).view(as_int[scores.dtype])
    flip = torch.iinfo(bits.dtype).max  # all bits but the sign
    return torch.where(bits < 0, bits ^ flip, bits)


DISAGREEMENT_CHUNK_BYTES = 64 * 2**20  # bound on the working tensors of one chunk of samples


def disagreement_matrix(logits, chunk_size: int | None = None) -> torch.Tensor:
    """D[i, j] = fraction of samples on which members i and j predict different labels.

    Float64 [k, k] in O(k² + k·N) memory, never the [k, k, N] comparison. The predictions
    P = argmax [k, N] are taken in chunks of `chunk_size` samples (default: as many as keep a
    chunk's working tensors near 64 MiB). In a chunk, column (x, c) of the one-hot O [k, n·C]
    marks the members predicting class c on sample x, and O Oᵀ counts the samples on which i and
    j agree. Only the columns that 2 ≤ m < k members share are multiplied: a column of one
    member adds to the diagonal only, a column of all k members adds 1 to every pair; the
    diagonal is N by definition. So O has at most n·min(C, k/2) columns, and far fewer when the
    members mostly agree. The counts are integers (exact in float32 below 2²⁴ per chunk, summed
    in float64) and D = (N − agree) / N, bit for bit the dense `(P_i != P_j).double().mean()`:
    symmetric, diagonal exactly 0. N = 0 gives NaN everywhere, as the mean of nothing does;
    a member whose prediction is undefined on some sample (`Examples.undefined`) gets NaN
    off the diagonal of its row and column."""
    predicted = logits.argmax(-1)  # [k, N]
    k, n = predicted.shape
    classes = logits.shape[-1]
    device = predicted.device
    if n == 0:
        return torch.full((k, k), float("nan"), dtype=torch.float64, device=device)
    if chunk_size is None:
        per_sample = max(4 * k * min(classes, max(k // 2, 1)), 8 * k, 8 * classes)
        chunk_size = DISAGREEMENT_CHUNK_BYTES // per_sample
    chunk_size = max(1, min(int(chunk_size), 2**24 - 1))
    agree = torch.zeros(k, k, dtype=torch.float64, device=device)
    everyone = 0  # samples on which all k members agree
    for start in range(0, n, chunk_size):
        part = predicted[:, start:start + chunk_size]
        column = part + classes * torch.arange(part.shape[1], device=device)  # (sample, class) -> x·C + c
        count = torch.bincount(column.flatten(), minlength=part.shape[1] * classes)
        everyone += int((count == k).sum())
        shared = (count >= 2) & (count < k)
        width = int(shared.sum())
        if width == 0:
            continue
        place = torch.where(shared, torch.cumsum(shared, 0), 0)  # shared column -> 1 + its place in O, others -> 0
        onehot = torch.zeros(k, width + 1, dtype=torch.float32, device=device)
        onehot.scatter_(1, place[column], 1.0)
        onehot = onehot[:, 1:]  # column 0 collected the unshared and unanimous predictions
        agree += (onehot @ onehot.T).double()
    agree += everyone
    agree.diagonal().fill_(n)
    return mark_undefined((n - agree) / n, logits, 0.0)


def mean_off_diagonal(matrix: torch.Tensor) -> float:
    k = matrix.shape[0]
    return float("nan") if k < 2 else (matrix.sum() - matrix.diagonal().sum()).item() / (k * (k - 1))


def weight_cosine(member_weights: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cosine matrix of members' flattened, concatenated weights, overall and per layer.

    A layer is a key's prefix before `.weight` / `.bias`; its vector is weight and bias."""
    def cosine_of(keys):  # C[i, j] = ⟨θ_i, θ_j⟩ / (‖θ_i‖ ‖θ_j‖), θ_i: member i's tensors `keys`, concatenated
        vectors = torch.stack([torch.cat([w[key].flatten() for key in keys]) for w in member_weights])
        unit = F.normalize(vectors.double(), dim=1)
        return unit @ unit.T
    layers: dict[str, list[str]] = {}
    for key in member_weights[0]:
        layers.setdefault(key.rpartition(".")[0], []).append(key)
    return cosine_of(list(member_weights[0])), {layer: cosine_of(names) for layer, names in layers.items()}


def gain_terms(examples: Examples) -> dict[str, torch.Tensor]:
    """The ensemble's losses against its members' mean loss (the Gibbs loss), per example [N].

    NLL with the arithmetic mean p̄: gibbs − ensemble = log p̄(y) − mean_i log p_i(y) ≥ 0 (Jensen's
    gap). With the normalised geometric mean q̄ ∝ exp(mean_i log p_i) the gap is exactly
    mean_i KL(q̄ ‖ p_i) (Wood et al.). Brier with p̄: the gap is exactly the members' spread
    mean_i ‖p_i − p̄‖². 0-1 loss: mean member error minus the error of argmax p̄ (no identity
    holds; it can be negative). Each term's mean over examples (weighted.mean) is the analyzer's."""
    log_p, labels = examples.log_probs, examples.labels
    mean_log = log_p.mean(0)  # mean_i log p_i, the unnormalised log q̄
    log_z = torch.logsumexp(mean_log, dim=-1)  # q̄ = exp(mean_log − log Z)
    probs, onehot = log_p.exp(), F.one_hot(labels, log_p.shape[2]).double()
    gibbs = -examples.member_log_likelihood.mean(0)
    return {"nll_gibbs": gibbs, "nll_ensemble": examples.nll,
            "nll_geometric": -(mean_log.gather(1, labels[:, None]).squeeze(1) - log_z),
            "kl_diversity": -log_z,  # mean_i KL(q̄ ‖ p_i)
            "nll_gap": gibbs - examples.nll,
            "brier_gibbs": (probs - onehot).pow(2).sum(-1).mean(0), "brier_ensemble": examples.brier,
            "brier_spread": (probs - examples.mean).pow(2).sum(-1).mean(0),
            "error_gibbs": (examples.member_predicted != labels).double().mean(0),
            "error_ensemble": (examples.predicted != labels).double()}


def risk_coverage(confidence: torch.Tensor, errors: torch.Tensor) -> torch.Tensor:
    """The risk at coverage j/N for j = 1..N: the curve (its areas: ordered.risk_coverage_areas).

    Samples are accepted in decreasing confidence; within a group of tied confidences the order
    is arbitrary, so each of them counts the group's mean error (the expectation over tie orders)."""
    n = len(errors)
    if n == 0 or confidence.isnan().any():  # no samples, or undefined predictions: no ranking
        return torch.full((n,), math.nan, dtype=torch.float64)
    order = torch.argsort(sortable_key(confidence), descending=True, stable=True)
    keys, errs = sortable_key(confidence)[order], errors.double()[order]
    _, inverse, counts = torch.unique_consecutive(keys, return_inverse=True, return_counts=True)
    group_mean = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, errs) / counts
    return torch.cumsum(group_mean[inverse], 0) / torch.arange(1, n + 1, dtype=torch.float64)


