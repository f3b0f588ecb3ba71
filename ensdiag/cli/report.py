"""`ensdiag report`: the paper's tables and figures of a run folder (report/ builds them)."""

import sys
from pathlib import Path

import typer
from rich.console import Console

from ..console import check_format, loading, note, output_file, show
from ..errors import unknown
from ..export import EXAMPLE_FIELDS, example_rows, table_writer, write_table
from ..io import atomic_write_text
from ..names import REPORT_FORMATS
from ..runs import check_run_folder
from .app import app
from .options import THREADS, own_threads


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(None, metavar="RUN_DIR", help="A run folder (default: the newest under ./runs), "
                                          "or several: their methods and seeds in one report (none of them is written to)."),
    fmt: str = typer.Option(None, "--format", help="table (default in a terminal), markdown, json, latex, html or csv "
                            "(every number as long rows: table, method, column, seed, value, mean, 95 % interval) or summary (one line per "
                            "method led by its effective ensemble size, what the seeds settle and what would settle the "
                            "rest, where the report was written and the command that opens it: the first screen)."),
    examples: Path = typer.Option(None, "--examples", help="Also write every run's per-example predictions and "
                                  "uncertainty (confidence, entropy, JSD, member agreement) to this .csv or .parquet file."),
    out: Path = typer.Option(None, help="Write the report in --format to this file (or to report.<ext> in this folder) instead of stdout."),
    reference: str = typer.Option(None, help="'paper': add the paper's published numbers (cifar10 preset)."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Rebuild RUN_DIR's figures/, report.md and report.html (--no-figures: leave the run folder untouched)."),
    svg: bool = typer.Option(False, "--svg", help="Also write every figure as SVG (vector, for papers; doubles the drawing time)."),
    detail: bool = typer.Option(False, "--detail", help="Also draw the detail catalogue's figures: member-pair "
                                "matrices, CKA heatmaps per layer and SmoothECE curves (their summaries are in the tables, "
                                "the matrices and curves in each run's metrics.json, either way)."),
    ood_score: str = typer.Option("msp", "--ood-score", help="The OOD table's score: msp (1 − MSP), entropy, jsd "
                                  "(mutual information), expected_entropy, energy, max_logit or variation_ratio."),
    conventions: str = typer.Option("ensdiag", help="Whose definitions of adaptive ECE and AURC the tables show: ensdiag or "
                                    "torch-uncertainty (to compare with papers that used it; docs/conventions.md)."),
    threads: int = THREADS,
):
    """The paper's tables (mean ± 95 % CI) and figures of a run.

    Also rebuilds report.md, report.html and figures/ in the run folder."""
    fmt = fmt or ("table" if sys.stdout.isatty() and out is None else "markdown")
    check_format(fmt, tuple(REPORT_FORMATS))  # every check that needs no tensor before matplotlib and torch
    if reference not in (None, "paper"):
        raise unknown("--reference", reference, ("paper",))
    if conventions not in ("ensdiag", "torch-uncertainty"):
        raise unknown("--conventions", conventions, ("ensdiag", "torch-uncertainty"))
    for run_dir in run_dirs or ():
        check_run_folder(run_dir)
    if examples is not None:  # refused now, not after the whole report
        table_writer(examples, "--examples ")
        output_file(examples, None, "--examples")
    own_threads(threads)  # (set once torch loads: a report read back needs none)
    from ..report import make_report, render, to_rich

    if detail and (not figures or len(run_dirs or ()) > 1):
        note("--detail draws figures into a run folder: with --no-figures or several folders nothing is drawn")
    extension = REPORT_FORMATS[fmt]
    target = None if out is None else output_file(out, f"report.{extension}")
    with loading("building the report (verdict bootstrap, figures) …"):
        result = make_report(list(run_dirs or []) or None, reference, write=figures, conventions=conventions, svg=svg,
                             ood_score=ood_score, detail=detail)
    # --examples: every finished run's example_rows, each led by its method and seed (the stored splits:
    # per-corruption shift splits, not their pool)
    if examples is not None:
        from ..predictions import load_predictions
        from ..report.merge import load_folders
        rows = []
        for method, seeds in load_folders(list(run_dirs) if run_dirs else [Path(result["run"])])["runs"].items():
            for seed, run in seeds.items():
                if run is not None and (run["folder"] / "predictions.safetensors").is_file():  # (LoRA: weights only)
                    predictions = load_predictions(run["folder"] / "predictions.safetensors")[0]
                    rows += [{"method": method, "seed": seed, **row} for row in example_rows(predictions)]
        write_table(rows, examples, EXAMPLE_FIELDS)
        note(f"per-example predictions written to {examples}")
    written = result.pop("written")  # a note for the terminal, not part of the report
    if fmt == "table" and target is None:  # the terminal: rich tables at its width, colours and all
        console = Console()
        for table in to_rich(result, width=console.width):
            show(console, table)
    else:
        text = render({**result, "written": written}, fmt, result["run"])
        if target is None:
            sys.stdout.write(text)
        else:
            atomic_write_text(target, text)
            note(f"report written to {target}")
    if written and not (fmt == "summary" and target is None and written.startswith("report.md")):
        note(written)  # (the summary says where the report is itself)
