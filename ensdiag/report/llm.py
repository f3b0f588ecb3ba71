"""LLM ensembles in one report: each method's weight space (a LoRA run part, lora.json) beside its
function space (its predictions part, e.g. read from lm-eval logs) and the verdict, and the
accuracy per subtask of a group task (splits `id/<subtask>`, foreign/lm_eval.py).

The side-by-side table appears when the folder holds both kinds of part (runs.py): typically
`ensdiag diversity ADAPTER_DIR… --save DIR --method M` and `ensdiag analyze LM_EVAL_LOGS… --out
DIR --method M` for the adapters, with `single` (one adapter) and `deep-ensemble` (independent
fine-tunes) analysed beside them for the verdict.
"""

from .load import dig
from .lora import _value_of, has_lora

DEFINITIONS = {
    "ΔW cosine": "mean over adapter pairs of the cosine of their updates ΔW_i = s·B_iA_i, all adapted layers together",
    "column overlap": "mean cos² of the principal angles between the members' column spaces (its null beside it in "
                      "the LoRA table)",
    "row overlap": "mean cos² of the principal angles between the members' row spaces",
    "disagreement": "mean pairwise disagreement of the members' answers on the in-distribution questions",
    "JSD": "H(p̄) − mean_i H(p_i) on the in-distribution questions (mutual information)",
    "Acc": "accuracy of p̄ on the in-distribution questions",
    "diversity ×": "the verdict's KL diversity over the Deep Ensemble's (1: as diverse as independent fine-tunes)",
    "NLL share": "the verdict's share of the Deep Ensemble's NLL gain over the single model",
}
WEIGHT_SPACE = (("ΔW cosine", ("summary", "delta_cosine", "mean")), ("column overlap", ("summary", "column_overlap", "mean")),
                ("row overlap", ("summary", "row_overlap", "mean")))
FUNCTION_SPACE = (("disagreement", ("disagreement", "splits", "id", "mean", "value"), None),
                  ("JSD", ("uncertainty", "splits", "id", "jsd", "value"), None),
                  ("Acc", ("calibration", "splits", "id", "accuracy", "value"), "up"))


def _analysed(run) -> bool:
    return run is not None and any(name != "lora" for name in run["metrics"]["analyzers"])  # a predictions part


def _analyzer_value(path):
    return lambda run: dig(run["metrics"]["analyzers"], path)


def llm_tables(runs: dict, verdicts: dict, expected: int, make_table) -> tuple[list[dict], dict]:
    """([weight space beside function space, accuracy per subtask], {label: definition}); each
    only where the runs have what it shows. `make_table` is aggregate's `_table`."""
    tables, definitions = [], {}
    finished = [run for seeds in runs.values() for run in seeds.values() if run is not None]
    if any(has_lora(run) for run in finished) and any(_analysed(run) for run in finished):
        columns = [(label, _value_of(path), None) for label, path in WEIGHT_SPACE]
        columns += [(label, _analyzer_value(path), direction) for label, path, direction in FUNCTION_SPACE]
        table = make_table("llm", "Weight space beside function space", columns, runs, expected, note=_note(runs, verdicts))
        table["columns"] += [{"name": "diversity ×", "direction": "up"}, {"name": "NLL share", "direction": "up"}]
        for row in table["rows"]:
            entry = verdicts.get(row["method"], {})
            row["cells"] += [{"mean": entry.get(key, {}).get("value"), "ci": None, "n": entry.get("seeds"), "values": [],
                              "interval": entry.get(key, {}).get("interval"), "expected": expected}
                             for key in ("diversity", "nll")]
        tables.append(table)
        definitions.update(DEFINITIONS)
    subtasks = list(dict.fromkeys(name.split("/", 1)[1] for run in finished for name in run["metrics"]["splits"]
                                  if name.startswith("id/")))
    if subtasks:
        columns = [(name, _analyzer_value(("calibration", "splits", f"id/{name}", "accuracy", "value")), "up")
                   for name in subtasks]
        tables.append(make_table("subtasks", "Accuracy per subtask (in-distribution)", columns, runs, expected,
                                 note="The in-distribution tables pool every subtask's questions; here each on its own."))
    return tables, definitions


def _note(runs, verdicts) -> str:
    sources = {dig(run["metrics"], ("lm_eval", "task")): dig(run["metrics"], ("lm_eval", "score_definition"))
               for seeds in runs.values() for run in seeds.values() if run is not None and dig(run["metrics"], ("lm_eval",))}
    read = "; ".join(f"lm-eval task {task}, scores: {score}" for task, score in sources.items() if isinstance(task, str))
    answers = " ".join(entry["answer"] for entry in verdicts.values() if isinstance(entry.get("answer"), str))
    return " ".join(part for part in (
        "Weight space from the adapters' factors (ensdiag diversity ADAPTER_DIR… --save), function space from their "
        "predictions" + (f" ({read})" if read else "") + ", the verdict's columns from the single model and the Deep "
        "Ensemble saved beside them. ΔW cosine near 0 with disagreement and JSD near the Deep Ensemble's: the "
        "adapters learnt different things; ΔW cosine and overlaps near 1 with little disagreement: one update learnt "
        "k times.", answers) if part)
