"""Rich renderings for the terminal: heatmap tables and metric summaries (stderr/stdout chosen by the caller)."""

import math

from rich.table import Table
from rich.text import Text

from .render import non_finite_word


def _cell(value, low: float, high: float) -> Text:
    """The value on a background from dark (low) to bright (high) blue; N/A, nan or ±inf on grey."""
    if value is None or not math.isfinite(value := float(value)):
        return Text(f" {_fmt(value):^5} ", style="white on rgb(90,90,90)")
    t = 0.0 if high <= low else min(max((value - low) / (high - low), 0.0), 1.0)
    r, g, b = int(20 + 40 * t), int(30 + 120 * t), int(60 + 195 * t)
    return Text(f" {value:.3f} ", style=f"{'black' if t > 0.6 else 'white'} on rgb({r},{g},{b})")


def heatmap_table(matrix, title: str, low: float = 0.0, high: float = 1.0, missing: str = "matrix not stored") -> Table:
    """The k×k matrix as coloured cells; a matrix that is None (not stored, empty split) as one line saying so."""
    if matrix is None:
        table = Table(title=Text(title), show_header=False, box=None)
        table.add_column("")
        table.add_row(missing)
        return table
    table = Table(title=Text(title), show_header=True, header_style="bold", box=None, padding=(0, 0))
    table.add_column("")
    for j in range(len(matrix)):
        table.add_column(f"m{j}", justify="center")
    for i, row in enumerate(matrix):
        table.add_row(f"m{i} ", *[_cell(v, low, high) for v in row])
    return table


def _fmt(value, digits=3):
    """A table cell: "N/A" for a missing value, "nan", "inf" or "-inf" for a non-finite number.

    A metric dict (value, definition, status) whose value is None shows its status word when
    that says why ("nan", "inf", "-inf", "empty", "omitted", …); "ok" and "n/a" show the value."""
    if isinstance(value, dict):
        status = value.get("status")
        if value.get("value") is None and isinstance(status, str) and status not in ("ok", "n/a"):
            return status
        value = value.get("value")
    if value is None:
        return "N/A"
    if isinstance(value, str):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return non_finite_word(number) or f"{number:.{digits}f}"


def metrics_table(metrics: dict, title: str = "Metrics") -> Table:
    """One row per split: Acc, NLL, ECE, Brier, H, JSD, disagreement; and OOD rows."""
    analyzers = metrics["analyzers"]
    calib = analyzers.get("calibration", {}).get("splits", {})
    unc = analyzers.get("uncertainty", {}).get("splits", {})
    dis = analyzers.get("disagreement", {}).get("splits", {})
    table = Table(title=Text(title))  # user-controlled strings (paths, split names) are never markup
    for column in ("split", "n", "Acc ↑", "NLL ↓", "ECE ↓", "Brier ↓", "H", "JSD", "disagreement"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for split, info in metrics["splits"].items():
        c, u, d = calib.get(split, {}), unc.get(split, {}), dis.get(split, {})
        table.add_row(Text(split), str(info["n"]), _fmt(c.get("accuracy")), _fmt(c.get("nll")), _fmt(c.get("ece")),
                      _fmt(c.get("brier")), _fmt(u.get("entropy")), _fmt(u.get("jsd")), _fmt(d.get("mean")))
    return table


def ood_table(metrics: dict) -> Table | None:
    ood = metrics["analyzers"].get("ood", {})
    if ood.get("status") != "ok":
        return None
    table = Table(title=f"OOD detection (ood vs id, {ood['n_ood']} vs {ood['n_id']}; OOD positive)")
    for column in ("score", "AUROC ↑", "AUPR-Out ↑", "AUPR-In ↑", "FPR95 OOD→ID ↓", "FPR95 ID→OOD ↓"):
        table.add_column(column, justify="left" if column == "score" else "right")
    keys = ("auroc", "aupr_out", "aupr_in", "fpr95_ood_as_id", "fpr95_id_as_ood")
    for name, entry in ood["scores"].items():
        table.add_row(Text(str(entry["score"])), *[_fmt(entry.get(key)) for key in keys])
    return table


def skipped_lines(metrics: dict) -> list[str]:
    """One line per analyzer that did not run: skipped (inputs missing) or failed (a broken plug-in)."""
    return [f"{name}: {result['status']} — {result['reason']}" for name, result in metrics["analyzers"].items()
            if result.get("status") in ("skipped", "failed")]
