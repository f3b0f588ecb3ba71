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

import re
from datetime import datetime
from pathlib import Path

from . import __version__
from .config import TrainConfig
from .errors import EnsdiagError
from .io import atomic_write_json, read_json

EXPERIMENT_FORMAT = "ensdiag.experiment/1"
STATE_FILE = "training-state.pt"
RUN_FILES = ("experiment.json", "report.md", "report.html", "model.safetensors", "predictions.safetensors",
             "metrics.json", "history.jsonl", "diversity.jsonl", "meta.json", STATE_FILE, "diversity.png", "diversity.svg",
             "reliability.png", "reliability.svg", "ood-scores.png", "ood-scores.svg", "training.png", "training.svg",
             "risk-coverage.png", "risk-coverage.svg", *(f"{name}.{ext}" for name in (
                 "cka-layers", "cka-heatmaps", "alignment", "paths", "tracking") for ext in ("png", "svg")))


def default_run_dir(preset: str, root="runs") -> Path:
    return Path(root) / f"{preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def check_run_folder(run_dir) -> Path:
    """The run folder's experiment.json path, or a one-line error saying what `run_dir` is instead
    (torch-free: the report command checks its argument with it before importing anything heavy)."""
    path = Path(run_dir) / "experiment.json"
    if Path(run_dir).is_file():
        hint = ("; for a model file use `ensdiag evaluate` or `ensdiag diversity`, for predictions `ensdiag analyze`"
                if Path(run_dir).suffix in (".safetensors", ".pt", ".ckpt", ".npz", ".npy") else "")
        raise EnsdiagError(f"{run_dir} is a file, not a run folder{hint}")
    if not path.is_file():
        raise EnsdiagError(f"{run_dir} is not an ensdiag run (no experiment.json)")
    return path


def read_experiment(run_dir) -> dict:
    """The run folder's experiment.json, checked like user input (its config validated). A
    folder of `ensdiag.diagnose` results (`"kind": "diagnosis"`) has no training config, only
    the names of its methods and seeds."""
    path = check_run_folder(run_dir)
    data = read_json(path, "experiment file")
    if not isinstance(data, dict) or data.get("format") != EXPERIMENT_FORMAT:
        raise EnsdiagError(f"{path} is not an {EXPERIMENT_FORMAT} file (damaged or not ensdiag's); "
                           "restore it or train into a new --out")
    for key in ("splits", "skipped"):
        if not isinstance(data.get(key, {}), dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in data.get(key, {}).items()):
            raise EnsdiagError(f"{path}: '{key}' must map split names to strings")
    if data.get("kind") == DIAGNOSIS:
        _check_diagnosis_config(path, data.get("config"))
    else:
        TrainConfig.from_dict(data.get("config"), source=str(path))
    return data


DIAGNOSIS = "diagnosis"
METHOD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # it names a folder


def check_run_name(method, seed):
    """A diagnosis run's method and seed, as they will name its folder `<method>/seed-<seed>`."""
    if not isinstance(method, str) or not METHOD_NAME.match(method):
        raise EnsdiagError(f"method name {method!r} must be 1-64 letters, digits, '.', '_' or '-' (it names a folder)")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise EnsdiagError(f"seed must be an integer in 0..2³¹−1, got {seed!r}")


def _check_diagnosis_config(path, config):
    if not isinstance(config, dict) or config.get("preset") != "custom" or not isinstance(config.get("methods"), list) \
            or not isinstance(config.get("seeds"), list):
        raise EnsdiagError(f"{path}: a diagnosis folder's config must hold preset 'custom', methods and seeds")
    if not all(isinstance(m, str) and METHOD_NAME.match(m) for m in config["methods"]) \
            or len(set(config["methods"])) != len(config["methods"]):
        raise EnsdiagError(f"{path}: methods must be distinct names of letters, digits, '.', '_' or '-'")
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in config["seeds"]) \
            or len(set(config["seeds"])) != len(config["seeds"]):
        raise EnsdiagError(f"{path}: seeds must be distinct integers in 0..2³¹−1")


def add_diagnosis(folder, method: str, seed: int, titles: dict) -> dict:
    """Create or extend a diagnosis folder's experiment.json with (method, seed); a folder that
    holds a training run is refused (its config names what was trained)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise EnsdiagError(f"{folder} exists and is not a directory")
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "experiment.json").exists():
        data = read_experiment(folder)
        if data.get("kind") != DIAGNOSIS:
            raise EnsdiagError(f"{folder} holds a training run; save diagnoses into a folder of their own")
    else:
        data = {"format": EXPERIMENT_FORMAT, "kind": DIAGNOSIS, "ensdiag_version": __version__,
                "created": datetime.now().isoformat(timespec="seconds"),
                "config": {"preset": "custom", "methods": [], "seeds": []}, "splits": {}, "skipped": {}}
    config = data["config"]
    config["methods"] += [method] if method not in config["methods"] else []
    config["seeds"] += [seed] if seed not in config["seeds"] else []
    data["splits"].update(titles)
    # a report leaves out the tables of a split that no run saved here has, as it does for a training run's
    data["skipped"] = {split: "no run saved here has this split" for split in ("shift", "ood") if split not in data["splits"]}
    atomic_write_json(folder / "experiment.json", data)
    return data
