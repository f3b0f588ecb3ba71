"""Aggregate a run folder's metrics over seeds into the paper's tables (a plain dict, JSON-able).

Each cell is mean ± half-width of the 95 % t-interval over the seeds that have the number:
t_{0.975, n−1} · s / √n. Seeds without metrics (a run in progress, a crashed
seed) are counted and shown (n per cell), never averaged in as if complete.
"""

from ..analysis import all_analyzers
from ..analysis.registry import CATALOGUE_LEFT_OUT
from ..errors import EnsdiagError, unknown
from ..export import STATUS_REASONS, flat_name
from ..layout import SPLIT_TABLES, lookup
from ..nn.methods import run_label
from ..seeds.across import across_seeds
from ..seeds.stats import mean_ci
from ..threads import apply as apply_threads
from .example_level import EXAMPLES_DEFINITION, Declared, budget_notes, example_cell
from . import ood_score as scores
from .diagnostics import with_diagnostics
from .across_tables import (SIZE_DEFINITIONS, bvd_table, damaged_lines, effective_size_table, seeds_needed_table,
                            verdict_table)
from .load import _number, dig, load_runs
from .lora import llm_tables, lora_tables

REPORT_SCHEMA = "ensdiag.report/1"
CI_DEFINITION = "mean ± t_{0.975,n−1}·s/√n over seeds (95 % Student-t interval; s = sample std, n seeds)"
MARKS = ("descriptive: the best and second-best mean over seeds per ↑/↓ column, not a test of their difference "
         "(marked means may lie within each other's intervals; the verdict's answers are tested)")

# Published numbers of the reference paper (CIFAR-10 preset only), by report column.
_SPLIT_LABELS, _OOD_LABELS = ("Acc", "NLL", "ECE", "H", "JSD"), ("AUPR", "AUROC", "FPR95 ID→OOD", "H", "JSD")
PAPER = {
    "id": {method: dict(zip(_SPLIT_LABELS, numbers)) for method, numbers in {
        "single": [.941, .237, .034, .073, None], "mc-dropout": [.936, .210, .021, .120, .022],
        "deep-ensemble": [.952, .152, .007, .136, .037], "batch-ensemble": [.938, .230, .032, .088, .002]}.items()},
    "shift": {method: dict(zip(_SPLIT_LABELS, numbers)) for method, numbers in {
        "single": [.558, 2.545, .323, .327, None], "mc-dropout": [.578, 2.054, .251, .449, .088],
        "deep-ensemble": [.575, 1.682, .206, .593, .176], "batch-ensemble": [.547, 2.357, .308, .400, .008]}.items()},
    # FPR95 as the paper's code computed it (ID flagged as OOD at 95 % OOD recall); the other
    # direction was not published, so its cell stays empty.
    "ood": {method: dict(zip(_OOD_LABELS, numbers)) for method, numbers in {
        "single": [.938, .893, .318, .480, None], "mc-dropout": [.932, .884, .324, .608, .122],
        "deep-ensemble": [.953, .924, .199, .829, .277], "batch-ensemble": [.932, .888, .297, .495, .010]}.items()},
}
CONVENTIONS = ("ensdiag", "torch-uncertainty")


def declared_columns(table_id: str, split: str | None = None, skipped=(), conventions: str = "ensdiag") -> list[tuple]:
    """[(label, analyzer, key path, direction, definition, split)] of every registered analyzer's
    columns in this table, in their declared order; columns of a skipped split are left out.
    With `conventions="torch-uncertainty"`, a column with a peer value reads that instead."""
    found = [(column.order, index, column.as_peer() if conventions == "torch-uncertainty" else column, analyzer)
             for analyzer in all_analyzers().values()
             for index, column in enumerate(analyzer.columns) if table_id in column.tables
             and column.split not in skipped]
    return [(column.label, analyzer.name, column.key_path(split), column.direction, column.definition,
             split if "{split}" in "".join(column.path) else column.split, column.since)
            for _, _, column, analyzer in sorted(found, key=lambda item: (item[0], item[1]))]


def _declared(run, analyzer, path, label, split=None, since=1, optional=False) -> tuple:
    """(the declared number of one run, None), or (None, why it is absent, in words): the run did not
    finish, the analyzer did not run (skipped, failed) or ran in a version older than the column
    (`Column.since`), the run has no such split (a seed trained before a shift set was on disk), the
    number is not defined for these inputs; an error when an analyzer that ran lacks a column its
    version declares, unless the column is `optional` (an OOD score a run may not have)."""
    if run is None:
        return None, "not finished"
    result = run["metrics"]["analyzers"].get(analyzer)
    if not isinstance(result, dict):
        return None, f"the {analyzer} analyzer did not run"
    if result.get("status") != "ok":
        return None, str(result.get("reason") or result.get("status"))
    version = result.get("version", 1)
    if isinstance(version, int) and not isinstance(version, bool) and version < since:
        return None, f"measured by an ensdiag whose {analyzer} analyzer did not have it yet"
    if split is not None and split not in run["metrics"]["splits"]:
        return None, f"no {split} split"
    value, found = lookup(result, path)
    if not found and not optional:
        raise EnsdiagError(f"{run['folder'] / 'metrics.json'}: the {analyzer} analyzer declares the report column "
                           f"{label!r} at {'.'.join(path)}, which its result lacks (written by another ensdiag or "
                           "plug-in version?); rerun `ensdiag evaluate` on that model")
    node = lookup(result, path[:-1])[0] if path and path[-1] == "value" else None
    if isinstance(node, dict) and node.get("value") is None:
        return None, str(node.get("note") or STATUS_REASONS.get(node.get("status"), "not defined for these inputs"))
    return value, None


def absent_note(table: dict, declared: list, runs: dict) -> str:
    """'N/A: <column> for <methods> — <why>' for every column a method has no number in (every
    absent number says why), one clause per reason."""
    clauses = {}
    for index, (label, analyzer, path, _, _, split, since) in enumerate(declared):
        for row, method in ((row, row["method"]) for row in table["rows"] if not row.get("reference")):
            if row["cells"][index].get("mean") is not None:
                continue
            reasons = {why for run in runs.get(method, {}).values()
                       if (why := _declared(run, analyzer, path, label, split, since, True)[1])}
            for reason in sorted(reasons):
                clauses.setdefault(reason, {}).setdefault(row["label"], []).append(label)
    grouped = {}  # (reason, methods) -> columns: one clause for what several columns miss alike
    for reason, methods in clauses.items():
        for method, labels in methods.items():
            grouped.setdefault((reason, tuple(labels)), []).append(method)
    return " ".join(f"N/A for {', '.join(methods)}: {', '.join(labels)} — {reason}."
                    for (reason, labels), methods in grouped.items())


def _cell(seeds: dict, value_of) -> dict:
    """mean_ci over the seeds that have the number, and which seeds those are (`seeds`, beside `values`)."""
    found = [(seed, value) for seed, run in seeds.items() if run is not None and _number(value := value_of(run))]
    return {**mean_ci([float(value) for _, value in found]), "seeds": [seed for seed, _ in found]}  # nulls not averaged


def _marks(rows, columns, valid=lambda value: True):
    """Best ('best') and second best ('second') per directed column, over the measured rows whose
    value is `valid` (a share below 0, worse than the single model, is no one's best); a second
    best only among three or more (of two, it would only mean the worse one)."""
    for index, (_, _, direction, *_) in enumerate(columns):
        if direction is None:
            continue
        ranked = sorted((row for row in rows if not row.get("reference") and row["cells"][index]["mean"] is not None
                         and valid(row["cells"][index]["mean"])),
                        key=lambda row: row["cells"][index]["mean"], reverse=direction == "up")
        for place, row in zip(("best", "second"), ranked[:1 if len(ranked) < 3 else 2] if len(ranked) > 1 else []):
            row["cells"][index]["mark"] = place


def _table(table_id, title, columns, runs, expected, note=""):
    """columns: [(label, value_of(run) -> number | None, direction[, {extra column fields}])]. A row
    lists the seeds that have metrics (`seeds`); a method's expected seeds are those it has
    (the run's seeds, or, from several folders, the seeds found for it)."""
    rows = [{"method": method, "label": run_label(method), "seeds": [seed for seed, run in seeds.items() if run is not None],
             "cells": [{**_cell(seeds, value_of), **example_cell(seeds, value_of), "expected": len(seeds) or expected}
                       for _, value_of, *_ in columns]}
            for method, seeds in runs.items()]
    _marks(rows, columns)
    return {"id": table_id, "title": title, "note": note,
            "columns": [{"name": name, "direction": direction, **(extra[0] if extra else {})}
                        for name, _, direction, *extra in columns], "rows": rows}


CATALOGUE_NOTE = ("The detail catalogue (SmoothECE and the calibration table's other ECEs, debiased ECE, temperature "
                  "scaling, selective prediction, conformal sets, member pairs, and member geometry's loss barriers "
                  "and CKA) was left out of these runs: `ensdiag train --detail` computes it with each run, "
                  "`ensdiag evaluate MODEL` for one model, `ensdiag diversity MODEL` for one model's member geometry.")


def _analyzer_columns(declared, optional=False) -> list[tuple]:
    return [(label, Declared(lambda run, a=analyzer, p=path, lb=label, sp=split, si=since: _declared(
                run, a, p, lb, sp, si, optional)[0], analyzer, path), direction, {"split": split, "key": flat_name(analyzer, path)})
            for label, analyzer, path, direction, _, split, since in declared]


def _measured(table) -> bool:
    """Whether any cell of the table holds a number (a table of nothing measured is left out: a
    folder of LoRA weight-space runs has no predictions for the others)."""
    return any(cell.get("mean") is not None for row in table["rows"] for cell in row["cells"])


def _meta_column(label, key, direction):
    return label, lambda run: dig(run["meta"], (key,)), direction


def _notes(runs, analyzer) -> str:
    """The notes an analyzer left in its results (e.g. temperature scaling that changes nothing), per method."""
    notes = {}
    for method, seeds in runs.items():
        for seed, run in seeds.items():
            note = dig(run["metrics"], ("analyzers", analyzer, "note")) if run else None
            if isinstance(note, str):
                notes.setdefault(run_label(method), []).append(f"seed {seed}")
                last = note
    return " ".join(f"{label} ({', '.join(seeds)}): {last}." for label, seeds in notes.items()) if notes else ""


def _members_table(runs, expected):
    """Each member on its own (in-distribution test set): the worst and best member's accuracy, and
    the members' mean NLL and ECE, beside the ensemble's accuracy."""
    def member(analyzer, key, reduce):
        def value_of(run):
            values = dig(run["metrics"], ("analyzers", analyzer, "splits", "id", key, "value"))
            values = [v for v in values if _number(v)] if isinstance(values, list) else []
            return reduce(values) if values else None
        return value_of

    columns = [("worst member Acc", member("calibration", "member_accuracy", min), "up"),
               ("best member Acc", member("calibration", "member_accuracy", max), "up"),
               ("ensemble Acc", lambda run: dig(run["metrics"], ("analyzers", "calibration", "splits", "id", "accuracy",
                                                                 "value")), "up"),
               ("member NLL", member("calibration", "member_nll", lambda v: sum(v) / len(v)), "down"),
               ("member ECE", member("ensemble-gain", "member_ece", lambda v: sum(v) / len(v)), "down")]
    table = _table("members", "Members on their own (in-distribution test set)", columns, runs, expected,
                   note="Worst and best member accuracy, the members' mean NLL and ECE (each member's own top-label "
                        "confidence), and the ensemble's accuracy, per seed, then averaged over seeds. Methods of one "
                        "member are not ranked in the member columns: their one member is the ensemble.")
    # a method of one member has no worst or best member to rank: mark the member columns among the others
    alone = {method for method, seeds in runs.items()
             if any(run is not None for run in seeds.values())
             and all(dig(run["metrics"], ("num_members",)) == 1 for run in seeds.values() if run is not None)}
    member_columns = [index for index, (name, _, _) in enumerate(columns) if name != "ensemble Acc"]
    for row in table["rows"]:
        for index in member_columns:
            row["cells"][index].pop("mark", None)
    _marks([row for row in table["rows"] if row["method"] not in alone],
           [column if index in member_columns else (column[0], column[1], None) for index, column in enumerate(columns)])
    return table


def _plugin_tables() -> list[tuple[str, object]]:
    """(table id, analyzer) of every table named by a column that no built-in table shows."""
    built_in = {*SPLIT_TABLES, "diversity", "geometry"}
    seen = {}
    for analyzer in all_analyzers().values():
        for column in analyzer.columns:
            for table in column.tables:
                if table not in built_in:
                    seen.setdefault(table, analyzer)
    return list(seen.items())


def build_report(run_dir, reference: str | None = None, data: dict | None = None, conventions: str = "ensdiag",
                 ood_score: str | None = None) -> dict:
    """The report dict; `data` is `load_runs(run_dir)` when the caller already has it; `conventions`
    picks whose definition of adaptive ECE and AURC the tables show (`CONVENTIONS`); `ood_score` the
    score of the OOD table (default 1 − MSP; report/ood_score.py)."""
    apply_threads(load=True)  # the CLI's choice, before the verdict's bootstrap (threads.py)
    if conventions not in CONVENTIONS:
        raise unknown("--conventions", conventions, CONVENTIONS)
    ood_score = scores.resolve(ood_score)
    data = data if data is not None else load_runs(run_dir)
    experiment, runs = data["experiment"], data["runs"]
    config = experiment["config"]
    titles, skipped = experiment.get("splits", {}), experiment.get("skipped", {})
    expected = len(config["seeds"])
    definitions = {}

    def analyzer_table(table_id, title, split=None, subset=None, note="", declared_in=None):
        declared = declared_columns(declared_in or table_id, split, skipped, conventions)
        if table_id == "ood":
            declared = scores.columns(declared, ood_score)
        definitions.update({label: definition for label, _, _, _, definition, _, _ in declared})
        optional = table_id == "ood" and ood_score != scores.DEFAULT_SCORE
        table = _table(table_id, title, _analyzer_columns(declared, optional), subset or runs, expected, note)
        absent = absent_note(table, declared, subset or runs)
        table["note"] = f"{table['note']} {absent}".strip() if absent else table["note"]
        return table

    tables = [analyzer_table("id", f"In-distribution ({titles.get('id', 'test')})", "id")]
    if "shift" not in skipped:
        # seeds trained while different corruption files were on disk were measured on different pools
        pools = sorted({str(dig(run["meta"], ("splits", "shift"))) for seeds in runs.values()
                        for run in seeds.values() if run and dig(run["meta"], ("splits", "shift"))})
        mixed = ("Seeds were measured on different shift sets and are averaged all the same: " + " | ".join(pools)
                 if len(pools) > 1 else "")
        tables.append(analyzer_table("shift", f"Distribution shift ({titles.get('shift', 'shift')}, pooled)", "shift",
                                     note=mixed))
        corruptions = sorted({name.split("/", 1)[1] for seeds in runs.values() for run in seeds.values() if run
                              for name in run["metrics"]["splits"] if name.startswith("shift/")})
        if corruptions:
            tables.append(_table("shift-corruptions", "Accuracy per corruption", [
                (c, lambda run, c=c: dig(run["metrics"], ("analyzers", "calibration", "splits", f"shift/{c}",
                                                           "accuracy", "value")), "up",
                 {"split": f"shift/{c}", "key": f"calibration/shift/{c}/accuracy"}) for c in corruptions],
                runs, expected))
    if "ood" not in skipped:
        tables.append(analyzer_table("ood", f"OOD detection ({titles.get('ood', 'ood')} vs ID; score "
                                     f"{scores.TITLES[ood_score]})", "ood",
                                     note="AUPR is AUPR-Out: average precision with OOD as the positive class. "
                                     "FPR95 OOD→ID: OOD accepted as ID at 95 % of ID accepted (the paper's text); "
                                     "FPR95 ID→OOD: ID flagged as OOD at 95 % of OOD flagged (the paper's code, whose "
                                     "numbers --reference paper shows). metrics.json holds every score's numbers "
                                     "(analyzer ood, scores); `ensdiag report --ood-score NAME` shows another."))
    # the paper's Figure 2a: disagreement on in-distribution, shifted and OOD data, then weight cosine
    scopes = {run_label(method): dig(run["metrics"], ("analyzers", "weight-similarity", "scope"))
              for method, seeds in runs.items() for run in seeds.values()
              if run and dig(run["metrics"], ("analyzers", "weight-similarity", "scope"))}
    scoped = " ".join(f"{label}: weight cosine on the {scope}." for label, scope in scopes.items() if scope)
    baselines = ("Read each cosine against its baseline: the members' cosine at initialisation, and for the aligned "
                 "cosine the null of untrained, independently initialised members aligned the same way.")
    tables.append(analyzer_table("diversity", "Member diversity (mean off-diagonal)", note=f"{baselines} {scoped}".strip()))
    tables.append(analyzer_table("geometry", "Member geometry: representations, paths between members, weight structure",
                                 note="CKA: linear CKA of members' representations, averaged over layers (per-layer "
                                     "curves in the figures; k×k heatmaps per layer with report --detail). Barriers: "
                                     "the largest rise above the straight line between two members' weights of the "
                                     "test loss, the test error, and the training loss on a fixed training sample, "
                                     "BatchNorm statistics recomputed along the path; the training-loss barrier tells"
                                     " whether members share one basin, a test-loss barrier of 0 alone does not "
                                     "(averaging tempers over-confident logits). Rank-1 layers: the fraction of "
                                     "layers where W_i ⊘ W_0 has rank 1 (BatchEnsemble: all, by construction: a check"
                                     " of the rebuild, not of diversity)."))  # (left out where nothing was measured, below)
    tables.append(_table("cost", "Computational cost", [_meta_column("parameters", "parameters", "down"),
                                                        _meta_column("training s", "train_seconds", "down")], runs, expected,
                         note="Training seconds include the per-epoch validation, as in the paper's Table 4."))
    variants = [m for m in runs if m in ("batch-ensemble-channel", "batch-ensemble-kernel")]
    if len(variants) == 2:
        tables.append(analyzer_table("be-variants", "BatchEnsemble channel- vs kernel-wise (in-distribution)", "id",
                                     {m: runs[m] for m in variants}, declared_in="id"))
    across = across_seeds(runs, data.get("groups"))
    sizes = across.effective_size
    verdict, verdicts = verdict_table(across.verdict, across.reasons, expected, data.get("groups"))
    sizes_table = effective_size_table(sizes)
    if sizes_table is not None:
        definitions.update(SIZE_DEFINITIONS)
    llm, llm_definitions = llm_tables(runs, verdicts, expected, _table)  # weight beside function space, subtasks
    needed_table = seeds_needed_table(verdicts)
    tables[:0] = [*(table for table in (verdict, sizes_table, needed_table) if table is not None), *llm]
    definitions.update(llm_definitions)
    bvd = bvd_table(across.bvd)
    if bvd is not None:
        tables.append(bvd)
    tables.append(_members_table(runs, expected))
    for table_id, analyzer in _plugin_tables():  # plug-in analyzers' own tables, from their declarations
        tables.append(analyzer_table(table_id, analyzer.description[:1].upper() + analyzer.description[1:]
                                     if analyzer.description else table_id,
                                     note=_notes(runs, analyzer.name)))
    tables, diagnostic_definitions = with_diagnostics(tables, runs, expected, _table)
    definitions.update(diagnostic_definitions)
    lora, lora_definitions = lora_tables(runs, expected, _table)
    tables += lora
    definitions.update(lora_definitions)
    tables = [table for table in tables if table["id"] == "verdict" or _measured(table)]  # e.g. weights only
    if reference == "paper":
        if config["preset"] != "cifar10":
            raise EnsdiagError(f"--reference paper compares with the paper's CIFAR-10 numbers; this run is the {config['preset']} preset")
        for table in tables:  # the paper's OOD numbers are those of 1 − MSP
            if table["id"] in PAPER and not (table["id"] == "ood" and ood_score != scores.DEFAULT_SCORE):
                table["rows"] += [{"method": method, "label": f"{run_label(method)} — paper (published)",
                                   "reference": True, "cells": [{"mean": numbers.get(column["name"]), "ci": None,
                                                                 "n": None, "values": []} for column in table["columns"]]}
                                  for method, numbers in PAPER[table["id"]].items()]
    missing = {method: [seed for seed, run in seeds.items() if run is None] for method, seeds in runs.items()}
    budgets, damaged = budget_notes(runs), damaged_lines(across.damaged, tables)
    # a line saying so where a run left the detail catalogue out (a training grid without --detail)
    catalogue = [CATALOGUE_NOTE] if any(isinstance(result, dict) and result.get("reason") == CATALOGUE_LEFT_OUT
                                        for seeds in runs.values() for run in seeds.values() if run
                                        for result in run["metrics"]["analyzers"].values()) else []
    return {"schema": REPORT_SCHEMA, "run": str(run_dir), "preset": config["preset"], "seeds": config["seeds"],
            "methods": config["methods"], "splits": titles, "skipped_splits": skipped,
            "missing_seeds": {m: s for m, s in missing.items() if s}, "aggregation": CI_DEFINITION,
            "examples": EXAMPLES_DEFINITION, "marks": MARKS, "verdict": verdicts, "effective_size": sizes,
            **({"notes": notes} if (notes := [*(experiment.get("notes") or []), *catalogue, *damaged]) else {}),
            **({"damaged_runs": {m: {str(seed): why for seed, why in seeds.items()} for m, seeds in across.damaged.items()}}
               if across.damaged else {}),
            "conventions": conventions, "ood_score": ood_score, **({"budgets": budgets} if budgets else {}),
            "definitions": definitions,
            "tables": tables, "figures": [], "figures_on_request": [],
            "labels": {method: run_label(method) for method in dict.fromkeys([*config["methods"], *runs, *sizes, *verdicts])}}
