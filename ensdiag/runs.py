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
from .io import atomic_write_json, inner_folder, locked_folder, read_json

EXPERIMENT_FORMAT = "ensdiag.experiment/1"
MAX_RUNS = 100_000  # (method, seed) pairs of one run folder: far beyond any real grid
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
    config = data["config"]
    if len(config["methods"]) * len(config["seeds"]) > MAX_RUNS:  # a report visits every (method, seed)
        raise EnsdiagError(f"{path} lists {len(config['methods']):,} methods × {len(config['seeds']):,} seeds, more "
                           f"than the {MAX_RUNS:,} runs ensdiag reads in one folder (damaged or not ensdiag's)")
    return data


DIAGNOSIS = "diagnosis"
METHOD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", re.ASCII)  # it names a folder; no dot-files
# what the run folder itself holds beside its methods' folders (compared case-blind: macOS and
# Windows file systems are)
RESERVED = ("experiment.json", "figures", "report")


def check_run_name(method, seed):
    """A diagnosis run's method and seed, as they will name its folder `<method>/seed-<seed>`."""
    if not isinstance(method, str) or not METHOD_NAME.match(method):
        raise EnsdiagError(f"method name {str(method)[:80]!r} must be 1-64 letters, digits, '.', '_' or '-' "
                           "(it names a folder)")
    if _reserved(method):
        raise EnsdiagError(f"method name {method!r} is a name the run folder itself uses (experiment.json, "
                           "report.*, figures); choose another")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise EnsdiagError(f"seed must be an integer in 0..2³¹−1, got {str(seed)[:40]}")


def _reserved(method: str) -> bool:
    folded = method.casefold()
    return folded in RESERVED or folded.startswith("report.")


# ------------------------------------------------------------------ what a METHOD/seed-N folder holds

PREDICTIONS, LORA, TRAINING = "predictions", "lora", "training"
KINDS = {PREDICTIONS: "an analysis of predictions", LORA: "a LoRA weight-space diagnosis",
         TRAINING: "a trained model", "unknown": "a result ensdiag cannot read"}
# The kinds one run may hold side by side: a LoRA ensemble's function space (predictions) and weight space
PAIRED = frozenset({PREDICTIONS, LORA})


def saved_kinds(run) -> set[str]:
    """The kinds of result a `<method>/seed-<seed>` folder holds (empty for a new or empty one)."""
    run = Path(run)
    kinds = set()
    if any((run / name).exists() for name in ("model.safetensors", "history.jsonl", STATE_FILE)):
        kinds.add(TRAINING)
    if (run / "predictions.safetensors").exists():
        kinds.add(PREDICTIONS)
    if (run / "metrics.json").exists():
        try:
            metrics = read_json(run / "metrics.json", "metrics file")
        except EnsdiagError:
            metrics = None
        if not isinstance(metrics, dict):
            kinds.add("unknown")
        else:
            kinds |= {PREDICTIONS} if metrics.get("analyzers") else set()
            kinds |= {LORA} if isinstance(metrics.get("lora"), dict) else set()
    return kinds


def claim_run(folder, method: str, seed: int, kind: str, overwrite: bool = False, create: bool = True) -> Path:
    """`folder/<method>/seed-<seed>/`, made ready to save a result of `kind` into: every folder on
    the way a real folder inside `folder` (`io.inner_folder`); a folder holding a training run
    refused; a result of the same kind already there refused unless `overwrite`; and no mixing of
    kinds beyond `PAIRED`. Call it before writing anything, with the kind the save writes (and,
    with `create=False`, before computing what to save: it then only checks)."""
    check_run_name(method, seed)
    folder = Path(folder)
    if (folder / "experiment.json").exists() and read_experiment(folder).get("kind") != DIAGNOSIS:
        raise EnsdiagError(f"{folder} holds a training run; save diagnoses into a folder of their own")
    run = inner_folder(folder, method, f"seed-{seed}", what="result", create=create)
    held = saved_kinds(run) - ({"unknown"} if overwrite else set())
    found = kind if kind in held else "unknown" if "unknown" in held else None
    if found is not None and not overwrite:
        raise EnsdiagError(f"{run} already holds {KINDS[found]}; pass --overwrite (overwrite=True from Python) to "
                           "replace it, or save under another --method or --seed")
    mixed = sorted(held - {kind})
    if mixed and {kind, *mixed} - PAIRED:
        raise EnsdiagError(f"{run} holds {KINDS[mixed[0]]}; a run never mixes it with {KINDS[kind]}: save under "
                           "another --method or --seed")
    return run


def combined(run, kind: str, metrics: dict, meta: dict) -> tuple[dict, dict]:
    """(metrics, meta) to write for a result of `kind` into `run`, keeping the part of the paired
    kind already saved there: a LoRA diagnosis is the `lora` section of metrics.json, an analysis
    of predictions everything else."""
    run = Path(run)
    if kind not in PAIRED or not (PAIRED - {kind}) & saved_kinds(run):
        return metrics, meta
    old_metrics, old_meta = (_readable(run / name) for name in ("metrics.json", "meta.json"))
    if kind == LORA:  # the analysis keeps its analyzers, splits and titles; the section is added
        return {**old_metrics, "lora": metrics["lora"]}, {**meta, **old_meta, "lora_source": meta.get("source")}
    lora_source = old_meta.get("lora_source", old_meta.get("source"))
    kept = {"lora": old_metrics["lora"]} if isinstance(old_metrics.get("lora"), dict) else {}
    return {**metrics, **kept}, {**old_meta, **meta, "lora_source": lora_source}


def _readable(path) -> dict:
    """A JSON object file of a run, or {} where it is missing or damaged (a save replaces it)."""
    try:
        data = read_json(path, "file")
    except EnsdiagError:
        return {}
    return data if isinstance(data, dict) else {}


def _check_diagnosis_config(path, config):
    if not isinstance(config, dict) or config.get("preset") != "custom" or not isinstance(config.get("methods"), list) \
            or not isinstance(config.get("seeds"), list):
        raise EnsdiagError(f"{path}: a diagnosis folder's config must hold preset 'custom', methods and seeds")
    if not all(isinstance(m, str) and METHOD_NAME.match(m) and not _reserved(m) for m in config["methods"]) \
            or len(set(config["methods"])) != len(config["methods"]):
        raise EnsdiagError(f"{path}: methods must be distinct names of letters, digits, '.', '_' or '-', none of "
                           "them a name the folder itself uses (experiment.json, report.*, figures)")
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


def save_result(folder, method: str, seed: int, kind: str, metrics: dict, meta: dict, titles: dict | None = None,
                predictions: dict | None = None, overwrite: bool = False) -> Path:
    """Save one diagnosis as `folder/<method>/seed-<seed>/` of a diagnosis folder, under the folder's
    lock: checked by `claim_run` before anything is written, listed in experiment.json, the paired
    kind's part kept (`combined`), meta.json written last (it marks the run finished; an overwrite
    removes the old one first, so a save cut short never looks finished)."""
    check_run_name(method, seed)  # before anything is created
    root = inner_folder(folder)
    with locked_folder(root, "run folder"):
        run = claim_run(root, method, seed, kind, overwrite)
        add_diagnosis(root, method, seed, titles or {})
        metrics, meta = combined(run, kind, metrics, meta)
        (run / "meta.json").unlink(missing_ok=True)
        if predictions is not None:
            from .predictions import save_predictions
            save_predictions(predictions, run / "predictions.safetensors", {"ensdiag.splits": titles or {}})
        atomic_write_json(run / "metrics.json", metrics)
        atomic_write_json(run / "meta.json", meta)
    return run
