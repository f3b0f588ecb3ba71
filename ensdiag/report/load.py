"""Reading a run folder for reports: every file checked like user input (a damaged one is a
one-line error naming it and what to do), through runs.py and no training code.

    data = load_runs("runs/demo")   # {"experiment", "runs": {method: {seed: {"metrics", "meta", "history", ...}}}}
"""

import json
import math
from pathlib import Path

from ..errors import EnsdiagError
from ..runs import DIAGNOSIS, LORA_FILE, LORA_FORMAT, read_experiment

MISSING = object()


def _lookup(node, path):
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return MISSING
        node = node[key]
    return node


def dig(node, path):
    """The value at `path`, or None where the path does not exist."""
    value = _lookup(node, path)
    return None if value is MISSING else value


def _number(value) -> bool:
    try:  # a 400-digit integer from a damaged file does not fit a float
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        return False


def newest_run(root="runs") -> Path:
    candidates = sorted((p for p in Path(root).glob("*/experiment.json")), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise EnsdiagError(f"no run folder under {root}/; train one with `ensdiag train` or name a RUN_DIR")
    return candidates[-1].parent


def load_runs(run_dir) -> dict:
    """{"experiment", "runs": {method: {seed: {"metrics", "meta", "history"} | None}}}."""
    run_dir = Path(run_dir)
    experiment = read_experiment(run_dir)
    config = experiment["config"]
    runs = {}
    for method in config["methods"]:
        runs[method] = {}
        for seed in config["seeds"]:
            folder = run_dir / method / f"seed-{seed}"
            metrics_path = folder / "metrics.json"
            analysed = metrics_path.is_file() and (folder / "meta.json").is_file()
            lora = _read_lora(folder / LORA_FILE) if experiment.get("kind") == DIAGNOSIS else None
            if not analysed and lora is None:
                runs[method][seed] = None
                continue
            metrics = _read_metrics(metrics_path) if analysed else {"analyzers": {}, "splits": {}}
            meta = _read_object(folder / "meta.json") if analysed else {
                "run": method, "method": method, "seed": seed, "splits": {}, "source": lora["source"]}
            if isinstance(metrics.get("lora"), dict):  # ensdiag 0.6 kept the section beside empty analyzers
                metrics["analyzers"]["lora"] = lora_result(metrics.pop("lora"))
            if lora is not None:  # the run's weight-space part, beside its predictions part (runs.py)
                metrics["analyzers"]["lora"] = lora_result(lora["lora"])
            runs[method][seed] = {"metrics": metrics, "meta": meta, "history": _read_history(folder / "history.jsonl"),
                                  "folder": folder, "tracking": _read_tracking(folder / "diversity.jsonl")}
    return {"experiment": experiment, "runs": runs}


def _read_lora(path):
    """A run's lora.json ({"format", "method", "seed", "source", "lora"}), or None without one."""
    if not path.is_file():
        return None
    data = _read_object(path)
    if data.get("format") != LORA_FORMAT or not isinstance(data.get("lora"), dict) or not isinstance(data.get("source"), str):
        raise _damaged(path, f"not an {LORA_FORMAT} record with a lora section")
    return data


def _damaged(path, what) -> EnsdiagError:
    return EnsdiagError(f"{path} is damaged ({what}); delete that seed's folder ({path.parent}) and rerun "
                        "`ensdiag train --resume` on the run to recompute it")


def _read_object(path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except EnsdiagError:
        raise  # already one line for the user
    except (OSError, ValueError) as error:
        raise _damaged(path, f"not readable JSON: {type(error).__name__}") from None
    if not isinstance(data, dict):
        raise _damaged(path, f"a JSON {type(data).__name__}, not an object")
    return data


def _read_metrics(path) -> dict:
    metrics = _read_object(path)
    if not isinstance(metrics.get("analyzers"), dict) or not isinstance(metrics.get("splits"), dict) or not all(
            isinstance(result, dict) and isinstance(result.get("status"), str) for result in metrics["analyzers"].values()):
        raise _damaged(path, "no 'analyzers' and 'splits' of the ensdiag.metrics layout")
    for score in (dig(metrics, ("analyzers", "ood", "scores")) or {}).values():
        if isinstance(score, dict) and "fpr95" in score:  # before 0.2: one FPR95, the OOD→ID direction
            score.setdefault("fpr95_ood_as_id", score["fpr95"])
            score.setdefault("fpr95_id_as_ood", {"value": None, "status": "missing",
                                                 "definition": "not computed by the ensdiag that wrote this file"})
    return metrics


def _read_rows(path, is_row, what) -> list[dict]:
    """One JSON object per line, each checked by `is_row`; a missing file has no rows (they are only drawn)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except EnsdiagError:
        raise  # already one line for the user
    except (OSError, ValueError) as error:
        raise _damaged(path, type(error).__name__) from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise _damaged(path, f"line {number} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("epoch"), int) or isinstance(row["epoch"], bool) \
                or not is_row(row):
            raise _damaged(path, f"line {number} is not {what}")
        rows.append(row)
    return rows


def _read_history(path) -> list[dict]:
    return _read_rows(path, lambda row: isinstance(row.get("loss"), (int, float)), "an epoch record")


TRACKED_KEYS = ("disagreement", "jsd", "weight_cosine", "aligned_weight_cosine")


def _read_tracking(path) -> list[dict]:
    """`train --track-diversity`'s rows (epoch 0 = initialisation)."""
    return _read_rows(path, lambda row: all(row.get(key) is None or _number(row[key]) for key in TRACKED_KEYS),
                      "a diversity record")


def lora_result(section: dict) -> dict:
    """A LoRA weight-space section in the metrics layout: one analyzer result among the others."""
    return {"status": "ok", "description": "LoRA adapters compared by their weights (lora/analysis.py)", **section}
