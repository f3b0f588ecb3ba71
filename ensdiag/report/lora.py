"""Reports of LoRA ensembles: runs saved by `ensdiag diversity ADAPTER_DIR… --save DIR` carry a
weight-space part (lora.json, runs.py), read as the `lora` analyzer's result in the metrics layout
(ensdiag/lora/analysis.py computes it); here it becomes report tables (mean ± 95 % CI over seeds,
like every other table) and figures. A folder of such runs alone holds no predictions: its other
tables have nothing measured and are left out, as any such table is.

LLM ensembles in one report: each method's weight space (a LoRA run part, lora.json) beside its
function space (its predictions part, e.g. read from lm-eval logs) and the verdict, and the
accuracy per subtask of a group task (splits `id/<subtask>`, foreign/lm_eval.py).

The side-by-side table appears when the folder holds both kinds of part (runs.py): typically
`ensdiag diversity ADAPTER_DIR… --save DIR --method M` and `ensdiag analyze LM_EVAL_LOGS… --out
DIR --method M` for the adapters, with `single` (one adapter) and `deep-ensemble` (independent
fine-tunes) analysed beside them for the verdict.

Its figures, also `ensdiag diversity ADAPTER_DIR… --plot`'s: `lora_heatmaps` (the k×k ΔW cosine over all adapted
layers, one row per ensemble, on the weight cosine's colour scale) and `lora_depth_figure` (per layer index, the
mean pairwise ΔW cosine and the column- and row-space overlaps, one line per module type, each null dashed)."""

from functools import partial
from typing import TYPE_CHECKING

from .figures import heatmap_grid, new_figure, plain, plottable
from .geometry_figures import _value
from .load import _damaged, _number, dig

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SUMMARY_COLUMNS = (  # (label, path in the section, definition)
    ("ΔW cosine", ("summary", "delta_cosine", "mean"),
     "mean over member pairs of ⟨ΔW_i, ΔW_j⟩/(‖ΔW_i‖‖ΔW_j‖), every adapted layer together, computed from the factors"),
    ("ΔW null RMS", ("summary", "delta_cosine", "null_rms"),
     "RMS cosine of updates with independent uniformly random singular vectors (expected cosine 0)"),
    ("column overlap", ("summary", "column_overlap", "mean"),
     "mean cos² of the principal angles between members' column spaces, mean over pairs and layers"),
    ("column null", ("summary", "column_overlap", "null"), "the same for independent random subspaces: max(ρ_i, ρ_j)/m"),
    ("row overlap", ("summary", "row_overlap", "mean"), "mean cos² of the principal angles between members' row spaces"),
    ("row null", ("summary", "row_overlap", "null"), "the same for independent random subspaces: max(ρ_i, ρ_j)/n"),
    ("effective rank", ("summary", "effective_rank", "mean"),
     "exp of the entropy of ΔW's normalised singular values (Roy & Vetterli 2007), mean over members and layers"),
    ("1 − eff. cosine", ("summary", "effective_cosine", "mean"),
     "1 − the mean pairwise cosine of the effective weights W + ΔW_i of the adapted layers (needs the base)"),
    ("orthogonal baseline", ("summary", "effective_cosine", "orthogonal_baseline"),
     "1 − that cosine if every update were orthogonal to W and to the others"),
    ("‖ΔW‖/‖W‖", ("summary", "relative_norm", "mean"), "‖ΔW_i‖_F/‖W‖_F over the adapted layers, mean over members"),
)
GAPS = ("1 − eff. cosine", "orthogonal baseline")  # cosines of effective weights sit near 1: show the gap


def has_lora(run) -> bool:
    return run is not None and dig(run["metrics"], ("analyzers", "lora", "status")) == "ok"


def _lora_runs(runs: dict) -> dict:
    return {method: seeds for method, seeds in runs.items() if any(has_lora(run) for run in seeds.values())}


def _value_of(path, gap=False):
    """A column's reader: what is not a number the table leaves out (aggregate._cell)."""
    def value_of(run):
        value = dig(run["metrics"], ("analyzers", "lora", *path)) if has_lora(run) else None
        return 1 - value if gap and _number(value) else value
    return value_of


def _type_groups(run) -> list[dict]:
    """The run's `by_type` entries that name their type (a damaged file has none)."""
    groups = dig(run["metrics"], ("analyzers", "lora", "by_type")) if has_lora(run) else None
    return [group for group in groups if isinstance(group, dict) and isinstance(group.get("type"), str)] \
        if isinstance(groups, list) else []


def lora_tables(runs: dict, expected: int, make_table) -> tuple[list[dict], dict]:
    """([summary table, ΔW cosine by module type], {label: definition}); nothing without LoRA runs.
    `make_table` is aggregate's `_table` (rows: methods, cells: mean ± CI over seeds)."""
    found = _lora_runs(runs)
    if not found:
        return [], {}
    columns = [(label, _value_of(path, label in GAPS), None) for label, path, _ in SUMMARY_COLUMNS]
    tables = [make_table("lora", "LoRA ensemble: weight space over all adapted layers", columns, found, expected,
                         note="Read each number against its baseline beside it: ΔW cosine ≈ 0 and overlaps near "
                              "their null mean members that moved in unrelated directions; near 1, one update "
                              "learnt k times. Columns of the effective weights need the base (--base).")]
    types = list(dict.fromkeys(group["type"] for seeds in found.values() for run in seeds.values()
                               for group in _type_groups(run)))

    def by_type(kind):
        return lambda run: next((group.get("delta_cosine") for group in _type_groups(run) if group["type"] == kind), None)

    if types:
        tables.append(make_table("lora-types", "LoRA ensemble: ΔW cosine by module type (mean over layers)",
                                 [(str(kind), by_type(kind), None) for kind in types], found, expected))
    return tables, {label: definition for label, _, definition in SUMMARY_COLUMNS}


def add_lora_figures(runs: dict, add, labels: dict) -> None:
    """The ΔW cosine heatmaps and the per-depth lines, from each LoRA method's first finished seed."""
    first = {}
    for method, seeds in _lora_runs(runs).items():
        seed, run = next((seed, run) for seed, run in seeds.items() if has_lora(run))
        first[f"{labels[method]}, seed {seed}"] = (run["metrics"]["analyzers"]["lora"], run["folder"])
    if not first:
        return
    sections = {label: section for label, (section, _) in first.items()}
    damaged = partial(_damaged, next(iter(first.values()))[1] / "metrics.json", "its lora section is not of the expected layout")
    add("lora-cosine", "LoRA ensembles: k×k cosine of the members' updates ΔW over all adapted layers (first seed)",
        lora_heatmaps, sections, damaged=damaged)
    add("lora-depth", "LoRA ensembles per layer index: ΔW cosine and column/row-space overlap, one line per "
                      "module type, null baselines dashed (first seed)", lora_depth_figure, sections, damaged=damaged)


LLM_DEFINITIONS = {
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
WEIGHT_SPACE = [(label, path) for label, path, _ in SUMMARY_COLUMNS if label in ("ΔW cosine", "column overlap", "row overlap")]
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
        definitions.update(LLM_DEFINITIONS)
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

PANELS = (("delta_cosine", "mean", "null_rms", "ΔW cosine between members\n(null: RMS, dashed)"),
          ("column_overlap", "mean", "null", "column-space overlap\n(mean cos², null dashed)"),
          ("row_overlap", "mean", "null", "row-space overlap\n(mean cos², null dashed)"))


def lora_heatmaps(sections: dict, title=None) -> "Figure":
    """sections: {row label: lora section}."""
    rows = [(plain(label), [("ΔW cosine, all adapted layers", plottable(section["summary"]["delta_cosine"]["matrix"]),
                      "cosine")]) for label, section in sections.items()]
    return heatmap_grid(rows, title=None if title is None else plain(title))


def lora_depth_figure(sections: dict) -> "Figure":
    """One row of three panels per section; x: the layer index, a line per module type."""
    figure = new_figure((11.0, 2.8 * len(sections)))
    axes = figure.subplots(len(sections), len(PANELS), squeeze=False)
    for row, (label, section) in zip(axes, sections.items()):
        layers = [layer for layer in section["layers"] if layer["depth"] is not None]
        types = list(dict.fromkeys(layer["type"] for layer in layers))
        for ax, (key, value, null, name) in zip(row, PANELS):
            for index, kind in enumerate(types):
                found = {}  # depth -> [layers], several modules of one type may share a depth
                for layer in layers:
                    if layer["type"] == kind:
                        found.setdefault(layer["depth"], []).append(layer[key])
                depths = sorted(found)
                mean = [sum(_value(entry[value]) for entry in found[d]) / len(found[d]) for d in depths]
                baseline = [sum(_value(entry[null]) for entry in found[d]) / len(found[d]) for d in depths]
                ax.plot(depths, mean, "-", marker="o", markersize=3, color=f"C{index % 10}", label=plain(kind))
                ax.plot(depths, baseline, "--", linewidth=0.8, alpha=0.6, color=f"C{index % 10}")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set_xlabel("layer index", fontsize=8)
            ax.set_ylabel(name, fontsize=8)
            ax.set_title(plain(label), fontsize=8)
        if types:
            row[-1].legend(fontsize=6, title="module", title_fontsize=6, loc="best")
    return figure
