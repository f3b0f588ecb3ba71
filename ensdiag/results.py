"""The `Diagnosis` of the public API: the core's data (core/diagnosis.py) with every way to show it.

    diagnosis = ensdiag.diagnose([net_a, net_b], test=(x, y))
    diagnosis.to_markdown()            # the report of one run (report/)
    diagnosis.flat(); diagnosis.to_frame(); diagnosis.save_examples("e.csv")   # export.py
    diagnosis.log_to(writer)           # TensorBoard, MLflow, W&B, Lightning loggers (integrations/)
    diagnosis                          # a notebook shows a compact summary (report/notebook.py)

The core only ever returns data; the renderers, exports and loggers read it, and this module is the
one place that joins them, above all of them (scikit-learn's Display objects are the model).
"""

import functools
import tempfile
from dataclasses import fields
from pathlib import Path

from .core import diagnose as core_diagnose
from .core.diagnosis import Diagnosis as Found
from .errors import EnsdiagError, path_argument, public
from .export import EXAMPLE_FIELDS, example_rows, flat_metrics, frame, metric_entries, write_table
from .integrations import log_to as log_to_target
from .report import make_report, render
from .report.notebook import diagnosis_html


class Diagnosis(Found):
    """What `ensdiag.diagnose()` returns: `metrics`, `predictions`, `titles`, `cost` (core/diagnosis.py),
    `save`, `write_files`, `to_json`, and the ways to show, export and log it below."""

    @classmethod
    def of(cls, found: Found) -> "Diagnosis":
        """The same diagnosis, with its methods (the core's own result is data only)."""
        return found if isinstance(found, cls) else cls(**{field.name: getattr(found, field.name) for field in fields(found)})

    @public
    def to_markdown(self) -> str:
        with tempfile.TemporaryDirectory() as scratch:
            self.save(scratch, "ensemble", 0)
            report = make_report(scratch, write=False)
            report["run"] = "ensdiag.diagnose"
            return render(report, "markdown", scratch)

    def _repr_html_(self) -> str:  # Jupyter: a compact summary scoped to its own element (report/notebook.py)
        return diagnosis_html(self.metrics)

    def flat(self, full: bool = False) -> dict:
        """{name: value} of every headline number, the same names for every k; NaN where not measured,
        with the reason in `.reasons` (export.py); `full`: every other stored scalar too."""
        return flat_metrics(self.metrics, full)

    @public
    def to_frame(self, what: str = "metrics", full: bool = False):
        """A pandas DataFrame: "metrics" (one row per number: name, value, reason, definition) or
        "examples" (one row per example: prediction, confidence, entropy, JSD, member agreement)."""
        if what == "examples":
            return frame(example_rows(self.predictions), EXAMPLE_FIELDS[2:])
        if what != "metrics":
            raise EnsdiagError(f"to_frame(what=...) takes 'metrics' or 'examples', not {what!r}")
        return frame([{key: value for key, value in entry.items() if key != "tables"}
                      for entry in metric_entries(self.metrics, full)])

    @public
    def save_examples(self, path) -> Path:
        """Per-example predictions and uncertainty as a .csv or .parquet file (pyarrow) at `path`."""
        return write_table(example_rows(self.predictions), path_argument(path), EXAMPLE_FIELDS[2:])

    @public
    def log_to(self, target, step: int | None = None, prefix: str = "ensdiag") -> None:
        """Log every headline number, the heatmaps and the summary to TensorBoard (a SummaryWriter),
        MLflow (mlflow, a run), W&B (wandb, a run) or a Lightning logger (integrations/)."""
        log_to_target(self, target, step, prefix)


@functools.wraps(core_diagnose)
def diagnose(*args, **kwargs) -> Diagnosis:
    return Diagnosis.of(core_diagnose(*args, **kwargs))
