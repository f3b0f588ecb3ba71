"""`ensdiag diversity`: how different the members really are, in outputs and weights."""

from pathlib import Path

import typer

from ..console import loading, note, print_json
from ..errors import DataNotFound, EnsdiagError
from ..lora import adapter_folders
from ..numbers import parse_precision, parse_seconds, path_points_option
from ..text import terminal_safe
from .app import app
from .lora import lora_diversity
from .options import ARCH, BUDGET, DATA, DATA_DIR, DEVICE, FAMILY, FORMAT, MODELS, NORMALIZE, NUM_CLASSES, OOD, PRECISION
from .options import DETAIL, SEED, SHIFT, THREADS, data_choice, ended_by_interruption, own_threads, quick_checks
from .options import show_items

MEASURED = ["disagreement", "member-pairs", "weight-similarity"]  # of the predictions analyzers; member geometry too with --geometry


@app.command()
def diversity(
    model_path: list[Path] = MODELS,
    family: str = FAMILY,
    arch: str = ARCH,
    num_classes: int = NUM_CLASSES,
    preset: str = typer.Option(None, help="Whose data to measure disagreement on (default: matches the model)."),
    data_dir: Path = DATA_DIR,
    data: Path = DATA,
    shift: str = SHIFT,
    ood: str = OOD,
    normalize: str = NORMALIZE,
    device: str = DEVICE,
    fmt: str = FORMAT,
    plot: Path = typer.Option(None, help="Also draw the heatmaps into this image file (.png, .svg, .pdf or .jpg, from its suffix)."),
    seed: int = SEED,
    geometry: bool = typer.Option(True, "--geometry/--no-geometry", help="Also member geometry: CKA per layer, "
                                  "aligned weight cosine, paths between members, rank of W_i ⊘ W_j."),
    max_examples: int = typer.Option(None, min=4, help="Geometry: at most this many images per split (default: all)."),
    path_points: str = typer.Option("11", help="Geometry: points on each path between members, or 'adaptive' "
                                    "(6, and the other 5 only where the curve bends; recorded in the result)."),
    base: Path = typer.Option(None, help="LoRA adapters: the base model's weights (a .safetensors file or a folder of "
                              "shards with model.safetensors.index.json), for the effective-weight quantities."),
    save: Path = typer.Option(None, help="LoRA adapters: also save the diagnosis as run METHOD/seed-SEED of this "
                              "folder, for `ensdiag report DIR`."),
    method: str = typer.Option("lora", help="LoRA adapters with --save: the run's name (--seed: its seed)."),
    budget: str = BUDGET,
    precision_target: float = PRECISION,
    detail: bool = DETAIL,
    overwrite: bool = typer.Option(False, "--overwrite", help="LoRA adapters with --save: replace the LoRA diagnosis "
                                   "already saved as that run (without it, an existing one is never replaced)."),
    threads: int = THREADS,
):
    """How different the members really are, in outputs and weights.

    Disagreement per split, weight-space cosine and member geometry. MODEL may instead be k ≥ 2 LoRA
    adapter folders as PEFT saves them (ADAPTER_DIR…: adapter_config.json and the weights), compared
    by their weights (docs/conventions.md, "LoRA ensembles")."""
    seed = quick_checks(model_path, data, shift, ood, fmt, seed)
    if adapter_folders(model_path):  # before anything imports torch: their configs are checked first
        return lora_diversity(model_path, base, fmt, plot, save, method, seed, {
            "--preset": preset, "--data": data, "--shift": shift, "--ood": ood, "--normalize": normalize,
            "--num-classes": num_classes, "--max-examples": max_examples, "--budget": budget,
            "--precision-target": precision_target}, overwrite)
    if base is not None or save is not None or overwrite:
        raise EnsdiagError("--base, --save and --overwrite are for LoRA adapter folders (ADAPTER_DIR…, each with "
                           "adapter_config.json)")
    from ..analysis import all_analyzers
    from ..core import Context, Measure, inspect
    from ..device import resolve_device
    from ..foreign.checkpoints import open_ensemble
    device = resolve_device(device)  # --device cuda without a GPU: one line, not a disagreement section skipped
    points = path_points_option(path_points)
    budget, precision_target = parse_seconds(budget), parse_precision(precision_target)
    geometric = [name for name, analyzer in all_analyzers().items() if analyzer.needs == "model"] if geometry else []
    model = open_ensemble(model_path, family, arch=arch, num_classes=num_classes)
    own_threads(threads, getattr(getattr(model, "spec", None), "arch", None))
    inputs, no_data, skipped = _inputs(model, preset, data, shift, ood, normalize, data_dir, device, geometry)
    diagnosis = inspect(model, inputs.splits if inputs else {}, preprocess=inputs and inputs.preprocess,
                        train=inputs and inputs.train,
                        measure=Measure(geometry=geometry, geometry_examples=max_examples, path_points=points,
                                        only=(*MEASURED, *geometric), detail=detail, seed=seed, budget=budget,
                                        precision=precision_target),
                        context=Context(titles=inputs and inputs.titles, skipped=skipped, no_data=no_data, status=loading))
    name = model_path[0].name if len(model_path) == 1 else f"{len(model_path)} files"
    from ..report.inspection import diversity_figures, diversity_view
    drawn = diversity_figures(diagnosis.metrics, plot, name) if plot is not None else []
    if fmt == "json":
        print_json(diagnosis.metrics)
    else:
        show_items(*diversity_view(terminal_safe(diagnosis.metrics), ", ".join(map(str, model_path))))
    if drawn:
        note(f"figures written to {', '.join(map(str, drawn))}")
    ended_by_interruption(diagnosis.metrics)


def _inputs(model, preset, data, shift, ood, normalize, data_dir, device, geometry):
    """(the core's `Inputs` with the model moved to its device, None, skipped splits) or (None, why there
    is no data — the weights still tell a story —, skipped splits)."""
    from ..core.inputs import prepare
    from ..foreign.checkpoints import RawEnsemble
    if isinstance(model, RawEnsemble):  # foreign tensors no architecture runs
        return None, (f"{model.reason}: disagreement needs a model that runs (ensdiag runs its mlp and CIFAR-style "
                      "resnet18, and torchvision members with --arch torchvision:NAME)"), {}
    try:
        with loading("loading the data …"):
            inputs = prepare(model, data_choice(model, preset, data, shift, ood, normalize), data_dir, device=device,
                             with_train=geometry)
    except DataNotFound as error:
        return None, f"no data to predict on: {error}", {split: str(error) for split in ("id", "shift", "ood")}
    except EnsdiagError as error:
        if preset is not None or data is not None:  # (the data of a preset guessed from the shapes may be missing)
            raise
        return None, f"no data to predict on: {error}", {}
    model.to(inputs.device)
    return inputs, None, inputs.skipped
