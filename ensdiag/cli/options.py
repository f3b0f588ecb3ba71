"""What the commands that open an ensemble share: their options, the checks that need no
tensor (run before torch is imported), the data the command line chose, and how they print their
result: JSON (the metrics layout, as metrics.json holds it) or tables on stdout, with notes on
stderr. Tables are built from the metrics with every string passed through the terminal sink first
(text.terminal_safe): split names, titles, filters and reasons may come from files."""

from pathlib import Path

import typer
from rich.console import Console

from ..console import EXIT_INTERRUPTED, check_format, literal, note, output_file, output_folder, print_json, show
from ..errors import EnsdiagError
from ..numbers import seed as checked_seed
from ..quickcheck import check_inputs, check_set
from ..runs import PREDICTIONS, RUN_FILES, claim_files, claim_run
from ..text import terminal, terminal_safe
from ..threads import own

SOURCES_HELP = ("An ensdiag model file, or an ensemble trained elsewhere: a torch-uncertainty checkpoint "
                "(.ckpt/.pt/.safetensors) or one state_dict per member (format detected from the keys).")

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
                         "none (default: what the model file records, else the preset's).")
NUM_CLASSES = typer.Option(None, "--num-classes", help="Classes per member where the shapes cannot tell (one network "
                           "with k heads, grouped MLPs with subgroups) or torchvision's classifier is not standard.")
FORMAT = typer.Option("table", "--format", help="table or json.")
SEED = typer.Option(0, help="Seed of MC Dropout's masks (the other methods are deterministic).")
BUDGET = typer.Option(None, "--budget", help="A time the whole command may take (e.g. 5m, 90s, 1h): each split and "
                      "geometry step reads the examples its measured cost affords, in a seeded random order, and says "
                      "how many and with what precision.")
DETAIL = typer.Option(False, "--detail", help="Intervals for the detail catalogue too (calibration variants, SmoothECE, "
                      "debiased ECE, member pairs, AURC, CKA, barriers): the headline tables' numbers always have them.")
PRECISION = typer.Option(None, "--precision-target", help="An interval half-width (e.g. 0.01): a split or geometry "
                         "step stops reading examples once every headline number it feeds is this precise.")
THREADS = typer.Option(None, "--threads", min=1, max=1024, help="torch's threads (default: OMP_NUM_THREADS, else one "
                       "for a network without convolutions, else the CPUs this process may use).")


def own_threads(threads, arch=None):
    """--threads, else OMP_NUM_THREADS, else ensdiag's choice for a network of `arch` (None: none; threads.py)."""
    if arch is not None:
        from ..nn.architectures import ARCHITECTURES
    own(threads, arch is not None and arch in ARCHITECTURES and not ARCHITECTURES[arch].convolutional)


def quick_checks(model_path, data, shift, ood, fmt, seed) -> int:
    """What needs no tensor, before torch is imported: the format and the seed (returned, checked), the inputs
    exist, the sets are known."""
    check_format(fmt)
    seed = checked_seed(seed)
    check_inputs("MODEL", model_path, folders=True)
    check_inputs("--data", [data] if data is not None else [], folders=True)
    check_set("--shift", shift)
    check_set("--ood", ood)
    return seed


def data_choice(model, preset, data, shift, ood, normalize):
    """The `DataChoice` of the command line (its paths were checked by `quick_checks`); without --preset and
    --data, the preset whose architecture, inputs and classes fit, said aloud for imported models, whose
    shapes need not say which data they were trained on."""
    from ..core.inputs import DataChoice, guess_preset
    if not preset and data is None:
        preset = guess_preset(model.spec)
        if getattr(model, "imported_from", None):
            note(f"no --preset given: measuring on the {preset} preset's data, whose inputs and classes fit this model")
    return DataChoice(preset=preset or None, data=None if data is None else str(data), shift=shift, ood=ood,
                      normalize=normalize)


def check_saving(out, method, seed, overwrite=False):
    """--method saves a diagnosis-kind run folder (as `Diagnosis.save`); --seed and --overwrite only go
    with it (lm-eval logs name their run themselves: --seed with --out is checked after reading them)."""
    if method is None:
        if (seed is not None or overwrite) and out is None:
            raise EnsdiagError(f"{'--overwrite' if overwrite else '--seed'} names the run --method saves: give "
                               "--method too (and --out)")
        if out is not None and out.suffix.lower() == ".json":
            claimed_file(out, overwrite)  # refused before anything is read
        return
    if out is None:
        raise EnsdiagError("--method saves the analysis as a run of a folder: give that folder with --out DIR")
    claim_run(output_folder(out), method, checked_seed(0 if seed is None else seed), PREDICTIONS, overwrite, create=False)


def claimed_file(out, overwrite=False) -> Path:
    """`analyze --out FILE.json|DIR` without --method: the file to write (DIR/metrics.json), never a link,
    never a run's result file replaced (runs.claim_files: not in a run folder's root or a training run's
    folder; an existing file only with --overwrite)."""
    target = output_file(out, "metrics.json")
    if target.name in RUN_FILES:
        claim_files(target.parent, (target.name,), overwrite)
    elif (target.exists() or target.is_symlink()) and not overwrite:
        raise EnsdiagError(f"--out {target} already exists; pass --overwrite to replace it, or name another file")
    return target


def show_metrics(metrics: dict, fmt: str, title: str):
    if fmt == "json":
        print_json(metrics)  # JSON escapes control characters (and all non-ASCII) itself
        return
    from ..report.inspection import metrics_view
    show_items(*metrics_view(terminal_safe(metrics), terminal(title), Console().width))


def show_items(items: list, notes: list):
    """Strings (literally; "dim:" marks a definition) and tables on stdout, notes on stderr."""
    console = Console()
    for item in items:
        if not isinstance(item, str):
            show(console, item)
        elif item.startswith("dim:"):
            console.print(item[4:], soft_wrap=True, style="dim", markup=False, highlight=False)
        else:
            console.print(literal(item), soft_wrap=True)
    for line in notes:
        note(line)


def ended_by_interruption(metrics: dict) -> None:
    """A diagnosis a Ctrl-C cut short was shown (and saved) with what it finished: say so, and end
    with the interrupted exit code (130)."""
    if metrics.get("interrupted"):
        note(metrics["interrupted"])
        raise typer.Exit(EXIT_INTERRUPTED)
