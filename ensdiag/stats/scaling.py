"""Temperature scaling fitted: the one solver behind every temperature ensdiag prints or uses (the
`temperature` analyzer, the `refinement` analyzer's cross-fitted T, the effective size's calibrated NLL).

    beta = fit_betas(z, labels)                     # β = 1/T per row of z [rows, N, C] (log-probabilities)
    fit_temperature(log_probs, labels)              # one T
    fold, place = folds("id", n, repeat=0)          # a seeded K-fold assignment (the same for every method)

The loss of softmax(β·z), NLL or Brier, has one minimum in β; `minimise` finds it for every row at once
by Newton steps kept inside a shrinking bracket (Press et al.'s rtsafe), to 10⁻¹² of β, over
β ∈ [1/50, 1/0.02]. A row whose examples hold no wrong top label (or no right one) has no minimum
inside: its loss falls all the way to a bound (T → 0.02: every prediction sharpened to certainty), and
a temperature fitted there ruins any other examples it is applied to. Such a row is left unscaled (β = 1)
and counted (`unfitted`): the examples give no evidence for a temperature.

Cross-fitting (`folds`): the examples are cut into `FOLDS` folds in a seeded order, by split family and
size as the bootstrap draws are (every method measured on the same examples gets the same folds), and
`REPEATS` such assignments are averaged: one assignment of a few hundred examples moves a
cross-fitted quantity by more than its own interval says.
"""

import torch
import torch.nn.functional as F

from . import bootstrap as B

LOW, HIGH = 1 / 50, 1 / 0.02  # β = 1/T searched in [0.02, 50]: T in [0.02, 50]
MAX_STEPS = 100  # Newton or bisection steps of a fit, at most (Newton converges in a handful)
FOLDS, REPEATS = 5, 4  # cross-fitting: folds per assignment, assignments averaged
FOLD_SEED = 2  # added to the split's draws' seed (bootstrap.seed_of): the folds' own stream
LOSSES = {"nll": "NLL, −log p(y)", "brier": "Brier score, Σ_c (p_c − 1[y=c])²"}


def terms(z: torch.Tensor, labels: torch.Tensor, beta: torch.Tensor, loss: str, dim: int = -1) -> tuple[torch.Tensor, ...]:
    """(loss, d loss/dβ, d² loss/dβ²) per example of softmax(β·z), z = log p̄ with the classes along `dim`
    ([..., C], or [..., C, N] with dim = −2: several times faster for a few classes), labels and β [...]."""
    log_q = torch.log_softmax(beta.unsqueeze(dim) * z, dim=dim)  # log softmax(β·z), β broadcast over z's other axes
    q = log_q.exp()
    centred = torch.where(q > 0, z - (torch.where(q > 0, q * z, 0.0)).sum(dim, keepdim=True), 0.0)  # z − E_q[z]
    variance = (q * centred * centred).sum(dim)  # Var_q[z] = d E_q[z] / dβ  (a class at p = 0, z = −∞, adds nothing)
    at_label = labels.unsqueeze(dim)
    if loss == "nll":  # log Σ exp(βz) − β z_y
        return -log_q.gather(dim, at_label).squeeze(dim), -centred.gather(dim, at_label).squeeze(dim), variance
    residual = q - F.one_hot(labels, z.shape[dim]).double().movedim(-1, dim)
    dq = q * centred  # d q_c / dβ
    d2q = q * (centred * centred - variance.unsqueeze(dim))
    return residual.pow(2).sum(dim), 2 * (residual * dq).sum(dim), 2 * (dq * dq + residual * d2q).sum(dim)


def minimise(derivatives, rows: int) -> torch.Tensor:
    """The β [rows] in [LOW, HIGH] minimising each row's loss, from `derivatives(β [n, r], which rows [n]) ->
    (mean slope, mean curvature) [n, r]` of a loss with one minimum (each step asks only for the rows still
    searching): at an end where the slope does not
    change sign there, else the slope's root by Newton steps kept inside a shrinking bracket (a
    bisection where a step would leave it). To 10⁻¹² of β."""
    every = torch.arange(rows)
    slope, _ = derivatives(torch.tensor([[LOW, HIGH]], dtype=torch.float64).expand(rows, 2), every)
    low_slope, high_slope = slope.unbind(1)
    low, high = torch.full((rows,), LOW, dtype=torch.float64), torch.full((rows,), HIGH, dtype=torch.float64)
    beta = torch.where(low_slope >= 0, low, torch.where(high_slope <= 0, high, torch.ones(rows, dtype=torch.float64)))
    active = every[(low_slope < 0) & (high_slope > 0)]  # a minimum strictly between the ends, not yet found
    for _ in range(MAX_STEPS):
        if not len(active):
            break
        at = beta[active]
        slope, curve = (part[:, 0] for part in derivatives(at[:, None], active))  # the rows still searching only
        low[active] = torch.where(slope < 0, at, low[active])
        high[active] = torch.where(slope > 0, at, high[active])
        step = at - slope / curve.clamp(min=1e-300)
        new = torch.where((curve > 0) & (step >= low[active]) & (step <= high[active]), step,
                          (low[active] + high[active]) / 2)  # else the bracket's midpoint
        beta[active] = new
        active = active[(new - at).abs() > 1e-12 * at.abs().clamp(min=1)]
    return beta


def informative(z: torch.Tensor, labels: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """[rows]: whether a row's counted examples (`inside` > 0) hold both a wrong and a right top label —
    errors on both sides of the decision, without which the loss has no minimum inside (β → a bound)."""
    right = (z.argmax(-1) == labels) & (inside > 0)
    wrong = (z.argmax(-1) != labels) & (inside > 0)
    return right.any(-1) & wrong.any(-1)


def fit_betas(z: torch.Tensor, labels: torch.Tensor, loss: str = "nll", inside: torch.Tensor | None = None) -> torch.Tensor:
    """β [rows] minimising each row's mean loss of softmax(β·z) (z [rows, m, C] log-probabilities, labels
    [rows, m]; `inside` [rows, m]: 1 for the examples that count, 0 for padding); 1 for a row that is not
    `informative` (no evidence for a temperature: its predictions are kept as they are)."""
    z = z.double()
    rows, m = labels.shape
    inside = torch.ones(rows, m, dtype=torch.float64) if inside is None else inside.double()
    share = (inside / inside.sum(-1, keepdim=True))[:, None]  # [rows, 1, m]: each counted example's part of the mean
    classes = z.transpose(1, 2).contiguous()  # [rows, C, m]: torch's softmax is slow over a short last axis
    finite = torch.where(classes.isfinite(), classes, 0.0)  # a class of probability 0 (z = −∞) weighs 0 in every moment
    moments = (finite[:, None], (finite * finite)[:, None], finite.gather(1, labels[:, None]).squeeze(1)[:, None])

    def derivatives(beta, which):  # β [n, r] of rows `which` -> each one's mean slope and curvature at each
        weight = share[which]
        if loss == "nll":  # d/dβ = E_q[z] − z_y, d²/dβ² = Var_q[z]: two moments of q = softmax(β·z), nothing more
            q = torch.softmax(beta[..., None, None] * classes[which, None], dim=-2)
            first, second = (q * moments[0][which]).sum(-2), (q * moments[1][which]).sum(-2)
            return ((first - moments[2][which]) * weight).sum(-1), ((second - first * first).clamp(min=0) * weight).sum(-1)
        shape = (*beta.shape, m)
        _, slope, curve = terms(classes[which, None].expand(*beta.shape, -1, m), labels[which, None].expand(shape),
                                beta[..., None].expand(shape), loss, dim=-2)
        return (slope * weight).sum(-1), (curve * weight).sum(-1)
    return torch.where(informative(z, labels, inside), minimise(derivatives, rows), torch.ones(rows, dtype=torch.float64))


def fit_notes(beta: torch.Tensor, fitted: torch.Tensor, what: str) -> str | None:
    """What a reader must know of a batch of fits: those left at T = 1 for want of an error to fit on, and those
    at a bound of the range searched; None where every fit is an inside minimum."""
    at_bound = (beta <= LOW * (1 + 1e-9)) | (beta >= HIGH * (1 - 1e-9))  # the loss still fell at an end of the range
    unfitted, bounded = int((~fitted).sum()), int((at_bound & fitted).sum())
    said = [*([f"{unfitted} of {len(beta)} {what} had no error (or no correct prediction) to fit a temperature on: "
               "T = 1 there"] if unfitted else []),
            *([f"{bounded} of {len(beta)} {what} ran to a bound of the range searched (T = {1 / HIGH:g} or {1 / LOW:g})"]
              if bounded else [])]
    return "; ".join(said) or None


def fit_temperature(log_probs: torch.Tensor, labels: torch.Tensor) -> float:
    """The T minimising the NLL of softmax(log_probs / T) (log_probs [N, C]); 1 where it has no minimum inside."""
    return 1 / fit_betas(log_probs[None], labels[None])[0].item()


def folds(name: str, inputs: int, blocks: int = 1, repeat: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(the fold of each of `blocks` × `inputs` examples [N], its place in the fold order [N]) of assignment
    `repeat`: the inputs in a seeded order, the i-th in fold i mod FOLDS; a clustered split's blocks (the pooled
    shift split: each input once per corruption) keep their input's fold."""
    seed = B.seed_of(name, inputs) + FOLD_SEED + 7919 * repeat  # (repeat 0: the folds of ensdiag 0.7)
    order = torch.randperm(inputs, generator=torch.Generator().manual_seed(seed))
    place = torch.empty(inputs, dtype=torch.long)
    place[order] = torch.arange(inputs)
    return (place % FOLDS).repeat(blocks), (place * blocks).repeat(blocks) + torch.arange(blocks).repeat_interleave(inputs)


def fitting_sets(fold: torch.Tensor, place: torch.Tensor, most: int) -> list[torch.Tensor]:
    """For each fold j, the examples its temperature is fitted on: those of the other folds, at most `most`,
    the first in the fold order."""
    return [(others := torch.nonzero(fold != j).flatten())[torch.argsort(place[others])[:most]] for j in range(FOLDS)]


def padded(chosen: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Index sets of different lengths as one index [sets, m] (padded with example 0) and its mask of real entries."""
    width = max(len(index) for index in chosen)
    return (torch.stack([F.pad(part, (0, width - len(part))) for part in chosen]),
            torch.stack([torch.arange(width) < len(part) for part in chosen]).double())
