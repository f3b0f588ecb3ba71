"""`ensdiag import`, `evaluate`, `analyze` and `diversity`: the commands that look at one trained
ensemble, ensdiag's own or one trained elsewhere (registered on cli.py's app, in help order).
Like cli.py, nothing here imports torch before a command runs.
"""

from pathlib import Path

import typer
from rich.console import Console

from .cli import app
from .console import check_format, literal, note, output_file, output_folder, print_json, show
from .errors import DataNotFound, EnsdiagError


def _show_metrics(metrics, title):
    from .report.terminal import metrics_table, ood_table, skipped_lines
    console = Console()
    show(console, metrics_table(metrics, title))
    table = ood_table(metrics)
    if table is not None:
        show(console, table)
    for line in skipped_lines(metrics):
        note(line)


SOURCES_HELP = ("An ensdiag model file, or an ensemble trained elsewhere: a torch-uncertainty checkpoint "
                "(.ckpt/.pt/.safetensors) or one state_dict per member (format detected from the keys).")


# the options every command that opens an ensemble shares
MODELS = typer.Argument(..., metavar="MODEL", help=SOURCES_HELP)
FAMILY = typer.Option("auto", "--from", help="For foreign checkpoints: auto, torch-uncertainty or state-dicts.")
ARCH = typer.Option("auto", help="auto (from the keys) or torchvision:NAME for torchvision members (e.g. torchvision:resnet18).")
DATA_DIR = typer.Option(Path("data"), "--data-dir", help="Where datasets live (torchvision's layout).")
DEVICE = typer.Option("auto", help="auto, cpu or cuda.")
DATA = typer.Option(None, "--data", help="Your test images instead of the preset's: an image folder (one folder per class), "
                    "an .npz (images, labels) or an .npy (docs/conventions.md, 'Your data').")
SHIFT = typer.Option(None, "--shift", help="The shift set: a registered dataset (`ensdiag datasets`) or a path like --data.")
OOD = typer.Option(None, "--ood", help="The OOD set: a registered dataset (`ensdiag datasets`) or a path like --data.")
NORMALIZE = typer.Option(None, "--normalize", help="Input normalisation MEAN,…:STD,… per channel (images in [0, 1]), or "
                         "none (default: the preset's).")
NUM_CLASSES = typer.Option(None, "--num-classes", help="Classes per member where the shapes cannot tell (one network "
                           "with k heads, grouped MLPs with subgroups) or torchvision's classifier is not standard.")


@app.command("import")
def import_(
    sources: list[Path] = typer.Argument(..., metavar="SRC", help=SOURCES_HELP),
    out: Path = typer.Option(..., help="The ensdiag model file to write (.safetensors)."),
    family: str = FAMILY,
    arch: str = ARCH,
    num_classes: int = NUM_CLASSES,
):
    """Convert an ensemble trained elsewhere to an ensdiag model file.

    Once, with its source recorded; ensdiag model files are copied as they are."""
    import json

    from .quickcheck import check_inputs
    check_inputs("SRC", sources, folders=True)
    from .checkpoint import save_model
    from .foreign.checkpoints import open_ensemble

    model = open_ensemble(sources, family, raw_ok=False, arch=arch, num_classes=num_classes)  # ensdiag's own files too
    target = output_file(out, "model.safetensors")
    source = json.dumps({"files": [path.name for path in sources], "from": family, "arch": arch}, sort_keys=True)
    save_model(model, target, {"ensdiag.source": source})
    note(f"{', '.join(map(str, sources))}: {model.spec.arch}, {model.method}, k = {model.num_members}")
    print(target)


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
    seed: int = typer.Option(0, help="Seed of MC Dropout's masks (the other methods are deterministic)."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
):
    """Predictions and every metric of one model on its data.

    The matching preset's test, shift and OOD data, or your own (--data, --shift, --ood)."""
    check_format(fmt)
    seed = _seed(seed)
    _quick_checks(model_path, data, shift, ood)
    from .analysis import analyze_predictions
    from .evaluate import evaluate_model
    from .foreign.checkpoints import open_ensemble
    from .io import atomic_write_json
    from .predictions import save_predictions

    out = None if out is None else output_folder(out)
    model = open_ensemble(model_path, family, raw_ok=False, arch=arch, num_classes=num_classes)
    model_path = ", ".join(map(str, model_path))
    from . import distributed
    try:
        choice = _data_choice(model, preset, data, shift, ood, normalize)
        predictions, titles, skipped = evaluate_model(model, choice, data_dir, download, device, seed=seed, spread=True)
    finally:
        distributed.finish()
    if not distributed.ranks().main:
        return  # under torchrun every rank predicted its share; rank 0 analyses and writes
    from .geometry.baselines import weights_with_initial
    metrics = analyze_predictions(predictions, weights=weights_with_initial(model, seed))
    metrics["split_titles"], metrics["skipped_splits"] = titles, skipped
    if out is not None:
        save_predictions({k: v for k, v in predictions.items() if k != "shift"}, Path(out) / "predictions.safetensors",
                         {"ensdiag.spec": model.spec.to_json(), "ensdiag.splits": titles})
        atomic_write_json(Path(out) / "metrics.json", metrics)
    if fmt == "json":
        print_json(metrics)
    else:
        _show_metrics(metrics, f"{model_path} ({model.spec.arch}, {model.method}, k={model.num_members})")
        for split, title in titles.items():
            note(f"{split}: {title}")
        for split, reason in skipped.items():
            note(f"{split}: not evaluated — {reason}")


def _quick_checks(model_path, data, shift, ood):
    """What needs no tensor, before torch is imported: the inputs exist, the sets are known."""
    from .quickcheck import check_inputs, check_set
    check_inputs("MODEL", model_path, folders=True)
    check_inputs("--data", [data] if data is not None else [], folders=True)
    check_set("--shift", shift)
    check_set("--ood", ood)


def _data_choice(model, preset, data, shift, ood, normalize):
    """The `DataChoice` of the command line (its paths were checked by `_quick_checks`)."""
    from .evaluate import DataChoice
    return DataChoice(preset=preset or (None if data is not None else _guessed_preset(model)),
                      data=None if data is None else str(data), shift=shift, ood=ood, normalize=normalize)


def _guessed_preset(model) -> str:
    """The preset whose architecture, inputs and classes fit; said aloud for imported models, whose
    shapes need not say which data they were trained on."""
    from .evaluate import guess_preset
    preset = guess_preset(model.spec)
    if getattr(model, "imported_from", None):
        note(f"no --preset given: measuring on the {preset} preset's data, whose inputs and classes fit this model")
    return preset


@app.command()
def analyze(
    sources: list[Path] = typer.Argument(..., metavar="PREDICTIONS",
                                         help="A .safetensors predictions file ('<split>/logits' [k,N,C], '<split>/labels' [N]), "
                                              "an .npz with the same keys (or logits/probs + labels), one .npy [k,N,C], "
                                              "one .npy [N,C] per member, or a .jsonl of multiple-choice scores (one "
                                              "question per line)."),
    labels: Path = typer.Option(None, help="Integer labels [N] (.npy) for .npy predictions."),
    ood: list[Path] = typer.Option(None, help="OOD predictions (.npy like PREDICTIONS, repeated for one file per member; "
                                              "or one .jsonl of OOD questions)."),
    inputs: str = typer.Option("logits", help="What .npy/.npz/.jsonl scores are: logits (or log-probabilities, "
                                              "log-likelihoods) or probs."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    out: Path = typer.Option(None, help="Also write the metrics to this JSON file (or to metrics.json in this folder); "
                                        "with --method, the folder to save the diagnosis into."),
    method: str = typer.Option(None, help="Save as run METHOD of the folder --out (OUT/METHOD/seed-SEED/), for "
                                          "`ensdiag report OUT`; the verdict needs runs named single and deep-ensemble."),
    seed: int = typer.Option(None, help="With --method: the seed this run is saved under (default 0)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="With --method: replace the analysis already saved as "
                                   "that run (without it, an existing one is never replaced)."),
):
    """Every metric from member predictions made anywhere.

    File layouts are in the README ("Bring your own ensemble", "Multiple-choice predictions")."""
    check_format(fmt)
    from .quickcheck import check_inputs
    check_inputs("PREDICTIONS", sources)
    check_inputs("--labels", [labels] if labels is not None else [])
    check_inputs("--ood", ood)
    _check_saving(out, method, seed, overwrite)
    from .analysis import analyze_predictions
    from .foreign.predictions import load_any_predictions
    from .io import atomic_write_json

    predictions, warnings = load_any_predictions(sources, labels, ood or (), inputs)
    for warning in warnings:
        note(f"warning: {warning}")
    metrics = analyze_predictions(predictions)
    if warnings:
        metrics["input_warnings"] = warnings
    if method is not None:
        from .diagnosis import Diagnosis
        source = f"ensdiag analyze {' '.join(path.name for path in [*sources, *(ood or ())])}"
        run = Diagnosis(metrics, predictions, {name: name for name in predictions}, source).save(out, method, seed or 0, overwrite)
        note(f"saved to {run}; `ensdiag report {out}` reports every run saved there")
    elif out is not None:
        atomic_write_json(output_file(out, "metrics.json"), metrics)
    if fmt == "json":
        print_json(metrics)
    else:
        _show_metrics(metrics, ", ".join(map(str, sources)))


def _check_saving(out, method, seed, overwrite=False):
    """--method saves a diagnosis-kind run folder (as `Diagnosis.save`); --seed and --overwrite only go with it."""
    if method is None:
        if seed is not None or overwrite:
            raise EnsdiagError(f"{'--seed' if seed is not None else '--overwrite'} names the run --method saves: give "
                               "--method too (and --out)")
        return
    if out is None:
        raise EnsdiagError("--method saves the analysis as a run of a folder: give that folder with --out DIR")
    from .runs import PREDICTIONS, claim_run
    claim_run(output_folder(out), method, _seed(0 if seed is None else seed), PREDICTIONS, overwrite, create=False)


def _seed(value):
    from .quickcheck import seed
    return seed(value)


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
    fmt: str = typer.Option("table", "--format", help="table or json."),
    plot: Path = typer.Option(None, help="Also draw the heatmaps into this image file (.png, .svg, .pdf or .jpg, from its suffix)."),
    seed: int = typer.Option(0, help="Seed of MC Dropout's masks (the other methods are deterministic)."),
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
    overwrite: bool = typer.Option(False, "--overwrite", help="LoRA adapters with --save: replace the LoRA diagnosis "
                                   "already saved as that run (without it, an existing one is never replaced)."),
):
    """How different the members really are, in outputs and weights.

    Disagreement per split, weight-space cosine and member geometry. MODEL may instead be k ≥ 2 LoRA
    adapter folders as PEFT saves them (ADAPTER_DIR…: adapter_config.json and the weights), compared
    by their weights (docs/conventions.md, "LoRA ensembles")."""
    check_format(fmt)
    seed = _seed(seed)
    _quick_checks(model_path, data, shift, ood)
    from .lora import adapter_folders
    if adapter_folders(model_path):  # before anything imports torch: their configs are checked first
        from .lora.command import lora_diversity
        return lora_diversity(model_path, base, fmt, plot, save, method, seed, {
            "--preset": preset, "--data": data, "--shift": shift, "--ood": ood, "--normalize": normalize,
            "--num-classes": num_classes, "--max-examples": max_examples}, overwrite)
    if base is not None or save is not None or overwrite:
        raise EnsdiagError("--base, --save and --overwrite are for LoRA adapter folders (ADAPTER_DIR…, each with "
                           "adapter_config.json)")
    from .quickcheck import path_points_option
    points = path_points_option(path_points)
    from .analysis import analyze_predictions
    from .device import resolve_device
    from .evaluate import evaluate_model, load_data
    from .foreign.checkpoints import RawEnsemble, open_ensemble

    resolve_device(device)  # --device cuda without a GPU: one line, not a disagreement section skipped

    model = open_ensemble(model_path, family, arch=arch, num_classes=num_classes)
    name = model_path[0].name if len(model_path) == 1 else f"{len(model_path)} files"
    model_path = Path(", ".join(map(str, model_path)))
    from .geometry.baselines import weights_with_initial
    weights = weights_with_initial(model, seed)
    if isinstance(model, RawEnsemble):  # no runnable architecture: the weights alone
        reason = (f"{model.reason}: disagreement needs a model that runs (ensdiag runs its mlp and CIFAR-style "
                  "resnet18, and torchvision members with --arch torchvision:NAME)")
        predictions, titles, skipped = None, {}, {}
    else:
        guessed = preset is None and data is None
        try:
            choice = _data_choice(model, preset, data, shift, ood, normalize)
            from .cli import loading
            with loading("loading the data …"):
                data = load_data(model, choice, data_dir, with_train=geometry)
            with loading("predicting every split …"):
                predictions, titles, skipped = evaluate_model(model, choice, data_dir, False, device, seed=seed, data=data)
        except DataNotFound as error:  # no data at all: the weights still tell a story
            predictions, titles, skipped = None, {}, {"id": str(error), "shift": str(error), "ood": str(error)}
            reason = "no data to predict on"
        except EnsdiagError as error:
            if not guessed:
                raise
            predictions, titles, skipped, reason = None, {}, {}, f"no data to predict on: {error}"
    if predictions is not None:
        metrics = analyze_predictions(predictions, weights, only=["disagreement", "weight-similarity"])
    else:
        from .analysis.diversity import weight_similarity
        from .analysis.registry import Skip
        try:
            result = {"status": "ok", **weight_similarity(None, weights)}
        except Skip as skip:
            result = {"status": "skipped", "reason": str(skip)}
        metrics = {"analyzers": {"disagreement": {"status": "skipped", "reason": reason},
                                 "weight-similarity": result}}
    method, arch = getattr(model, "method", "unknown"), getattr(getattr(model, "spec", None), "arch", "unknown")
    report = {"model": str(model_path), "method": method, "num_members": len(weights) if method == "unknown" else model.num_members,
              "splits": titles, "not_evaluated": skipped,
              "disagreement": metrics["analyzers"]["disagreement"], "weight_similarity": metrics["analyzers"]["weight-similarity"]}
    if geometry:
        report["geometry"] = _geometry(model, predictions is not None and data, predictions is not None and choice, device,
                                       seed, max_examples, reason if predictions is None else "", points)
    if plot is not None:
        from .report.figures import heatmap_grid, plain, plottable, save_figure
        rows = []
        if report["disagreement"]["status"] == "ok":
            splits = report["disagreement"]["splits"]
            panels = [(name, matrix, "disagreement") for name in ("id", "shift", "ood")
                      if name in splits and (matrix := plottable(splits[name]["matrix"]["value"])) is not None]
            rows += [("disagreement", panels)] if panels else []
        cosine = plottable(report["weight_similarity"].get("matrix", {}).get("value"))
        if report["weight_similarity"]["status"] == "ok" and cosine is not None:
            rows.append(("weight cosine", [("all layers", cosine, "cosine")]))
        aligned = report.get("geometry", {}).get("alignment", {})
        if aligned.get("status") == "ok" and (matrix := plottable(aligned["aligned"]["matrix"]["value"])) is not None:
            rows[-1][1].append(("aligned to member 0", matrix, "cosine"))
        cka = report.get("geometry", {}).get("cka", {})
        if cka.get("status") == "ok":
            rows += [(f"CKA ({split})", [(layer, plottable(entry["linear"]["value"])) for layer, entry in found["layers"].items()])
                     for split, found in cka["splits"].items() if found["layers"]]
        if not rows:
            raise EnsdiagError(f"nothing to plot for {method} with k={report['num_members']}: one weight set, no data "
                               "found, or matrices too large to store (k > 256)")
        plot = save_figure(heatmap_grid(rows, title=plain(f"{name}: {method}, k={report['num_members']}")), plot)[0]
        plot = [plot, *_geometry_plots(report.get("geometry", {}), plot, method)]
    if fmt == "json":
        print_json(report)
        return
    from .report.terminal import _fmt as cell, heatmap_table
    console = Console()
    console.print(literal(f"{model_path}: {arch}, {method}, k = {report['num_members']}"), soft_wrap=True)
    if report["disagreement"]["status"] == "ok":
        console.print("disagreement: the fraction of examples on which two members predict different classes "
                      "(0: always the same class); normalised: divided by the ensemble's error rate", soft_wrap=True,
                      style="dim", markup=False, highlight=False)
        for name, entry in report["disagreement"]["splits"].items():
            if "/" in name:
                continue
            extra = f", normalised {cell(entry['normalized'])}" if "normalized" in entry else ""
            console.print(literal(f"disagreement on {name} ({titles.get(name, name)}): mean {cell(entry['mean'])}{extra}"), soft_wrap=True)
            show(console, heatmap_table(entry["matrix"]["value"], ""))
    else:
        note(f"disagreement: {report['disagreement']['reason']}")
    similarity = report["weight_similarity"]
    if similarity["status"] == "ok":
        initial = similarity.get("initial", {})
        at_init = (f" (at initialisation {cell(initial)}, {initial['source']})"
                   if initial.get("value") is not None else "")
        console.print(literal(f"weight cosine, all layers: mean {cell(similarity['mean'])}{at_init}"), soft_wrap=True)
        console.print("weight cosine: ⟨θ_i, θ_j⟩ / (‖θ_i‖‖θ_j‖) of two members' flattened weights (1: the same "
                      "direction; independent networks: near 0)", soft_wrap=True, style="dim", markup=False, highlight=False)
        show(console, heatmap_table(similarity["matrix"]["value"], ""))
    else:
        note(f"weight cosine: {similarity['reason']}")
    if geometry:
        from .report.terminal import geometry_tables
        for item in geometry_tables(report["geometry"]):
            show(console, item) if not isinstance(item, str) else console.print(literal(item), soft_wrap=True)
    for split, reason in skipped.items():
        note(f"{split}: not evaluated — {reason}")
    if plot is not None:
        note(f"figures written to {', '.join(map(str, plot))}")


def _geometry(model, data, choice, device, seed, max_examples, reason, path_points=11) -> dict:
    """The model analyzers' results; without data (or for raw tensors) only what the weights tell."""
    from .analysis import analyze_model
    from .analysis.registry import ANALYZERS
    from .evaluate import model_probe
    from .foreign.checkpoints import RawEnsemble
    names = [name for name, analyzer in ANALYZERS.items() if analyzer.needs == "model"]
    weights_only = ["rank-structure"]
    if isinstance(model, RawEnsemble) or not data:
        from .analysis.geometry import ModelProbe
        results = analyze_model(ModelProbe(model, {}, None, seed=seed), only=weights_only)
        why = reason or "no data to read the members on"
        return {**{name: {"status": "skipped", "reason": why} for name in names if name not in weights_only}, **results}
    from .cli import loading
    probe, results = model_probe(model, data, choice, device, seed, max_examples, path_points), {}
    for name in names:  # one status line per step: paths on a ResNet-18 take minutes on a CPU
        with loading(f"member geometry: {ANALYZERS[name].description} …"):
            results.update(analyze_model(probe, only=[name]))
    return results


def _geometry_plots(results: dict, plot, method: str) -> list:
    """Line figures of member geometry beside the heatmaps: <plot>-cka-layers, -alignment, -paths."""
    from .report.figures import save_figure
    from .report.geometry_figures import alignment_figure, cka_layers_figure, paths_figure
    drawn = []
    for name, suffix, figure in (("cka", "cka-layers", cka_layers_figure), ("alignment", "alignment", alignment_figure),
                                 ("paths", "paths", paths_figure)):
        if results.get(name, {}).get("status") == "ok":
            target = plot.with_name(f"{plot.stem}-{suffix}{plot.suffix}")
            drawn += save_figure(figure({method: results[name]}), target)
    return drawn
