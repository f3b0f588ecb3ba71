"""`Diagnosis`: what the inspection core found (core/inspection.py), the one result every path returns.

    diagnosis.metrics                  # metrics.json's layout: {"analyzers": {name: result}, "splits", …}
    diagnosis.save("runs/mine", method="deep-ensemble", seed=0)   # then: ensdiag report runs/mine

It is data: the core writes it to files (`save`, `write_files`, `to_json`) and nothing else.
Renderers, exports and loggers read it (report/, export.py, integrations/); the `Diagnosis` that
`ensdiag.diagnose()` returns adds them as methods from above (results.py).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnsdiagError, InputTypeError, path_argument, public
from ..io import atomic_write_json
from ..layout import finite
from ..predictions import save_predictions
from ..runs import PREDICTIONS, claim_files, save_result
from ..text import terminal  # split names may come from files: a REPL prints a Diagnosis as it is


@dataclass
class Diagnosis:
    """`metrics` (the metrics.json layout), `predictions` ({split: {"logits", "labels"}}), the
    split titles, and `cost` ({"parameters", "train_seconds"} where known: the report's cost table)."""

    metrics: dict
    predictions: dict
    titles: dict = field(default_factory=dict)
    source: str = "ensdiag.diagnose"  # what made it, recorded in the saved run's meta.json
    cost: dict = field(default_factory=dict)

    @public
    def save(self, folder, method: str = "ensemble", seed: int = 0, overwrite: bool = False) -> Path:
        """Write this diagnosis as `folder/<method>/seed-<seed>/` (metrics.json, predictions, meta.json)
        and list it in `folder/experiment.json`, so `ensdiag report folder` reads it beside others. An
        analysis already saved there is replaced only with `overwrite=True`; a LoRA weight-space part of
        the same run (lora.json) stays beside it (runs.save_result)."""
        return save_result(path_argument(folder, "folder"), method, seed, PREDICTIONS, self.metrics, {
            "run": method, "method": method, "seed": seed, "splits": self.titles, "source": self.source,
            **checked_cost(self.cost)}, self.titles, self.predictions or None, overwrite)

    @public
    def write_files(self, folder, spec=None, overwrite: bool = False) -> Path:
        """predictions.safetensors and metrics.json into `folder` (`ensdiag evaluate --out`); the pooled
        shift split is left out (it is rebuilt on load). Never into a run folder's root or beside a
        training run; files an earlier call wrote there are replaced only with `overwrite` (runs.claim_files)."""
        folder = path_argument(folder, "folder")
        if folder.exists() and not folder.is_dir():
            raise EnsdiagError(f"{folder} is a file, not a folder")
        folder = claim_files(folder, ("predictions.safetensors", "metrics.json"), overwrite, "folder")
        pooled = "shift" in self.predictions and any(name.startswith("shift/") for name in self.predictions)
        metadata = {"ensdiag.splits": self.titles, **({"ensdiag.spec": spec.to_json()} if spec is not None else {})}
        save_predictions({name: split for name, split in self.predictions.items() if not (pooled and name == "shift")},
                         folder / "predictions.safetensors", metadata)
        atomic_write_json(folder / "metrics.json", self.metrics)
        return folder

    def to_json(self) -> str:
        return json.dumps(finite(self.metrics), indent=2, allow_nan=False) + "\n"

    def __repr__(self) -> str:
        splits = ", ".join(f"{name} n={split['logits'].shape[1]}" for name, split in self.predictions.items())
        k = self.metrics.get("num_members", self.metrics.get("ensemble", {}).get("num_members"))
        interrupted = "; interrupted: the rest was not measured" if self.metrics.get("interrupted") else ""
        return terminal(f"Diagnosis(k={k}, {splits}, analyzers: {', '.join(self.metrics['analyzers'])}{interrupted})")


def checked_cost(cost: dict) -> dict:
    """{"parameters": int, "train_seconds": float} as given (either may be absent), checked."""
    if not isinstance(cost, dict):
        raise InputTypeError(f"cost must be a dict {{'parameters': …, 'train_seconds': …}}, got {type(cost).__name__}")
    unknown = sorted(set(cost) - {"parameters", "train_seconds"})
    if unknown:
        raise EnsdiagError(f"cost takes parameters and train_seconds, not {', '.join(map(repr, unknown))}")
    parameters, seconds = cost.get("parameters"), cost.get("train_seconds")
    if parameters is not None and (not isinstance(parameters, int) or isinstance(parameters, bool) or parameters < 0):
        raise EnsdiagError(f"cost['parameters'] must be a whole number ≥ 0, got {parameters!r}")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not 0 <= seconds < float("inf")):
        raise EnsdiagError(f"cost['train_seconds'] must be a finite number of seconds ≥ 0, got {seconds!r}")
    return {key: value for key, value in (("parameters", parameters), ("train_seconds", seconds)) if value is not None}
