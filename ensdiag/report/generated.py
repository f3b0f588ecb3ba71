"""The terminal's tables of generated answers (stats/generated.py): one row per split, each
number with its interval, and lm-eval's group aggregates when the task is a group."""

from ..stats.generated import COLUMNS
from ..text import counted
from .groups import group_table
from .terminal import cell, titled


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

