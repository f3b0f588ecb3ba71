"""No printed value lies outside its own interval: every example-level column of the registry, on
ensembles where the bias corrections move the interval most (many classes, so the classwise ECE's
bins are sparse; few examples; a well-calibrated model, whose ECE is nearly all fold bias), and the
member-geometry intervals (CKA on few examples, scaled up from a kept subset; a barrier)."""

import json
import math

import pytest
import torch

from ensdiag.stats import bootstrap as B
from ensdiag.stats import constructions as CI


def _ensemble(n, classes, temperature, seed, k=4):
    """Member logits and labels drawn from the tempered mean prediction (temperature 1: calibrated)."""
    g = torch.Generator().manual_seed(seed)
    base = 3 * torch.randn(n, classes, generator=g)
    logits = base[None] + 0.7 * torch.randn(k, n, classes, generator=g)
    mean = torch.softmax(logits, -1).mean(0)
    labels = torch.multinomial(torch.softmax(mean.log() / temperature, -1), 1, generator=g).squeeze(1)
    return logits, labels


def _predictions(n, classes, temperature, seed):
    found = {}
    for offset, (split, size) in enumerate((("id", n), ("shift", n), ("ood", n), ("val", 60))):
        logits, labels = _ensemble(size, classes, temperature, seed + offset)
        found[split] = {"logits": logits, "labels": None if split == "ood" else labels}
    return found


def _intervals(node, path=()):
    """(path, value, interval) of every metric in a metrics.json tree that carries an interval."""
    if isinstance(node, dict):
        if isinstance(node.get("interval"), dict) and "value" in node:
            yield path, node["value"], node["interval"]
        for key, child in node.items():
            yield from _intervals(child, (*path, key))


@pytest.mark.parametrize("n, classes, temperature, seed", [(40, 10, 1.0, 0), (150, 10, 1.0, 1), (150, 20, 1.3, 2),
                                                           (400, 5, 0.8, 3)])
def test_every_printed_value_lies_in_its_own_interval(n, classes, temperature, seed):
    from ensdiag.core import inspect_predictions
    metrics = json.loads(inspect_predictions(_predictions(n, classes, temperature, seed), detail=True).to_json())
    found = list(_intervals(metrics["analyzers"]))
    assert len(found) > 40  # every analyzer's detail columns, not a handful
    outside, refused = [], []
    for path, value, interval in found:
        if interval["low"] is None:
            assert interval.get("note"), f"{path}: no interval and no reason"
            refused.append(path)
            continue
        if value is None or not math.isfinite(value):
            continue
        if not interval["low"] - 1e-12 <= value <= interval["high"] + 1e-12:
            outside.append((path, value, interval["low"], interval["high"]))
        if "full_split" in interval:
            assert interval["full_split"]["low"] - 1e-12 <= value <= interval["full_split"]["high"] + 1e-12
    assert not outside, outside
    mce = ("calibration", "splits", "id", "mce")
    assert mce in refused  # no construction covers the population's MCE: it says so instead
    note = metrics["analyzers"]["calibration"]["splits"]["id"]["mce"]["interval"]["note"]
    assert note.startswith("no interval:") and "covers" in note


def test_the_classwise_ece_s_ray_alone_would_miss_its_value_and_the_hull_holds_it():
    """The case that prompted the hull: the ray inversion's interval for a sum of |gaps| over sparse
    bins lies wholly below the plug-in value; the printed interval holds both."""
    from ensdiag.stats.examples import Examples
    from ensdiag.stats.weighted import classwise_bins
    logits, labels = _ensemble(150, 20, 1.0, 5)
    split = Examples.of({"logits": logits, "labels": labels})
    estimate = classwise_bins(split.mean, split.labels, None).folded()
    counts = B.counts_of(B.draws("id", 150, 400), 150)
    resampled = classwise_bins(split.mean, split.labels, counts).folded()
    value = estimate.value()
    ray_low, ray_high = CI.ray(estimate, resampled)
    assert ray_high < value  # the ray alone: an interval for the bias-corrected value, below the plug-in
    entry = CI.interval(estimate, resampled, 150, "ray")
    assert entry["low"] <= ray_low and entry["low"] <= value <= entry["high"] and "hull" in entry["method"]


def test_cka_on_few_examples_holds_its_value():
    """Linear CKA of independent features on 60 examples is biased far above 0; the basic interval
    alone sits below the value, the printed one holds it (and is clamped to [0, 1])."""
    from ensdiag.geometry.cka import Moments
    from ensdiag.geometry.resampled import cka_entry, cka_resamples
    g = torch.Generator().manual_seed(3)
    features = {"layer": [torch.randn(60, 8, generator=g, dtype=torch.float64) for _ in range(3)]}
    moments = Moments()
    moments.add(features["layer"])
    linear = moments.cka()[0]
    value = float((linear.sum() - linear.diagonal().sum()) / 6)
    estimate, values = cka_resamples(features, 60, "id", value)
    assert CI.basic(value, values)[1] < value  # the bias correction alone moves the interval off the value
    entry = cka_entry((estimate, values), 60, 60)
    assert 0.0 <= entry["low"] <= value <= entry["high"] <= 1.0


def test_a_percentile_column_is_unchanged_by_the_hull():
    values = torch.linspace(0, 1, 1001, dtype=torch.float64)
    assert CI.interval(0.5, values, 100)["low"] == pytest.approx(0.025)
    low, high = CI.basic(0.2, values**2)
    entry = CI.interval(0.2, values**2, 100, "basic")
    plain = CI.percentile(0.2, values**2)
    assert (entry["low"], entry["high"]) == pytest.approx((min(low, plain[0], 0.2), max(high, plain[1], 0.2)))
