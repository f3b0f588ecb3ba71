"""Reading a run folder: its layout, its experiment.json (validated like user input).

    runs/<preset>-<timestamp>/
      experiment.json                 preset, methods, seeds, overrides, skipped splits
      <method>/seed-<seed>/
        model.safetensors  predictions.safetensors  metrics.json  history.jsonl  meta.json
        diversity.jsonl               (with --track-diversity: per-epoch diversity, epoch 0 = initialisation)
        training-state.pt             (only while the run is unfinished: the resume point)

Training (experiment.py) writes these; reports read them through this module alone, so a
report is rebuilt without importing any training code.
"""

from datetime import datetime
from pathlib import Path

from .config import TrainConfig
from .errors import EnsdiagError
from .io import read_json

EXPERIMENT_FORMAT = "ensdiag.experiment/1"
STATE_FILE = "training-state.pt"
RUN_FILES = ("experiment.json", "report.md", "report.html", "model.safetensors", "predictions.safetensors",
             "metrics.json", "history.jsonl", "diversity.jsonl", "meta.json", STATE_FILE, "diversity.png", "diversity.svg",
             "reliability.png", "reliability.svg", "ood-scores.png", "ood-scores.svg", "training.png", "training.svg",
             "risk-coverage.png", "risk-coverage.svg", *(f"{name}.{ext}" for name in (
                 "cka-layers", "cka-heatmaps", "alignment", "paths", "tracking") for ext in ("png", "svg")))


def default_run_dir(preset: str, root="runs") -> Path:
    return Path(root) / f"{preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def read_experiment(run_dir) -> dict:
    """The run folder's experiment.json, checked like user input (its config validated)."""
    path = Path(run_dir) / "experiment.json"
    if not path.is_file():
        raise EnsdiagError(f"{run_dir} is not an ensdiag run (no experiment.json)")
    data = read_json(path, "experiment file")
    if not isinstance(data, dict) or data.get("format") != EXPERIMENT_FORMAT:
        raise EnsdiagError(f"{path} is not an {EXPERIMENT_FORMAT} file (damaged or not ensdiag's); "
                           "restore it or train into a new --out")
    for key in ("splits", "skipped"):
        if not isinstance(data.get(key, {}), dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in data.get(key, {}).items()):
            raise EnsdiagError(f"{path}: '{key}' must map split names to strings")
    TrainConfig.from_dict(data.get("config"), source=str(path))
    return data
