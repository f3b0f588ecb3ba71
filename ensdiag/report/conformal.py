"""The conformal analyzer's result on the terminal: coverage and set size of LAC and APS sets at
α = 0.1 on the held-out questions, overall and per subtask, and what the split and the guarantee
are (analysis/conformal.py computes them)."""

from rich.table import Table
from rich.text import Text

from .terminal import cell, fits, titled, within


COLUMNS = ("LAC coverage", "LAC set size ↓", "APS coverage", "APS set size ↓")


def _title(result: dict) -> Text:
    alpha, split = result["alpha"], result["split"]
    return Text(f"Conformal prediction sets from p̄ (α = {alpha}: coverage ≥ {1 - alpha:g} guaranteed marginally; "
                f"calibrated on {split['n_calibration']:,} questions, measured on {split['n_test']:,})")


def _cells(result: dict, subtask=None, interval=False) -> list[str]:
    lac, aps = result["scores"]["lac"], result["scores"]["aps"]
    if subtask is not None:
        lac, aps = lac["per_subtask"][subtask], aps["per_subtask"][subtask]
    return [cell(found[key], interval=interval) for found in (lac, aps) for key in ("coverage", "set_size")]


def conformal_table(result: dict) -> Table:
    table = titled(_title(result), ("questions", "n", *COLUMNS))
    lac = result["scores"]["lac"]
    table.add_row("all test questions", f"{lac['n']:,}", *_cells(result, interval=True))
    for name, entry in lac.get("per_subtask", {}).items():
        table.add_row(Text(f"  {name}"), f"{entry['n']:,}", *_cells(result, name))
    return table


def conformal_tables(result: dict, width: int | None = None) -> list[Table]:
    """[`conformal_table`], or where it is wider than `width`: every test question's numbers with
    their intervals one per row, then each subtask's (no intervals) held to the width."""
    table = conformal_table(result)
    if fits(table, width):
        return [table]
    lac = result["scores"]["lac"]
    overall = Table(title=_title(result))
    overall.add_column("")
    overall.add_column(f"all test questions (n = {lac['n']:,})", justify="right", overflow="fold")
    for label, value in zip(COLUMNS, _cells(result, interval=True)):
        overall.add_row(label, value)
    tables = [within(overall, width)]
    if lac.get("per_subtask"):
        subtasks = Table(title="Conformal prediction sets per subtask")
        subtasks.add_column("subtask", overflow="fold")  # a long name folds, never loses a character
        for label in ("n", *COLUMNS):
            subtasks.add_column(label, justify="right")
        for name, entry in lac["per_subtask"].items():
            subtasks.add_row(Text(name), f"{entry['n']:,}", *_cells(result, name))
        tables.append(within(subtasks, width))
    return tables


def conformal_notes(result: dict) -> list[str]:
    split = result["split"]
    return [f"conformal: calibration {split['calibration']}, test {split['test']}; {result['guarantee']}"]
