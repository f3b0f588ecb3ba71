"""How the commands that inspect one ensemble print their result: JSON (the metrics layout, as
metrics.json holds it) or tables on stdout, with notes on stderr."""

from rich.console import Console

from ..console import literal, note, print_json, show


def show_metrics(metrics: dict, fmt: str, title: str):
    if fmt == "json":
        print_json(metrics)
        return
    from ..report.inspection import metrics_view
    tables, notes = metrics_view(metrics, title)
    console = Console()
    for table in tables:
        show(console, table)
    for line in notes:
        note(line)


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
        import typer

        from ..console import EXIT_INTERRUPTED
        note(metrics["interrupted"])
        raise typer.Exit(EXIT_INTERRUPTED)
