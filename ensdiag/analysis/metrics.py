"""Pure metric functions over member logits. Natural log throughout.

Shapes: member logits [k, N, C] (members first), labels int64 [N]. p̄ is the mean of the
members' softmax probabilities. Every function here is independent of ensdiag's classes
and is tested against scikit-learn, a hand-computed case, or a dense re-implementation.
"""

import math

import torch
import torch.nn.functional as F


def mean_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log p̄ [N, C], stably: logsumexp over members of log-softmax, minus log k."""
    return torch.logsumexp(F.log_softmax(logits.double(), dim=-1), dim=0) - math.log(logits.shape[0])


def mean_probs(logits: torch.Tensor) -> torch.Tensor:
    return mean_log_probs(logits).exp()


def undefined_predictions(logits) -> torch.Tensor:
    """[k, N] bool: where a member's softmax is undefined (NaN logits, a +inf logit, or all −inf).

    Its argmax is then arbitrary (torch takes a NaN as the maximum), so the accuracies and the
    disagreement built on it are NaN rather than a number that looks measured."""
    return ~torch.isfinite(logits.amax(-1))


def accuracy(logits, labels) -> float:
    """Accuracy of argmax p̄; NaN if p̄ is undefined (NaN) on some sample."""
    log_p = mean_log_probs(logits)
    correct = (log_p.argmax(-1) == labels).double()
    return correct.masked_fill(log_p.isnan().any(-1), math.nan).mean().item()


def nll(logits, labels) -> float:
    """Mean over samples of −log p̄(y|x)."""
    return -mean_log_probs(logits).gather(1, labels[:, None]).mean().item()


def brier(logits, labels) -> float:
    """Mean over samples of Σ_c (p̄_c − 1[y = c])²."""
    p = mean_probs(logits)
    return (p - F.one_hot(labels, p.shape[1]).double()).pow(2).sum(1).mean().item()


def bin_statistics(confidence, target, num_bins: int = 15, equal_mass: bool = False, extra_first: bool = False) -> dict:
    """The one binning routine of ECE, its variants and the reliability diagrams.

    Equal-width bins on [0, 1]: the first is [0, 1/B], then (lo, hi]; 1.0 falls in the last.
    Equal-mass bins: the samples sorted by confidence (stable), bin b holding samples
    ⌊bN/B⌋..⌊(b+1)N/B⌋−1; with `extra_first` (torch-uncertainty's split, `torch.tensor_split`)
    every bin holds ⌊N/B⌋ and the first N mod B bins one more. Returns counts and the sums of
    confidence and target per bin."""
    confidence, target = confidence.double().contiguous(), target.double()
    if equal_mass:
        order = torch.argsort(confidence, stable=True)
        index = torch.empty_like(order)
        bins, n = torch.arange(num_bins), len(confidence)
        # bin b starts at sorted position ⌊bN/B⌋, or at b⌊N/B⌋ + min(b, N mod B) with the extras first
        starts = bins * (n // num_bins) + bins.clamp(max=n % num_bins) if extra_first else bins * n // num_bins
        index[order] = torch.searchsorted(starts, torch.arange(len(confidence)), right=True) - 1
        lower = upper = None
    else:
        edges = torch.linspace(0, 1, num_bins + 1, dtype=torch.float64)
        index = torch.searchsorted(edges[1:-1], confidence, right=False)  # x == edge -> lower bin
        lower, upper = edges[:-1].tolist(), edges[1:].tolist()
    return {"count": torch.bincount(index, minlength=num_bins).double(), "lower": lower, "upper": upper,
            "confidence": torch.bincount(index, weights=confidence, minlength=num_bins),
            "target": torch.bincount(index, weights=target, minlength=num_bins)}


def _calibration_error(stats, n, signed=False) -> float:
    gap = stats["confidence"] - stats["target"]
    return ((gap if signed else gap.abs()).sum() / n).item()


def ece(logits, labels, num_bins: int = 15) -> tuple[float, dict]:
    """Expected calibration error of the top-label confidence max p̄, and its reliability bins.

    Bins are equal-width on [0, 1]: the first is [0, 1/B], then (lo, hi]; a confidence of
    exactly 1.0 falls in the last bin. ECE = Σ_b |B_b|/N · |acc_b − conf_b|."""
    confidence, predicted = mean_probs(logits).max(dim=1)
    stats = bin_statistics(confidence, predicted == labels, num_bins)
    safe = stats["count"].clamp(min=1)
    bins = {"lower": stats["lower"], "upper": stats["upper"], "count": stats["count"].long().tolist(),
            "accuracy": (stats["target"] / safe).tolist(), "confidence": (stats["confidence"] / safe).tolist()}
    return _calibration_error(stats, len(labels)), bins


def adaptive_ece(logits, labels, num_bins: int = 15, extra_first: bool = False) -> float:
    """ECE over equal-mass bins of max p̄ (each bin holds N/B samples, ±1); `extra_first`: the
    bins of torch-uncertainty (the N mod B extra samples in the first bins)."""
    confidence, predicted = mean_probs(logits).max(dim=1)
    stats = bin_statistics(confidence, predicted == labels, num_bins, equal_mass=True, extra_first=extra_first)
    return _calibration_error(stats, len(labels))


def overconfidence(logits, labels, num_bins: int = 15) -> float:
    """Σ_b |B_b|/N · (conf_b − acc_b) over equal-width bins: > 0 over-confident, < 0 under-confident."""
    confidence, predicted = mean_probs(logits).max(dim=1)
    return _calibration_error(bin_statistics(confidence, predicted == labels, num_bins), len(labels), signed=True)


def max_calibration_error(logits, labels, num_bins: int = 15) -> float:
    """MCE: max over the non-empty equal-width bins of max p̄ of |acc_b − conf_b| (the ECE's bins)."""
    confidence, predicted = mean_probs(logits).max(dim=1)
    stats = bin_statistics(confidence, predicted == labels, num_bins)
    filled = stats["count"] > 0
    gap = (stats["confidence"][filled] - stats["target"][filled]).abs() / stats["count"][filled]
    return gap.max().item() if filled.any() else math.nan


def classwise_ece(logits, labels, num_bins: int = 15) -> float:
    """Mean over classes c of Σ_b |B_b|/N · |mean 1[y = c] − mean p̄_c| over equal-width bins of p̄_c.

    The mean is over the classes that occur: the label of some sample, or p̄_c > 0 on some sample
    (every class, for softmax outputs of finite logits). A choice that no question has (padding,
    `PAD_LOGIT`) has p̄_c = 0 everywhere and is never the label: no class, so padding a question
    set to more choices leaves this number as it was."""
    p = mean_probs(logits)
    present = (p > 0).any(0) | (torch.bincount(labels, minlength=p.shape[1]) > 0)
    per_class = [_calibration_error(bin_statistics(p[:, c], labels == c, num_bins), len(labels))
                 for c in range(p.shape[1]) if present[c]]
    return sum(per_class) / len(per_class)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """−Σ p log p over the last axis, with 0 log 0 = 0."""
    return -torch.special.xlogy(p, p).sum(-1)


def predictive_entropy(logits) -> torch.Tensor:
    """H(p̄) per sample [N]: total uncertainty."""
    return entropy(mean_probs(logits))


def expected_entropy(logits) -> torch.Tensor:
    """(1/k) Σ_i H(p_i) per sample [N]: aleatoric uncertainty."""
    return entropy(F.softmax(logits.double(), dim=-1)).mean(0)


def jsd(logits) -> torch.Tensor:
    """H(p̄) − (1/k) Σ_i H(p_i) per sample [N] (mutual information; epistemic).

    Non-negative by concavity of entropy; clamped at 0 against float rounding. Samples on which
    every member gives the same distribution get exactly 0: rounding in H(p̄) would otherwise
    leave 1e-16-sized values that break ties between them when JSD ranks samples (OOD scores)."""
    value = (predictive_entropy(logits) - expected_entropy(logits)).clamp(min=0)
    log_p = F.log_softmax(logits.double(), dim=-1)
    identical = (log_p == log_p[:1]).all(dim=2).all(dim=0)
    return value.masked_fill(identical, 0.0)


def max_softmax_probability(logits) -> torch.Tensor:
    return mean_probs(logits).max(dim=1).values


def member_accuracy(logits, labels) -> list[float]:
    """Accuracy of each member's argmax; NaN for a member whose prediction is undefined on some sample."""
    correct = (logits.argmax(-1) == labels).double()
    return correct.masked_fill(undefined_predictions(logits), math.nan).mean(1).tolist()


def member_nll(logits, labels) -> list[float]:
    log_p = F.log_softmax(logits.double(), dim=-1)
    return (-log_p.gather(2, labels.expand(logits.shape[0], -1)[..., None]).squeeze(-1).mean(1)).tolist()


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


def ood_metrics(score_id: torch.Tensor, score_ood: torch.Tensor) -> dict[str, float]:
    """AUROC, AUPR-Out, AUPR-In and FPR95 from one sort; exact with ties.

    Scores are uncertainty scores (higher = more OOD); OOD is the positive class.
    - AUROC = P(score_ood > score_id) + ½ P(equal).
    - AUPR-Out / AUPR-In: average precision (step sum, scikit-learn's definition) with OOD
      resp. ID as positive (ID ranked by the negated score).
    - FPR95 in both directions (they differ; papers rarely say which they use):
      `fpr95_ood_as_id`: the fraction of OOD samples accepted as ID (score ≤ τ) at the
      smallest threshold τ that accepts at least 95 % of ID samples (ID is the "positive" kept
      at TPR 95 %); samples tied at τ are accepted. The reference paper's text.
      `fpr95_id_as_ood`: the fraction of ID samples flagged as OOD (score ≥ τ) at the largest
      threshold τ that flags at least 95 % of OOD samples (OOD positive, recall 95 %); ties at
      τ are flagged. scikit-learn's ROC point, torch-uncertainty's FPR95 and the paper's code.
    """
    n_id, n_ood = len(score_id), len(score_ood)
    scores = torch.cat([score_id.flatten(), score_ood.flatten()])
    if not scores.is_floating_point():
        scores = scores.double()
    is_ood = torch.cat([torch.zeros(n_id, dtype=torch.float64), torch.ones(n_ood, dtype=torch.float64)])
    keys, order = torch.sort(sortable_key(scores))
    is_ood = is_ood[order]
    _, group_sizes = torch.unique_consecutive(keys, return_counts=True)  # ascending tie groups
    group_ends = group_sizes.cumsum(0) - 1
    cum_ood = is_ood.cumsum(0)[group_ends]  # OOD with score ≤ group value
    cum_id = (group_ends + 1).double() - cum_ood
    ood_in = torch.diff(cum_ood, prepend=cum_ood.new_zeros(1))
    id_in = torch.diff(cum_id, prepend=cum_id.new_zeros(1))
    id_below = cum_id - id_in
    auroc = (ood_in * (id_below + 0.5 * id_in)).sum() / (n_id * n_ood)
    # AUPR-Out: thresholds descending; at group g, TP = OOD with score ≥ g, FP = ID with score ≥ g
    tp_out = n_ood - (cum_ood - ood_in)
    fp_out = n_id - (cum_id - id_in)
    aupr_out = (ood_in / n_ood * tp_out / (tp_out + fp_out)).sum()
    # AUPR-In: ID positive, negated score, so thresholds ascend: TP = ID ≤ g, FP = OOD ≤ g
    aupr_in = (id_in / n_id * cum_id / (cum_id + cum_ood)).sum()
    first = torch.nonzero(cum_id * 100 >= 95 * n_id)[0, 0]  # integer-exact 95 %
    fpr95_ood_as_id = cum_ood[first] / n_ood
    last = torch.nonzero(tp_out * 100 >= 95 * n_ood)[-1, 0]  # OOD flagged (score ≥ g) falls as g rises
    fpr95_id_as_ood = fp_out[last] / n_id
    return {"auroc": auroc.item(), "aupr_out": aupr_out.item(), "aupr_in": aupr_in.item(),
            "fpr95_ood_as_id": fpr95_ood_as_id.item(), "fpr95_id_as_ood": fpr95_id_as_ood.item()}


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
    a member whose prediction is undefined on some sample (`undefined_predictions`) gets NaN
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
    matrix = (n - agree) / n
    undefined = undefined_predictions(logits).any(1)
    if undefined.any():
        off_diagonal = (undefined[:, None] | undefined[None, :]).fill_diagonal_(False)
        matrix = matrix.masked_fill(off_diagonal, math.nan)
    return matrix


def mean_off_diagonal(matrix: torch.Tensor) -> float:
    k = matrix.shape[0]
    if k < 2:
        return float("nan")
    return (matrix.sum() - matrix.diagonal().sum()).item() / (k * (k - 1))


def cosine_matrix(vectors: torch.Tensor) -> torch.Tensor:
    """C[i, j] = ⟨θ_i, θ_j⟩ / (‖θ_i‖ ‖θ_j‖) for rows θ_i of [k, P]."""
    unit = F.normalize(vectors.double(), dim=1)
    return unit @ unit.T


def weight_cosine(member_weights: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cosine matrix of members' flattened, concatenated weights, overall and per layer.

    A layer is a key's prefix before `.weight` / `.bias`; its vector is weight and bias."""
    keys = list(member_weights[0])
    overall = torch.stack([torch.cat([w[key].flatten() for key in keys]) for w in member_weights])
    layers: dict[str, list[str]] = {}
    for key in keys:
        layers.setdefault(key.rpartition(".")[0], []).append(key)
    per_layer = {layer: cosine_matrix(torch.stack([torch.cat([w[k].flatten() for k in names]) for w in member_weights]))
                 for layer, names in layers.items()}
    return cosine_matrix(overall), per_layer


def ensemble_gain(logits, labels) -> dict[str, float]:
    """The ensemble's losses against its members' mean loss (the Gibbs loss), per loss.

    NLL with the arithmetic mean p̄: gibbs − ensemble = mean_n [log p̄(y) − mean_i log p_i(y)] ≥ 0
    (Jensen's gap). With the normalised geometric mean q̄ ∝ exp(mean_i log p_i) the gap is exactly
    mean_n mean_i KL(q̄ ‖ p_i) (Wood et al.). Brier with p̄: the gap is exactly the members' spread
    mean_i ‖p_i − p̄‖². 0-1 loss: mean member error minus the error of argmax p̄ (no identity
    holds; it can be negative)."""
    log_p = F.log_softmax(logits.double(), dim=-1)  # [k, N, C]
    k, n = logits.shape[:2]
    member_log_y = log_p.gather(2, labels.expand(k, -1)[..., None]).squeeze(-1)  # [k, N]
    log_mean = mean_log_probs(logits)  # log p̄
    mean_log = log_p.mean(0)  # mean_i log p_i, the unnormalised log q̄
    log_z = torch.logsumexp(mean_log, dim=-1)  # q̄ = exp(mean_log − log Z)
    probs, mean = log_p.exp(), log_mean.exp()
    onehot = F.one_hot(labels, logits.shape[2]).double()
    member_errors = (log_p.argmax(-1) != labels).double().mean(1)
    return {
        "nll_gibbs": -member_log_y.mean().item(),
        "nll_ensemble": -log_mean.gather(1, labels[:, None]).mean().item(),
        "nll_geometric": -(mean_log.gather(1, labels[:, None]).squeeze(1) - log_z).mean().item(),
        "kl_diversity": -log_z.mean().item(),  # mean_i KL(q̄ ‖ p_i), averaged over samples
        "brier_gibbs": (probs - onehot).pow(2).sum(-1).mean().item(),
        "brier_ensemble": (mean - onehot).pow(2).sum(-1).mean().item(),
        "brier_spread": (probs - mean).pow(2).sum(-1).mean().item(),
        "error_gibbs": member_errors.mean().item(),
        "error_ensemble": (log_mean.argmax(-1) != labels).double().mean().item(),
        "member_error": member_errors.tolist(),
    }


def risk_coverage(confidence: torch.Tensor, errors: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(risk at coverage j/N for j = 1..N, AURC = the mean of those risks).

    Samples are accepted in decreasing confidence; within a group of tied confidences the order
    is arbitrary, so each of them counts the group's mean error (the expectation over tie orders)."""
    n = len(errors)
    if n == 0 or confidence.isnan().any():  # no samples, or undefined predictions: no ranking
        return torch.full((n,), math.nan, dtype=torch.float64), math.nan
    order = torch.argsort(sortable_key(confidence), descending=True, stable=True)
    keys, errs = sortable_key(confidence)[order], errors.double()[order]
    _, inverse, counts = torch.unique_consecutive(keys, return_inverse=True, return_counts=True)
    group_mean = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, errs) / counts
    risk = torch.cumsum(group_mean[inverse], 0) / torch.arange(1, n + 1, dtype=torch.float64)
    return risk, risk.mean().item()


def augrc(risk: torch.Tensor) -> float:
    """AUGRC (Traub et al. 2024) from the risks of `risk_coverage`: the mean over coverages j/N of
    the generalised risk (j/N)·risk_j, the fraction of all N samples accepted and wrong."""
    n = len(risk)
    coverage = torch.arange(1, n + 1, dtype=torch.float64) / n
    return (coverage * risk).mean().item() if n else math.nan


def augrc_trapezoid(risk: torch.Tensor) -> float:
    """torch-uncertainty's AUGRC: `aurc_trapezoid` of the generalised risks (j/N)·risk_j."""
    return aurc_trapezoid(torch.arange(1, len(risk) + 1, dtype=torch.float64) / max(len(risk), 1) * risk)


def aurc_trapezoid(risk: torch.Tensor) -> float:
    """torch-uncertainty's AURC from the same risks: the trapezoid rule over coverages 1/N..1,
    divided by the span 1 − 1/N, i.e. (Σ_j risk_j − (risk_1 + risk_N)/2) / (N − 1)."""
    n = len(risk)
    if n < 2:
        return risk.mean().item() if n else math.nan
    return ((risk.sum() - (risk[0] + risk[-1]) / 2) / (n - 1)).item()


def fit_temperature(log_probs: torch.Tensor, labels: torch.Tensor, low: float = 0.02, high: float = 50.0,
                    steps: int = 200) -> float:
    """The temperature T minimising the NLL of softmax(log_probs / T) (log_probs [N, C]).

    The NLL is convex in β = 1/T (a log-sum-exp minus a linear term), so a golden-section
    search over β ∈ [1/high, 1/low] finds the minimum to float precision."""
    z = log_probs.double()
    picked = z.gather(1, labels[:, None]).squeeze(1)

    def loss(beta):
        return (torch.logsumexp(beta * z, dim=1) - beta * picked).mean().item()

    a, b = 1 / high, 1 / low
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(d)
    return 2 / (a + b)
