"""`refinement`: how much of a loss recalibration removes, and how much it cannot.

Berta et al. (2025, "Rethinking early stopping: refine, then calibrate") split a proper loss into
what the best post-hoc recalibration g of the predictions removes and what remains:

    loss(p̄) = [loss(p̄) − loss(g ∘ p̄)]  +  loss(g ∘ p̄)
               calibration error          refinement error

Refinement is what the predictions can still tell apart; calibration is what a map on top of them
fixes. Here g is temperature scaling of the ensemble's prediction, p' = softmax(log p̄ / T) (one
parameter: a lower bound on what any recalibration removes), fitted for each loss (NLL, Brier)
by **cross-fitting on the split's own examples**: the examples are cut into `FOLDS` seeded folds
(by split family and size, as the bootstrap draws: every method measured on the same examples
gets the same folds; the pooled shift split by image, each with all its corruptions) and each
fold's examples are recalibrated with the T fitted on the other folds (at most `FIT_EXAMPLES` of
them, the first in the fold order). Held-out fitting keeps the refinement from borrowing the
fit's own noise, and needs no validation split (the cifar10 preset has none). The two parts add
up to the loss exactly, per example and so in every mean; the calibration part can fall a little
below 0 where the model is calibrated already (the fold's T is fitted on other examples).

Intervals: every number is a weighted mean over the examples (weighted.py), and each bootstrap
resample refits its fold temperatures by one Newton step from the fitted ones, from the same
weighted sums of the per-example first and second derivatives in β = 1/T (the loss after it by
its second-order expansion): the refit's own sampling noise is in the interval, at the cost of one
pass over the examples.
"""

import torch
import torch.nn.functional as F

from . import bootstrap as B
from . import weighted as W
from .examples import Examples
from .registry import Column, Skip, metric, register_analyzer, register_resampler

FOLDS = 5
FIT_EXAMPLES = 20_000  # of the other folds' examples, at most, fit each fold's temperature
LOW, HIGH = 1 / 50, 1 / 0.02  # β = 1/T searched in [0.02, 50], T in [0.02, 50] (as the temperature analyzer)
FOLD_SEED = 2  # added to the split's draws' seed (bootstrap.seed_of): the folds' own stream
SPLITS = ("id",)  # where the report reads it: the main job pays for no other split's fits (docs/conventions.md)
MAX_STEPS = 100  # Newton or bisection steps of a fit, at most (Newton converges in a handful)
LOSSES = {"nll": "NLL, −log p(y)", "brier": "Brier score, Σ_c (p_c − 1[y=c])²"}
PARTS = {
    "loss": "mean over samples of the {loss} of p̄",
    "calibration": "mean over samples of the {loss} of p̄ minus that after temperature scaling, p' = softmax(log p̄ / T) "
                   "with T cross-fitted on the split's own samples ({folds} folds): what recalibration removes "
                   "(Berta et al. 2025)",
    "refinement": "mean over samples of the {loss} after temperature scaling (T cross-fitted on the split's own "
                  "samples, {folds} folds): what recalibration cannot remove (Berta et al. 2025)",
}


def definition(part: str, loss: str) -> str:
    return PARTS[part].format(loss=LOSSES[loss], folds=FOLDS)


def scaled(z: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """log softmax(β·z) over the last axis; β broadcast over z's leading axes."""
    return torch.log_softmax(beta[..., None] * z, dim=-1)


def losses(z: torch.Tensor, labels: torch.Tensor, beta: torch.Tensor, loss: str) -> torch.Tensor:
    """The loss of softmax(β·z) per example (z [..., C], labels and β [...])."""
    log_q = scaled(z, beta)
    if loss == "nll":
        return -log_q.gather(-1, labels[..., None]).squeeze(-1)
    return (log_q.exp() - F.one_hot(labels, z.shape[-1]).double()).pow(2).sum(-1)


def terms(z: torch.Tensor, labels: torch.Tensor, beta: torch.Tensor, loss: str) -> tuple[torch.Tensor, ...]:
    """(loss, d loss/dβ, d² loss/dβ²) per example of softmax(β·z), z = log p̄ [..., C], labels and β [...]."""
    log_q = scaled(z, beta)
    q = log_q.exp()
    centred = z - (q * z).sum(-1, keepdim=True)  # z − E_q[z]
    variance = (q * centred * centred).sum(-1)  # Var_q[z] = d E_q[z] / dβ
    at_label = labels[..., None]
    if loss == "nll":  # log Σ exp(βz) − β z_y
        return -log_q.gather(-1, at_label).squeeze(-1), -centred.gather(-1, at_label).squeeze(-1), variance
    residual = q - F.one_hot(labels, z.shape[-1]).double()
    dq = q * centred  # d q_c / dβ
    d2q = q * (centred * centred - variance[..., None])
    return residual.pow(2).sum(-1), 2 * (residual * dq).sum(-1), 2 * (dq * dq + residual * d2q).sum(-1)


def minimise(derivatives, folds: int) -> torch.Tensor:
    """The β [folds] in [LOW, HIGH] minimising each fold's loss, from `derivatives(β [folds, r]) -> (mean
    slope, mean curvature) [folds, r]` of a loss with one minimum: at an end where the slope does not
    change sign there, else the slope's root by Newton steps kept inside a shrinking bracket (a
    bisection where a step would leave it; Press et al.'s rtsafe). To 10⁻¹² of β."""
    slope, _ = derivatives(torch.tensor([[LOW, HIGH]], dtype=torch.float64).expand(folds, 2))
    low_slope, high_slope = slope.unbind(1)
    low, high = torch.full((folds,), LOW, dtype=torch.float64), torch.full((folds,), HIGH, dtype=torch.float64)
    beta = torch.where(low_slope >= 0, low, torch.where(high_slope <= 0, high, torch.ones(folds, dtype=torch.float64)))
    inside = (low_slope < 0) & (high_slope > 0)  # a minimum strictly between the ends
    for _ in range(MAX_STEPS):
        if not inside.any():
            break
        slope, curve = (part[:, 0] for part in derivatives(beta[:, None]))
        low, high = torch.where(inside & (slope < 0), beta, low), torch.where(inside & (slope > 0), beta, high)
        step = beta - slope / curve.clamp(min=1e-300)
        bisect = (low + high) / 2
        new = torch.where((curve > 0) & (step >= low) & (step <= high), step, bisect)
        done = (new - beta).abs() <= 1e-12 * beta.abs().clamp(min=1)
        beta = torch.where(inside, new, beta)
        inside = inside & ~done
    return beta


def folds(name: str, split: Examples) -> tuple[torch.Tensor, torch.Tensor]:
    """(the fold of each example [N], its place in the fold order [N]): inputs in a seeded order, the
    i-th in fold i mod FOLDS; a clustered split's blocks (examples.py) keep their input's fold."""
    inputs = split.clusters or split.size
    order = torch.randperm(inputs, generator=torch.Generator().manual_seed(B.seed_of(name, inputs) + FOLD_SEED))
    place = torch.empty(inputs, dtype=torch.long)
    place[order] = torch.arange(inputs)
    blocks = split.size // inputs
    return (place % FOLDS).repeat(blocks), (place * blocks).repeat(blocks) + torch.arange(blocks).repeat_interleave(inputs)


def fit(name: str, split: Examples) -> dict:
    """Per loss: each fold's β fitted on the other folds, and the per-example terms every weighting
    reads (the fit sets' derivatives at their fold's β, each example's own at its fold's β)."""
    z, labels = split.log_mean, split.labels
    fold, place = folds(name, split)
    chosen = []
    for j in range(FOLDS):
        others = torch.nonzero(fold != j).flatten()
        chosen.append(others[torch.argsort(place[others])[:FIT_EXAMPLES]])
    width = max(len(index) for index in chosen)
    index = torch.stack([F.pad(part, (0, width - len(part))) for part in chosen])  # [FOLDS, m], padded with example 0
    inside = torch.stack([torch.arange(width) < len(part) for part in chosen]).double()
    z_fit, y_fit = z[index], labels[index]
    found = {}
    for loss in LOSSES:
        def derivatives(beta, loss=loss):  # β [folds, r] -> each fold's mean slope and curvature at each
            shape = (*beta.shape, width)
            _, slope, curve = terms(z_fit[:, None].expand(*shape, -1), y_fit[:, None].expand(shape),
                                    beta[..., None].expand(shape), loss)
            return tuple((part * inside[:, None]).sum(-1) / inside.sum(-1)[:, None] for part in (slope, curve))
        beta = minimise(derivatives, FOLDS)
        _, d1, d2 = terms(z_fit, y_fit, beta[:, None].expand(-1, width), loss)
        found[loss] = {"beta": beta, "fit": [(part, d1[j, :len(part)], d2[j, :len(part)]) for j, part in enumerate(chosen)],
                       "own": terms(z, labels, beta[fold], loss), "plain": losses(z, labels, torch.ones(len(z)), loss),
                       "groups": W.Groups(fold, FOLDS)}
    return found


def parts(name: str, split: Examples, loss: str, w=None) -> dict:
    """{"loss", "calibration", "refinement"} of one loss for weighting w (None, [n] or [b, n]): the
    refinement with each fold's β refitted to w by one Newton step, calibration = loss − refinement."""
    def make():
        fitted = split.memo(f"refinement:{name}", lambda: fit(name, split))[loss]
        weights, single = W.rows(w, split.size)
        slope = torch.stack([weights[:, chosen] @ d1 for chosen, d1, _ in fitted["fit"]], 1)  # [b, FOLDS]
        curve = torch.stack([weights[:, chosen] @ d2 for chosen, _, d2 in fitted["fit"]], 1)
        beta = fitted["beta"]
        newton = (beta - slope / curve.clamp(min=1e-300)).clamp(LOW, HIGH) - beta
        step = torch.where(curve > 0, newton, torch.zeros_like(newton))  # no curvature (Brier's flat ends): held
        value, d1, d2 = fitted["own"]
        groups, total = fitted["groups"], weights.sum(1)
        refined = (groups.sums(weights, value) + step * groups.sums(weights, d1) + step**2 / 2 * groups.sums(weights, d2))
        refinement = refined.sum(1) / total
        plain = weights @ fitted["plain"] / total
        out = {"loss": plain, "calibration": plain - refinement, "refinement": refinement}
        return {key: found[0] if single else found for key, found in out.items()}
    return split.per_weighting(f"refinement:{name}:{loss}", w, make)


@register_analyzer("refinement", description="NLL and Brier split into calibration (what temperature scaling, "
                   "cross-fitted on the split, removes) and refinement (what it cannot; Berta et al. 2025)",
                   columns=[Column(f"{loss_label} {part} ({split})", ("splits", split, loss, part, "value"), "down",
                                   definition(part, loss), ("refinement",), 20 * index + 10 * offset + place, split=split)
                            for index, split in enumerate(SPLITS)
                            for offset, (loss, loss_label) in enumerate((("nll", "NLL"), ("brier", "Brier")))
                            for place, part in enumerate(("calibration", "refinement"))])
def refinement(predictions, weights=None):
    splits = {}
    for name, split in predictions.items():
        if name not in SPLITS or split["labels"] is None or len(split["labels"]) == 0:
            continue  # each split costs a fit per fold and loss: where the report reads it
        split = Examples.of(split)
        if (split.clusters or split.size) < 2 * FOLDS:
            splits[name] = {loss: {part: metric(None, definition(part, loss), note=f"fewer than {2 * FOLDS} inputs: "
                                                f"too few to cross-fit over {FOLDS} folds") for part in PARTS}
                            for loss in LOSSES}
            continue
        entry = {loss: {part: metric(float(found), definition(part, loss)) for part, found in parts(name, split, loss).items()}
                 for loss in LOSSES}
        for loss in LOSSES:
            betas = split.memo(f"refinement:{name}", lambda: fit(name, split))[loss]["beta"]
            entry[loss]["temperatures"] = metric((1 / betas).tolist(), f"each fold's T, fitted on the other folds "
                                                 f"to minimise the {LOSSES[loss]}")
        splits[name] = {**entry, "n": split.size}
    if not splits:
        raise Skip("no labelled in-distribution test split")
    return {"splits": splits, "map": "temperature scaling of log p̄, cross-fitted on each split's own samples "
                                     f"({FOLDS} seeded folds; each fold's T fitted on at most {FIT_EXAMPLES:,} of the "
                                     "other folds' samples)"}


@register_resampler("refinement")
def _resampler(predictions, weights, result, wanted):
    """Each split's parts over its resamples, the fold temperatures refitted by one Newton step each."""
    chosen = {name: Examples.of(predictions[name]) for name in result.get("splits", {}) if name in predictions}

    def resample(counts):
        return {path: parts(path[1], chosen[path[1]], path[2], counts[path[1]])[path[3]] for path in wanted
                if path[1] in counts and path[1] in chosen}
    return resample
