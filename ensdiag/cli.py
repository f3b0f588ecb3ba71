"""The `ensdiag` command line: parse options, call the library, render. No maths here.

    ensdiag --help

Exit codes and how failures are shown: console.py. Nothing here imports torch before a
command needs it, so `--help` and `--version` start fast.
"""

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from . import __version__
from .console import check_format, err_console, literal, note, output_file, print_json, run, show
from .config import PRESETS  # torch-free: the presets' names for the help
from .errors import EnsdiagError, unknown

class _Command(typer.core.TyperCommand):
    """Usage lines as Unix tools write them: `MODEL...`, `[RUN_DIR]` (typer writes `{MODEL}...`)."""

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                continue
            name = (param.metavar or param.name).upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces


class _App(typer.Typer):
    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", _Command)
        return super().command(*args, **kwargs)


# Plain help (no boxes): at 80 columns rich's panels cut option names and fold every line
app = _App(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
           context_settings={"help_option_names": ["-h", "--help"]},
           help="Is your ensemble really an ensemble? Diagnostics for trained ensembles.")


def _version(value: bool):
    if value:
        sys.stdout.write(f"ensdiag {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print ensdiag's version and exit.")):
    """Is your ensemble really an ensemble? Diagnostics for trained ensembles.

    Exit codes: 0 ok, 1 internal error, 2 bad input, 130 interrupted (rerun to resume)."""


@app.command()
def models(
    arch: str = typer.Option(None, help="Only this architecture (mlp, resnet18)."),
    members: int = typer.Option(4, "--members", "-k", help="Ensemble members."),
    num_classes: int = typer.Option(10, help="Output classes."),
    options: bool = typer.Option(False, "--options", help="List every method's options (train --option METHOD.NAME=VALUE) instead."),
):
    """Architectures × methods ensdiag builds, with parameter counts.

    The paper's Table 4 counts, for every architecture and registered method."""
    from .nn import ARCHITECTURES, METHODS, build_model
    from .nn.methods import members_for

    if options:
        table = Table(title="Method options (ensdiag train --option METHOD.NAME=VALUE)")
        for column in ("method", "option", "default", "valid values", "what it does"):
            table.add_column(column, overflow="fold")
        for method, kit in METHODS.items():
            for option in kit.declared:
                default = "the architecture's" if option.default is None else str(option.default)
                table.add_row(literal(method), literal(option.name), default, option.describe(), literal(option.help))
        show(Console(), table)
        return

    shapes = {"mlp": (1, 28, 28), "resnet18": (3, 32, 32)}
    table = Table(title=f"Models (k = {members}, {num_classes} classes)")
    for column in ("architecture", "input", "method", "members", "parameters"):
        table.add_column(column, justify="right" if column in ("members", "parameters") else "left")
    if arch is not None and arch not in ARCHITECTURES:
        raise unknown("architecture", arch, ARCHITECTURES)
    whole = [name for name, builder in ARCHITECTURES.items() if builder.whole_networks]
    for name in [name for name in ([arch] if arch else list(ARCHITECTURES)) if name not in whole]:
        shape = shapes.get(name, (1, 28, 28))
        for method, kit in METHODS.items():
            for options in kit.model_variants(ARCHITECTURES[name].convolutional):
                model = build_model(name, method, members_for(method, members), num_classes, shape, **options)
                described = ", ".join(f"{value} {key}" if key == "layout" else str(value) if isinstance(value, str)
                                      else f"{key} {value:g}" for key, value in options.items())
                label = f"{method} ({described})" if options else method
                count = sum(p.numel() for p in model.parameters())
                table.add_row(name, "×".join(map(str, shape)), label, str(model.num_members), f"{count:,}")
    show(Console(), table)
    for name in whole:
        note(f"{name}:NAME — any torchvision classification model, imported as a Deep Ensemble (ensdiag import --arch "
             f"{name}:resnet18 …); its size is the model's")


@app.command()
def presets(fmt: str = typer.Option("table", "--format", help="table or json.")):
    """Every preset's protocol: data, model and training defaults.

    What `ensdiag train --preset P` runs when no option overrides it."""
    import dataclasses

    from .config import PRESETS
    check_format(fmt)
    fields = ("dataset", "shift", "ood", "arch", "methods", "members", "seeds", "epochs", "optimizer", "lr", "batch_size",
              "weight_decay", "milestones", "early_stopping", "patience", "val_fraction", "augment")
    rows = {name: {key: dataclasses.asdict(config)[key] for key in fields} for name, config in PRESETS.items()}
    if fmt == "json":
        print_json(rows)
        return
    table = Table(title="Presets (ensdiag train --preset P; every option overrides its default)")
    table.add_column("", no_wrap=True)
    for name in rows:
        table.add_column(name, overflow="fold")
    for key in fields:
        table.add_row(key.replace("_", " "), *[", ".join(map(str, value)) if isinstance(value, (list, tuple))
                                               else str(value) for value in (row[key] for row in rows.values())])
    Console().print(table)  # names and short numbers: folding long cells at the terminal's width loses nothing


@app.command()
def datasets(data_dir: Path = typer.Option(Path("data"), "--data-dir", help="Where your datasets live (torchvision's layout).")):
    """Every dataset ensdiag reads: found or missing, and where.

    Where it looked, what it expects, and how to get it."""
    from .console import wrapped
    from .data import all_datasets  # torch-free: listing costs no torch start-up

    console = Console()
    width = max(40, console.width - 2)
    console.print(literal(f"Datasets (--data-dir {data_dir})"), soft_wrap=True)
    colours = {"found": "green", "partial": "yellow", "missing": "red"}
    for name, dataset in all_datasets().items():
        where = dataset.locate(data_dir)
        files = dataset.expected_files(data_dir)
        partial = dataset.coverage(dataset.present_parts(data_dir)) if where is not None else ""
        status = "partial" if partial else "found" if where is not None else "missing"
        console.print(f"[bold]{name}[/] ({literal(dataset.role)}): [{colours[status]}]{status}[/]", soft_wrap=True)
        if status == "missing":
            for folder in sorted({str(f.parent) for f in files}):  # a path is printed whole, never cut
                names = sorted(f.name for f in files if str(f.parent) == folder)
                console.print(literal(f"  expects in {folder}/: {', '.join(names[:6])}" + (" …" if len(names) > 6 else "")),
                              soft_wrap=True)
            how = wrapped(f"to get it: {dataset.how_to_get}", width - 2).replace("\n", "\n    ")
            console.print(literal(f"  {how}"), soft_wrap=True)
        else:
            place = f"in {where}" if isinstance(where, Path) else str(where)  # embedded sets say where they come from
            console.print(literal(f"  {place}" + (f": {partial}" if partial else "")), soft_wrap=True)


def _csv(text, kind=str, what="value"):
    if text is None:
        return None
    try:
        return [kind(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise EnsdiagError(f"{what} must be a comma-separated list of {kind.__name__}s, got {text!r}") from None


@app.command()
def train(
    preset: str = typer.Option("digits", help=f"The protocol: {', '.join(PRESETS)} (digits is embedded and runs offline; "
                                "`ensdiag presets` shows each one's defaults)."),
    method: str = typer.Option(None, help="Comma list of methods (`ensdiag models` lists every registered one; default: the preset's)."),
    seeds: str = typer.Option(None, help="Comma list of seeds (default: the preset's, `ensdiag presets`)."),
    epochs: int = typer.Option(None, help="Maximum epochs."),
    lr: float = typer.Option(None, help="Initial learning rate."),
    batch_size: int = typer.Option(None, help="Examples per batch (per member for Deep Ensembles)."),
    members: int = typer.Option(None, "--members", "-k", help="Ensemble members k (and MC Dropout passes)."),
    dropout: float = typer.Option(None, help="MC Dropout rate."),
    mc_dropout_train: str = typer.Option(None, help="MC Dropout in training: on (torch-uncertainty's, which the paper's numbers came from; the presets) or off (dropout only at test time, as the paper's text says)."),
    be_variant: str = typer.Option(None, help="BatchEnsemble conv perturbation: channel or kernel."),
    be_init: str = typer.Option(None, help="Fast-weight init: normal[:std], ones, random-sign[:p]."),
    be_layout: str = typer.Option(None, help="BatchEnsemble layout: paper (random member biases, biased block convs, plain shortcuts; the presets) or original (zero biases, every conv perturbed)."),
    be_loss: str = typer.Option(None, help="BatchEnsemble loss: mean (cross-entropy over all k·B rows, the original's; default) or sum (over members, which gives the shared weights k times a single model's gradient)."),
    be_split_batch: bool = typer.Option(None, "--be-split-batch/--no-be-split-batch", help="Original split mode: each member gets B/k examples."),
    be_fast_weight_decay: bool = typer.Option(None, "--be-fast-weight-decay/--no-be-fast-weight-decay", help="Weight decay on r, s (paper: on)."),
    early_stopping: bool = typer.Option(None, "--early-stopping/--no-early-stopping",
                                        help="Stop when validation accuracy stops improving and keep the best epoch's weights (digits, mnist: on; cifar10: off)."),
    patience: int = typer.Option(None, help="Early stopping: epochs without an improvement of min_delta before stopping (preset: 10)."),
    val_fraction: float = typer.Option(None, help="Fraction of the training set held out for validation, seeded (digits, mnist: 0.1; cifar10: 0, the full training set)."),
    ddp: bool = typer.Option(False, "--ddp", help="Under torchrun: train each run on all ranks together "
                             "(DistributedDataParallel) instead of spreading the runs over the ranks."),
    geometry: bool = typer.Option(None, "--geometry/--no-geometry", help="Member geometry after training: CKA per "
                                  "layer, aligned weight cosine, paths between members, rank of W_i ⊘ W_j (default on)."),
    track_diversity: bool = typer.Option(None, "--track-diversity/--no-track-diversity",
                                         help="Record members' disagreement, JSD and weight cosine (raw and aligned) on the "
                                         "validation split at initialisation and after every epoch (diversity.jsonl)."),
    method_option: list[str] = typer.Option(None, "--option", "-O", metavar="METHOD.NAME=VALUE",
                                            help="A method's option (repeatable); `ensdiag models --options` lists them all."),
    precision: str = typer.Option(None, help="Training arithmetic: auto (bf16 autocast on CUDA, fp32 on the CPU), fp32 "
                                  "or bf16. Predictions and every metric are computed in fp32 whatever this says."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    data_dir: Path = typer.Option(Path("data"), "--data-dir", help="Where datasets live (torchvision's layout)."),
    download: bool = typer.Option(False, "--download", help="Let torchvision download MNIST/FashionMNIST/CIFAR-10/SVHN."),
    shift: str = typer.Option(None, help="Replace the preset's shift set: a registered dataset (`ensdiag datasets`) or "
                              "your files (an image folder, .npz or .npy)."),
    ood: str = typer.Option(None, help="Replace the preset's OOD set: a registered dataset or your files, like --shift."),
    out: Path = typer.Option(None, help="Run folder (default runs/<preset>-<timestamp>); rerun into it to resume."),
    resume: Path = typer.Option(None, help="Continue the run in this folder with its stored settings."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
):
    """Train every method × seed of a preset into a run folder.

    Writes models, predictions and metrics per run; rerun into the folder to resume."""
    from .quickcheck import check_train, integer_list
    options = dict(methods=_csv(method, what="--method"), seeds=integer_list(seeds, "--seeds"), epochs=epochs, lr=lr,
                   batch_size=batch_size, members=members, dropout=dropout, mc_dropout_train=mc_dropout_train, be_variant=be_variant,
                   be_init=be_init, be_layout=be_layout, be_loss=be_loss, be_split_batch=be_split_batch, be_fast_weight_decay=be_fast_weight_decay,
                   early_stopping=early_stopping, patience=patience, val_fraction=val_fraction,
                   track_diversity=track_diversity, geometry=geometry, precision=precision, method_options=method_option or None,
                   shift=shift, ood=ood)
    if resume is not None:
        given = sorted(key for key, value in options.items() if value is not None)
        if given or out is not None:
            raise EnsdiagError(f"--resume continues a run with its stored settings; drop {', '.join(given) or '--out'}")
    check_train(preset, options["methods"], out, resume, shift, ood)  # before torch: a typo costs well under a second
    with loading("loading torch …", quiet):  # a transient line: gone once training shows its progress
        from .config import TrainConfig, preset_config
        from .experiment import run_experiment
        from .runs import default_run_dir, read_experiment

    options.update(method_options=_method_options(method_option), shift=_set(shift), ood=_set(ood))
    if resume is not None:
        config, out = TrainConfig.from_dict(read_experiment(resume)["config"], source=str(resume / "experiment.json")), resume
    else:
        config = preset_config(preset, **options)
        from .distributed import from_environment
        if out is None and from_environment().distributed:
            raise EnsdiagError("under torchrun, name the run folder with --out: every rank must write the same one")
        out = out or default_run_dir(config.preset)
    from . import distributed
    try:
        run_dir = run_experiment(config, out, data_dir, download, device, quiet, sys.argv, ddp=ddp)
    finally:
        distributed.finish()
    ranks = distributed.ranks()
    if not ranks.main:
        return  # rank 0 reports for the whole job
    if ranks.distributed:  # the job's report, written once every rank has finished
        from .report import make_report
        make_report(run_dir)
    if not quiet:
        from .report import build_report, to_rich
        with loading("summarising the grid (the verdict's bootstrap) …"):
            summary = build_report(run_dir)
        for table in to_rich(summary, only={"verdict", "id", "ood", "diversity"}, width=err_console.width):
            show(err_console, table)
        note(f"run folder: {run_dir}  (full report: ensdiag report {run_dir})")
    print(run_dir)


def loading(text: str, quiet: bool = False):
    """A transient status line on the terminal while a slow step prints nothing (torch's import):
    it leaves nothing behind, and shows nothing when stderr is not a terminal or with --quiet."""
    from contextlib import nullcontext
    if quiet or not err_console.is_terminal:
        return nullcontext()
    return err_console.status(text, spinner="dots")


def _set(value):
    """A --shift/--ood value as stored in the run: a dataset name as given, files as an absolute path."""
    if value is None:
        return None
    from .quickcheck import is_path
    return str(Path(value).resolve()) if is_path(value) else value


def _method_options(pairs):
    if not pairs:
        return None
    from .nn.methods import parse_method_options
    return parse_method_options(pairs)


# import, evaluate, analyze and diversity (cli_inspect.py) register here, keeping the help's order
from . import cli_inspect  # noqa: E402,F401


REPORT_FORMATS = ("table", "markdown", "json", "latex", "html")  # report/__init__.py's FORMATS (a test keeps them equal)


@app.command()
def report(
    run_dir: Path = typer.Argument(None, metavar="RUN_DIR", help="A run folder (default: the newest under ./runs)."),
    fmt: str = typer.Option(None, "--format", help="table (default in a terminal), markdown, json, latex or html."),
    out: Path = typer.Option(None, help="Write the report in --format to this file (or to report.<ext> in this folder) instead of stdout."),
    reference: str = typer.Option(None, help="'paper': add the paper's published numbers (cifar10 preset)."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Rebuild RUN_DIR's figures/, report.md and report.html (--no-figures: leave the run folder untouched)."),
    svg: bool = typer.Option(False, "--svg", help="Also write every figure as SVG (vector, for papers; doubles the drawing time)."),
    conventions: str = typer.Option("ensdiag", help="Whose definitions of adaptive ECE and AURC the tables show: ensdiag or "
                                    "torch-uncertainty (to compare with papers that used it; docs/conventions.md)."),
):
    """The paper's tables (mean ± 95 % CI) and figures of a run.

    Also rebuilds report.md, report.html and figures/ in the run folder."""
    import io

    fmt = fmt or ("table" if sys.stdout.isatty() and out is None else "markdown")
    check_format(fmt, REPORT_FORMATS)  # every check that needs no tensor before matplotlib and torch
    if reference not in (None, "paper"):
        raise unknown("--reference", reference, ("paper",))
    if conventions not in ("ensdiag", "torch-uncertainty"):
        raise unknown("--conventions", conventions, ("ensdiag", "torch-uncertainty"))
    if run_dir is not None:
        from .runs import check_run_folder
        check_run_folder(run_dir)
    from .io import atomic_write_text
    from .report import make_report, render, to_rich

    extension = {"table": "txt", "markdown": "md", "json": "json", "latex": "tex", "html": "html"}[fmt]
    target = None if out is None else output_file(out, f"report.{extension}")
    with loading("building the report (verdict bootstrap, figures) …"):
        result = make_report(run_dir, reference, write=figures, conventions=conventions, svg=svg)
    written = result.pop("written")  # a note for the terminal, not part of the report
    if fmt == "table":
        buffer = io.StringIO() if target is not None else None
        console = Console(file=buffer, width=160) if buffer is not None else Console()
        for table in to_rich(result, width=console.width):
            show(console, table)
        text = buffer.getvalue() if buffer is not None else None
    else:
        text = render(result, fmt, result["run"])
        if target is None:
            sys.stdout.write(text)
    if target is not None:
        atomic_write_text(target, text)
        note(f"report written to {target}")
    if written:
        note(written)


# bench (cli_bench.py) registers last, as the help lists it
from . import cli_bench  # noqa: E402,F401


def main(argv=None):
    """Entry point (`ensdiag`): see console.py for the exit codes."""
    run(app, argv)
