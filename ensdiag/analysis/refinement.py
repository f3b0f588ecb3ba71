"""`refinement`: how much of a loss recalibration removes, and how much it cannot.

Berta et al. (2025, "Rethinking early stopping: refine, then calibrate") split a proper loss into
what the best post-hoc recalibration g of the predictions removes and what remains:

    loss(p̄) = [loss(p̄) − loss(g ∘ p̄)]  +  loss(g ∘ p̄)
               calibration error          refinement error

Refinement is what the predictions can still tell apart; calibration is what a map on top of them
fixes. Here g is temperature scaling of the ensemble's prediction, p' = softmax(log p̄ / T) (one
parameter: a lower bound on what any recalibration removes), fitted for each loss (NLL, Brier)
by **cross-fitting on the split's own examples** (scaling.py): the examples are cut into `FOLDS` seeded folds
(by split family and size, as the bootstrap draws: every method measured on the same examples gets the same
folds; the pooled shift split by image, each with all its corruptions) and each fold's examples are
recalibrated with the T fitted on the other folds (at most `FIT_EXAMPLES` of them, the first in the fold
order); `REPEATS` such assignments are averaged, because on a few hundred examples one assignment moves the
calibration part by more than its interval (each assignment's is kept: `assignments`). A fold whose fitting
examples hold no error keeps T = 1 (no evidence for a temperature; said in a note). Held-out fitting keeps
the refinement from borrowing the fit's own noise, and needs no validation split (the cifar10 preset has
none). The two parts add up to the loss exactly, per example and so in every mean; the calibration part can
fall a little below 0 where the model is calibrated already (the fold's T is fitted on other examples).

Intervals: every number is a weighted mean over the examples (weighted.py), and each bootstrap
resample refits its fold temperatures by one Newton step from the fitted ones, from the same
weighted sums of the per-example first and second derivatives in β = 1/T (the loss after it by
its second-order expansion): the refit's own sampling noise is in the interval, at the cost of one
pass over the examples.
"""

import torch

from ..errors import Skip
from ..layout import finite, metric
from ..stats import weighted as W
from ..stats.examples import Examples
from .registry import Column, labelled, register_analyzer, register_resampler
from ..stats.scaling import (FOLDS, HIGH, LOSSES, LOW, REPEATS, fit_betas, fit_notes, fitting_sets, folds, informative, padded,
                      terms)

FIT_EXAMPLES = 20_000  # of the other folds' examples, at most, fit each fold's temperature
SPLITS = ("id",)  # where the report reads it: the main job pays for no other split's fits (docs/conventions.md)
PARTS = {
    "loss": "mean over samples of the {loss} of p̄",
    "calibration": "mean over samples of the {loss} of p̄ minus that after temperature scaling, p' = softmax(log p̄ / T) "
                   "with T cross-fitted on the split's own samples ({folds} folds, {repeats} assignments averaged): what "
                   "recalibration removes (Berta et al. 2025)",
    "refinement": "mean over samples of the {loss} after temperature scaling (T cross-fitted on the split's own "
                  "samples, {folds} folds, {repeats} assignments averaged): what recalibration cannot remove "
                  "(Berta et al. 2025)",
}


def definition(part: str, loss: str) -> str:
    return PARTS[part].format(loss=LOSSES[loss], folds=FOLDS, repeats=REPEATS)


def fit(name: str, split: Examples) -> dict:
    """Per loss: in each of `REPEATS` fold assignments, each fold's β fitted on the other folds (1 where those
    hold no error: `informative`), and what every weighting reads, as matrices [N, cells] (a cell: one fold of
    one assignment) that one product with the weights sums per cell: the fit sets' first and second
    derivatives at their cell's β ("fit"), and each example's own loss and derivatives at its cell's β ("own")."""
    z, labels = split.log_mean, split.labels
    inputs = split.clusters or split.size
    assignments = [folds(name, inputs, split.size // inputs, repeat) for repeat in range(REPEATS)]
    index, inside = padded([part for fold, place in assignments for part in fitting_sets(fold, place, FIT_EXAMPLES)])
    z_fit, y_fit = z[index], labels[index]
    fitted = informative(z_fit, y_fit, inside)
    cell = torch.stack([repeat * FOLDS + fold for repeat, (fold, _) in enumerate(assignments)])  # [REPEATS, N]

    def spread(values):  # [cells, m] at the fit sets' places -> [N, cells]
        return torch.zeros(len(index), split.size, dtype=torch.float64).scatter_add_(1, index, values * inside).T

    found = {}
    for loss in LOSSES:
        beta = fit_betas(z_fit, y_fit, loss, inside)
        _, d1, d2 = terms(z_fit, y_fit, beta[:, None].expand(-1, index.shape[1]), loss)
        own = [torch.zeros(split.size, len(index), dtype=torch.float64) for _ in range(3)]
        for repeat in range(REPEATS):
            for matrix, values in zip(own, terms(z, labels, beta[cell[repeat]], loss)):
                matrix.scatter_(1, cell[repeat][:, None], values[:, None])
        found[loss] = {"beta": beta, "fitted": fitted, "fit": (spread(d1), spread(d2)), "own": own,
                       "plain": terms(z, labels, torch.ones(len(z)), loss)[0]}
    return found


def parts(name: str, split: Examples, loss: str, w=None) -> dict:
    """{"loss", "calibration", "refinement"} of one loss for weighting w (None, [n] or [b, n]), the refinement
    averaged over the fold assignments, each fold's β refitted to w by one Newton step (a fold left unscaled
    stays so); calibration = loss − refinement; "each": the refinement of every assignment, [REPEATS]."""
    def make():
        fitted = split.memo(f"refinement:{name}", lambda: fit(name, split))[loss]
        weights, single = W.rows(w, split.size)
        slope, curve = (weights @ matrix for matrix in fitted["fit"])  # [b, cells]
        beta = fitted["beta"]
        newton = (beta - slope / curve.clamp(min=1e-300)).clamp(LOW, HIGH) - beta
        step = torch.where((curve > 0) & fitted["fitted"], newton, 0.0)  # no curvature (Brier's flat ends): held
        value, d1, d2 = (weights @ matrix for matrix in fitted["own"])
        total = weights.sum(1)
        each = (value + step * d1 + step**2 / 2 * d2).view(len(weights), REPEATS, FOLDS).sum(2) / total[:, None]
        refinement = each.mean(1)
        plain = weights @ fitted["plain"] / total
        out = {"loss": plain, "calibration": plain - refinement, "refinement": refinement, "each": each}
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
    for name, split in labelled(predictions, SPLITS):  # each split costs a fit per fold and loss: where the report reads it
        if (split.clusters or split.size) < 2 * FOLDS:
            splits[name] = {loss: {part: metric(None, definition(part, loss), note=f"fewer than {2 * FOLDS} inputs: "
                                                f"too few to cross-fit over {FOLDS} folds") for part in PARTS}
                            for loss in LOSSES}
            continue
        entry = {}
        for loss in LOSSES:
            found = parts(name, split, loss)
            entry[loss] = {part: metric(float(found[part]), definition(part, loss)) for part in PARTS}
            each = (found["loss"] - found["each"]).tolist()
            entry[loss]["calibration"]["assignments"] = finite(each)  # the spread averaging over assignments removes
            fitted = split.memo(f"refinement:{name}", lambda: fit(name, split))[loss]
            entry[loss]["temperatures"] = metric((1 / fitted["beta"]).tolist(), f"each fold's T, fitted on the other "
                                                 f"folds to minimise the {LOSSES[loss]} ({REPEATS} assignments of "
                                                 f"{FOLDS} folds; 1 where those folds hold no error to fit on)")
            note = fit_notes(fitted["beta"], fitted["fitted"], "fold fits")
            if note:
                entry[loss]["temperatures"]["note"] = note
        splits[name] = {**entry, "n": split.size}
    if not splits:
        raise Skip("no labelled in-distribution test split")
    return {"splits": splits, "map": "temperature scaling of log p̄, cross-fitted on each split's own samples "
                                     f"({FOLDS} seeded folds, {REPEATS} assignments averaged; each fold's T fitted on at "
                                     f"most {FIT_EXAMPLES:,} of the other folds' samples)"}


@register_resampler("refinement")
def _resampler(predictions, weights, result, wanted):
    """Each split's parts over its resamples, the fold temperatures refitted by one Newton step each."""
    chosen = {name: Examples.of(predictions[name]) for name in result.get("splits", {}) if name in predictions}

    def resample(counts):
        return {path: parts(path[1], chosen[path[1]], path[2], counts[path[1]])[path[3]] for path in wanted
                if path[1] in counts and path[1] in chosen}
    return resample
