"""An analyzer's example-level numbers as statistics: the value and its bootstrap resamples from one function.

    STATISTICS = {"nll": lambda split, w: weighted.mean(split.nll, w)}   # split: an `Examples`
    value(STATISTICS["nll"](split, None))                                # the analyzer's number
    register_resampler("calibration")(per_split(STATISTICS))             # its resamples, for intervals

A statistic is f(split, w) over one split's `Examples` (examples.py) and example weights w
(weighted.py: None, or counts [b, n] of b bootstrap resamples); it returns a tensor, or a
`constructions.Folded` where the interval is inverted along a ray (a sum of absolute bin gaps). The
analyzer reports f(split, None); the interval pass (ensdiag/core/intervals.py) calls the same f with
blocks of counts, so an analyzer's number and its interval can never be computed two ways.
"""

from .constructions import Folded
from .examples import Examples
from .weighted import OverBudget


def value(found) -> float:
    """The number a statistic gave for one weighting (a 0-d tensor, a float or a `Folded`)."""
    return found.value() if isinstance(found, Folded) else float(found)


class Refused:
    """What a resampler gives for a number it gives no interval: the reason (its resamples would pass the
    memory budget, or no construction covers its population value), printed where the interval would be."""

    def __init__(self, reason: str):
        self.reason = reason


def refusing(statistic, split, w):
    """statistic(split, w), or `Refused` with the reason where its working set passes the memory budget."""
    try:
        return statistic(split, w)
    except OverBudget as refused:
        return Refused(str(refused))


def per_split(statistics: dict):
    """The resampler (`registry.register_resampler`) of per-split statistics {key: f(split, w)}: for
    every wanted ("splits", split, *key, "value") of a split the analyzer reported, f on that split's
    counts."""
    def resampler(predictions, weights, result, wanted):
        chosen = {name: Examples.of(predictions[name]) for name in result.get("splits", {}) if name in predictions}
        functions = {path: (name, statistic, split) for name, split in chosen.items()
                     for key, statistic in statistics.items()  # where each per-split number sits in the result
                     if (path := ("splits", name, *((key,) if isinstance(key, str) else key), "value")) in wanted}

        def resample(counts):
            return {path: refusing(statistic, split, counts[name]) for path, (name, statistic, split) in functions.items()
                    if name in counts}
        return resample
    return resampler
