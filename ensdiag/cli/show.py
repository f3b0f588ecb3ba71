"""How the commands that inspect one ensemble print their result: JSON (the metrics layout, as
metrics.json holds it) or tables on stdout, with notes on stderr. Tables are built from the
metrics with every string passed through the terminal sink first (text.terminal_safe): split
names, titles, filters and reasons may come from files."""

import typer
from rich.console import Console

from ..console import EXIT_INTERRUPTED, literal, note, print_json, show
from ..text import terminal, terminal_safe


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
