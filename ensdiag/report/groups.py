"""A benchmark group's table on the terminal: each group (lm-eval's aggregate of its leaf
subtasks, weighted as lm-eval weighted them) and each subtask, every number with its interval
(the questions resampled within each subtask; foreign/lm_eval_groups.py computes them)."""

from rich.table import Table
from rich.text import Text

from .terminal import cell, titled

CHOICE_COLUMNS = (("Acc ↑", "accuracy"), ("NLL ↓", "nll"), ("Brier ↓", "brier"), ("JSD", "jsd"),
                  ("disagreement", "disagreement"))


def group_table(section: dict, columns=CHOICE_COLUMNS) -> Table:
    """Rows: every group (its weighting beside it), then every subtask; the members' own accuracy
    last (a group's equals lm-eval's group number for each member)."""
    table = titled(Text(f"lm-eval groups: each group's number aggregated as lm-eval aggregates its "
                        f"{section.get('metric', 'metric')}"),
                   ("group / subtask", "n", "weighting", *(label for label, _ in columns), "members' Acc"), left=(0, 2))
    rows = [(name, entry, "by size" if entry["by_size"] else "equal") for name, entry in section["groups"].items()]
    rows += [(f"  {name}", entry, "") for name, entry in section["subtasks"].items()]
    for name, entry, weighting in rows:
        members = entry.get("member_accuracy", {}).get("value") or []
        table.add_row(Text(name), f"{entry['n']:,}", weighting, *(cell(entry.get(key), interval=True) for _, key in columns),
                      ", ".join(cell(value) for value in members))
    return table


def group_notes(section: dict) -> list[str]:
    """One line per group: how its weighting was found."""
    return [f"group {name}: {entry['why']}" for name, entry in section["groups"].items()]
