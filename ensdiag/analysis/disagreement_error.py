"""`disagreement-error`: do the members disagree as often as they err?

For members trained independently, the rate at which two of them predict different classes on
test data tracks their test error (Jiang et al., ICLR 2022, "Assessing generalization of SGD via
disagreement"; Kirsch & Gal 2022 tie it to the ensemble's calibration): a real Deep Ensemble's

    D / E = mean over examples of the pairwise disagreement / mean over examples of the members' error

is near 1, while members that collapsed onto one function disagree far less than they err, a ratio
far below 1 (identical members: 0). Both means run over the same examples, so the ratio and its
bootstrap interval come from one function of the examples' weights (`weighted.ratio_of_means`):
each resample's own ratio of its own two means. On every labelled split (OOD splits carry no
labels: their classes are not the model's), each corruption only within the pooled shift split.
No member error on a split leaves the ratio undefined (null, with a note); a resample that draws
none of the examples some member gets wrong has no ratio (+inf, or 0/0) and is left out, so with a
handful of such examples there is no interval.
"""

import torch

from ..stats import weighted as W
from ..stats.examples import Examples
from .registry import Column, labelled, register_analyzer, register_resampler
from ..errors import Skip
from ..layout import metric
from ..stats.resampled import per_split, value

DEFINITIONS = {
    "ratio": "mean pairwise disagreement / mean member error over the same samples (Jiang et al. 2022: ≈ 1 for "
             "independently trained members; identical members: 0); null where no member errs",
    "disagreement": "mean over samples of the fraction of ordered member pairs i ≠ j predicting different classes",
    "member_error": "mean over samples of the fraction of members whose argmax is not the label (the members' mean "
                    "error rate)",
}
NO_ERROR = "no member errs on these samples: disagreement over error is undefined"


def member_error(split: Examples) -> torch.Tensor:
    """(1/k) Σ_i 1[argmax p_i ≠ y] per example [N]."""
    return split.member_errors.mean(0)


STATISTICS = {
    "ratio": lambda split, w: W.ratio_of_means(split.pair_disagreement, member_error(split), w),
    "disagreement": lambda split, w: W.mean(split.pair_disagreement, w),
    "member_error": lambda split, w: W.mean(member_error(split), w),
}
TABLE_SPLITS = ("id", "shift", "val")  # metrics.json has every labelled split (the training sample's too)


@register_analyzer("disagreement-error", description="Disagreement vs error: the members' mean pairwise disagreement "
                   "over their mean error on each labelled split (≈ 1 for a Deep Ensemble, 0 for identical members)",
                   columns=[Column(f"D/E ({split})", ("splits", split, "ratio", "value"), None, DEFINITIONS["ratio"],
                                   ("disagreement-error",), 10 * index, split=split)
                            for index, split in enumerate(TABLE_SPLITS)])
def disagreement_error(predictions, weights=None):
    splits = {}
    for name, split in labelled(predictions):
        if "/" in name:
            continue  # every labelled split but each corruption's (the pooled shift split holds them)
        if split.members < 2:
            raise Skip("needs at least two members (k = 1): one member has no one to disagree with")
        found = {key: value(statistic(split, None)) for key, statistic in STATISTICS.items()}
        entry = {key: metric(found[key], DEFINITIONS[key]) for key in ("disagreement", "member_error")}
        entry["ratio"] = metric(found["ratio"], DEFINITIONS["ratio"]) if found["member_error"] > 0 else \
            metric(None, DEFINITIONS["ratio"], note=NO_ERROR)
        splits[name] = {**entry, "n": split.size}
    if not splits:
        raise Skip("no labelled split (errors need labels; OOD splits are unlabelled)")
    return {"splits": splits}


register_resampler("disagreement-error")(per_split(STATISTICS))
