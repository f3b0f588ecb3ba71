"""`ensdiag models`, `presets` and `datasets`: what ensdiag builds, runs and reads (no tensors)."""

import dataclasses
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from ..config import PRESETS
from ..console import check_format, literal, note, print_json, show, wrapped
from ..data import all_datasets  # torch-free: listing costs no torch start-up
from ..errors import unknown
from .app import app


@app.command()
def models(
    arch: str = typer.Option(None, help="Only this architecture (mlp, resnet18)."),
    members: int = typer.Option(4, "--members", "-k", help="Ensemble members."),
    num_classes: int = typer.Option(10, help="Output classes."),
    options: bool = typer.Option(False, "--options", help="List every method's options (train --option METHOD.NAME=VALUE) instead."),
):
    """Architectures × methods ensdiag builds, with parameter counts.

    Every architecture and registered method, then the ResNet-18 layout whose counts the paper's Table 4 gives."""
    import torch

    from ..nn import ARCHITECTURES, METHODS, build_model
    from ..nn.methods import members_for

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
                with torch.device("meta"):  # counted, never allocated
                    model = build_model(name, method, members_for(method, members), num_classes, shape, **options)
                described = ", ".join(f"{value} {key}" if key == "layout" else str(value) if isinstance(value, str)
                                      else f"{key} {value:g}" for key, value in options.items())
                label = f"{method} ({described})" if options else method
                count = sum(p.numel() for p in model.parameters())
                table.add_row(name, "×".join(map(str, shape)), label, str(model.num_members), f"{count:,}")
    show(Console(), table)
    if (arch in (None, "resnet18")) and members == 4 and num_classes == 10:
        # the paper's layout beside its Table 4: its numbers are these counts cut (not rounded) to 0.01 M
        table = Table(title="ResNet-18 as the paper counted it (Table 4): torch-uncertainty's layout, a bias on "
                            "every convolution (build_model(…, arch_options={'conv_bias': True}); BatchEnsemble: "
                            "layout=paper, shortcut_bias)")
        for column in ("method", "options", "parameters", "paper (M)"):
            table.add_column(column, justify="left" if column in ("method", "options") else "right")
        for method, count in paper_layout_counts().items():
            arch_options, options = PAPER_LAYOUT[method]
            described = ", ".join(f"{key}={value}" for key, value in {**arch_options, **options}.items())
            table.add_row(method, described, f"{count:,}", f"{PAPER_TABLE_4[method]:.2f}")
        show(Console(), table)
    for name in whole:
        note(f"{name}:NAME — any torchvision classification model, imported as a Deep Ensemble (ensdiag import --arch "
             f"{name}:resnet18 …); its size is the model's")


PAPER_TABLE_4 = {"single": 11.17, "mc-dropout": 11.17, "deep-ensemble": 44.71, "batch-ensemble": 11.22}  # M, as printed
PAPER_LAYOUT = {"single": ({"conv_bias": True}, {}), "mc-dropout": ({"conv_bias": True}, {}),
                "deep-ensemble": ({"conv_bias": True}, {}),
                "batch-ensemble": ({}, {"layout": "paper", "shortcut_bias": True})}


def paper_layout_counts() -> dict:
    """{method: parameters} of ResNet-18 (k = 4, CIFAR shapes) in torch-uncertainty's layout with convolution
    biases, which gives all of the paper's Table 4 counts (built on the meta device: no memory)."""
    import torch

    from ..nn import build_model
    from ..nn.methods import members_for
    found = {}
    with torch.device("meta"):
        for method, (arch_options, options) in PAPER_LAYOUT.items():
            model = build_model("resnet18", method, members_for(method, 4), 10, (3, 32, 32), arch_options=arch_options,
                                **options)
            found[method] = sum(p.numel() for p in model.parameters())
    return found


@app.command()
def presets(fmt: str = typer.Option("table", "--format", help="table or json.")):
    """Every preset's protocol: data, model and training defaults.

    What `ensdiag train --preset P` runs when no option overrides it."""
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
