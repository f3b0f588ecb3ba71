"""`conformal`: split-conformal prediction sets from the ensemble's probabilities p̄ (LAC and APS
scores), with their coverage and size on held-out questions, overall and per subtask.

    sets = prediction_sets(lac_scores(p), conformal_quantile(lac_scores(p_cal)[range(n), y_cal], 0.1), p > 0)

Split conformal prediction (Vovk et al. 2005; Angelopoulos & Bates 2023): a score s(x, y) that
is large when y is an unlikely answer to x; the calibration questions' scores s_i = s(x_i, y_i);
the threshold q̂ = the ⌈(n + 1)(1 − α)⌉-th smallest of the n calibration scores (+∞ where that
rank passes n: every set is every choice); the prediction set C(x) = {y : s(x, y) ≤ q̂}.
- LAC (least ambiguous set-valued classifier, Sadinle et al. 2019): s(x, y) = 1 − p̄_y;
- APS (adaptive prediction sets, Romano et al. 2020), without randomisation:
  s(x, y) = Σ_c p̄_c·1[p̄_c > p̄_y] + p̄_y, the mass of the choices at least as likely as y.
A choice of probability exactly 0 (the padding of a question with fewer choices) is never in a set.

**What is guaranteed.** If the calibration and the test questions are exchangeable (drawn alike,
in an order that says nothing about them: a random split of one benchmark, as here), then for a
new question the probability that its answer is in its set is at least 1 − α, and, when no two
scores tie, at most 1 − α + 1/(n + 1). The probability is over the calibration questions and the
new one together: the guarantee is marginal, an average over questions, not conditional on a
subtask, a kind of question or one calibration draw — a subtask may be covered less (the
per-subtask numbers show how much). The (n + 1) in the rank is the finite-sample correction that
makes it hold for every n. Questions from another distribution (another benchmark, a shift) are
not covered by it.

**Which questions.** The labelled `val` split calibrates where there is one, and every `id`
question is a test question; otherwise the `id` questions are split at random, half for
calibration (⌊n/2⌋) and the rest for test, with a generator seeded by `SEED`: the result states
the split. Coverage and mean set size are measured on the test questions: overall, and per
subtask where `id` pools subtasks (`id/<subtask>`, lm-eval groups). Their intervals are given
here, given this calibration (the core's resampling would put calibration copies into the test
half): coverage Clopper–Pearson over the test questions; set size a percentile bootstrap over them.
"""

import math
from fractions import Fraction

import torch

from ..stats import bootstrap as B
from ..stats import constructions as CI
from ..stats.examples import Examples
from .registry import Column, register_analyzer
from ..errors import Skip
from ..layout import metric

ALPHA = 0.1
LEVELS = (0.05, 0.1, 0.2)
SEED = 0
GUARANTEE = ("Split conformal: if calibration and test questions are exchangeable, P(answer ∈ set) ≥ 1 − α for a "
             "new question, ≤ 1 − α + 1/(n+1) without ties in the scores (n calibration questions; the threshold is "
             "the ⌈(n+1)(1−α)⌉-th smallest calibration score). Marginal, over questions and calibration draws together: "
             "not conditional on a subtask or a kind of question; not for questions from another distribution.")
DEFINITIONS = {"lac": "LAC: s(x, y) = 1 − p̄_y", "aps": "APS (not randomised): s(x, y) = Σ_c p̄_c·1[p̄_c > p̄_y] + p̄_y"}


def lac_scores(probs: torch.Tensor) -> torch.Tensor:
    """s(x, c) = 1 − p_c for every choice [N, C]."""
    return 1 - probs


def aps_scores(probs: torch.Tensor) -> torch.Tensor:
    """s(x, c) = Σ_c' p_c'·1[p_c' > p_c] + p_c for every choice [N, C] (ties: the same score)."""
    ascending = probs.sort(dim=-1).values
    below = torch.cumsum(ascending, dim=-1)
    at_most = torch.searchsorted(ascending.contiguous(), probs.contiguous(), right=True)  # choices with p ≤ p_c
    total = below[..., -1:]
    greater = total - below.gather(-1, (at_most - 1).clamp(min=0))
    return greater + probs


SCORES = {"lac": lac_scores, "aps": aps_scores}


def conformal_rank(n: int, alpha: float) -> int:
    """⌈(n + 1)(1 − α)⌉, computed exactly (α as the decimal it was written as)."""
    return math.ceil((n + 1) * (1 - Fraction(str(alpha))))


def conformal_quantile(calibration: torch.Tensor, alpha: float) -> float:
    """The ⌈(n + 1)(1 − α)⌉-th smallest calibration score; +∞ where that rank passes n."""
    rank = conformal_rank(len(calibration), alpha)
    return math.inf if rank > len(calibration) else calibration.kthvalue(rank).values.item()


def prediction_sets(scores: torch.Tensor, threshold: float, possible: torch.Tensor) -> torch.Tensor:
    """[N, C] bool: choice c is in the set of question x when s(x, c) ≤ q̂ (and c is a choice)."""
    return (scores <= threshold) & possible


def calibration_split(n: int, seed: int = SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """(calibration, test) positions of n questions: a seeded random half (⌊n/2⌋) and the rest, sorted."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    half = n // 2
    return order[:half].sort().values, order[half:].sort().values


def _subtasks(predictions: dict) -> list[tuple[str, int, int]] | None:
    """[(subtask, start, stop)] where `id` is its `id/<subtask>` splits one after the other (lm-eval
    groups), else None."""
    parts = [name for name in predictions if name.startswith("id/")]
    ids = predictions["id"]
    if not parts or sum(predictions[name]["logits"].shape[1] for name in parts) != ids["logits"].shape[1]:
        return None
    found, start = [], 0
    for name in parts:
        part = predictions[name]
        stop = start + part["logits"].shape[1]
        if part["labels"] is None or not torch.equal(part["labels"], ids["labels"][start:stop]) \
                or not torch.equal(part["logits"], ids["logits"][:, start:stop]):
            return None
        found.append((name.split("/", 1)[1], start, stop))
        start = stop
    return found


def _measured(sets: torch.Tensor, labels: torch.Tensor, with_intervals: bool) -> dict:
    covered = sets.gather(1, labels[:, None]).squeeze(1)
    sizes = sets.sum(1).double()
    n = len(labels)
    entry = {"n": n, "coverage": metric(covered.double().mean().item(), "fraction of test questions whose answer is "
                                        "in their set"),
             "set_size": metric(sizes.mean().item(), "mean number of choices in a set"),
             "empty": metric((sizes == 0).double().mean().item(), "fraction of test questions with an empty set")}
    if with_intervals and n:
        low, high = CI.clopper_pearson(int(covered.sum()), n)
        entry["coverage"]["interval"] = {"low": low, "high": high, "level": CI.LEVEL, "n": n,
                                         "method": "Clopper–Pearson over the test questions, given the calibration"}
        entry["set_size"]["sizes"] = sizes  # its interval: `_set_size_intervals`, every score's from one pass
    return entry


def _set_size_intervals(entries: list[dict], name: str) -> None:
    """The percentile interval of each entry's mean set size over the test questions, the resamples'
    counts drawn once for all of them (the same draws for every score)."""
    sizes = torch.stack([entry["set_size"].pop("sizes") for entry in entries], 1)
    n = len(sizes)
    count = B.resamples_for(n)
    resampled = torch.cat([B.counts_of(rows, n) @ sizes / n for _, rows in B.blocks(name, n, count)])
    for entry, column in zip(entries, resampled.T):
        entry["set_size"]["interval"] = {**CI.interval(entry["set_size"]["value"], column.contiguous(), n),
                                         "method": f"{CI.METHODS['percentile']} (the test questions), {count:,} resamples, "
                                                   "given the calibration"}


COLUMNS = [Column(f"{label} {what}", ("scores", score, key, "value"), direction, f"{DEFINITIONS[score]}; {meaning}",
                  ("conformal",), order, split="id", examples=False)
           for order, (label, score) in enumerate((("LAC", "lac"), ("APS", "aps")))
           for what, key, direction, meaning in (
               (f"coverage (α = {ALPHA})", "coverage", None, f"test coverage of split-conformal sets, target ≥ {1 - ALPHA:g}"),
               ("set size", "set_size", "down", "mean set size on the test questions"))]


@register_analyzer("conformal", detail=True, description="Split-conformal prediction sets from p̄ (LAC and APS): coverage and "
                   "set size on held-out questions, overall and per subtask", columns=COLUMNS)
def conformal(predictions, weights=None):
    ids = predictions.get("id")
    if ids is None or ids["labels"] is None or ids["logits"].shape[1] == 0:
        raise Skip("no labelled id split to measure prediction sets on")
    val = predictions.get("val")
    probs = Examples(ids["logits"], None).mean
    labels = ids["labels"]
    if val is not None and val["labels"] is not None and len(val["labels"]) >= 1:
        cal_probs, cal_labels = Examples(val["logits"], None).mean, val["labels"]
        test = torch.arange(len(labels))
        split = {"calibration": "val", "test": "id (every question)", "n_calibration": len(cal_labels), "n_test": len(test)}
    else:
        if len(labels) < 4:
            raise Skip(f"{len(labels)} id questions: too few to split into calibration and test halves")
        calibration, test = calibration_split(len(labels))
        cal_probs, cal_labels = probs[calibration], labels[calibration]
        split = {"calibration": f"a random half of id (⌊n/2⌋, seed {SEED})", "test": "the other id questions",
                 "seed": SEED, "n_calibration": len(calibration), "n_test": len(test)}
    subtasks = _subtasks(predictions)
    results = {}
    for name, score in SCORES.items():
        calibration_scores = score(cal_probs).gather(1, cal_labels[:, None]).squeeze(1)
        scores, possible = score(probs[test]), probs[test] > 0
        entry = {"definition": DEFINITIONS[name], "levels": {}}
        for alpha in LEVELS:
            threshold = conformal_quantile(calibration_scores, alpha)
            sets = prediction_sets(scores, threshold, possible)
            found = _measured(sets, labels[test], alpha == ALPHA)
            found["threshold"] = threshold if math.isfinite(threshold) else None
            if alpha == ALPHA:
                entry.update(found)
                if subtasks is not None:  # (one after the other, covering id: `_subtasks`)
                    sizes = torch.tensor([stop - start for _, start, stop in subtasks])
                    of_test = torch.repeat_interleave(torch.arange(len(subtasks)), sizes)[test]
                    entry["per_subtask"] = {sub: _measured(sets[of_test == index], labels[test][of_test == index],
                                                           False) for index, (sub, _, _) in enumerate(subtasks)}
            else:
                entry["levels"][str(alpha)] = {key: found[key] for key in ("coverage", "set_size", "threshold")}
        results[name] = entry
    _set_size_intervals(list(results.values()), "id")  # (test is never empty: every id question, or half of 4 or more)
    return {"alpha": ALPHA, "levels": list(LEVELS), "split": split, "guarantee": GUARANTEE, "scores": results}
