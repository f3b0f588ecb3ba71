"""Timing the fast path and the reference pipeline on synthetic data of the protocols' shapes.

    ensdiag bench --arch mlp --device cpu            # MNIST-sized: 60,000 × 1×28×28, batch 128
    ensdiag bench --arch resnet18 --device cuda      # CIFAR-sized: 50,000 × 3×32×32, batch 128

Each method is trained with the preset's optimiser, batch size and augmentation (mnist for
`mlp`, cifar10 for `resnet18`). Warm-up batches run first and are not timed; so is the
one-time preparation of the training split (normalising it on the device), which is
reported separately. With `batches` only that many batches per epoch are timed and the epoch
time is extrapolated from them (the JSON says so).
"""

import math
import time
from dataclasses import asdict, dataclass

import torch

from ..config import preset_config
from ..data.batching import Normalize, epoch_permutations
from ..nn import build_model
from ..nn.members import fastest
from ..train import FitData, make_optimizer, num_orders, train_epoch
from .reference import ReferenceModel, make_loader

PROTOCOLS = {"mlp": ("mnist", 60_000), "resnet18": ("cifar10", 50_000)}
BENCH_METHODS = ("single", "mc-dropout", "deep-ensemble", "batch-ensemble-channel", "batch-ensemble-kernel")
TEST_SIZE = 10_000


@dataclass
class BenchSettings:
    arch: str = "mlp"
    methods: tuple[str, ...] = BENCH_METHODS
    device: str = "cpu"
    epochs: int = 1  # timed epochs per method (after warm-up)
    batches: int | None = None  # time only this many batches per epoch, extrapolate to the epoch
    train_size: int | None = None  # default: the protocol's (60,000 / 50,000)
    test_size: int = TEST_SIZE
    eval_batch_size: int = 1000
    warmup_batches: int = 5  # never more than the timed batches
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16
    compile: bool = False  # torch.compile the model body (fast path only)
    reference: bool = True
    reference_workers: int | None = None  # DataLoader workers; default 0 on CPU, min(8, cores) on CUDA
    strategies: bool = False  # also time the Deep Ensemble member strategies (nn/members.py)
    members: int = 4

    def to_dict(self):
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}


def synthetic_split(n, shape, num_classes, seed):
    """uint8 images and labels of the real shapes (their values do not change the timing)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=generator)
    return images, torch.randint(0, num_classes, (n,), generator=generator)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device):
    _sync(device)
    began = time.perf_counter()
    result = fn()
    _sync(device)
    return time.perf_counter() - began, result


def train_members(method: str, members: int, split_batch=False) -> int:
    """How many member forward passes one training example costs."""
    return members if method == "deep-ensemble" or (method == "batch-ensemble" and not split_batch) else 1


def time_fast_path(config, run, train, test, settings, device, strategy=None) -> dict:
    """Seconds per epoch and throughputs of ensdiag's own training and inference."""
    method, options = config.model_options(run)
    torch.manual_seed(0)
    model = build_model(config.arch, method, None if method == "single" else config.members,
                        config.num_classes, config.input_shape, **options).to(device)
    model.member_strategy = strategy or fastest(device.type, config.arch)
    autocast = settings.precision == "bf16" or (settings.precision == "auto" and device.type == "cuda")
    channels_last = device.type == "cuda" and config.arch != "mlp"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if settings.compile:
        model.body.compile()
    normalize = Normalize(config.mean, config.std, device)
    data = FitData(train[0].to(device), train[1].to(device), test[0][:0].to(device), test[1][:0].to(device),
                   normalize, augment=config.augment)
    prepare_seconds, _ = _timed(lambda: data.training_images(torch.bfloat16 if autocast else torch.float32), device)
    optimizer, _ = make_optimizer(model, config)
    generator = torch.Generator(device=device).manual_seed(0)
    n, bs = len(train[1]), config.batch_size
    orders_per_epoch = num_orders(method, model.num_members)
    batches_per_epoch = math.ceil(n / bs)
    timed_batches = min(settings.batches or batches_per_epoch, batches_per_epoch)

    def epoch(batches):
        orders = epoch_permutations(n, orders_per_epoch, generator, device)[:, :batches * bs]
        return train_epoch(model, optimizer, data, orders, config, generator, autocast, channels_last)

    epoch(min(settings.warmup_batches, timed_batches))
    seconds = [_timed(lambda: epoch(timed_batches), device)[0] for _ in range(settings.epochs)]
    per_epoch = sum(seconds) / len(seconds) * batches_per_epoch / timed_batches
    inference = time_fast_inference(model, test[0], normalize, settings, device, autocast, channels_last)
    k_train = train_members(method, model.num_members, config.be_split_batch)
    return {"members": model.num_members, "seconds_per_epoch": per_epoch, "epoch_seconds_measured": seconds,
            "timed_batches": timed_batches, "batches_per_epoch": batches_per_epoch,
            "images_per_second": n / per_epoch, "member_images_per_second": n * k_train / per_epoch,
            "prepare_seconds": prepare_seconds, **inference}


@torch.no_grad()
def time_fast_inference(model, images, normalize, settings, device, autocast, channels_last) -> dict:
    model.eval()
    x = normalize(images.to(device)).to(torch.bfloat16 if autocast else torch.float32)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    size = settings.eval_batch_size

    def run():
        for start in range(0, len(x), size):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                model(x[start:start + size])

    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        model(x[:size])  # warm-up
    seconds, _ = _timed(run, device)
    return {"inference_images_per_second": len(x) / seconds,
            "inference_member_images_per_second": len(x) * model.num_members / seconds}


def time_reference(config, run, train, test, settings, device, workers) -> dict:
    """The same measurements for the reference pipeline (reference.py)."""
    reference = ReferenceModel(config, run, device)
    loader = make_loader(*train, config, config.batch_size, True, workers, device, augment=config.augment)
    batches_per_epoch = len(loader)
    timed_batches = min(settings.batches or batches_per_epoch, batches_per_epoch)
    reference.train_epoch(loader, max_batches=min(settings.warmup_batches, timed_batches))
    seconds = [_timed(lambda: reference.train_epoch(loader, max_batches=timed_batches), device)[0]
               for _ in range(settings.epochs)]
    per_epoch = sum(seconds) / len(seconds) * batches_per_epoch / timed_batches
    test_loader = make_loader(*test, config, settings.eval_batch_size, False, workers, device)
    reference.predict(test_loader, max_batches=1)
    inference_seconds, _ = _timed(lambda: reference.predict(test_loader), device)
    return {"reference_seconds_per_epoch": per_epoch, "reference_epoch_seconds_measured": seconds,
            "reference_timed_batches": timed_batches,
            "reference_inference_images_per_second": len(test[1]) / inference_seconds}


def run_bench(settings: BenchSettings, device: torch.device, on_result=None) -> dict:
    """Every method's fast-path and reference numbers, the ratios the targets name, the settings."""
    preset, default_size = PROTOCOLS[settings.arch]
    config = preset_config(preset, members=settings.members)
    train = synthetic_split(settings.train_size or default_size, config.input_shape, config.num_classes, seed=0)
    test = synthetic_split(settings.test_size, config.input_shape, config.num_classes, seed=1)
    workers = settings.reference_workers
    if workers is None:
        workers = 0 if device.type == "cpu" else min(8, torch.get_num_threads())
    results = {}
    for run in settings.methods:
        row = time_fast_path(config, run, train, test, settings, device)
        if settings.reference:
            row.update(time_reference(config, run, train, test, settings, device, workers))
            row["speedup"] = row["reference_seconds_per_epoch"] / row["seconds_per_epoch"]
        results[run] = row
        if on_result is not None:
            on_result(run, row)
    strategies = {}
    if settings.strategies:
        from ..nn.members import STRATEGIES
        for strategy in STRATEGIES:
            row = time_fast_path(config, "deep-ensemble", train, test, settings, device, strategy=strategy)
            strategies[strategy] = {key: row[key] for key in ("seconds_per_epoch", "timed_batches",
                                                              "inference_images_per_second")}
            if on_result is not None:
                on_result(f"deep-ensemble [{strategy}]", strategies[strategy])
    return {"settings": {**settings.to_dict(), "preset": preset, "train_size": len(train[1]),
                         "batch_size": config.batch_size, "optimizer": config.optimizer,
                         "augment": config.augment, "reference_workers": workers,
                         "threads": torch.get_num_threads()},
            "methods": results, "strategies": strategies, "ratios": ratios(results)}


def ratios(results: dict) -> dict:
    """The ratios the performance targets are stated in."""
    out = {}
    seconds = {run: row["seconds_per_epoch"] for run, row in results.items()}
    if "single" in seconds and "deep-ensemble" in seconds:
        out["deep-ensemble / single"] = seconds["deep-ensemble"] / seconds["single"]
    for variant in ("batch-ensemble-channel", "batch-ensemble-kernel", "batch-ensemble"):
        if variant in seconds and "deep-ensemble" in seconds:
            out[f"{variant} / deep-ensemble"] = seconds[variant] / seconds["deep-ensemble"]
    speedups = [row["speedup"] for row in results.values() if "speedup" in row]
    if speedups:
        out["smallest speed-up over reference"] = min(speedups)
    return out
