"""lm-eval's tables on the terminal: the generated answers (stats/generated.py), one row per split, each
number with its interval; and a benchmark group's table: each group (lm-eval's aggregate of its leaf
subtasks, weighted as lm-eval weighted them) and each subtask, every number with its interval (the
questions resampled within each subtask; foreign/lm_eval_groups.py computes them)."""

from rich.table import Table
from rich.text import Text

from ..stats.generated import COLUMNS
from ..text import counted
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


def generated_tables(metrics: dict, title: str) -> list:
    """The splits' table and, for a group, lm-eval's aggregates (rich tables)."""
    table = titled(f"{title}: the generated answers of {counted(metrics['num_members'], 'member')}",
                   ("split", "n", *(label for label, _ in COLUMNS), "members' Acc (lm-eval's exact_match)"))
    for name, found in metrics["generated"].items():
        members = ", ".join(cell(value) for value in found["member_accuracy"]["value"] or [])
        table.add_row(name, f"{found['n']:,}", *(cell(found[key], interval=True) for _, key in COLUMNS), members)
    tables = [table]
    groups = metrics.get("lm_eval", {}).get("groups")
    if groups:
        tables.append(group_table(groups, COLUMNS))
    return tables
