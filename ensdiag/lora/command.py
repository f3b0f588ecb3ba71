"""`ensdiag diversity ADAPTER_DIR…`: a LoRA ensemble compared by its weights (cli/diversity.py hands
adapter folders here). Configs are checked before torch is imported; `--save DIR` writes a
diagnosis run that `ensdiag report DIR` renders."""

from pathlib import Path

from rich.console import Console

from ..console import literal, note, output_folder, print_json, show
from ..errors import EnsdiagError
from .config import read_adapter_folders

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
        from ..runs import LORA, claim_run
        claim_run(output_folder(save, "--save"), method, seed, LORA, overwrite, create=False)
    if plot is not None:
        _check_plot(plot)
    from ..progress import step_bar
    from .analysis import diagnose_adapters
    with step_bar(f"comparing {len(configs)} adapters, layer by layer") as advance:
        section = diagnose_adapters(configs, base, progress=advance)
    if save is not None:
        run = save_lora_run(save, method, seed, section, overwrite)
        note(f"saved to {run}; `ensdiag report {save}` reports every run saved there")
    drawn = draw(section, plot, folders) if plot is not None else []
    if fmt == "json":
        from ..report.load import lora_result
        print_json({"analyzers": {"lora": lora_result(section)}, "splits": {},  # the one metrics layout
                    "ensemble": {"method": "LoRA adapters", "num_members": section["k"]}})
    else:
        from ..text import terminal_safe
        from .present import lora_renderables
        console = Console()
        for item in lora_renderables(terminal_safe(section)):  # layer and module names come from files
            show(console, item) if not isinstance(item, str) else console.print(literal(item), soft_wrap=True)
    if drawn:
        note(f"figures written to {', '.join(map(str, drawn))}")


def _check_plot(plot: Path):
    from ..report.figures import FIGURE_FORMATS
    fmt = plot.suffix.lower().lstrip(".") or "png"
    if fmt not in FIGURE_FORMATS or plot.is_dir():
        raise EnsdiagError(f"--plot {plot}: name an image file ({', '.join('.' + f for f in FIGURE_FORMATS)})")


def draw(section: dict, plot: Path, folders) -> list[Path]:
    """<plot>: the k×k ΔW cosine; <plot>-depth: the per-layer lines."""
    from ..report.figures import save_figure
    from ..report.lora_figures import lora_depth_figure, lora_heatmaps
    label = f"LoRA, k={section['k']}, r={section['rank']}"
    title = f"{', '.join(Path(folder).name for folder in folders)}"[:120]
    drawn = save_figure(lora_heatmaps({label: section}, title=title), plot)
    target = plot.with_name(f"{plot.stem}-depth{plot.suffix}")
    return drawn + save_figure(lora_depth_figure({label: section}), target)


def save_lora_run(folder, method: str, seed: int, section: dict, overwrite: bool = False) -> Path:
    """`folder/<method>/seed-<seed>/lora.json`: the run's weight-space part, listed in the folder's
    experiment.json like any diagnosis (`runs.save_result`: a predictions part of the same run is left
    as it is, a LoRA diagnosis already there is replaced only with `overwrite`)."""
    from ..runs import LORA, lora_record, save_result
    return save_result(folder, method, seed, LORA, lora_record(method, seed, SOURCE, section), overwrite=overwrite)
