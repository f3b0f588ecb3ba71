"""Reading a run folder for reports: every file checked like user input (a damaged one is a
one-line error naming it and what to do), through runs.py and no training code. Files are read
bounded in size and nesting (io.read_json), and every number read back is range-checked
(ranges.py): a damaged value is an error, never a report's best.

    data = load_runs("runs/demo")   # {"experiment", "runs": {method: {seed: {"metrics", "meta", "history", ...}}}}
"""

import math
from pathlib import Path

from ..errors import EnsdiagError
from ..io import UnreadableJson, parse_json, read_bounded, read_json
from ..runs import DIAGNOSIS, read_experiment
from .ranges import COSINE, NON_NEGATIVE, PROBABILITY, bad_number, meta_out_of_range, out_of_range

MAX_FILE_BYTES = 256 << 20  # a run's metrics.json, meta.json or .jsonl rows: far beyond any ensdiag writes
MAX_EPOCH = 10**6

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
            if not (metrics_path.is_file() and (folder / "meta.json").is_file()):
                runs[method][seed] = None
                continue
            runs[method][seed] = {"metrics": _read_metrics(metrics_path), "meta": _read_meta(folder / "meta.json"),
                                  "history": _read_history(folder / "history.jsonl"), "folder": folder,
                                  "tracking": _read_tracking(folder / "diversity.jsonl")}
    return {"experiment": experiment, "runs": runs}


def _damaged(path, what) -> EnsdiagError:
    path = Path(path)
    return EnsdiagError(f"{path} is damaged ({what}); {_remedy(path)}")


def _remedy(path: Path) -> str:
    """What recomputes a damaged run file: training resumes a training run's seed; a diagnosis
    folder's run is saved again by whatever saved it."""
    try:
        diagnosis = read_json(path.parents[2] / "experiment.json", "experiment file").get("kind") == DIAGNOSIS
    except (EnsdiagError, AttributeError, IndexError):
        diagnosis = False
    if diagnosis:
        return (f"save that run ({path.parent}) again with --overwrite (`ensdiag analyze … --method`, "
                "`ensdiag diversity ADAPTER_DIR… --save`, or Diagnosis.save(…, overwrite=True))")
    return f"delete that seed's folder ({path.parent}) and rerun `ensdiag train --resume` on the run to recompute it"


def _reason(error: EnsdiagError, path) -> str:
    """An io error's words without the path it begins with (the damaged line names the file)."""
    return str(error).replace(f"file {path} ", "").replace(f"cannot read file {path}: ", "")


def _read_object(path) -> dict:
    try:
        data = read_json(path, "file", MAX_FILE_BYTES)
    except UnreadableJson as error:
        raise _damaged(path, f"not readable JSON: {error.reason}") from None
    except EnsdiagError as error:  # not a regular file, not readable
        raise _damaged(path, _reason(error, path)) from None
    if not isinstance(data, dict):
        raise _damaged(path, f"a JSON {type(data).__name__}, not an object")
    return data


def _read_metrics(path) -> dict:
    metrics = _read_object(path)
    if not isinstance(metrics.get("analyzers"), dict) or not isinstance(metrics.get("splits"), dict) or not all(
            isinstance(result, dict) and isinstance(result.get("status"), str) for result in metrics["analyzers"].values()):
        raise _damaged(path, "no 'analyzers' and 'splits' of the ensdiag.metrics layout")
    problem = out_of_range(metrics)
    if problem is not None:
        raise _damaged(path, problem)
    if "lora" in metrics:
        from .lora import check_lora
        check_lora(metrics["lora"], path)
    for score in (dig(metrics, ("analyzers", "ood", "scores")) or {}).values():
        if isinstance(score, dict) and "fpr95" in score:  # before 0.2: one FPR95, the OOD→ID direction
            score.setdefault("fpr95_ood_as_id", score["fpr95"])
            score.setdefault("fpr95_id_as_ood", {"value": None, "status": "missing",
                                                 "definition": "not computed by the ensdiag that wrote this file"})
    return metrics


def _read_meta(path) -> dict:
    meta = _read_object(path)
    problem = meta_out_of_range(meta)
    if problem is not None:
        raise _damaged(path, problem)
    return meta


def _read_rows(path, is_row, what) -> list[dict]:
    """One JSON object per line, each checked by `is_row`; a missing file has no rows (they are only drawn).
    The file is bounded in size, its lines in nesting, every epoch an integer in 0..10⁶."""
    if not path.exists() and not path.is_symlink():
        return []
    try:
        lines = read_bounded(path, "file", MAX_FILE_BYTES).decode("utf-8").splitlines()
    except UnreadableJson as error:
        raise _damaged(path, error.reason) from None
    except EnsdiagError as error:  # not a regular file, not readable
        raise _damaged(path, _reason(error, path)) from None
    except UnicodeDecodeError:
        raise _damaged(path, "not UTF-8 text") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = parse_json(line, f"line {number}")
        except UnreadableJson:
            raise _damaged(path, f"line {number} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("epoch"), int) or isinstance(row["epoch"], bool) \
                or not 0 <= row["epoch"] <= MAX_EPOCH or not is_row(row):
            raise _damaged(path, f"line {number} is not {what}")
        rows.append(row)
    return rows


def _read_history(path) -> list[dict]:
    return _read_rows(path, lambda row: _loss(row.get("loss")) and _in(row, HISTORY), "an epoch record")


def _loss(value) -> bool:
    """A recorded training loss: any float (a diverged epoch's is NaN or infinite), or an integer of 64 bits."""
    return isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool) and bad_number(value) is None)


HISTORY = {"accuracy": PROBABILITY, "val_accuracy": PROBABILITY, "val_nll": NON_NEGATIVE, "seconds": NON_NEGATIVE}


TRACKED = {"disagreement": PROBABILITY, "jsd": NON_NEGATIVE, "weight_cosine": COSINE, "aligned_weight_cosine": COSINE}


def _in(row: dict, ranges: dict) -> bool:
    """Whether each of the row's `ranges` keys is absent, null, or a number in its range."""
    return all(row.get(key) is None or (_number(row[key]) and bad_number(row[key], bounds) is None)
               for key, bounds in ranges.items())


def _read_tracking(path) -> list[dict]:
    """`train --track-diversity`'s rows (epoch 0 = initialisation)."""
    return _read_rows(path, lambda row: _in(row, TRACKED), "a diversity record")
