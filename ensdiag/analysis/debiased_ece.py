"""`debiased-ece`: a calibration error whose binned estimate is not biased upward at small n.

The binned ECE of a finite test set overstates the calibration error: a bin's accuracy carries
sampling noise, and |noise| only adds (Kumar et al. 2019, "Verified Uncertainty Calibration";
Roelofs et al. 2022). Kumar et al.'s debiased estimator of the squared ℓ2 calibration error of the
top-label confidence subtracts each bin's share of that noise:

    CE²_debiased = Σ_b (n_b / n) · [ (conf_b − acc_b)² − acc_b (1 − acc_b) / (n_b − 1) ]

over equal-mass bins (bins of one example add nothing), and reports sqrt(max(CE², 0)) — an ℓ2
calibration error, comparable with itself across test-set sizes, not with the ℓ1 ECE. The plug-in
ℓ2 error of the same bins (`plugin_l2`) is stored beside it: their gap is the bias removed.

Bins as the authors' package `uncertainty-calibration` makes them (`get_equal_bins`, 15 bins): the
sorted confidences cut into near-equal consecutive groups (numpy's array_split sizes), each edge
midway between neighbouring groups, the last at 1; an example goes into the first bin whose
edge is ≥ its confidence.
"""

from ..stats import weighted as W
from ..stats import ordered as O
from .registry import Column, labelled, register_analyzer, register_resampler
from ..errors import Skip
from ..layout import metric
from ..stats.resampled import per_split, value

BINS = W.ECE_BINS
DEFINITION = (f"Kumar et al.'s debiased ℓ2 calibration error of max p̄ over {BINS} equal-mass bins: "
              "sqrt(max(Σ_b n_b/n·[(conf_b − acc_b)² − acc_b(1 − acc_b)/(n_b − 1)], 0)); unbiased for the squared "
              "error, where the binned ECE grows as the test set shrinks")
PLUGIN = f"plug-in ℓ2 calibration error of the same {BINS} equal-mass bins (biased upward)"
STATISTICS = {key: (lambda split, w, key=key: O.debiased_l2(split.confidence, split.correct, w, BINS)[key])
              for key in ("debiased_l2", "plugin_l2")}


@register_analyzer("debiased-ece", detail=True, description="Kumar et al.'s debiased ℓ2 calibration error beside the binned ECE",
                   columns=[Column("debiased ℓ2 CE", ("splits", "id", "debiased_l2", "value"), "down", DEFINITION,
                                   ("calibration",), 40, split="id",
                                   interval="basic")])  # a resample's duplicates re-bias it: the percentiles sit above
def debiased_ece(predictions, weights=None):
    splits = {}
    for name, split in labelled(predictions):
        found = O.debiased_l2(split.confidence, split.correct, None, BINS)  # (what STATISTICS read)
        splits[name] = {"debiased_l2": metric(value(found["debiased_l2"]), DEFINITION),
                        "plugin_l2": metric(value(found["plugin_l2"]), PLUGIN),
                        "bins": None if found["bins"].isnan() else int(found["bins"])}
    if not splits:
        raise Skip("no split has labels")
    return {"splits": splits}


register_resampler("debiased-ece")(per_split(STATISTICS))
