"""The `ensdiag` command line: parse options, call the library, render. No maths here.

    ensdiag --help
"""

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .errors import EnsdiagError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Is your ensemble really an ensemble? Diagnostics for trained ensembles.")
err_console = Console(stderr=True)


@app.callback()
def _root():
    """Is your ensemble really an ensemble? Diagnostics for trained ensembles."""


@app.command()
def models(
    arch: str = typer.Option(None, help="Only this architecture (mlp, resnet18)."),
    members: int = typer.Option(4, "--members", "-k", help="Ensemble members."),
    num_classes: int = typer.Option(10, help="Output classes."),
):
    """Every architecture x method ensdiag builds, with its parameter count (paper Table 4)."""
    from .nn import ARCHITECTURES, METHODS, build_model

    shapes = {"mlp": (1, 28, 28), "resnet18": (3, 32, 32)}
    table = Table(title=f"Models (k = {members}, {num_classes} classes)")
    for column in ("architecture", "input", "method", "members", "parameters"):
        table.add_column(column, justify="right" if column in ("members", "parameters") else "left")
    for name in [arch] if arch else list(ARCHITECTURES):
        shape = shapes.get(name, (1, 28, 28))
        for method in METHODS:
            variants = [("channel",), ("kernel",)] if method == "batch-ensemble" else [()]
            for variant in variants:
                options = {"variant": variant[0]} if variant else {}
                model = build_model(name, method, None if method == "single" else members,
                                    num_classes, shape, **options)
                label = f"{method} ({variant[0]})" if variant else method
                count = sum(p.numel() for p in model.parameters())
                table.add_row(name, "×".join(map(str, shape)), label, str(model.num_members), f"{count:,}")
    Console().print(table)


@app.command()
def datasets(data_dir: Path = typer.Option(Path("data"), "--data-dir", help="Where your datasets live (torchvision's layout).")):
    """Every dataset ensdiag reads: found or missing, where it looked, what it expects, how to get it."""
    from .data import DATASETS

    table = Table(title=f"Datasets (--data-dir {data_dir})", show_lines=True)
    for column in ("name", "role", "status", "looked in / expects", "how to get it"):
        table.add_column(column, overflow="fold")
    for name, dataset in DATASETS.items():
        where = dataset.locate(data_dir)
        files = dataset.expected_files(data_dir)
        if where is not None:
            status, looked = "[green]found[/]", str(where)
        else:
            status = "[red]missing[/]"
            folders = sorted({str(f.parent) for f in files})
            looked = f"{', '.join(folders)}: {', '.join(sorted({f.name for f in files})[:6])}" + (" …" if len(files) > 6 else "")
        table.add_row(name, dataset.role, status, looked, dataset.how_to_get)
    Console().print(table)


def main(argv=None):
    """Entry point: user errors become one line on stderr and a non-zero exit, never a traceback.

    typer (standalone mode) already reports usage errors as such and exits."""
    try:
        app(args=argv, prog_name="ensdiag")
    except EnsdiagError as error:
        sys.stderr.write(f"error: {error}\n")
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
