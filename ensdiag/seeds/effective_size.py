"""Effective ensemble size: each method of a run folder as the number of Deep-Ensemble members that
would score as well (Ashukha et al., ICLR 2020, "deep ensemble equivalent"), read off the power law
of the Deep Ensemble's loss in its size (Lobacheva et al., NeurIPS 2020; power_law.py).

    found = effective_sizes(runs)          # {method: {"members", "cnll" | "brier" | "auroc": {"value", "interval", …}}}
    found["batch-ensemble"]["cnll"]        # {"value": 1.1, "interval": [1.0, 1.3], "extrapolated": False, …}

From predictions alone (every run's, as across.py reads them: trained here, or `ensdiag analyze`
predictions of an LLM's adapters saved as methods of one run folder):
1. each sub-ensemble of the Deep Ensemble (all subsets of each size n = 1…K, or `MAX_SUBSETS`
   drawn at random from a fixed generator where a size has more) and each method pool their
   members' probabilities, p̄ = mean_i p_i (`Examples.subset`: every per-example quantity as the
   tables define it);
2. the calibrated NLL: −log softmax(log p̄ / T)(y), T fitted by the one solver (stats/scaling.py)
   on the run's validation split; a run without one cross-fits T on the test set (Ashukha et al.'s
   test-time cross-validation: each fold scored with the T fitted on the other folds, as the
   refinement analyzer's, assignments averaged); a fit whose examples hold no error keeps T = 1, and
   the entry's `temperature_note` says how many did and how many ran to a bound; the Brier score and
   OOD AUROC (score 1 − max p̄) as the per-split tables measure them, unscaled;
3. per seed, the Deep Ensemble's mean over the sub-ensembles of each size, the power law fitted to
   it, and the size at which it reaches the method's value on the same seed (≥ 1: a method no
   better than one member is 1; beyond the K sizes measured the law is extrapolated, and said so);
4. the mean over seeds, with a 95 % interval that is the envelope of the Student-t interval over
   the per-seed sizes and the verdict's paired bootstrap (resampled seeds, `verdict.chosen_seeds`;
   test examples with the draws behind every cell, `bootstrap.Draws`, the first `RESAMPLES` of
   them; T is fitted once, on data not resampled).
A size is read only where the Deep Ensemble's mean curve improves with every member it adds.
"""

import math
from itertools import combinations

import torch

from ..stats import bootstrap as B
from ..stats import weighted as W
from ..stats.bootstrap import BLOCK_ENTRIES
from ..stats.scaling import FOLDS, REPEATS, fit_betas, fit_notes, fitting_sets, folds, informative, padded
from ..budget import over_budget
from ..checks import test_set_difference
from . import power_law
from .stats import envelope, percentiles, t_quantile
from .verdict import REFERENCE, chosen_seeds

MAX_SUBSETS = 24  # sub-ensembles per size: all of them up to this many, else this many drawn at random
RESAMPLES = 250  # the first of the verdict's resamples: each refits every law and re-reads every size, so a
#                  quarter of them keeps the report's cost down (2.5th and 97.5th percentiles: the 7th from each end)
METRICS = {"cnll": "calibrated NLL", "brier": "Brier score", "auroc": "OOD AUROC"}


def subsets(k: int, limit: int = MAX_SUBSETS) -> list[tuple[int, ...]]:
    """The sub-ensembles of each size 1…k: every one where a size has at most `limit`, else `limit`
    distinct ones drawn from a fixed generator (so reports are reproducible)."""
    found, generator = [], torch.Generator().manual_seed(0)
    for n in range(1, k + 1):
        if math.comb(k, n) <= limit:
            found += list(combinations(range(k), n))
            continue
        chosen = set()
        while len(chosen) < limit:
            chosen.add(tuple(sorted(torch.randperm(k, generator=generator)[:n].tolist())))
        found += sorted(chosen)
    return found


def _pooled(split, chosen: list[tuple[int, ...]], *quantities) -> list[torch.Tensor]:
    """[S, …] each of the `Examples` quantities (log_mean, brier, confidence, …) of every chosen
    sub-ensemble of a split, one sub-ensemble at a time."""
    found = [[getattr(part, name) for name in quantities] for part in (split.subset(members) for members in chosen)]
    return [torch.stack(column) for column in zip(*found)]


def _calibrated_nll(pooled: torch.Tensor, labels: torch.Tensor, val_pooled, val_labels) -> tuple:
    """([S, N] −log softmax(log p̄ / T)(y) per example, the fitted β's, whether each fit had evidence): T fitted
    on the validation split or, without one, cross-fitted on the test set (scaling.py: each fold's T fitted on
    the other folds, `REPEATS` assignments averaged); a fit whose examples hold no error keeps T = 1."""
    picked = pooled.gather(2, labels.expand(len(pooled), -1)[..., None]).squeeze(-1)  # [S, N]: log p̄(y)
    if val_pooled is not None:
        y = val_labels.expand(len(val_pooled), -1)
        beta = fit_betas(val_pooled, y)
        return (torch.logsumexp(pooled * beta[:, None, None], 2) - picked * beta[:, None], beta,
                informative(val_pooled, y, torch.ones_like(y, dtype=torch.float64)))
    assignments = [folds("id", pooled.shape[1], 1, repeat) for repeat in range(REPEATS)]
    index, inside = padded([part for fold, place in assignments for part in fitting_sets(fold, place, len(labels))])
    betas, fitted = [], []
    for part in pooled.split(max(1, BLOCK_ENTRIES // inside.numel() // pooled.shape[2])):  # sub-ensembles at once
        z_fit, y_fit, mask = part[:, index].flatten(0, 1), labels[index].repeat(len(part), 1), inside.repeat(len(part), 1)
        betas.append(fit_betas(z_fit, y_fit, "nll", mask))
        fitted.append(informative(z_fit, y_fit, mask))
    betas = torch.cat(betas).view(len(pooled), -1)
    nll = sum(torch.logsumexp(pooled * t[..., None], 2) - picked * t
              for t in (betas[:, repeat * FOLDS + fold] for repeat, (fold, _) in enumerate(assignments))) / REPEATS
    return nll, betas.flatten(), torch.cat(fitted)


def per_example(run, chosen: list[tuple[int, ...]]) -> dict:
    """Each chosen sub-ensemble's per-example values on one run (across.Seed): {"cnll", "brier",
    "id_score": [S, N], "ood_score": [S, N_ood] (where the run has OOD data)}."""
    pooled, brier, confidence = _pooled(run.id, chosen, "log_mean", "brier", "confidence")
    val_pooled, val_labels = (_pooled(run.val, chosen, "log_mean")[0], run.val.labels) if run.val is not None else (None, None)
    cnll, beta, fitted = _calibrated_nll(pooled, run.id.labels, val_pooled, val_labels)
    out = {"cnll": cnll, "beta": beta, "fitted": fitted, "brier": brier, "id_score": 1 - confidence}
    if run.ood is not None:
        out["ood_score"] = 1 - _pooled(run.ood, chosen, "confidence")[0]
    return out


def _resampled(values: dict, w_id: torch.Tensor, w_ood) -> dict:
    """{metric: [1 + R, S]} each sub-ensemble's mean under the weightings (row 0: as measured), as
    losses (AUROC as 1 − AUROC: lower is better for every curve)."""
    found = {key: w_id @ values[key].T / w_id.sum(1, keepdim=True) for key in ("cnll", "brier")}
    if "ood_score" in values and w_ood is not None:
        found["auroc"] = 1 - torch.stack([W.auroc(i, o, w_id, w_ood) for i, o in zip(values["id_score"],
                                                                                     values["ood_score"])], dim=1)
    return found


def _read(values: torch.Tensor, fitted: dict, picked: torch.Tensor, k: int) -> dict:
    """One metric's size entry: the method's values [seeds, 1 + R] (row 0 of the second axis: as measured)
    read off the seeds' laws (`fitted`, each [seeds, 1 + R]), with the Deep Ensemble's curve: the size where
    the mean of the seeds' curves reaches the mean of the method's values (the verdict's ratio of means, here
    through the curve); its interval the envelope of the paired t-test's set over seeds
    (power_law.seed_interval) and the bootstrap over seeds and examples (`picked` [R, seeds]: the seeds each
    resample drew)."""
    shown = {"curve": fitted["curve"], "fit": fitted["fit"]}
    if "law" not in fitted:
        return {"value": None, "interval": None, "reason": fitted["reason"], **shown}
    a, b, c = fitted["law"]
    value = power_law.solve(values[:, 0][None], a[:, 0][None], b[:, 0][None], c[:, 0][None])[0].item()
    per_seed = power_law.size_at(values[:, 0], a[:, 0], b[:, 0], c[:, 0]).tolist()
    if math.isnan(value):
        return {"value": None, "interval": None, "per_seed": per_seed,
                "reason": "the Deep Ensemble's fitted curve does not fall on every seed", **shown}
    drawn = torch.nn.functional.one_hot(picked, values.shape[0]).sum(1).double()  # [R, seeds]: times drawn
    resampled = power_law.solve(values[:, 1:].T, a[:, 1:].T, b[:, 1:].T, c[:, 1:].T, drawn)
    over_seeds = power_law.seed_interval(values[:, 0], a[:, 0], b[:, 0], c[:, 0], t_quantile(values.shape[0])) \
        if values.shape[0] > 1 else None
    value = round(value, 9)  # the bisection's last digits are noise: a Deep Ensemble reads its k exactly
    interval = envelope(percentiles(resampled.tolist()), over_seeds, [value, value])  # (holding the estimate)
    interval = [round(bound, 9) if math.isfinite(bound) else bound for bound in interval]
    beyond = k * (1 + 1e-9)  # a size past the Deep Ensemble's own is read by extrapolating the law (∞: unbounded)
    return {"value": value, "interval": interval, "per_seed": per_seed, "reason": None,
            "extrapolated": value > beyond or (interval is not None and beyond < interval[1] < math.inf), **shown}


def _fitted(curves: torch.Tensor, metric: str) -> dict:
    """The Deep Ensemble's curve of one metric over seeds [seeds, 1 + R, K] fitted, every seed and
    weighting at once ({"law": (a, b, c) each [seeds, 1 + R]}), with what the report shows of it: the
    measured curve's mean over seeds, the law fitted to that mean, and why no size is read where the
    mean curve does not improve with every member it adds."""
    seeds, rows, k = curves.shape
    mean_curve = curves[:, 0].mean(0)
    a, b, c = power_law.fit(mean_curve[None])
    shown = {"curve": (1 - mean_curve if metric == "auroc" else mean_curve).tolist(),
             "fit": {"a": (1 - a if metric == "auroc" else a).item(), "b": b.item(), "c": c.item()}}
    if not bool((mean_curve.diff() < -1e-9 * mean_curve.abs().max()).all()):  # (beyond rounding: copies)
        return {**shown, "reason": f"the Deep Ensemble's {METRICS[metric]} does not improve with every member it adds"}
    return {**shown, "law": tuple(part.view(seeds, rows) for part in power_law.fit(curves.reshape(-1, k)))}


def effective_sizes(runs: dict, draws=None, resamples: int = RESAMPLES) -> dict:
    """{method: entry} for every method of `runs` ({method: {seed: across.Seed}}) beside a Deep Ensemble,
    the Deep Ensemble itself included (it reads K: the law passes through its value); {} without
    one. An entry: {"members": k, "reference_members": K, "seeds", "subsets", "temperature", and
    per metric {"value", "interval", "per_seed", "extrapolated", "reason", "curve", "fit"}} or
    {"reason"}; `draws` is the verdict's bootstrap.Draws (shared: the test-set sampling is the tables')."""
    if REFERENCE not in runs:
        return {}
    draws = draws if draws is not None else B.Draws()
    loaded = {method: {seed: run for seed, run in seeds.items() if run.id.size >= 2} for method, seeds in runs.items()}
    reference = loaded[REFERENCE]
    ks = {run.id.members for run in reference.values()}
    if len(ks) != 1 or min(ks) < 2:
        why = "the Deep Ensemble has one member" if ks == {1} else "the Deep Ensemble's seeds have different member counts"
        return {method: {"reason": why} for method in runs} if ks else {}
    k = ks.pop()
    chosen_subsets = subsets(k)
    by_size = torch.nn.functional.one_hot(torch.tensor([len(members) for members in chosen_subsets]) - 1, k).double()
    by_size = by_size / by_size.sum(0)  # [S, K]: the mean over each size's sub-ensembles
    fitted_for, found = {}, {}
    for method in runs:
        seeds = sorted(set(reference) & set(loaded[method]))
        if not seeds:
            continue
        n, difference = reference[seeds[0]].id.size, test_set_difference(
            [(group[seed].id.labels, group[seed].id.logits.shape[-1]) for group in (reference, loaded[method]) for seed in seeds])
        if difference is not None:
            found[method] = {"reason": f"its test set and the Deep Ensemble's differ ({difference})"}
            continue
        reason = over_budget(len(chosen_subsets) * n * reference[seeds[0]].id.logits.shape[-1] * 8 * 3,
                             "the Deep Ensemble's sub-ensembles")
        if reason:
            found[method] = {"reason": reason}
            continue
        ood = {group[seed].ood.size if group[seed].ood is not None else None
               for group in (reference, loaded[method]) for seed in seeds}
        n_ood = ood.pop() if len(ood) == 1 else None
        key = (tuple(seeds), n, n_ood)
        def counts(split, size):  # drawn as many as the verdict reads, so that they are drawn once
            return draws.counts(split, size, 0, max(resamples, B.RESAMPLES))[:resamples]
        w_id = torch.cat([torch.ones(1, n, dtype=torch.float64), counts("id", n)])
        w_ood = torch.cat([torch.ones(1, n_ood, dtype=torch.float64), counts("ood", n_ood)]) if n_ood else None
        if key not in fitted_for:  # the Deep Ensemble's laws serve every method with these seeds
            found_seeds = [per_example(reference[seed], chosen_subsets) for seed in seeds]
            per_seed = [_resampled(values, w_id, w_ood) for values in found_seeds]
            fitted_for[key] = {metric: _fitted(torch.stack([values[metric] @ by_size for values in per_seed]), metric)
                               for metric in per_seed[0]}
            fitted_for[key]["fits"] = [(values["beta"], values["fitted"]) for values in found_seeds]
        fitted = fitted_for[key]
        found_seeds = [per_example(loaded[method][seed], [tuple(range(loaded[method][seed].id.members))])
                       for seed in seeds]
        mine = [_resampled(values, w_id, w_ood) for values in found_seeds]
        validated = all(group[seed].val is not None for group in (reference, loaded[method]) for seed in seeds)
        fits = [*fitted["fits"], *((values["beta"], values["fitted"]) for values in found_seeds)]
        entry = {"members": loaded[method][seeds[0]].id.members, "reference_members": k, "seeds": len(seeds),
                 "reference": method == REFERENCE, "subsets": len(chosen_subsets), "resamples": resamples,
                 "temperature": "validation" if validated else "cross-validation",
                 "temperature_note": fit_notes(torch.cat([beta for beta, _ in fits]),
                                               torch.cat([mask for _, mask in fits]),
                                               "temperature fits (this method's and the Deep Ensemble's sub-ensembles')")}
        picked = chosen_seeds(len(seeds), resamples)
        for metric in METRICS:
            if metric in fitted and metric in mine[0]:
                entry[metric] = _read(torch.stack([values[metric][:, 0] for values in mine]), fitted[metric], picked, k)
        found[method] = entry
    return found
