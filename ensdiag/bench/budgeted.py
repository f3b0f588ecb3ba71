"""`ensdiag bench --diagnose --budget 5m`: one whole diagnosis within a time budget, beside the
estimate of the same diagnosis on every example.

    ensdiag bench --diagnose --budget 5m --arch resnet18 --device cpu --method deep-ensemble

The model (untrained, `torch.manual_seed(0)`) is diagnosed as `ensdiag.diagnose` does it, on
synthetic images of the protocol's shapes (10,000 per split: id, shift, ood, val; 2,000
training images for BatchNorm and the training-loss sample), with a `planning.Plan`: every step
reads the examples its measured cost affords. The record keeps what the plan measured (each
split's and geometry step's examples, points and pairs, and the interval half-width reached),
every headline number with its example-level interval, the steps skipped and why, the wall
time, and `full_estimate_seconds`: the same diagnosis on every example, from the costs this
run measured. The machine's load average before and after is recorded: timings on a shared
machine are only as quiet as it was.
"""

import math
import os
import time
from dataclasses import dataclass

import torch

from ..core import Context, Measure, inspect
from ..data.batching import Normalize
from ..export import headline_entries, read_entry
from ..layout import lookup
from ..nn import flush_denormals
from ..nn.members import fastest
from .diagnose import synthetic_protocol
from .harness import PROTOCOL_IMAGES, settings_record


@dataclass
class BudgetSettings:
    arch: str = "resnet18"
    methods: tuple[str, ...] = ("deep-ensemble",)
    device: str = "cpu"
    members: int = 4
    test_size: int = PROTOCOL_IMAGES  # images in each of the id, shift, ood and val splits
    train_size: int = 2_000
    budget: str = "5m"
    precision: float | None = None


def headline(metrics: dict) -> dict:
    """{flat name: {"value", "low", "high", "n", "method"}} of every headline number that was measured."""
    found = {}
    for entry in headline_entries():
        value, _ = read_entry(metrics, entry)
        if not math.isfinite(value):
            continue
        result = metrics["analyzers"][entry["analyzer"]]
        interval, _ = lookup(result, (*entry["path"][:-1], "interval"))
        row = {"value": value}
        if isinstance(interval, dict):
            row.update({key: interval.get(key) for key in ("low", "high", "n", "method") if key in interval})
        found[entry["name"]] = row
    return found


def skipped(metrics: dict) -> dict:
    """{analyzer: reason} of the analyzers that did not run."""
    return {name: result.get("reason") for name, result in metrics["analyzers"].items()
            if isinstance(result, dict) and result.get("status") in ("skipped", "failed")}


def run_budget_bench(settings: BudgetSettings, device, log=None) -> dict:
    flush_denormals()
    config, splits, train = synthetic_protocol(settings, ("id", "shift", "ood", "val"))
    methods = {}
    for run in settings.methods:
        torch.manual_seed(0)
        model = config.build(run).to(device).eval()
        model.member_strategy = fastest(device.type, config.arch)
        load = os.getloadavg()
        began = time.perf_counter()
        diagnosis = inspect(model, splits, preprocess=Normalize(config.mean, config.std, device), train=train,
                            measure=Measure(budget=settings.budget, precision=settings.precision),
                            context=Context(device=device))
        wall = time.perf_counter() - began
        metrics = diagnosis.metrics
        methods[run] = {"members": model.num_members, "wall_seconds": round(wall, 1),
                        "load_average": {"before": [round(x, 2) for x in load],
                                         "after": [round(x, 2) for x in os.getloadavg()]},
                        "budget": metrics["budget"], "headline": headline(metrics), "skipped": skipped(metrics)}
        if log is not None:
            log(f"{run}: {wall:.0f} s within a budget of {settings.budget}")
    return {"kind": "diagnose-budget", "settings": settings_record(settings),
            "methods": methods}
