"""Reading a run folder for reports: every file checked like user input (a damaged one is a
one-line error naming it and what to do), through runs.py and no training code. Files are read
bounded in size and nesting (io.read_json), and every number read back is range-checked
(below): a damaged value is an error, never a report's best.

    data = load_runs("runs/demo")   # {"experiment", "runs": {method: {seed: {"metrics", "meta", "history", ...}}}}

The range of every number a report reads back from a run folder. A value outside its range was
not written by ensdiag (a damaged, hand-edited or hostile file): the report names it as damage,
never averages it, prints it with hundreds of digits or marks it best.

    problem = out_of_range(metrics)     # None, or "analyzers.calibration.splits.id.accuracy.value is 1e+308, …"

Ranges are by the name of the quantity (the key holding {"value": …}), so every analyzer's
results are checked, a plug-in's too: names not listed here need only be finite numbers. No file
ensdiag writes holds NaN or infinity (JSON has neither), nor an integer beyond 64 bits.
"""

import math
from pathlib import Path

from ..errors import EnsdiagError
from ..io import UnreadableJson, parse_json, read_bounded, read_json
from ..layout import lookup
from ..runs import DIAGNOSIS, LORA_FILE, LORA_FORMAT, read_experiment

TOLERANCE = 1e-6  # rounding at the ends of a range (a CKA of 1.0000000002)
PROBABILITY, COSINE, SIGNED_SHARE = (0.0, 1.0), (-1.0, 1.0), (-1.0, 1.0)
NON_NEGATIVE, BRIER = (0.0, math.inf), (0.0, 2.0)
RANGES = {
    **dict.fromkeys(("accuracy", "member_accuracy", "ece", "ece_adaptive", "ece_adaptive_tu", "ece_classwise",
                     "member_ece", "auroc", "aupr_in", "aupr_out", "fpr95", "fpr95_ood_as_id", "fpr95_id_as_ood",
                     "aurc", "aurc_trapezoid", "error_ensemble", "error_gibbs", "disagreement", "rank_one", "member_error"),
                    PROBABILITY),
    **dict.fromkeys(("overconfidence", "error_gap", "disagreement_gap"), SIGNED_SHARE),
    **dict.fromkeys(("brier", "brier_ensemble", "brier_gibbs", "brier_spread"), BRIER),
    **dict.fromkeys(("nll", "member_nll", "nll_ensemble", "nll_gibbs", "nll_geometric", "nll_gap", "entropy",
                     "expected_entropy", "jsd", "kl_diversity", "normalized", "temperature_pooled", "epkl", "rmi", "ratio"),
                    NON_NEGATIVE),
    **dict.fromkeys(("weight_cosine", "aligned_weight_cosine", "linear", "spearman_au_eu"), COSINE),
}
# a name whose range depends on the analyzer: a mean of disagreements, of cosines
BY_ANALYZER = {("disagreement", "mean"): PROBABILITY, ("disagreement", "matrix"): PROBABILITY,
               ("weight-similarity", "mean"): COSINE, ("weight-similarity", "matrix"): COSINE,
               ("weight-similarity", "initial"): COSINE, ("cka", "mean"): COSINE,
               ("refinement", "loss"): NON_NEGATIVE, ("refinement", "refinement"): NON_NEGATIVE,
               ("refinement", "temperatures"): NON_NEGATIVE}
INTEGER_LIMIT = 2**63
META = {"parameters": NON_NEGATIVE, "train_seconds": NON_NEGATIVE, "eval_seconds": NON_NEGATIVE,
        "epochs_run": NON_NEGATIVE, "weights_epoch": NON_NEGATIVE, "best_val_epoch": NON_NEGATIVE}


def shown(value) -> str:
    """A number as a person reads it, however large: 1e+308, not 309 digits."""
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def bad_number(value, bounds=None) -> str | None:
    """Why a number read back is damage (not finite, beyond 64 bits, outside `bounds`), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) >= INTEGER_LIMIT:
        return f"is {shown(value)}"
    if not math.isfinite(value):
        return f"is {value}"
    if bounds is not None and not bounds[0] - TOLERANCE <= value <= bounds[1] + TOLERANCE:
        return f"is {shown(value)}, outside [{bounds[0]:g}, {bounds[1]:g}]"
    return None


def _numbers(node, path):
    """(path, number) of every number in a value: a number, a list, a matrix (lists of lists)."""
    stack = [(node, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, list):
            stack.extend((entry, f"{where}[{index}]") for index, entry in enumerate(item))
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            yield where, item


def out_of_range(metrics: dict) -> str | None:
    """The first number of a metrics.json that is not what ensdiag writes, said in words, or None."""
    stack = [(metrics, "", None, None)]
    while stack:
        node, where, name, analyzer = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                inside = key if where == ".analyzers" else analyzer
                if key == "value" and name is not None:
                    bounds = BY_ANALYZER.get((analyzer, name), RANGES.get(name))
                    problem = next(((place, why) for place, number in _numbers(value, f"{where}.value")
                                    if (why := bad_number(number, bounds))), None)
                    if problem:
                        return f"{problem[0].lstrip('.')} {problem[1]}"
                    continue
                stack.append((value, f"{where}.{key}", key, inside))
        elif isinstance(node, list):
            stack.extend((entry, f"{where}[{index}]", name, analyzer) for index, entry in enumerate(node))
        elif (why := bad_number(node)) is not None:
            return f"{where.lstrip('.')} {why}"
    return None


def meta_out_of_range(meta: dict) -> str | None:
    """The first number of a meta.json the report reads that is damage, or None."""
    for key, bounds in META.items():  # (a Deep Ensemble's epochs: one per member)
        why = next((f"{where} {why}" for where, number in _numbers(meta.get(key), key)
                    if (why := bad_number(number, bounds))), None)
        if why:
            return why
    return None


MAX_FILE_BYTES = 256 << 20  # a run's metrics.json, meta.json or .jsonl rows: far beyond any ensdiag writes
MAX_EPOCH = 10**6

def dig(node, path):
    """The value at `path`, or None where the path does not exist."""
    return lookup(node, path)[0]


def _number(value) -> bool:
    try:  # a 400-digit integer from a damaged file does not fit a float
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        return False


def first_run(seeds: dict) -> tuple:
    """(seed, run) of the first finished run of a method's seeds, or (None, None)."""
    return next(((seed, run) for seed, run in seeds.items() if run is not None), (None, None))


def first_ran(runs: dict, analyzer: str) -> dict:
    """{method: (seed, run)} of every method whose first finished run has `analyzer`'s result ("ok")."""
    return {method: (seed, run) for method, seeds in runs.items() for seed, run in [first_run(seeds)]
            if run is not None and dig(run["metrics"], ("analyzers", analyzer, "status")) == "ok"}


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
            meta = _read_object(folder / "meta.json", meta_out_of_range) if analysed else {
                "run": method, "method": method, "seed": seed, "splits": {}, "source": lora["source"]}
            if isinstance(metrics.get("lora"), dict):  # ensdiag 0.6 kept the section beside empty analyzers
                metrics["analyzers"]["lora"] = lora_result(metrics.pop("lora"))
            if lora is not None:  # the run's weight-space part, beside its predictions part (runs.py)
                metrics["analyzers"]["lora"] = lora_result(lora["lora"])
            history = _read_rows(folder / "history.jsonl", lambda row: _loss(row.get("loss")) and _in(row, HISTORY),
                                 "an epoch record")
            # `train --track-diversity`'s rows (epoch 0 = initialisation)
            tracking = _read_rows(folder / "diversity.jsonl", lambda row: _in(row, TRACKED), "a diversity record")
            runs[method][seed] = {"metrics": metrics, "meta": meta, "history": history, "folder": folder,
                                  "tracking": tracking}
    return {"experiment": experiment, "runs": runs}


def _read_lora(path):
    """A run's lora.json ({"format", "method", "seed", "source", "lora"}), or None without one."""
    if not path.is_file():
        return None
    data = _read_object(path)
    if data.get("format") != LORA_FORMAT or not isinstance(data.get("lora"), dict) or not isinstance(data.get("source"), str):
        raise _damaged(path, f"not an {LORA_FORMAT} record with a lora section")
    check_lora(data["lora"], path)
    return data


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


def _read_object(path, damage=lambda data: None) -> dict:
    """A JSON object from the run folder, or the `_damaged` error; `damage(data)`: what else makes it damage."""
    try:
        data = read_json(path, "file", MAX_FILE_BYTES)
    except UnreadableJson as error:
        raise _damaged(path, f"not readable JSON: {error.reason}") from None
    except EnsdiagError as error:  # not a regular file, not readable
        raise _damaged(path, _reason(error, path)) from None
    if not isinstance(data, dict):
        raise _damaged(path, f"a JSON {type(data).__name__}, not an object")
    if (problem := damage(data)) is not None:
        raise _damaged(path, problem)
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
        check_lora(metrics["lora"], path)
    for score in (dig(metrics, ("analyzers", "ood", "scores")) or {}).values():
        if isinstance(score, dict) and "fpr95" in score:  # before 0.2: one FPR95, the OOD→ID direction
            score.setdefault("fpr95_ood_as_id", score["fpr95"])
            score.setdefault("fpr95_id_as_ood", {"value": None, "status": "missing",
                                                 "definition": "not computed by the ensdiag that wrote this file"})
    return metrics


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


def _loss(value) -> bool:
    """A recorded training loss: any float (a diverged epoch's is NaN or infinite), or an integer of 64 bits."""
    return isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool) and bad_number(value) is None)


HISTORY = {"accuracy": PROBABILITY, "val_accuracy": PROBABILITY, "val_nll": NON_NEGATIVE, "seconds": NON_NEGATIVE}


TRACKED = {"disagreement": PROBABILITY, "jsd": NON_NEGATIVE, "weight_cosine": COSINE, "aligned_weight_cosine": COSINE}


def _in(row: dict, ranges: dict) -> bool:
    """Whether each of the row's `ranges` keys is absent, null, or a number in its range."""
    return all(row.get(key) is None or (_number(row[key]) and bad_number(row[key], bounds) is None)
               for key, bounds in ranges.items())


def lora_result(section: dict) -> dict:
    """A LoRA weight-space section in the metrics layout: one analyzer result among the others."""
    return {"status": "ok", "description": "LoRA adapters compared by their weights (lora/analysis.py)", **section}


MAX_READ_MEMBERS = 4096  # as predictions: what a saved section may claim (ensdiag itself saves at most 64)


def check_lora(section, path) -> None:
    """A saved `lora` section checked like user input before any table or figure reads it: k, r and
    every k×k matrix consistent, every number finite and in its range, or one `_damaged` line."""
    def damaged(what):
        return _damaged(path, f"its lora section {what}")

    if not isinstance(section, dict):
        raise damaged("is not an object")
    k, rank = section.get("k"), section.get("rank")
    if not isinstance(k, int) or isinstance(k, bool) or not 2 <= k <= MAX_READ_MEMBERS:
        raise damaged(f"has k = {str(k)[:40]}, not a number of members from 2 to {MAX_READ_MEMBERS}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= 1 << 16:
        raise damaged(f"has r = {str(rank)[:40]}, not a rank from 1 to 65536")
    for key in ("members", "files"):
        if not isinstance(section.get(key), list) or len(section[key]) != k:
            raise damaged(f"lists {key} that are not its k = {k}")
    summary = section.get("summary")
    if not isinstance(summary, dict):
        raise damaged("has no summary")
    problem = out_of_range({"lora": section})  # every number finite, no integer beyond 64 bits
    if problem is not None:
        raise damaged(f"has {problem}")
    matrices = [("delta_cosine", summary.get("delta_cosine"))]
    if summary.get("effective_cosine") is not None:
        matrices.append(("effective_cosine", summary["effective_cosine"]))
    for name, entry in matrices:
        matrix = entry.get("matrix") if isinstance(entry, dict) else None
        if not isinstance(matrix, list) or len(matrix) != k or not all(isinstance(row, list) and len(row) == k
                                                                      for row in matrix):
            raise damaged(f"has a {name} matrix that is not {k}×{k}")
    checks = [(("delta_cosine", "mean"), COSINE), (("delta_cosine", "null_rms"), PROBABILITY),
              (("column_overlap", "mean"), PROBABILITY), (("column_overlap", "null"), PROBABILITY),
              (("row_overlap", "mean"), PROBABILITY), (("row_overlap", "null"), PROBABILITY),
              (("effective_rank", "mean"), (1.0, float(rank))), (("effective_cosine", "mean"), COSINE),
              (("effective_cosine", "orthogonal_baseline"), COSINE), (("relative_norm", "mean"), NON_NEGATIVE)]
    values = [(".".join(where), dig(summary, where), bounds) for where, bounds in checks]
    values += [(f"{name}.matrix", value, COSINE) for name, entry in matrices for row in entry["matrix"] for value in row]
    for where, value, bounds in values:
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or bad_number(value, bounds)):
            raise damaged(f"has summary.{where} = {str(value)[:40]}, not a number in [{bounds[0]:g}, {bounds[1]:g}]")
    for key in ("by_type", "by_depth", "layers"):
        if not isinstance(section.get(key), list) or not all(isinstance(group, dict) for group in section[key]):
            raise damaged(f"has no list of {key}")
