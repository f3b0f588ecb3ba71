"""Timing the fast path and the reference pipeline on synthetic data of the protocols' shapes.

    ensdiag bench --arch mlp --device cpu            # MNIST-sized: 60,000 × 1×28×28, batch 128
    ensdiag bench --arch resnet18 --device cuda      # CIFAR-sized: 50,000 × 3×32×32, batch 128

Each method is trained with the preset's optimiser, batch size and augmentation (mnist for
`mlp`, cifar10 for `resnet18`). Warm-up batches run first and are not timed; so is the
one-time preparation of the training split (normalising it on the device), which is
reported separately. With `batches` only that many batches per epoch are timed and the epoch
time is extrapolated from them (the JSON says so).

Timers run round-robin (one epoch of every method and pipeline per round) and report their
median epoch, so slow drift of a shared machine cannot favour whichever method runs first.
"""

import math
import statistics
import time
from contextlib import suppress
from dataclasses import asdict, dataclass

import torch

from ..config import preset_config
from ..data.batching import Normalize, epoch_permutations
from ..errors import EnsdiagError
from ..geometry.tracking import DiversityTracker
from ..nn import ARCHITECTURES, METHODS, flush_denormals
from ..nn.members import fastest, unsupported
from ..nn.methods import resolve_options, run_methods
from ..precision import training_math, uses_bf16
from ..train import FitData, evaluate, make_optimizer, train_epoch
from .reference import ReferenceModel, make_loader

PROTOCOLS = {"mlp": ("mnist", 60_000), "resnet18": ("cifar10", 50_000)}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PROTOCOL_IMAGES = 10_000  # the test splits of MNIST and CIFAR-10


def bench_methods() -> tuple[str, ...]:
    """Every registered method, one with run variants (BatchEnsemble) as its variants."""
    return tuple(run for name, kit in METHODS.items() for run in (kit.run_variants or (name,)))


BENCH_METHODS = bench_methods()


def default_methods(arch: str) -> tuple[str, ...]:
    """Every bench method the architecture can build (kernel-wise BatchEnsemble needs convolutions)."""
    if arch not in ARCHITECTURES:
        return bench_methods()
    builder, runs, usable = ARCHITECTURES[arch], run_methods(), []
    for run in bench_methods():
        method, fixed = runs[run]
        with suppress(EnsdiagError):
            resolve_options(method, fixed, builder.default_options, builder.convolutional, arch)
            usable.append(run)
    return tuple(usable)


@dataclass
class BenchSettings:
    arch: str = "mlp"
    methods: tuple[str, ...] = BENCH_METHODS
    device: str = "cpu"
    epochs: int = 3  # timed rounds (one epoch of every method each), after warm-up; the median counts
    batches: int | None = None  # time only this many batches per epoch, extrapolate to the epoch
    train_size: int | None = None  # default: the protocol's (60,000 / 50,000)
    test_size: int = PROTOCOL_IMAGES
    eval_batch_size: int = 1000
    warmup_batches: int = 5  # never more than the timed batches
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16
    compile: bool = False  # torch.compile the model body (fast path only)
    compile_mode: str = "default"  # torch.compile mode; "reduce-overhead" adds CUDA graphs on CUDA
    reference: bool = True
    strategies: bool = False  # also time the Deep Ensemble member strategies (nn/members.py)
    members: int = 4
    tracking: bool = False  # also time `train --track-diversity`'s per-epoch measurement


def settings_record(settings) -> dict:
    """A bench's settings as its JSON record keeps them (tuples as lists), with torch's thread count."""
    return {**{key: list(value) if isinstance(value, tuple) else value for key, value in asdict(settings).items()},
            "threads": torch.get_num_threads()}


def synthetic_split(n, shape, num_classes, seed):
    """uint8 images and labels of the real shapes (their values do not change the timing)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=generator)
    return images, torch.randint(0, num_classes, (n,), generator=generator)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    _sync(device)
    began = time.perf_counter()
    result = fn()
    _sync(device)
    return time.perf_counter() - began, result


def epoch_seconds(seconds, batches_per_epoch, timed_batches) -> float:
    """The median timed epoch, scaled up to a full epoch when only some batches were timed."""
    return statistics.median(seconds) * batches_per_epoch / timed_batches


class FastPathTimer:
    """One method on ensdiag's own training loop, set up once and timed an epoch at a time."""

    def __init__(self, config, run, data: FitData, settings, device, strategy=None):
        torch.manual_seed(0)
        model = config.build(run).to(device)
        model.member_strategy = strategy or fastest(device.type, config.arch)
        self.autocast = uses_bf16(settings.precision, device)
        self.channels_last = device.type == "cuda" and config.arch != "mlp"
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if settings.compile:
            model.body.compile(mode=settings.compile_mode)
        self.model, self.config, self.data, self.settings, self.device = model, config, data, settings, device
        self.optimizer, _ = make_optimizer(model, config)
        self.generator = torch.Generator(device=device).manual_seed(0)
        self.n = len(data.train_labels)
        self.batch_examples = model.kit.examples_per_batch(config.batch_size)
        self.batches_per_epoch = math.ceil(self.n / self.batch_examples)
        self.timed_batches = min(settings.batches or self.batches_per_epoch, self.batches_per_epoch)

    def _epoch(self, batches):
        orders = epoch_permutations(self.n, self.model.kit.data_orders(), self.generator,
                                    self.device)[:, :batches * self.batch_examples]
        with training_math(self.device):  # what `train` runs under (cudnn.benchmark, TF32 on CUDA)
            train_epoch(self.model, self.optimizer, self.data, orders, self.config, self.generator, self.autocast,
                        self.channels_last)

    def warm_up(self):
        # a compiled model recompiles for the epoch's last, smaller batch: warm up on every shape
        before = compile_counters()
        self._epoch(self.timed_batches if self.settings.compile else min(self.settings.warmup_batches,
                                                                           self.timed_batches))
        self.compiled = compile_report(self.settings.compile_mode, before, compile_counters()) if self.settings.compile else None

    def epoch(self) -> float:
        return timed(lambda: self._epoch(self.timed_batches), self.device)[0]

    def tracking_seconds(self, val) -> float:
        """The median time of one `--track-diversity` row on the validation split `val` (images,
        labels); the validation logits it reads come from the epoch's validation pass (exact fp32, as in `train`)."""
        logits = evaluate(self.model, val[0].to(self.device), val[1].to(self.device), self.data.normalize,
                          keep_logits=True)[2]
        tracker = DiversityTracker(self.model)
        tracker.measure(0, logits)  # warm-up
        return statistics.median(timed(lambda: tracker.measure(1, logits), self.device)[0] for _ in range(3))

    @torch.no_grad()
    def summary(self, seconds, test_images) -> dict:
        """The epoch's numbers, and the inference's: the test images through the model in eval batches."""
        per_epoch = epoch_seconds(seconds, self.batches_per_epoch, self.timed_batches)
        model, device, autocast, size = self.model.eval(), self.device, self.autocast, self.settings.eval_batch_size
        x = self.data.normalize(test_images.to(device)).to(torch.bfloat16 if autocast else torch.float32)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)

        def run():
            for start in range(0, len(x), size):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    model(x[start:start + size])

        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            model(x[:size])  # warm-up
        inference, _ = timed(run, device)
        k_train = model.kit.passes_per_example(self.config.be_split_batch)
        return {"members": model.num_members, "seconds_per_epoch": per_epoch, "epoch_seconds_measured": seconds,
                "timed_batches": self.timed_batches, "batches_per_epoch": self.batches_per_epoch,
                "images_per_second": self.n / per_epoch, "member_images_per_second": self.n * k_train / per_epoch,
                "inference_images_per_second": len(x) / inference,
                "inference_member_images_per_second": len(x) * model.num_members / inference,
                **({"compiled": self.compiled} if self.compiled else {})}


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the torch.compile modes that ask for CUDA graphs


def compile_counters() -> dict:
    from torch._dynamo.utils import counters
    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
            "cuda_graph_skips": counters["inductor"]["cudagraph_skips"]}


def compile_report(mode: str, before: dict, after: dict) -> dict:
    """What torch.compile really did for one model between two `compile_counters()`: the graphs
    it made, its graph breaks, and whether the CUDA graphs the mode asks for were used. Inductor
    skips them quietly (a log line) on the CPU and for graphs that mutate their inputs, such as
    BatchNorm's running statistics, so the mode's name alone does not say what was timed."""
    made = {key: after[key] - before[key] for key in after}
    if mode not in CUDA_GRAPH_MODES:
        cuda_graphs = "not asked"
    elif made["cuda_graph_skips"]:
        cuda_graphs = f"skipped in {made['cuda_graph_skips']} compiled graph(s): timed as plain compiled code"
    else:
        cuda_graphs = "used"
    return {"mode": mode, "graphs": made["graphs"], "graph_breaks": made["graph_breaks"], "cuda_graphs": cuda_graphs}


class ReferenceTimer:
    """The same method on the reference pipeline (reference.py)."""

    def __init__(self, config, run, train, settings, device, workers):
        self.reference = ReferenceModel(config, run, device)
        batch_examples = self.reference.networks[0].kit.examples_per_batch(config.batch_size)
        self.loader = make_loader(*train, config, batch_examples, True, workers, device, augment=config.augment)
        self.config, self.settings, self.device, self.workers = config, settings, device, workers
        self.batches_per_epoch = len(self.loader)
        self.timed_batches = min(settings.batches or self.batches_per_epoch, self.batches_per_epoch)

    def warm_up(self):
        self.reference.train_epoch(self.loader, max_batches=min(self.settings.warmup_batches, self.timed_batches))

    def epoch(self) -> float:
        return timed(lambda: self.reference.train_epoch(self.loader, max_batches=self.timed_batches), self.device)[0]

    def summary(self, seconds, test) -> dict:
        test_loader = make_loader(*test, self.config, self.settings.eval_batch_size, False, self.workers, self.device)
        self.reference.predict(test_loader, max_batches=1)
        inference_seconds, _ = timed(lambda: self.reference.predict(test_loader), self.device)
        return {"reference_seconds_per_epoch": epoch_seconds(seconds, self.batches_per_epoch, self.timed_batches),
                "reference_epoch_seconds_measured": seconds, "reference_timed_batches": self.timed_batches,
                "reference_inference_images_per_second": len(test[1]) / inference_seconds}


LABELS = {"fast": "{}", "reference": "{} [reference]", "strategy": "deep-ensemble [{}]"}  # a timer's, in the log


def run_bench(settings: BenchSettings, device: torch.device, log=None) -> dict:
    """Every method's fast-path and reference numbers, the ratios the targets name, the settings.

    All timers are set up and warmed first, then timed round-robin, one epoch each per round,
    and each reports its median epoch: drift on a shared machine then hits every method
    alike instead of whichever runs last."""
    flush_denormals()  # as training and prediction do; docs/performance.md shows why
    preset, default_size = PROTOCOLS[settings.arch]
    config = preset_config(preset, members=settings.members, methods=list(settings.methods))  # validates them
    train = synthetic_split(settings.train_size or default_size, config.input_shape, config.num_classes, seed=0)
    test = synthetic_split(settings.test_size, config.input_shape, config.num_classes, seed=1)
    workers = 0 if device.type == "cpu" else min(8, torch.get_num_threads())  # the reference's DataLoader workers
    data = FitData(train[0].to(device), train[1].to(device), test[0][:0].to(device), test[1][:0].to(device),
                   Normalize(config.mean, config.std, device), augment=config.augment)
    dtype = torch.bfloat16 if uses_bf16(settings.precision, device) else torch.float32
    prepare_seconds, _ = timed(lambda: data.training_images(dtype), device)

    if settings.compile:  # every model shares the architectures' forward code: one cache entry per model and shape
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    timers = {}  # (row, kind) -> timer; kind: fast | reference | strategy
    for run in settings.methods:
        timers[run, "fast"] = FastPathTimer(config, run, data, settings, device)
        if settings.reference:
            timers[run, "reference"] = ReferenceTimer(config, run, train, settings, device, workers)
    skipped = {}  # strategy -> why it cannot run here
    if settings.strategies:  # the ways to run the members of every method that offers a choice
        for method in (name for name, kit in METHODS.items() if kit.strategies):
            for strategy in METHODS[method].strategies:
                why = unsupported(strategy, device.type, settings.arch)
                if why is not None:
                    skipped[strategy] = why
                    continue
                timers[strategy, "strategy"] = FastPathTimer(config, method, data, settings, device, strategy)
    for timer in timers.values():
        timer.warm_up()
    seconds = {key: [] for key in timers}
    for round_ in range(settings.epochs):
        for key, timer in timers.items():
            seconds[key].append(timer.epoch())
        if log is not None:
            log(f"round {round_ + 1}/{settings.epochs}: " + ", ".join(
                f"{LABELS[kind].format(name)} {seconds[name, kind][-1]:.3g} s" for name, kind in timers))

    results, strategies = {}, {}
    val = synthetic_split(round(config.val_fraction * len(train[1])) or len(test[1]), config.input_shape, config.num_classes, seed=2)
    for (name, kind), timer in timers.items():
        if kind == "fast":
            results[name] = {**timer.summary(seconds[name, kind], test[0]), "prepare_seconds": prepare_seconds}
            if settings.tracking:
                results[name]["tracking_seconds"] = timer.tracking_seconds(val)
                results[name]["tracking_val_size"] = len(val[1])
        elif kind == "reference":
            results[name].update(timer.summary(seconds[name, kind], test))
            results[name]["speedup"] = results[name]["reference_seconds_per_epoch"] / results[name]["seconds_per_epoch"]
        else:
            row = timer.summary(seconds[name, kind], test[0])
            strategies[name] = {key: row[key] for key in ("seconds_per_epoch", "timed_batches",
                                                          "inference_images_per_second")}
    ratios, per_epoch = {}, {run: row["seconds_per_epoch"] for run, row in results.items()}  # (the targets' terms)
    if "single" in per_epoch and "deep-ensemble" in per_epoch:
        ratios["deep-ensemble / single"] = per_epoch["deep-ensemble"] / per_epoch["single"]
    for run in per_epoch:  # every efficient ensemble against the ensemble it stands in for
        if run not in ("single", "mc-dropout", "deep-ensemble") and "deep-ensemble" in per_epoch:
            ratios[f"{run} / deep-ensemble"] = per_epoch[run] / per_epoch["deep-ensemble"]
    for run, row in results.items():
        if "tracking_seconds" in row:
            ratios[f"{run} tracking / epoch"] = row["tracking_seconds"] / row["seconds_per_epoch"]
    speedups = [row["speedup"] for row in results.values() if "speedup" in row]
    if speedups:
        ratios["smallest speed-up over reference"] = min(speedups)
    return {"settings": {**settings_record(settings), "preset": preset, "train_size": len(train[1]),
                         "batch_size": config.batch_size, "optimizer": config.optimizer,
                         "augment": config.augment, "reference_workers": workers,
                         "timing": "round-robin, median epoch"},
            "methods": results, "strategies": strategies, "strategies_skipped": skipped, "ratios": ratios,
            "strategy_in_use": fastest(device.type, settings.arch)}
