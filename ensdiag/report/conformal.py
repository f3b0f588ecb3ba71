"""The conformal analyzer's result on the terminal: coverage and set size of LAC and APS sets at
α = 0.1 on the held-out questions, overall and per subtask, and what the split and the guarantee
are (analysis/conformal.py computes them)."""

from rich.table import Table
from rich.text import Text

from .terminal import cell


def conformal_table(result: dict) -> Table:
    alpha, split = result["alpha"], result["split"]
    table = Table(title=Text(f"Conformal prediction sets from p̄ (α = {alpha}: coverage ≥ {1 - alpha:g} guaranteed "
                             f"marginally; calibrated on {split['n_calibration']:,} questions, measured on "
                             f"{split['n_test']:,})"))
    for label in ("questions", "n", "LAC coverage", "LAC set size ↓", "APS coverage", "APS set size ↓"):
        table.add_column(label, justify="left" if label == "questions" else "right")
    lac, aps = result["scores"]["lac"], result["scores"]["aps"]
    table.add_row("all test questions", f"{lac['n']:,}", cell(lac["coverage"], interval=True),
                  cell(lac["set_size"], interval=True), cell(aps["coverage"], interval=True),
                  cell(aps["set_size"], interval=True))
    for name, entry in lac.get("per_subtask", {}).items():
        other = aps["per_subtask"][name]
        table.add_row(Text(f"  {name}"), f"{entry['n']:,}", cell(entry["coverage"]), cell(entry["set_size"]),
                      cell(other["coverage"]), cell(other["set_size"]))
    return table


def conformal_notes(result: dict) -> list[str]:
    split = result["split"]
    return [f"conformal: calibration {split['calibration']}, test {split['test']}; {result['guarantee']}"]
