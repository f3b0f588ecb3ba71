"""Reports of LoRA ensembles: runs saved by `ensdiag diversity ADAPTER_DIR… --save DIR` carry a `lora`
section in their metrics.json (ensdiag/lora/analysis.py); here it becomes report tables (mean ±
95 % CI over seeds, like every other table) and figures. A folder of such runs alone holds no
predictions, so its report shows only these tables."""

from .load import _damaged, dig

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
    return run is not None and isinstance(dig(run["metrics"], ("lora",)), dict)


def lora_only(runs: dict) -> bool:
    """Whether every finished run of the folder is a LoRA comparison without predictions."""
    finished = [run for seeds in runs.values() for run in seeds.values() if run is not None]
    return bool(finished) and all(has_lora(run) and not run["metrics"]["analyzers"] for run in finished)


def _lora_runs(runs: dict) -> dict:
    return {method: seeds for method, seeds in runs.items() if any(has_lora(run) for run in seeds.values())}


def _value_of(path, gap=False):
    def value_of(run):
        value = dig(run["metrics"], ("lora", *path)) if has_lora(run) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        return 1 - value if gap else value
    return value_of


def _type_groups(run) -> list[dict]:
    """The run's `by_type` entries that name their type (a damaged file has none)."""
    groups = dig(run["metrics"], ("lora", "by_type")) if has_lora(run) else None
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
        def value_of(run):
            value = next((group.get("delta_cosine") for group in _type_groups(run) if group["type"] == kind), None)
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        return value_of

    if types:
        tables.append(make_table("lora-types", "LoRA ensemble: ΔW cosine by module type (mean over layers)",
                                 [(str(kind), by_type(kind), None) for kind in types], found, expected))
    return tables, {label: definition for label, _, definition in SUMMARY_COLUMNS}


def add_lora_figures(runs: dict, add) -> None:
    """The ΔW cosine heatmaps and the per-depth lines, from each LoRA method's first finished seed."""
    from ..nn.methods import run_label
    from .lora_figures import lora_depth_figure, lora_heatmaps
    first = {}
    for method, seeds in _lora_runs(runs).items():
        seed, run = next((seed, run) for seed, run in seeds.items() if has_lora(run))
        first[f"{run_label(method)}, seed {seed}"] = (run["metrics"]["lora"], run["folder"])
    if not first:
        return
    sections = {label: section for label, (section, _) in first.items()}
    try:
        add("lora-cosine", "LoRA ensembles: k×k cosine of the members' updates ΔW over all adapted layers (first seed)",
            lora_heatmaps(sections))
        add("lora-depth", "LoRA ensembles per layer index: ΔW cosine and column/row-space overlap, one line per "
                          "module type, null baselines dashed (first seed)", lora_depth_figure(sections))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError):
        raise _damaged(next(iter(first.values()))[1] / "metrics.json", "its lora section is not of the expected layout") from None


MAX_READ_MEMBERS = 4096  # as predictions: what a saved section may claim (ensdiag itself saves at most 64)


def check_lora(section, path) -> None:
    """A saved `lora` section checked like user input before any table or figure reads it: k, r and
    every k×k matrix consistent, every number finite and in its range, or one `_damaged` line."""
    from .ranges import COSINE, NON_NEGATIVE, PROBABILITY, bad_number, out_of_range

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
