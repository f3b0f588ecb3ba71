"""The CLI's side of LoRA ensembles: `ensdiag diversity ADAPTER_DIR…` (their weights compared,
cli/diversity.py hands adapter folders here) and `ensdiag evaluate ADAPTER_DIR…` (lm-eval scores each,
lora/harness.py). Configs are checked before torch is imported; `--save DIR` writes a diagnosis run
that `ensdiag report DIR` renders."""

from pathlib import Path

from ..console import note, output_folder, print_json
from ..errors import EnsdiagError
from ..lora.config import read_adapter_folders
from ..progress import step_bar
from ..runs import LORA, claim_run
from ..text import terminal_safe
from .options import show_items, show_metrics

SOURCE = "ensdiag diversity (LoRA adapters)"


def lora_diversity(folders, base, fmt: str, plot, save, method: str, seed: int, not_for_adapters: dict,
                   overwrite: bool = False):
    """`not_for_adapters`: {option: value} of the command's options that need runnable members;
    `overwrite`: replace a LoRA diagnosis already saved as `save/method/seed-<seed>`."""
    given = [option for option, value in not_for_adapters.items() if value is not None]
    if given:
        raise EnsdiagError(f"{', '.join(given)} do{'es' if len(given) == 1 else ''} not apply to LoRA adapters: "
                           "ensdiag compares their weights and does not run them")
    if overwrite and save is None:
        raise EnsdiagError("--overwrite replaces a run --save saved: give --save DIR too")
    if base is not None and not Path(base).exists():
        raise EnsdiagError(f"--base {base} does not exist")
    configs = read_adapter_folders(folders)
    if save is not None:  # refused now, not after the whole diagnosis (nothing is created yet)
        claim_run(output_folder(save, "--save"), method, seed, LORA, overwrite, create=False)
    if plot is not None:
        from ..report.figures import FIGURE_FORMATS
        if (plot.suffix.lower().lstrip(".") or "png") not in FIGURE_FORMATS or plot.is_dir():
            raise EnsdiagError(f"--plot {plot}: name an image file ({', '.join('.' + f for f in FIGURE_FORMATS)})")
    from ..lora.analysis import diagnose_adapters, save_lora_run
    with step_bar(f"comparing {len(configs)} adapters, layer by layer") as advance:
        section = diagnose_adapters(configs, base, progress=advance)
    if save is not None:
        run = save_lora_run(save, method, seed, section, SOURCE, overwrite)
        note(f"saved to {run}; `ensdiag report {save}` reports every run saved there")
    drawn = []
    if plot is not None:  # <plot>: the k×k ΔW cosine; <plot>-depth: the per-layer lines
        from ..report.figures import save_figure
        from ..report.lora import lora_depth_figure, lora_heatmaps
        label = f"LoRA, k={section['k']}, r={section['rank']}"
        title = f"{', '.join(Path(folder).name for folder in folders)}"[:120]
        drawn = save_figure(lora_heatmaps({label: section}, title=title), plot) + save_figure(
            lora_depth_figure({label: section}), plot.with_name(f"{plot.stem}-depth{plot.suffix}"))
    if fmt == "json":
        print_json(with_lora({"splits": {}, "ensemble": {"method": "LoRA adapters", "num_members": section["k"]}},
                             section))
    else:
        show_items(lora_renderables_of(section), [])
    if drawn:
        note(f"figures written to {', '.join(map(str, drawn))}")


def with_lora(metrics: dict, section: dict) -> dict:
    """The one metrics layout: the weight-space section as one analyzer result among the others
    (as `ensdiag report` reads a saved run's lora.json)."""
    from ..report.load import lora_result
    return {**metrics, "analyzers": {**metrics.get("analyzers", {}), "lora": lora_result(section)}}


def lora_renderables_of(section: dict) -> list:
    from ..report.lora_terminal import lora_renderables
    return lora_renderables(terminal_safe(section))  # layer and module names come from files


def evaluate_command(folders, base, tasks, ood_task, include_path, out, method, seed, device, batch_size, limit, fmt,
                     not_for_adapters):
    """`ensdiag evaluate ADAPTER_DIR…`: lm-eval runs, the run is saved, then its metrics (with their
    intervals) and the weight-space summary are printed, or --format json: one metrics layout with the
    weight space as its `lora` analyzer, as `diversity ADAPTER_DIR… --format json` prints it."""
    from ..lora.harness import evaluate_adapters  # (lm-eval's readers load torch)
    run, metrics, section = evaluate_adapters(folders, base, tasks, ood_task, include_path, out, method, seed, device,
                                              batch_size, limit, not_for_adapters)
    if fmt == "json":
        print_json(with_lora(metrics, section))
    else:
        title = f"{tasks}: {len(folders)} LoRA adapters (lm-eval)"
        if "generated" in metrics:
            from ..report.inspection import generated_tables
            show_items(generated_tables(terminal_safe(metrics), title), [])  # names from lm-eval's files
        else:
            show_metrics(metrics, "table", title)
        show_items(lora_renderables_of(section)[:3], [])  # the headline, the members, the summary table
    note(f"saved to {run}; `ensdiag report {run.parent.parent}` reports every run saved there")
