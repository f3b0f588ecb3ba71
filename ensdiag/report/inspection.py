"""One diagnosis on the terminal and in figures: what `ensdiag evaluate`, `analyze` and
`diversity` print and draw, and lm-eval's tables: the generated answers (stats/generated.py), one row
per split, and a benchmark group's table: each group (lm-eval's aggregate of its leaf subtasks, weighted as
lm-eval weighted them) and each subtask, every number with its interval (the questions resampled within each
subtask; foreign/lm_eval_groups.py computes them). Everything reads the one metrics layout (`Diagnosis.metrics`):
{"analyzers": {name: result}, "split_titles", "skipped_splits", "ensemble"}.

    lines, notes = diversity_view(diagnosis.metrics, "model.safetensors")   # stdout, stderr
    drawn = diversity_figures(diagnosis.metrics, Path("heatmaps.png"), "model.safetensors")
"""

from rich.table import Table
from rich.text import Text

from ..analysis import all_analyzers
from ..errors import EnsdiagError
from ..stats.generated import COLUMNS
from ..text import counted
from .example_level import budget_lines
from .figures import heatmap_grid, plain, plottable, save_figure
from .geometry_figures import LINE_FIGURES, cka_rows, disagreement_panels, pair_lines, pair_rows
from .terminal import (cell, conformal_notes, conformal_tables, geometry_tables, heatmap_table, interval_lines,
                       metrics_tables, ood_tables, skipped_lines, titled)

DISAGREEMENT = ("disagreement: the fraction of examples on which two members predict different classes "
                "(0: always the same class); normalised: divided by the ensemble's error rate")
COSINE = ("weight cosine: ⟨θ_i, θ_j⟩ / (‖θ_i‖‖θ_j‖) of two members' flattened weights (1: the same "
          "direction; independent networks: near 0)")


def metrics_view(metrics: dict, title: str, width: int | None = None) -> tuple[list, list[str]]:
    """(tables for stdout, notes for stderr) of every predictions analyzer; the per-split table
    within `width` columns where one is given (a terminal's)."""
    tables = metrics_tables(metrics, title, width)
    ood, notes = ood_tables(metrics, width)
    tables += ood
    notes += skipped_lines(metrics) + interval_lines(metrics) + budget_lines(metrics)
    conformal = metrics["analyzers"].get("conformal", {})
    if conformal.get("status") == "ok":
        tables += conformal_tables(conformal, width)
        notes += conformal_notes(conformal)
    groups = metrics.get("lm_eval", {}).get("groups")
    if groups:  # a benchmark group read from lm-eval logs: its own table
        tables.append(group_table(groups))
        notes += [f"group {name}: {entry['why']}" for name, entry in groups["groups"].items()]  # how each was weighted
    notes += [f"{split}: {title}" for split, title in metrics.get("split_titles", {}).items() if title != split]
    notes += [f"{split}: not evaluated — {reason}" for split, reason in metrics.get("skipped_splits", {}).items()]
    return tables, notes


def model_results(metrics: dict) -> dict:
    """The model analyzers' results (member geometry) of a metrics dict."""
    model = {name for name, analyzer in all_analyzers().items() if analyzer.needs == "model"}
    return {name: result for name, result in metrics["analyzers"].items() if name in model}


def diversity_view(metrics: dict, name: str) -> tuple[list, list[str]]:
    """(items for stdout: strings (printed literally, `dim:` first for definitions) and tables, notes for stderr)."""
    ensemble, analyzers = metrics.get("ensemble", {}), metrics["analyzers"]
    titles = metrics.get("split_titles", {})
    arch = ensemble.get("arch", "unknown")
    items = [f"{name}: {arch}, {ensemble.get('method', 'unknown')}, k = {ensemble.get('num_members')}"]
    notes = []
    disagreement = analyzers.get("disagreement", {})
    if disagreement.get("status") == "ok":
        items.append("dim:" + DISAGREEMENT)
        for split, entry in disagreement["splits"].items():
            if "/" in split:
                continue
            extra = f", normalised {cell(entry['normalized'])}" if "normalized" in entry else ""
            items.append(f"disagreement on {split} ({titles.get(split, split)}): mean {cell(entry['mean'], interval='n')}{extra}")
            items.append(heatmap_table(entry["matrix"]["value"], ""))
    elif disagreement:
        notes.append(f"disagreement: {disagreement.get('reason')}")
    if "member-pairs" in analyzers:
        items += pair_lines(analyzers["member-pairs"])
    similarity = analyzers.get("weight-similarity", {})
    if similarity.get("status") == "ok":
        initial = similarity.get("initial", {})
        at_init = f" (at initialisation {cell(initial)}, {initial['source']})" if initial.get("value") is not None else ""
        items += [f"weight cosine, all layers: mean {cell(similarity['mean'])}{at_init}", "dim:" + COSINE,
                  heatmap_table(similarity["matrix"]["value"], "")]
    elif similarity:
        notes.append(f"weight cosine: {similarity.get('reason')}")
    geometry = model_results(metrics)
    if geometry:
        items += geometry_tables(geometry)
    notes += interval_lines(metrics) + budget_lines(metrics)
    notes += [f"{split}: not evaluated — {reason}" for split, reason in metrics.get("skipped_splits", {}).items()]
    return items, notes


def diversity_figures(metrics: dict, plot, name: str) -> list:
    """The heatmaps (disagreement per split, weight cosine raw and aligned, CKA per split) into
    `plot`, and member geometry's line figures beside it: <plot>-cka-layers, -alignment, -paths."""
    analyzers, ensemble = metrics["analyzers"], metrics.get("ensemble", {})
    method, k = ensemble.get("method", "unknown"), ensemble.get("num_members")
    panels, cosine = disagreement_panels(analyzers, ("id", "shift", "ood"), "")
    rows = ([("disagreement", panels)] if panels else []) + pair_rows(analyzers.get("member-pairs"))
    if cosine is not None:
        rows.append(("weight cosine", [("all layers", cosine, "cosine")]))
    aligned = analyzers.get("alignment", {})
    if rows and aligned.get("status") == "ok" and (matrix := plottable(aligned["aligned"]["matrix"]["value"])) is not None:
        rows[-1][1].append(("aligned to member 0", matrix, "cosine"))
    if analyzers.get("cka", {}).get("status") == "ok":
        rows += cka_rows(analyzers["cka"], "CKA")
    if not rows:
        raise EnsdiagError(f"nothing to plot for {method} with k={k}: one weight set, no data found, or matrices too "
                           "large to store (k > 256)")
    drawn = save_figure(heatmap_grid(rows, title=plain(f"{name}: {method}, k={k}")), plot)[:1]
    results, plot = model_results(metrics), drawn[0]
    for name, suffix, figure in LINE_FIGURES:
        if results.get(name, {}).get("status") == "ok":
            drawn += save_figure(figure({method: results[name]}), plot.with_name(f"{plot.stem}-{suffix}{plot.suffix}"))
    return drawn


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
