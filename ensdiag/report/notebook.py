"""A diagnosis in a notebook (`Diagnosis._repr_html_`), and what loggers show of it.

    html = diagnosis_html(diagnosis.metrics)   # one <div>, every style inline
    line = summary_line(diagnosis.metrics)      # "3 members disagree on 4.1 % of id examples; ..."
    figure = heatmaps(diagnosis.metrics)        # disagreement per split and weight cosine, or None

The HTML is one element whose styles are all inline attributes: no <style> block, no class
that a page's stylesheet could be meant for, no <html>/<body>, so nothing of it applies outside
it, whatever page it lands in. It holds the summary line, the main numbers (the report's
per-split, diversity and geometry columns, as every analyzer declares them: rows are numbers,
columns splits) and the disagreement heatmaps as an embedded PNG. Numbers that were not
measured are listed once below, with the reason.
"""

import base64
import math

from ..export import metric_entries
from ..text import html
from .figures import figure_bytes, heatmap_grid
from .geometry_figures import disagreement_panels
from .terminal import cell

MAIN_TABLES = ("id", "shift", "ood", "diversity", "geometry")  # the report's tables the summary shows
WHOLE = "members"  # the column of numbers about the whole ensemble (no split)

BOX = ("font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;line-height:1.45;color:#1f2328;"
       "background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:10px 14px;margin:4px 0;max-width:100%;"
       "box-sizing:border-box;overflow-x:auto;text-align:left")
CELL = "color:#1f2328;background:transparent;padding:2px 10px;border:0;border-bottom:1px solid #eaeef2;text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums"
HEAD = "color:#1f2328;background:transparent;padding:2px 10px;border:0;border-bottom:2px solid #8c959f;text-align:right;font-weight:600;white-space:nowrap"


def summary_line(metrics: dict) -> str:
    """One sentence from the numbers: how often the members disagree, what averaging them buys,
    how alike their weights are; for one member, that there is nothing to compare."""
    k = metrics.get("num_members")
    if k == 1:
        return "1 member: a single model; there is nothing to compare between members."
    found = {entry["name"]: entry["value"] for entry in metric_entries(metrics)}
    number = {name: value for name, value in found.items() if value is not None and math.isfinite(value)}
    parts = []
    if "disagreement/id/mean" in number:
        parts.append(f"{k} members disagree on {number['disagreement/id/mean']:.1%} of in-distribution examples")
    if "disagreement/ood/mean" in number:
        parts.append(f"on {number['disagreement/ood/mean']:.1%} of OOD examples")
    if "ensemble-gain/id/nll_gap" in number and "ensemble-gain/id/error_gibbs" in number \
            and "ensemble-gain/id/error_ensemble" in number:
        parts.append(f"averaging them lowers the NLL by {number['ensemble-gain/id/nll_gap']:.3f} nats and the error "
                     f"from {number['ensemble-gain/id/error_gibbs']:.1%} (mean member) to "
                     f"{number['ensemble-gain/id/error_ensemble']:.1%}")
    if "weight-similarity/mean" in number:
        parts.append(f"their weight cosine is {number['weight-similarity/mean']:.2f}")
    if not parts:
        return f"{k} members; no number compares them here."
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def heatmaps(metrics: dict):
    """The k×k disagreement per split and the weight cosine as one figure, or None (k = 1, not stored)."""
    panels, cosine = disagreement_panels(metrics.get("analyzers", {}))
    if cosine is not None:
        panels.append(("weight cosine", cosine, "cosine"))
    return heatmap_grid([("members", panels)]) if panels else None


def figure_rgb(figure):
    """The figure as an RGB array [H, W, 3] of uint8 (what loggers' image calls take)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _main_rows(metrics):
    """{row label: {column: (value, definition)}}, the columns in order, and [(name, reason)] not measured."""
    rows, columns, missing = {}, [], []
    for entry in metric_entries(metrics):
        if not set(entry["tables"]) & set(MAIN_TABLES) or "torch-uncertainty" in entry["label"]:
            continue
        split = entry["split"] or ("ood" if "ood" in entry["tables"] else WHOLE)  # OOD detection: ood against id
        if entry["reason"] is not None:
            if split == WHOLE or split in metrics.get("splits", {}):  # absent splits need no excuse
                missing.append((entry["label"] if split == WHOLE or entry["label"].endswith(f"({split})")
                                else f"{entry['label']} ({split})", entry["reason"]))
            continue
        label = entry["label"].removesuffix(f" ({split})")
        columns += [split] if split not in columns else []
        rows.setdefault(label, {})[split] = (entry["value"], entry["definition"])
    order = [split for split in (*metrics.get("splits", {}), WHOLE) if split in columns]
    return rows, order, missing


def diagnosis_html(metrics: dict, title: str = "ensdiag diagnosis") -> str:
    """The compact, self-scoped HTML summary of one diagnosis (see the module's docstring)."""
    def esc(value) -> str:  # every field may come from a file: HTML escaped, control characters too (text.py)
        return html(f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value))
    splits = metrics.get("splits", {})
    sizes = " · ".join(f"{esc(name)} n={esc(found.get('n', 0))}" for name, found in splits.items() if isinstance(found, dict))
    parts = [f"<div style=\"{BOX}\">",
             f"<div style=\"font-weight:600;margin:0 0 4px\">{esc(title)} · k = {esc(metrics.get('num_members'))} · "
             f"{esc(metrics.get('num_classes'))} classes · {sizes}</div>",
             f"<div style=\"margin:0 0 8px\">{esc(summary_line(metrics))}</div>"]
    rows, columns, missing = _main_rows(metrics)
    if rows:
        head = "".join(f"<th style=\"{HEAD}\">{esc(column)}</th>" for column in columns)
        parts.append(f"<table style=\"border-collapse:collapse;margin:0 0 8px;font-size:12px;width:auto;color:#1f2328\">"
                     f"<thead><tr><th style=\"{HEAD};text-align:left\"></th>{head}</tr></thead><tbody>")
        for label, cells in rows.items():
            tds = "".join(f"<td style=\"{CELL}\" title=\"{esc(cells[c][1] or '')}\">{esc(cell(cells[c][0]))}</td>"
                          if c in cells else f"<td style=\"{CELL};color:#8c959f\"></td>" for c in columns)
            parts.append(f"<tr><td style=\"{CELL};text-align:left\">{esc(label)}</td>{tds}</tr>")
        parts.append("</tbody></table>")
    figure = heatmaps(metrics)
    if figure is not None:
        data = base64.b64encode(figure_bytes(figure, "png", 100)).decode("ascii")
        parts.append(f"<img alt=\"member disagreement per split and weight cosine\" src=\"data:image/png;base64,{data}\" "
                     "style=\"display:block;max-width:100%;height:auto;margin:0 0 6px;border:0\">")
    if missing:
        grouped = {}
        for label, reason in missing:
            grouped.setdefault(reason, []).append(label)
        text = "; ".join(f"{', '.join(labels)} ({reason})" for reason, labels in grouped.items())
        parts.append(f"<div style=\"font-size:11px;color:#57606a;margin:0\">Not measured: {esc(text)}.</div>")
    parts.append("</div>")
    return "".join(parts)


__all__ = ["diagnosis_html", "figure_rgb", "heatmaps", "summary_line"]
