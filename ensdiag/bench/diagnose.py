"""`ensdiag bench --diagnose`: what each diagnosis step costs, in evaluation passes.

    ensdiag bench --diagnose --arch mlp --device cpu                  # MNIST shapes, 10,000 test images
    ensdiag bench --diagnose --arch resnet18 --device cpu --test-size 1000 --train-size 500 --epochs 1

The unit is one evaluation pass: the model's k members predicting the N in-distribution test
images. Every other step is timed on the same model and data and reported as a multiple of
it, so a ratio carries over between machines where seconds do not:

- each predictions analyzer (calibration, OOD scores, temperature fitting, …) on the ID,
  shift, OOD and validation splits (N images each);
- the model analyzers: CKA, weight alignment, paths between members, rank structure;
- the report of a folder with every method × `seeds` runs: loading it, the tables with the
  verdict's bootstrap, the bootstrap alone, the figures, and the markdown and HTML.

Steps run round-robin (every step once per round) and each reports its median, as the
training bench does. The models are untrained (`torch.manual_seed(seed)`): the costs do not
depend on what was learned, except the iteration counts of temperature fitting and weight
matching. The report's other seeds reuse seed 0's logits with a little noise, so they cost
what real runs would without predicting again.

Paths cost (pairs × points × (path images + BatchNorm images + training sample)) forward
passes. With fewer images or pairs than the protocol's, the JSON's `estimate` scales each
step's measured cost per image to the protocol's sizes (10,000 images per split, paths on
3 pairs × 11 points × (5,000 + 2,000 + 2,000) images) and says so.

With `--budget` (`run_budget_bench`), one whole diagnosis within a time budget instead, beside the
estimate of the same diagnosis on every example:

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
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..analysis import all_analyzers, analyze_model, analyze_predictions
from ..analysis.geometry import BATCHNORM_EXAMPLES, PATH_EXAMPLES, PATH_PAIRS, PATH_POINTS, ModelProbe
from ..config import preset_config
from ..core import Context, Measure, inspect
from ..core.diagnosis import Diagnosis
from ..core.predict import predict
from ..data.batching import Normalize
from ..data.registry import Split
from ..export import headline_entries, read_entry
from ..layout import lookup
from ..nn import flush_denormals
from ..nn.members import fastest
from ..predictions import with_pooled_shift
from ..report import make_figures, make_report, render
from ..report.aggregate import build_report
from ..report.load import load_runs
from ..seeds.across import load_seeds
from ..seeds.verdict import verdict
from .harness import PROTOCOL_IMAGES, PROTOCOLS, settings_record, synthetic_split, timed
from .main_job import load_average

SPLITS = ("id", "shift", "ood", "val")  # val: what temperature scaling is fitted on


@dataclass
class DiagnoseSettings:
    arch: str = "mlp"
    methods: tuple[str, ...] = ("single", "mc-dropout", "deep-ensemble", "batch-ensemble")  # the presets' grid
    device: str = "cpu"
    members: int = 4
    test_size: int = PROTOCOL_IMAGES  # images in each of the id, shift, ood and val splits
    train_size: int = BATCHNORM_EXAMPLES  # training images: BatchNorm along paths and the training-loss sample
    rounds: int = 3
    seeds: int = 3  # runs per method in the report's folder
    path_pairs: int = PATH_PAIRS
    path_points: int | str = PATH_POINTS
    warmup: bool = True  # a first, untimed call of every step (off where one call takes minutes)


class MethodSteps:
    """One method's model on the synthetic splits, and its diagnosis steps as timers."""

    def __init__(self, config, method, settings, splits, train, device):
        torch.manual_seed(0)
        self.method = method
        self.model = config.build(method).to(device).eval()
        self.model.member_strategy = fastest(device.type, config.arch)
        self.normalize = Normalize(config.mean, config.std, device)
        self.splits, self.train, self.settings, self.device = splits, train, settings, device
        self.predictions = with_pooled_shift(predict(self.model, splits, self.normalize, device))
        self.weights = self.model.member_weights()
        self.results = {}  # the model analyzers' last results
        self.aligned = None  # alignment's result, which the timed paths start from (as a diagnosis does)

    def probe(self) -> ModelProbe:
        return ModelProbe(self.model, {"id": self.splits["id"], "ood": self.splits["ood"]}, self.normalize,
                          self.train.images, train_labels=self.train.labels, path_pairs=self.settings.path_pairs,
                          path_points=self.settings.path_points)

    def steps(self) -> dict:
        """{step: zero-argument function}; "predict id" is the unit."""
        steps = {"predict id": lambda: predict(self.model, {"id": self.splits["id"]}, self.normalize, self.device),
                 "predict all splits": lambda: predict(self.model, self.splits, self.normalize, self.device)}
        analyzers = all_analyzers()
        for name in (name for name, analyzer in analyzers.items() if analyzer.needs == "predictions"):
            steps[f"analyzer {name}"] = lambda name=name: analyze_predictions(self.predictions, self.weights, only=[name])
        if not self.model.kit.one_weight_set and self.model.num_members > 1:  # member geometry, after the rest
            for name in (name for name, analyzer in analyzers.items() if analyzer.needs == "model"):
                steps[f"geometry {name}"] = lambda name=name: self._model_analyzer(name)
        return steps

    def _model_analyzer(self, name):
        probe = self.probe()
        if name == "paths" and self.model.kit.own_weights:  # alignment is its own step: paths start from its result
            self.aligned = self.aligned or self.probe().aligned()
            probe._cache["aligned"] = self.aligned
        result = analyze_model(probe, only=[name])[name]  # in exact fp32, as analyze_model always runs
        if result["status"] == "failed":
            raise RuntimeError(f"{self.method}: {name} failed: {result['reason']}")
        self.results[name] = result
        return result


def _estimate(settings, seconds: dict, sizes: dict) -> dict | None:
    """The whole diagnosis (`ensdiag diversity` with geometry: the three splits predicted, every
    analyzer) at the protocol's sizes, from each step's measured cost per image; None when
    measured at those sizes already."""
    n, bn = settings.test_size, settings.train_size
    protocol_paths = sizes.get("protocol_path_images") or PATH_PAIRS * PATH_POINTS * (PATH_EXAMPLES + 2 * BATCHNORM_EXAMPLES)
    if n >= PROTOCOL_IMAGES and bn >= BATCHNORM_EXAMPLES and settings.path_pairs >= PATH_PAIRS \
            and settings.path_points == PATH_POINTS:
        return None
    scale = PROTOCOL_IMAGES / n
    total = 0.0
    for step, value in seconds.items():
        if step in ("predict id",) or step.startswith("report"):
            continue
        if step == "geometry paths":
            total += value * protocol_paths / sizes["path_images"] if sizes["path_images"] else 0.0
        elif step in ("geometry alignment", "geometry rank-structure"):
            total += value  # weights only
        else:
            total += value * scale
    return {"seconds": total, "images_per_split": PROTOCOL_IMAGES,
            "how": f"each step's measured seconds per image scaled from {n:,} to {PROTOCOL_IMAGES:,} images per split; "
                   f"paths from {sizes['path_images']:,} to {protocol_paths:,} image passes "
                   f"({PATH_PAIRS} pairs × ({PATH_POINTS} points + the barrier search's, as measured) × "
                   f"({PATH_EXAMPLES:,} + 2 × {BATCHNORM_EXAMPLES:,})); "
                   "alignment and rank read weights only"}


def _path_images(steps: MethodSteps) -> tuple[int, int]:
    """(image passes the timed paths step made, those of the protocol's paths): points evaluated ×
    (test + training sample + BatchNorm images), an adaptive grid's points and the barrier search's
    walks counted from its result; the protocol's pairs walk `PATH_POINTS` points each and the search
    beyond the first walk as many points as the measured pairs did on average, at the protocol's images."""
    result = steps.results.get("paths")
    if result is None or result["status"] != "ok":
        return 0, 0
    has_norm = "recomputed" in result["batchnorm"]
    per_point = result["n"] + result["train_n"] + (min(len(steps.train), BATCHNORM_EXAMPLES) if has_norm else 0)
    pairs = result["pairs"]
    points = sum(pair.get("points_evaluated", len(pair["t"])) for pair in pairs)
    search = (points - sum(len(pair["t"]) for pair in pairs)) / len(pairs)
    return points * per_point, round(PATH_PAIRS * (PATH_POINTS + search) * (PATH_EXAMPLES + 2 * BATCHNORM_EXAMPLES))


def synthetic_protocol(settings, names) -> tuple:
    """(config, {split: Split}, training Split): the protocol's shapes filled with seeded synthetic
    images, `settings.test_size` per split of `names` (OOD unlabelled), `settings.train_size` to train on."""
    preset, _ = PROTOCOLS[settings.arch]
    config = preset_config(preset, members=settings.members, methods=list(settings.methods))
    shape, classes = config.input_shape, config.num_classes
    splits = {name: Split(*synthetic_split(settings.test_size, shape, classes, seed=1 + i), f"synthetic {name}")
              for i, name in enumerate(names)}
    splits["ood"] = Split(splits["ood"].images, None, "synthetic ood")
    train = Split(*synthetic_split(settings.train_size, shape, classes, seed=7), "synthetic training images")
    return config, splits, train


def run_diagnose_bench(settings: DiagnoseSettings, device, log=None) -> dict:
    flush_denormals()
    config, splits, train = synthetic_protocol(settings, SPLITS)
    methods = {run: MethodSteps(config, run, settings, splits, train, device) for run in settings.methods}
    timers = {(run, step): fn for run, steps in methods.items() for step, fn in steps.steps().items()}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        # every method × seed as diagnosis runs; seeds after the first reuse seed 0's logits with noise
        for run, steps in methods.items():
            for seed in range(settings.seeds):
                predictions = steps.predictions
                if seed:
                    generator = torch.Generator().manual_seed(seed)
                    predictions = {name: {**split, "logits": split["logits"] + 0.05 * torch.randn(
                        split["logits"].shape, generator=generator)} for name, split in predictions.items()}
                metrics = analyze_predictions(predictions, steps.weights)
                Diagnosis(metrics, predictions, {name: f"synthetic {name}" for name in SPLITS}).save(folder, run, seed)
        # the report's parts, each timed alone (figures and text from one report built up front), and the whole
        # command, which builds the report itself
        data = load_runs(folder)
        report = build_report(folder, None, data, "ensdiag")
        timers.update({("report", step): fn for step, fn in {
            "report load": lambda: load_runs(folder),
            "report tables and verdict": lambda: build_report(folder, None, load_runs(folder), "ensdiag"),
            "report verdict bootstrap": lambda: verdict(load_seeds(load_runs(folder)["runs"])[0]),
            "report figures": lambda: make_figures(report, data["runs"], folder),
            "report markdown and html": lambda: (render(report, "markdown"), render(report, "html", folder)),
            "report (whole command)": lambda: make_report(folder)}.items()})
        for fn in timers.values() if settings.warmup else ():  # first calls build caches and import lazily
            fn()
        seconds = {key: [] for key in timers}
        for round_ in range(settings.rounds):
            for key, fn in timers.items():
                seconds[key].append(timed(fn, device)[0])
            if log is not None:
                log(f"round {round_ + 1}/{settings.rounds} done")
    median = {key: statistics.median(values) for key, values in seconds.items()}
    unit_run = "deep-ensemble" if "deep-ensemble" in methods else next(iter(methods))
    result = {}
    for run, steps in methods.items():
        unit = median[run, "predict id"]
        rows = {step: {"seconds": median[run, step], "passes": median[run, step] / unit} for (r, step) in median if r == run}
        measured, protocol = _path_images(steps)
        sizes = {"path_images": measured, "protocol_path_images": protocol}
        diagnosis = sum(row["seconds"] for step, row in rows.items() if step != "predict id")
        result[run] = {"members": steps.model.num_members, "steps": rows, **sizes,
                       "diagnosis_seconds": diagnosis, "diagnosis_passes": diagnosis / unit,
                       "estimate": _estimate(settings, {s: r["seconds"] for s, r in rows.items()}, sizes)}
    unit = median[unit_run, "predict id"]
    report = {step: {"seconds": median["report", step], "passes": median["report", step] / unit}
              for (r, step) in median if r == "report"}
    return {"kind": "diagnose", "settings": settings_record(settings),
            "unit": f"one evaluation pass: the model's members predicting the {settings.test_size:,} ID test images",
            "methods": result, "report": {"unit_method": unit_run, "runs": len(methods) * settings.seeds, "steps": report}}


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


def run_budget_bench(settings: BudgetSettings, device, log=None) -> dict:
    flush_denormals()
    config, splits, train = synthetic_protocol(settings, ("id", "shift", "ood", "val"))
    methods = {}
    for run in settings.methods:
        torch.manual_seed(0)
        model = config.build(run).to(device).eval()
        model.member_strategy = fastest(device.type, config.arch)
        load = load_average()
        began = time.perf_counter()
        diagnosis = inspect(model, splits, preprocess=Normalize(config.mean, config.std, device), train=train,
                            measure=Measure(budget=settings.budget, precision=settings.precision),
                            context=Context(device=device))
        wall = time.perf_counter() - began
        metrics = diagnosis.metrics
        methods[run] = {"members": model.num_members, "wall_seconds": round(wall, 1),
                        "load_average": {"before": load, "after": load_average()}, "budget": metrics["budget"],
                        "headline": headline(metrics),
                        "skipped": {name: result.get("reason") for name, result in metrics["analyzers"].items()
                                    if isinstance(result, dict) and result.get("status") in ("skipped", "failed")}}
        if log is not None:
            log(f"{run}: {wall:.0f} s within a budget of {settings.budget}")
    return {"kind": "diagnose-budget", "settings": settings_record(settings),
            "methods": methods}
