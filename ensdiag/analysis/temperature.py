"""`temperature`: temperature scaling fitted on the validation split, in the two ways an ensemble
allows, with ECE and NLL before and after on every other labelled split.

- pool-then-calibrate: one T on log p̄ (the pooled prediction), p' = softmax(log p̄ / T);
- calibrate-then-pool: one T_i per member on its own logits, p' = mean_i softmax(z_i / T_i).
Runs without a validation split (the cifar10 preset trains on all 50,000 images) skip it.
"""

import torch

from ..stats import weighted as W
from ..stats.examples import Examples
from .registry import Column, labelled, register_analyzer, register_resampler
from ..errors import Skip
from ..layout import SPLIT_TABLES, metric
from ..stats.resampled import value
from ..stats.scaling import fit_betas, fit_notes, informative

NOTHING_CHANGES = 0.01  # |T − 1| below this: calibration changes (almost) nothing, and the result says so
STATISTICS = {"ece": lambda split, w: W.calibration_bins(split.confidence, split.correct, w).folded(),
              "nll": lambda split, w: W.mean(split.nll, w)}


def scaled(split: Examples, pooled_t: float, member_t: list[float]) -> dict[str, Examples]:
    """The split before scaling and after each way of scaling (one "member" for pool-then-calibrate)."""
    z = split.logits.double()
    return {"before": split, "pool_then_calibrate": Examples((split.log_mean / pooled_t)[None], split.labels),
            "calibrate_then_pool": Examples(z / torch.tensor(member_t, dtype=torch.float64)[:, None, None], split.labels)}


@register_analyzer("temperature", detail=True, description="Temperature scaling fitted on the validation split: one T for the "
                   "pooled prediction or one per member; ECE and NLL before and after", columns=[
                       Column("T pooled", ("temperature_pooled", "value"), None, "the temperature fitted on log p̄",
                              ("temperature",), 10),
                       Column("ECE", ("splits", "id", "before", "ece", "value"), "down", "ECE before scaling",
                              ("temperature",), 20, split="id"),
                       Column("ECE pool→T", ("splits", "id", "pool_then_calibrate", "ece", "value"), "down",
                              "ECE after pool-then-calibrate", ("temperature",), 30, split="id"),
                       Column("ECE T→pool", ("splits", "id", "calibrate_then_pool", "ece", "value"), "down",
                              "ECE after calibrate-then-pool", ("temperature",), 40, split="id"),
                       Column("NLL pool→T", ("splits", "id", "pool_then_calibrate", "nll", "value"), "down",
                              "NLL after pool-then-calibrate", ("temperature",), 50, split="id")])
def temperature(predictions, weights=None):
    val = predictions.get("val")
    if val is None or val["labels"] is None or len(val["labels"]) == 0:
        raise Skip("no validation split to fit a temperature on (e.g. a run trained on its whole training set)")
    logits, labels = val["logits"], val["labels"]
    z = torch.cat([Examples(logits, None).log_mean[None], torch.log_softmax(logits.double(), -1)])  # pooled, then each member
    betas = fit_betas(z, labels.expand(len(z), -1))
    pooled_t, *member_t = (1 / betas).tolist()
    splits = {}
    for name, split in labelled(predictions, SPLIT_TABLES):  # the per-split tables' splits (its columns read the test set's)
        splits[name] = {kind: {key: metric(value(statistic(examples, None)), f"{key.upper()} {kind.replace('_', ' ')}")
                               for key, statistic in STATISTICS.items()}
                        for kind, examples in scaled(split, pooled_t, member_t).items()}
    result = {"temperature_pooled": metric(pooled_t, "T minimising the validation NLL of softmax(log p̄ / T)"),
              "temperature_members": metric(member_t, "each member's T minimising its validation NLL"),
              "splits": splits}
    fits = fit_notes(betas, informative(z, labels.expand(len(z), -1), torch.ones(len(z), len(labels))),
                     "fits (the pooled prediction's and each member's)")
    if fits:
        result["note"] = fits
    elif all(abs(t - 1) < NOTHING_CHANGES for t in [pooled_t, *member_t]):
        result["note"] = f"every fitted temperature is within {NOTHING_CHANGES} of 1: scaling changes almost nothing"
    return result


@register_resampler("temperature")
def _resampler(predictions, weights, result, wanted):
    """The ECE and NLL before and after scaling over resampled test examples, given the temperatures
    fitted on the validation split (which is not resampled)."""
    pooled_t, member_t = result["temperature_pooled"]["value"], result["temperature_members"]["value"]
    chosen = {name: scaled(Examples.of(predictions[name]), pooled_t, member_t) for name in result["splits"]
              if any(path[:2] == ("splits", name) for path in wanted)}

    def resample(counts):
        return {path: statistic(examples, counts[name]) for name, kinds in chosen.items() if name in counts
                for kind, examples in kinds.items() for key, statistic in STATISTICS.items()
                if (path := ("splits", name, kind, key, "value")) in wanted}
    return resample
