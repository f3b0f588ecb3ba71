"""`ensdiag evaluate`: predictions and every metric of one model, on its preset's data or yours."""

from pathlib import Path

import typer

from ..console import check_format, output_folder
from .app import app
from .options import (
    ARCH,
    DATA,
    DATA_DIR,
    DEVICE,
    FAMILY,
    FORMAT,
    MODELS,
    NORMALIZE,
    NUM_CLASSES,
    OOD,
    SEED,
    SHIFT,
    data_choice,
    quick_checks,
)
from .show import show_metrics


@app.command()
def evaluate(
    model_path: list[Path] = MODELS,
    family: str = FAMILY,
    arch: str = ARCH,
    num_classes: int = NUM_CLASSES,
    preset: str = typer.Option(None, help="Whose data to evaluate on (default: the preset matching the model)."),
    data_dir: Path = DATA_DIR,
    download: bool = typer.Option(False, "--download", help="Let torchvision download MNIST/FashionMNIST/CIFAR-10/SVHN."),
    data: Path = DATA,
    shift: str = SHIFT,
    ood: str = OOD,
    normalize: str = NORMALIZE,
    device: str = DEVICE,
    out: Path = typer.Option(None, help="Folder to write predictions.safetensors and metrics.json into (created if missing)."),
    seed: int = SEED,
    fmt: str = FORMAT,
):
    """Predictions and every metric of one model on its data.

    The matching preset's test, shift and OOD data, or your own (--data, --shift, --ood)."""
    check_format(fmt)
    quick_checks(model_path, data, shift, ood)
    out = None if out is None else output_folder(out)
    from .. import distributed
    from ..core import inspect
    from ..evaluate import prepare
    from ..foreign.checkpoints import open_ensemble

    model = open_ensemble(model_path, family, raw_ok=False, arch=arch, num_classes=num_classes)
    try:
        ranks, device = distributed.start(device)  # under torchrun every rank predicts its share
        if download and not ranks.main:
            distributed.barrier()  # rank 0 downloads first
        inputs = prepare(model, data_choice(model, preset, data, shift, ood, normalize), data_dir, download and ranks.main,
                         device)
        if download and ranks.main:
            distributed.barrier()
        diagnosis = inspect(model.to(device), inputs.splits, preprocess=inputs.preprocess, seed=seed, geometry=False,
                            titles=inputs.titles, skipped=inputs.skipped, spread=ranks.distributed)
    finally:
        distributed.finish()
    if diagnosis is None:
        return  # rank 0 analyses and writes
    if out is not None:
        diagnosis.write_files(out, spec=model.spec)
    show_metrics(diagnosis.metrics, fmt, f"{', '.join(map(str, model_path))} ({model.spec.arch}, {model.method}, "
                                         f"k={model.num_members})")
