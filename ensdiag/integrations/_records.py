"""What the loggers receive, library-agnostic: scalars, images, texts and JSON documents.

    records = diagnosis_records(diagnosis.metrics)          # one diagnosis
    records = report_records(make_report("runs/demo"))      # a run folder: tables, the verdict, figures

Each logger integration (tensorboard.py, mlflow.py, wandb.py, lightning.py) writes these with
its own library's calls; none of them decides what is logged. Names are "/"-joined paths under
a prefix (default "ensdiag"): the headline numbers by their flat names (export.py), e.g.
`ensdiag/calibration/id/accuracy`; a report's cells as `ensdiag/<method>/<number>` and its
verdict as `ensdiag/verdict/<method>/<nll|ece|auroc|diversity>`. Only measured, finite numbers
are logged; the text `<prefix>/not_measured` says which were not, and why.
"""

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnsdiagError, InputTypeError
from ..export import metric_entries, report_rows
from ..layout import finite
from ..report.notebook import figure_rgb, heatmaps, summary_line
from ..report.verdict_text import QUESTIONS
from ..text import terminal


@dataclass
class Records:
    scalars: dict = field(default_factory=dict)    # name -> float
    images: dict = field(default_factory=dict)     # name -> RGB uint8 array [H, W, 3]
    texts: dict = field(default_factory=dict)      # name -> str
    documents: dict = field(default_factory=dict)  # file name -> JSON-able dict (where the tool keeps files)


def _slug(text: str) -> str:
    """A column label as a name part: letters, digits, '_', '-', '.' ("FPR95 OOD→ID" -> "FPR95_OOD_ID")."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "value"


def diagnosis_records(metrics: dict, prefix: str = "ensdiag") -> Records:
    """Every headline number, the heatmaps, the summary line, what was not measured, and metrics.json."""
    records = Records()
    missing = []
    for entry in metric_entries(metrics):
        if entry["reason"] is None and math.isfinite(entry["value"]):
            records.scalars[f"{prefix}/{entry['name']}"] = entry["value"]
        elif entry["split"] is None or entry["split"] in metrics.get("splits", {}):
            missing.append(f"{entry['name']}: {entry['reason'] or 'non-finite'}")
    figure = heatmaps(metrics)
    if figure is not None:
        records.images[f"{prefix}/heatmaps"] = figure_rgb(figure)
    records.texts[f"{prefix}/summary"] = terminal(summary_line(metrics))
    if missing:
        records.texts[f"{prefix}/not_measured"] = "\n".join(map(terminal, missing))  # reasons may name splits from files
    records.documents[f"{prefix}/metrics.json"] = finite(metrics)
    return records


def report_records(report: dict, run_dir=None, prefix: str = "ensdiag") -> Records:
    """A report's cells (mean over seeds), the verdict's shares, its answers and its figures
    (read from `run_dir`/figures when the report drew them)."""
    records = Records()
    for row in report_rows(report):  # (a cell averaged over seeds is a row per seed, each with its mean)
        if row["table"] != "verdict" and not row["reference"] and row["mean"] is not None and math.isfinite(row["mean"]):
            name = row["key"] or f"{row['table']}/{_slug(row['column'])}"
            records.scalars[f"{prefix}/{row['method']}/{name}"] = row["mean"]
    for method, entry in report.get("verdict", {}).items():
        for key, _ in QUESTIONS:
            value = entry.get(key, {}).get("value")
            if isinstance(value, (int, float)) and math.isfinite(value):
                records.scalars[f"{prefix}/verdict/{method}/{key}"] = float(value)
        if entry.get("answer"):
            records.texts[f"{prefix}/verdict/{method}"] = terminal(f"{entry['answer']}\n\n{entry.get('sentence', '')}".strip(),
                                                                   keep="\n")
    if run_dir is not None:
        from matplotlib.image import imread
        for figure in report.get("figures", []):
            path = Path(run_dir) / figure["png"]
            if path.is_file():
                records.images[f"{prefix}/figures/{figure['name']}"] = (imread(path)[..., :3] * 255).round().astype("uint8")
    return records


def checked_step(step, prefix: str = "ensdiag"):
    """`step` (None or a whole number 0..2⁶³−1, what every logger stores) and `prefix` (a name), checked."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise InputTypeError(f"step must be a whole number or None, got {type(step).__name__}")
    if step is not None and not 0 <= step < 2**63:
        raise EnsdiagError(f"step must be a whole number in 0..2⁶³−1, got {str(step)[:40]}")
    if not isinstance(prefix, str):
        raise InputTypeError(f"prefix must be a string, got {type(prefix).__name__}")
    if any(part in ("", ".", "..") for part in prefix.split("/")):  # loggers keep names as file paths too
        raise EnsdiagError(f"prefix {prefix[:80]!r} must be names joined by '/', none of them empty, '.' or '..'")
