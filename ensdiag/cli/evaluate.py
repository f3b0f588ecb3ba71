"""`ensdiag evaluate`: predictions and every metric of one model, on its preset's data or yours."""

from pathlib import Path

import typer

from ..console import output_folder
from ..errors import EnsdiagError
from ..lora import adapter_folders
from ..numbers import parse_precision, parse_seconds
from ..runs import claim_files
from .app import app
from .lora import evaluate_command
from .options import ARCH, BUDGET, DATA, DATA_DIR, DEVICE, FAMILY, FORMAT, MODELS, NORMALIZE, NUM_CLASSES, OOD, PRECISION
from .options import DETAIL, SHIFT, THREADS, data_choice, ended_by_interruption, own_threads, quick_checks, show_metrics


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
    out: Path = typer.Option(None, help="Folder to write predictions.safetensors and metrics.json into (created if missing; "
                             "not a run folder, a link, or a folder holding saved results unless --overwrite)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the predictions.safetensors and metrics.json "
                                   "an earlier evaluate wrote into --out (without it, saved results are never replaced)."),
    seed: int = typer.Option(0, help="Seed of MC Dropout's masks (the other methods are deterministic); LoRA adapters: "
                             "the run's seed."),
    fmt: str = FORMAT,
    budget: str = BUDGET,
    precision_target: float = PRECISION,
    detail: bool = DETAIL,
    base: Path = typer.Option(None, help="LoRA adapters: the base model's local folder, loaded by lm-eval with each adapter."),
    tasks: str = typer.Option(None, help="LoRA adapters: the lm-eval task (or group) to score them on."),
    ood_task: str = typer.Option(None, "--ood-task", help="LoRA adapters: an lm-eval task whose questions are the OOD split."),
    include_path: Path = typer.Option(None, "--include-path", help="LoRA adapters: a folder of lm-eval task YAML files."),
    method: str = typer.Option(None, help="LoRA adapters: the run's name in --out (default: the adapters' parent folder)."),
    limit: int = typer.Option(None, min=1, help="LoRA adapters: lm-eval's --limit (the first N documents per task)."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="LoRA adapters: lm-eval's batch size."),
    threads: int = THREADS,
):
    """Predictions and every metric of one model on its data.

    The matching preset's test, shift and OOD data, or your own (--data, --shift, --ood). MODEL may instead be
    k ≥ 2 LoRA adapter folders of one base (ADAPTER_DIR… --base MODEL_DIR --tasks NAME): lm-evaluation-harness
    scores each (pip install 'ensdiag[llm]'), and the run saved to --out holds their predictions and weight space."""
    seed = quick_checks(model_path, data, shift, ood, fmt, seed)
    if adapter_folders(model_path):
        return evaluate_command(model_path, base, tasks, ood_task, include_path, out, method, seed, device, batch_size,
                                limit, fmt, {"--preset": preset, "--data": data, "--shift": shift, "--ood": ood,
                                               "--normalize": normalize, "--num-classes": num_classes, "--download": download,
                                               "--from": family != "auto", "--arch": arch != "auto",
                                               "--budget": budget, "--precision-target": precision_target,
                                               "--overwrite": True if overwrite else None})
    if any(value is not None for value in (base, tasks, ood_task, include_path, method, limit)):
        raise EnsdiagError("--base, --tasks, --ood-task, --include-path, --method and --limit are for LoRA adapter "
                           "folders (ADAPTER_DIR…, each with adapter_config.json)")
    budget, precision_target = parse_seconds(budget), parse_precision(precision_target)
    if overwrite and out is None:
        raise EnsdiagError("--overwrite replaces what --out holds: give --out DIR too")
    if out is not None:  # refused now, not after predicting every split (runs.claim_files says what is refused)
        out = claim_files(output_folder(out), ("predictions.safetensors", "metrics.json"), overwrite)
    from ..distributed import barrier, finish, start
    from ..core import Context, Measure, inspect
    from ..core.inputs import prepare
    from ..foreign.checkpoints import open_ensemble

    model = open_ensemble(model_path, family, raw_ok=False, arch=arch, num_classes=num_classes)
    own_threads(threads, model.spec.arch)
    try:
        ranks, device = start(device)  # under torchrun every rank predicts its share
        if download and not ranks.main:
            barrier()  # rank 0 downloads first
        inputs = prepare(model, data_choice(model, preset, data, shift, ood, normalize), data_dir, download and ranks.main,
                         device)
        if download and ranks.main:
            barrier()
        diagnosis = inspect(model.to(device), inputs.splits, preprocess=inputs.preprocess,
                            measure=Measure(geometry=False, detail=detail, seed=seed, budget=budget,
                                            precision=precision_target),
                            context=Context(titles=inputs.titles, skipped=inputs.skipped, spread=ranks.distributed))
    finally:
        finish()
    if diagnosis is None:
        return  # rank 0 analyses and writes
    if out is not None:
        diagnosis.write_files(out, spec=model.spec, overwrite=overwrite)
    show_metrics(diagnosis.metrics, fmt, f"{', '.join(map(str, model_path))} ({model.spec.arch}, {model.method}, "
                                         f"k={model.num_members})")
    ended_by_interruption(diagnosis.metrics)
