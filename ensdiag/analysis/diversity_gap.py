"""`diversity-gap`: does the members' diversity on their training data carry over to new data?

Members trained jointly (one loss over the whole ensemble, as the efficient methods train) can
"collude": disagree on the training examples in ways that lower the joint loss there without
generalising (Jeffares et al., NeurIPS 2023, "Joint training of deep ensembles fails due to learner
collusion"). This analyzer measures two diversities on the same members' predictions of a fixed
sample of training examples (split `train`), of the validation split and of the test split:

- disagreement: the fraction of ordered member pairs that predict different classes, per sample;
- KL diversity: mean_i KL(q̄ ‖ p_i) with q̄ ∝ exp(mean_i log p_i) (= −log Σ_c exp(mean_i log p_i,c),
  label-free; the ensemble-gain analyzer's term, analysis/gain.py),

and their gap, train − test: a statistic of two independent samples, resampled apart (stratified).
The training sample is `seeded_sample(n, TRAINING_SAMPLE)`: the first `TRAINING_SAMPLE` examples of the seeded order
member geometry draws its training sample from (geometry/paths.py, GEOMETRY_SEED), sorted, so
the same training data give the same sample on every path; the inspection core predicts it as the
split `train` wherever labelled training data are given (core/inspection.py).
"""

import torch

from ..errors import Skip
from ..layout import metric
from ..stats import weighted as W
from ..stats.examples import Examples
from .registry import Column, register_analyzer, register_resampler

TRAINING_SAMPLE = 1000  # training examples predicted for the diversity on training data (all, where fewer)
SPLITS = ("train", "val", "id")
TITLES = {"train": "train", "val": "val", "id": "test"}
DEFINITIONS = {
    "disagreement": "mean over samples of the fraction of ordered member pairs i ≠ j predicting different classes",
    "kl_diversity": "mean over samples of mean_i KL(q̄ ‖ p_i), q̄ ∝ exp(mean_i log p_i) the normalised geometric mean "
                    "(= −log Σ_c exp(mean_i log p_i,c))",
}
GAP = ("on the training sample minus on the test split (Jeffares et al. 2023: jointly trained members can be diverse "
       "on their training data in a way that does not generalise)")
NO_TRAIN = ("no training sample: predicted where labelled training data are given (training, `ensdiag diversity`, "
            "diagnose(train=…))")


def kl_terms(split: Examples) -> torch.Tensor:
    """mean_i KL(q̄ ‖ p_i) per example [N]: exactly 0 where every member gives the same distribution."""
    found = (-torch.logsumexp(split.log_probs.mean(0), dim=-1)).clamp(min=0)
    identical = (split.log_probs == split.log_probs[:1]).all(dim=2).all(dim=0)
    return found.masked_fill(identical, 0.0)


TERMS = {"disagreement": lambda split: split.pair_disagreement,
         "kl_diversity": lambda split: split.memo("kl-diversity", lambda: kl_terms(split))}


def diversity(key: str, split: Examples, w=None) -> torch.Tensor:
    return W.mean(TERMS[key](split), w)


def gap(key: str, train: Examples, test: Examples, w_train=None, w_test=None) -> torch.Tensor:
    """The diversity on the training sample minus that on the test split, for each pair of weightings."""
    return diversity(key, train, w_train) - diversity(key, test, w_test)


COLUMNS = [Column(f"{label} ({TITLES[split]})", ("splits", split, key, "value"), None,
                  f"{DEFINITIONS[key]}, on the {TITLES[split]} split", ("diversity-gap",), order + index, split=split)
           for order, (label, key) in ((0, ("disagreement", "disagreement")), (10, ("KL diversity", "kl_diversity")))
           for index, split in enumerate(SPLITS)]
COLUMNS += [Column(f"{label} gap (train − test)", (f"{key}_gap", "value"), None, f"{DEFINITIONS[key]}, {GAP}",
                   ("diversity-gap",), order + 5, split="train", examples=("train", "id"))
            for order, (label, key) in ((0, ("disagreement", "disagreement")), (10, ("KL", "kl_diversity")))]


@register_analyzer("diversity-gap", description="Diversity on training, validation and test examples, and its "
                   "train − test gap (learner collusion: jointly trained members diverse only on their training data)",
                   columns=COLUMNS)
def diversity_gap(predictions, weights=None):
    k = next(iter(predictions.values()))["logits"].shape[0]
    if k < 2:
        raise Skip("needs at least two members (k = 1)")
    chosen = {name: Examples.of(predictions[name]) for name in SPLITS
              if name in predictions and predictions[name]["logits"].shape[1] > 0}
    if "id" not in chosen:
        raise Skip("no test examples")
    splits = {name: {**{key: metric(float(diversity(key, split)), DEFINITIONS[key]) for key in TERMS}, "n": split.size}
              for name, split in chosen.items()}
    if "train" in chosen:
        gaps = {f"{key}_gap": metric(float(gap(key, chosen["train"], chosen["id"])), f"{DEFINITIONS[key]}, {GAP}")
                for key in TERMS}
    else:  # every absent number says why
        splits["train"] = {key: metric(None, DEFINITIONS[key], note=NO_TRAIN) for key in TERMS}
        gaps = {f"{key}_gap": metric(None, f"{DEFINITIONS[key]}, {GAP}", note=NO_TRAIN) for key in TERMS}
    return {"splits": splits, **gaps,
            "training_sample": f"at most {TRAINING_SAMPLE:,} training examples: the first of the seeded order member "
                               "geometry samples its training examples in (analysis/geometry.py), ascending"}


@register_resampler("diversity-gap")
def _resampler(predictions, weights, result, wanted):
    """Each split's diversities over its own resamples; the gap over the training sample's and the test
    split's, drawn apart (two independent samples)."""
    chosen = {name: Examples.of(predictions[name]) for name in result.get("splits", {}) if name in predictions}

    def resample(counts):
        found = {}
        for path in wanted:
            if path[0] == "splits" and path[1] in counts:
                found[path] = diversity(path[2], chosen[path[1]], counts[path[1]])
            elif path[0].endswith("_gap") and "train" in counts and "id" in counts:
                found[path] = gap(path[0][:-len("_gap")], chosen["train"], chosen["id"], counts["train"], counts["id"])
        return found
    return resample
