"""Rich renderings for the terminal: heatmap tables and metric summaries (stderr/stdout chosen by the caller)."""

from rich.table import Table
from rich.text import Text


def _cell(value: float, low: float, high: float) -> Text:
    """The value on a background from dark (low) to bright (high) blue."""
    t = 0.0 if high <= low else min(max((value - low) / (high - low), 0.0), 1.0)
    r, g, b = int(20 + 40 * t), int(30 + 120 * t), int(60 + 195 * t)
    return Text(f" {value:.3f} ", style=f"{'black' if t > 0.6 else 'white'} on rgb({r},{g},{b})")


def heatmap_table(matrix, title: str, low: float = 0.0, high: float = 1.0) -> Table:
    table = Table(title=title, show_header=True, header_style="bold", box=None, padding=(0, 0))
    table.add_column("")
    for j in range(len(matrix)):
        table.add_column(f"m{j}", justify="center")
    for i, row in enumerate(matrix):
        table.add_row(f"m{i} ", *[_cell(float(v), low, high) for v in row])
    return table


def _value(entry):
    return None if entry is None else entry.get("value")


def _fmt(value, digits=3):
    return "N/A" if value is None else f"{value:.{digits}f}"


def metrics_table(metrics: dict, title: str = "Metrics") -> Table:
    """One row per split: Acc, NLL, ECE, Brier, H, JSD, disagreement; and OOD rows."""
    analyzers = metrics["analyzers"]
    calib = analyzers.get("calibration", {}).get("splits", {})
    unc = analyzers.get("uncertainty", {}).get("splits", {})
    dis = analyzers.get("disagreement", {}).get("splits", {})
    table = Table(title=title)
    for column in ("split", "n", "Acc ↑", "NLL ↓", "ECE ↓", "Brier ↓", "H", "JSD", "disagreement"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for split, info in metrics["splits"].items():
        c, u, d = calib.get(split, {}), unc.get(split, {}), dis.get(split, {})
        table.add_row(split, str(info["n"]), _fmt(_value(c.get("accuracy"))), _fmt(_value(c.get("nll"))),
                      _fmt(_value(c.get("ece"))), _fmt(_value(c.get("brier"))), _fmt(_value(u.get("entropy"))),
                      _fmt(_value(u.get("jsd"))), _fmt(_value(d.get("mean"))))
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
        table.add_row(entry["score"], *[_fmt(entry[key]["value"]) for key in keys])
    return table


def skipped_lines(metrics: dict) -> list[str]:
    return [f"{name}: skipped — {result['reason']}" for name, result in metrics["analyzers"].items()
            if result.get("status") == "skipped"]
