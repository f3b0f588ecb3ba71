"""Reading a run folder: its layout, its experiment.json (validated like user input).

    runs/<preset>-<timestamp>/
      experiment.json                 preset, methods, seeds, overrides, skipped splits
      <method>/seed-<seed>/
        model.safetensors  predictions.safetensors  metrics.json  history.jsonl  meta.json
        diversity.jsonl               (with --track-diversity: per-epoch diversity, epoch 0 = initialisation)
        training-state.pt             (only while the run is unfinished: the resume point)

A folder of diagnoses (`"kind": "diagnosis"`) holds in each <method>/seed-<seed>/ up to two parts,
each written by its own command and touching only its own files:
        metrics.json  predictions.safetensors  meta.json    the predictions part (`analyze --method`,
                                                            `Diagnosis.save`); meta.json last
        lora.json                                           the weight-space part of LoRA adapters
                                                            (`diversity ADAPTER_DIR… --save`)
so one adapter ensemble's function space (its lm-eval predictions) and weight space sit in one
run. ensdiag 0.6 kept the weight-space part in metrics.json (`lora` beside empty analyzers):
still read, and moved to lora.json before a predictions part is saved over it.

Training (experiment.py) writes these; reports read them through this module alone, so a
report is rebuilt without importing any training code.
"""

import re
from datetime import datetime
from pathlib import Path

from . import __version__
from .config import TrainConfig
from .errors import EnsdiagError
from .io import atomic_write_json, inner_folder, locked_folder, read_json, read_safetensors

EXPERIMENT_FORMAT = "ensdiag.experiment/1"
MAX_RUNS = 100_000  # (method, seed) pairs of one run folder: far beyond any real grid
STATE_FILE = "training-state.pt"
CACHE_FILE = "report-cache.json"  # the report kept for the next `ensdiag report` (report/cached.py)
REPORT_FILES = ("report.md", "report.html", CACHE_FILE)  # what a report writes at the folder's root, beside figures/
RUN_FILES = ("experiment.json", *REPORT_FILES, "model.safetensors", "predictions.safetensors", "metrics.json",
             "history.jsonl", "diversity.jsonl", "meta.json", "lora.json", STATE_FILE, *(f"{name}.{ext}" for name in (
                 "diversity", "reliability", "ood-scores", "training", "risk-coverage", "cka-layers", "cka-heatmaps",
                 "alignment", "paths", "tracking") for ext in ("png", "svg")))


def default_run_dir(preset: str) -> Path:
    return Path("runs") / f"{preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


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
RESERVED = ("experiment.json", "figures", "report", *REPORT_FILES)


def check_run_name(method, seed):
    """A diagnosis run's method and seed, as they will name its folder `<method>/seed-<seed>`."""
    if not isinstance(method, str) or not METHOD_NAME.match(method):
        raise EnsdiagError(f"method name {str(method)[:80]!r} must be 1-64 letters, digits, '.', '_' or '-' "
                           "(it names a folder)")
    if _reserved(method):
        raise EnsdiagError(f"method name {method!r} is a name the run folder itself uses (experiment.json, "
                           f"report.*, {CACHE_FILE}, figures); choose another")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise EnsdiagError(f"seed must be an integer in 0..2³¹−1, got {str(seed)[:40]}")


def _reserved(method: str) -> bool:
    folded = method.casefold()
    return folded in RESERVED or folded.startswith("report.")


# ------------------------------------------------------------------ what a METHOD/seed-N folder holds

LORA_FILE = "lora.json"
LORA_FORMAT = "ensdiag.lora-run/1"

PREDICTIONS, LORA, TRAINING = "predictions", "lora", "training"
KINDS = {PREDICTIONS: "an analysis of predictions", LORA: "a LoRA weight-space diagnosis",
         TRAINING: "a trained model", "unknown": "a result ensdiag cannot read"}
# The kinds one run may hold side by side: a LoRA ensemble's function space (predictions) and weight space
PAIRED = frozenset({PREDICTIONS, LORA})


def saved_kinds(run) -> set[str]:
    """The kinds of result a `<method>/seed-<seed>` folder holds (empty for a new or empty one): a
    training run's files; the predictions part (metrics.json, predictions.safetensors, meta.json);
    the LoRA weight-space part (lora.json, or the section in a 0.6 metrics.json)."""
    run = Path(run)
    kinds = set()
    if any((run / name).exists() for name in ("model.safetensors", "history.jsonl", STATE_FILE)):
        kinds.add(TRAINING)
    if (run / LORA_FILE).exists():
        kinds.add(LORA)
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
            kinds |= {LORA} if isinstance(metrics.get("lora"), dict) else set()  # written by ensdiag 0.6
    return kinds


def saved_parts(run_folder) -> set[str]:
    """Which of the two parts a diagnosis run holds (`PAIRED`): "predictions" and "lora"."""
    return saved_kinds(run_folder) & PAIRED


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


def claim_files(folder, names, overwrite: bool = False, option: str = "--out") -> Path:
    """`folder`, checked before the result files `names` (`evaluate --out`'s predictions.safetensors
    and metrics.json, `analyze --out`'s metrics.json) are written into it: never a run folder's root
    (its results live in METHOD/seed-N), never beside a training run or a LoRA diagnosis (kinds these
    files would corrupt), and a result already there replaced only with `overwrite`. Nothing is created."""
    folder = Path(folder)
    if (folder / "experiment.json").exists():
        raise EnsdiagError(f"{option} {folder} is a run folder (it holds experiment.json, and its results live in "
                           "METHOD/seed-N folders): write into a folder of its own")
    foreign = sorted(saved_kinds(folder) - {PREDICTIONS, "unknown"})
    if foreign:
        raise EnsdiagError(f"{option} {folder} holds {KINDS[foreign[0]]}, which these files would replace: write into "
                           "a folder of its own")
    held = [name for name in names if (folder / name).exists() or (folder / name).is_symlink()]
    if held and not overwrite:
        raise EnsdiagError(f"{option} {folder} already holds {held[0]} (saved results); pass --overwrite to replace "
                           "them, or write into another folder")
    return folder


def _check_diagnosis_config(path, config):
    if not isinstance(config, dict) or config.get("preset") != "custom" or not isinstance(config.get("methods"), list) \
            or not isinstance(config.get("seeds"), list):
        raise EnsdiagError(f"{path}: a diagnosis folder's config must hold preset 'custom', methods and seeds")
    if not all(isinstance(m, str) and METHOD_NAME.match(m) and not _reserved(m) for m in config["methods"]) \
            or len(set(config["methods"])) != len(config["methods"]):
        raise EnsdiagError(f"{path}: methods must be distinct names of letters, digits, '.', '_' or '-', none of "
                           f"them a name the folder itself uses (experiment.json, report.*, {CACHE_FILE}, figures)")
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in config["seeds"]) \
            or len(set(config["seeds"])) != len(config["seeds"]):
        raise EnsdiagError(f"{path}: seeds must be distinct integers in 0..2³¹−1")


def lora_record(method: str, seed: int, source: str, section: dict) -> dict:
    return {"format": LORA_FORMAT, "run": method, "method": method, "seed": seed, "source": source, "lora": section}


def keep_lora_apart(run_folder) -> None:
    """Before a predictions part is written: a 0.6 lora-only metrics.json's section moves to lora.json
    (unless one is there), so the weight-space part is not lost under the analysis."""
    folder = Path(run_folder)
    data = read_json(folder / "metrics.json", "metrics file") if (folder / "metrics.json").is_file() else None
    lora_only = isinstance(data, dict) and isinstance(data.get("lora"), dict) and not data.get("analyzers")  # (0.6's)
    if not lora_only or (folder / LORA_FILE).exists():
        return
    meta = read_json(folder / "meta.json", "meta file") if (folder / "meta.json").is_file() else {}
    source = meta.get("source") if isinstance(meta, dict) and isinstance(meta.get("source"), str) else "ensdiag 0.6"
    seed = folder.name.removeprefix("seed-")
    seed = int(seed) if seed.isascii() and seed.isdigit() and len(seed) <= 10 else 0
    atomic_write_json(folder / LORA_FILE, lora_record(folder.parent.name, seed, source, data["lora"]))


def save_result(folder, method: str, seed: int, kind: str, record: dict, meta: dict | None = None,
                titles: dict | None = None, predictions: dict | None = None, overwrite: bool = False) -> Path:
    """Save one part of a diagnosis run `folder/<method>/seed-<seed>/`, under the folder's lock:
    checked by `claim_run` before anything is written, listed in experiment.json, touching only its
    own files. `kind` PREDICTIONS: `record` is metrics.json, with `meta` (written last: it marks the
    run finished; an overwrite removes the old one first, so a save cut short never looks finished)
    and `predictions`; a 0.6 run's LoRA section moves to lora.json first. `kind` LORA: `record` is
    lora.json (`lora_record`)."""
    check_run_name(method, seed)  # before anything is created
    root = inner_folder(folder)
    with locked_folder(root, "run folder"):
        if predictions is not None and (root / "experiment.json").exists():  # (claim_run's refusals first)
            _one_test_set(root, claim_run(root, method, seed, kind, overwrite, create=False), predictions)
        run = claim_run(root, method, seed, kind, overwrite)
        # the folder's experiment.json created or extended with (method, seed) (`claim_run` refused any other kind)
        if (root / "experiment.json").exists():
            data = read_experiment(root)
        else:
            data = {"format": EXPERIMENT_FORMAT, "kind": DIAGNOSIS, "ensdiag_version": __version__,
                    "created": datetime.now().isoformat(timespec="seconds"),
                    "config": {"preset": "custom", "methods": [], "seeds": []}, "splits": {}, "skipped": {}}
        data["config"]["methods"] += [method] if method not in data["config"]["methods"] else []
        data["config"]["seeds"] += [seed] if seed not in data["config"]["seeds"] else []
        data["splits"].update(titles or {})
        # a report leaves out the tables of a split that no run saved here has, as it does for a training run's
        data["skipped"] = {split: "no run saved here has this split" for split in ("shift", "ood")
                           if split not in data["splits"]}
        atomic_write_json(root / "experiment.json", data)
        if kind == LORA:
            atomic_write_json(run / LORA_FILE, record)  # one file: written whole or not
            return run
        keep_lora_apart(run)  # the run's weight-space part is not this save's to touch
        (run / "meta.json").unlink(missing_ok=True)
        if predictions is not None:
            from .predictions import save_predictions
            save_predictions(predictions, run / "predictions.safetensors", {"ensdiag.splits": titles or {}})
        atomic_write_json(run / "metrics.json", record)
        atomic_write_json(run / "meta.json", meta or {})
    return run


def _one_test_set(root: Path, run: Path, predictions: dict) -> None:
    """Refuse predictions whose classes or labels differ from those of another run of the folder on a split
    both have (checks.test_set_difference): a report compares a folder's runs example by example."""
    from .checks import test_set_difference
    mine = {name: (split["labels"], split["logits"].shape[-1]) for name, split in predictions.items()
            if split.get("labels") is not None and name != "val"}  # (a seed's validation split may be its own)
    config = read_experiment(root)["config"]
    for other in (root / method / f"seed-{seed}" for method in config["methods"] for seed in config["seeds"]):
        shapes = {}
        try:
            labels, _ = read_safetensors(other / "predictions.safetensors", "predictions file",
                                         {f"{name}/labels" for name in mine}, shapes) if other != run else ({}, None)
            differences = [(name, test_set_difference([mine[name], (labels[f"{name}/labels"], shapes[f"{name}/logits"][-1])]))
                           for name in mine.keys() & {key.removesuffix("/labels") for key in labels}]
        except Exception:  # no predictions, or damaged ones (which the report names)
            continue
        for name, difference in differences:
            if difference is not None:
                raise EnsdiagError(f"this run's {name!r} test set is not that of {other} ({difference}): a folder's "
                                   "runs are compared on one test set; save it into a folder of its own")
